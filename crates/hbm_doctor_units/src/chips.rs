//! Accelerator memory sizes, the one chip table: every name a TPU generation goes by (`--target`,
//! `TPU_ACCELERATOR_TYPE`, JAX's `device_kind`, the PCI id, the monitor's `chip_type` label),
//! which chip a limit points to, and where a requirement fits.
//!
//! Usable HBM per device as the TPU compiler counts it was read off jax 0.10.2 / libtpu 0.0.42.1
//! deviceless compiles (docs/deviceless-tpu.md); physical sizes are the vendor's. Every figure is
//! per JAX device, the unit the compiler's `exceeds available HBM` speaks in: a chip holds
//! `devices_per_chip` of them.

use crate::size::format_size;

/// A TPU generation as users name it in `--target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpuGeneration {
    /// Short name (`v5e`).
    pub name: &'static str,
    /// Marketing name.
    pub long_name: &'static str,
    /// Physical HBM per JAX device (per chip on v4 megacore, v5e, v5p, v6e; per TensorCore on
    /// v2, v3, v4 outside megacore and 7x).
    pub physical_bytes: u64,
    /// HBM the compiler lets a program use on one device, when measured.
    pub usable_bytes: u64,
    /// JAX devices per chip as users see them on the TPU VM.
    pub devices_per_chip: u32,
    /// JAX's `device_kind` (`TPU v5 lite`); empty for a mode no runtime reports on its own.
    pub device_kind: &'static str,
    /// The monitor's `chip_type` label (tpu-info's spelling: `v5e`, `7x`); empty likewise.
    pub label: &'static str,
    /// Other names accepted for it (lower case): Cloud TPU's accelerator types, topology
    /// prefixes, code names, older spellings of this table.
    pub aliases: &'static [&'static str],
}

const GIB: u64 = 1 << 30;

/// Known TPU generations, smallest usable memory first.
pub const TPUS: &[TpuGeneration] = &[
    TpuGeneration {
        name: "v2",
        long_name: "TPU v2",
        physical_bytes: 8 * GIB,
        usable_bytes: 8_031_043_584,
        devices_per_chip: 2,
        device_kind: "TPU v2",
        label: "v2",
        aliases: &[],
    },
    TpuGeneration {
        name: "v4-core",
        long_name: "TPU v4 TensorCore (non-megacore mode)",
        physical_bytes: 16 * GIB,
        usable_bytes: 16_373_514_240,
        devices_per_chip: 2,
        device_kind: "",
        label: "",
        aliases: &[],
    },
    TpuGeneration {
        name: "v3",
        long_name: "TPU v3",
        physical_bytes: 16 * GIB,
        usable_bytes: 16_621_830_144,
        devices_per_chip: 2,
        device_kind: "TPU v3",
        label: "v3",
        aliases: &[],
    },
    TpuGeneration {
        name: "v5e",
        long_name: "TPU v5e (v5 lite)",
        physical_bytes: 16 * GIB,
        usable_bytes: 16_909_336_576,
        devices_per_chip: 1,
        device_kind: "TPU v5 lite",
        label: "v5e",
        aliases: &["v5lite", "v5litepod", "v5 lite", "v5lp", "tpu v5e"],
    },
    TpuGeneration {
        name: "v4",
        long_name: "TPU v4 (megacore)",
        physical_bytes: 32 * GIB,
        // `of 30.75G hbm` in users' messages: one JAX device per chip, both TensorCores.
        usable_bytes: 33_017_561_088,
        devices_per_chip: 1,
        device_kind: "TPU v4",
        label: "v4",
        aliases: &[],
    },
    TpuGeneration {
        name: "v6e",
        long_name: "TPU v6e (Trillium)",
        physical_bytes: 32 * GIB,
        usable_bytes: 33_550_237_696,
        devices_per_chip: 1,
        device_kind: "TPU v6 lite",
        label: "v6e",
        aliases: &["trillium", "v6lite", "v6litepod", "tpu v6e"],
    },
    TpuGeneration {
        name: "v7",
        long_name: "TPU7x (Ironwood) TensorCore",
        physical_bytes: 96 * GIB,
        // A deviceless `tpu7x:2x2x1` compile (jax 0.10.2 / libtpu 0.0.42.1) shows 8 devices
        // (2 per chip) and `exceeds available HBM (94.75G)`; the largest donated f32 program that
        // compiles is 101,732,712,448 B, plus the 128 KiB the compiler keeps on every generation
        // (the same bisection gives v5e's and v6e's figures above exactly). No device offers a
        // program the chip's 192 GiB.
        usable_bytes: 101_732_843_520,
        devices_per_chip: 2,
        device_kind: "TPU7x",
        label: "7x",
        // `v7-core` is this entry's name before the table went per device.
        aliases: &["v7x", "7x", "tpu7x", "ironwood", "v7-core", "tpu 7x"],
    },
    TpuGeneration {
        name: "v5p",
        long_name: "TPU v5p",
        physical_bytes: 95 * GIB,
        usable_bytes: 102_803_439_616,
        devices_per_chip: 1,
        device_kind: "TPU v5",
        label: "v5p",
        aliases: &["tpu v5p"],
    },
];

/// Looks a generation up by any name it goes by: `v5e`, `v5litepod-8`, `tpu-v6e`, `trillium`,
/// `7x`, `tpu7x:2x2x1`, `v4-core`, JAX's `TPU v5 lite`. Case and a `tpu`/`tpu-` prefix do not
/// matter; a slice size or topology after `-` or `:` is ignored.
pub fn tpu_by_name(name: &str) -> Option<&'static TpuGeneration> {
    let lower = name.trim().to_ascii_lowercase();
    let find = |n: &str| {
        TPUS.iter().find(|t| {
            t.name == n || t.aliases.contains(&n) || t.device_kind.eq_ignore_ascii_case(n)
        })
    };
    if let Some(t) = find(&lower) {
        return Some(t);
    }
    let n = lower
        .trim_start_matches("tpu")
        .trim_start_matches('-')
        .trim();
    if let Some(t) = find(n) {
        return Some(t);
    }
    find(n.split(['-', ':']).next().unwrap_or(n))
}

/// The generation whose JAX `device_kind` is `kind` (`TPU v5 lite`, `TPU7x`).
pub fn tpu_by_device_kind(kind: &str) -> Option<&'static TpuGeneration> {
    let kind = kind.trim();
    TPUS.iter().find(|t| {
        !t.device_kind.is_empty()
            && (t.device_kind.eq_ignore_ascii_case(kind)
                || t.aliases.iter().any(|a| a.eq_ignore_ascii_case(kind)))
    })
}

/// The generation of a Google TPU PCI function (vendor `0x1ae0`) from its `device` and
/// `subsystem_device` ids, as tpu-info reads them.
pub fn tpu_by_pci(device: &str, subsystem_device: &str) -> Option<&'static TpuGeneration> {
    let name = match (device, subsystem_device) {
        ("0x0027", "0x004e") => "v2",
        ("0x0027", _) => "v3",
        ("0x005e", _) => "v4",
        ("0x0063", _) => "v5e",
        ("0x0062", _) => "v5p",
        ("0x006f", _) => "v6e",
        ("0x0076", _) => "v7",
        _ => return None,
    };
    tpu_by_name(name)
}

/// The generation whose usable HBM (as the compiler prints it, rounded to two decimals in G) is
/// exactly `limit`.
pub fn usable_match(limit: u64) -> Option<&'static TpuGeneration> {
    TPUS.iter().find(|t| {
        let rounded = (t.usable_bytes as f64 / GIB as f64 * 100.0).round() / 100.0;
        t.usable_bytes == limit || (limit as f64 / GIB as f64 - rounded).abs() < 0.006
    })
}

/// What a limit (and the reserved part, when stated) says about the device.
pub fn infer_tpu(limit: u64, reserved: Option<u64>) -> Option<(String, u64)> {
    // An exact match on the compiler's usable figure (as bytes, or rounded to two decimals in G).
    for t in TPUS {
        let rounded = (t.usable_bytes as f64 / GIB as f64 * 100.0).round() / 100.0;
        let limit_g = limit as f64 / GIB as f64;
        if t.usable_bytes == limit || (limit_g - rounded).abs() < 0.006 {
            return Some((
                format!(
                    "{} ({} HBM per device)",
                    t.long_name,
                    format_size(t.physical_bytes)
                ),
                t.physical_bytes,
            ));
        }
    }
    let total = limit + reserved.unwrap_or(0);
    let physical = [8 * GIB, 16 * GIB, 32 * GIB, 95 * GIB, 96 * GIB]
        .into_iter()
        .find(|&p| total <= p && total as f64 >= p as f64 * 0.85)?;
    let names = match physical / GIB {
        8 => "TPU v2 core",
        16 => "TPU v3 core, v4 core or v5e",
        32 => "TPU v3 chip, v4 chip or v6e",
        95 => "TPU v5p",
        _ => "TPU7x (Ironwood) TensorCore",
    };
    Some((
        format!("{names} ({} HBM per device)", format_size(physical)),
        physical,
    ))
}

/// The TPU generations whose usable HBM holds `bytes` on one device.
pub fn tpus_that_fit(bytes: u64) -> Vec<String> {
    let mut out: Vec<&TpuGeneration> = TPUS
        .iter()
        .filter(|t| t.usable_bytes >= bytes && !matches!(t.name, "v2" | "v3" | "v4-core"))
        .collect();
    out.sort_by_key(|t| t.usable_bytes);
    out.into_iter()
        .map(|t| format!("{} ({} usable)", t.name, format_size(t.usable_bytes)))
        .collect()
}

/// Common GPU memory sizes (bytes), for spotting an allocator capped below the device.
pub const GPU_SIZES_GB: &[u64] = &[8, 12, 16, 24, 32, 40, 48, 80, 94, 141, 192];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infers_chips() {
        assert!(infer_tpu(16_909_336_576, None)
            .expect("v5e")
            .0
            .contains("v5e"));
        assert!(
            infer_tpu(crate::size::parse_size("15.75G").expect("size"), None)
                .expect("v5e")
                .0
                .contains("v5e")
        );
        assert!(
            infer_tpu(crate::size::parse_size("95.74G").expect("size"), None)
                .expect("v5p")
                .0
                .contains("v5p")
        );
        let (name, physical) = infer_tpu(
            crate::size::parse_size("30.75G").expect("size"),
            crate::size::parse_size("1.25G"),
        )
        .expect("32G");
        assert_eq!(physical, 32 * GIB, "{name}");
        assert_eq!(infer_tpu(100, None), None);
        assert_eq!(tpu_by_name("v5litepod-4").map(|t| t.name), Some("v5e"));
        assert_eq!(
            tpus_that_fit(20 * GIB).first().map(String::as_str),
            Some("v4 (30.75G usable)")
        );
        // Real v4 users see one device per chip (megacore): `of 30.75G hbm`.
        let (name, physical) =
            infer_tpu(crate::size::parse_size("30.75G").expect("size"), None).expect("v4");
        assert!(name.contains("v4") && physical == 32 * GIB, "{name}");
        // A deviceless compile for a v4 topology sees each TensorCore (15.25G).
        let (name, _) =
            infer_tpu(crate::size::parse_size("15.25G").expect("size"), None).expect("core");
        assert!(name.contains("TensorCore"), "{name}");
        assert!(!tpus_that_fit(15 * GIB)
            .iter()
            .any(|t| t.starts_with("v4-core")));
        // A deviceless `tpu7x:2x2x1` compile: one JAX device per TensorCore, 94.75G each.
        let (name, physical) =
            infer_tpu(crate::size::parse_size("94.75G").expect("size"), None).expect("v7");
        assert!(name.contains("7x") && physical == 96 * GIB, "{name}");
    }

    #[test]
    fn every_spelling_of_a_generation_finds_one_entry() {
        for n in [
            "v7",
            "7x",
            "v7x",
            "tpu7x",
            "TPU7x",
            "tpu7x:2x2x1",
            "tpu7x-8",
            "v7-8",
            "ironwood",
            "v7-core",
        ] {
            assert_eq!(tpu_by_name(n).map(|t| t.name), Some("v7"), "{n}");
        }
        assert_eq!(tpu_by_name("v4-core").map(|t| t.name), Some("v4-core"));
        assert_eq!(tpu_by_name("v4-8").map(|t| t.name), Some("v4"));
        assert_eq!(tpu_by_name("tpu-v6e").map(|t| t.name), Some("v6e"));
        assert_eq!(tpu_by_name("trillium").map(|t| t.name), Some("v6e"));
        assert_eq!(tpu_by_name("TPU v5 lite").map(|t| t.name), Some("v5e"));
        assert_eq!(tpu_by_name("v9"), None);
        assert_eq!(tpu_by_device_kind("TPU7x").map(|t| t.label), Some("7x"));
        assert_eq!(tpu_by_device_kind("TPU v5e").map(|t| t.label), Some("v5e"));
        assert_eq!(tpu_by_device_kind("TPU v5").map(|t| t.name), Some("v5p"));
        assert_eq!(tpu_by_pci("0x0076", "").map(|t| t.name), Some("v7"));
        assert_eq!(tpu_by_pci("0x0027", "0x004e").map(|t| t.name), Some("v2"));
        // Per device, as the compiler counts: the v7 entry is what one device offers.
        let v7 = tpu_by_name("v7").expect("v7");
        assert_eq!(v7.usable_bytes, 101_732_843_520);
        assert_eq!(format_size(v7.usable_bytes), "94.75G");
        assert_eq!(
            v7.physical_bytes * u64::from(v7.devices_per_chip),
            192 * GIB
        );
        let v4 = tpu_by_name("v4").expect("v4");
        assert_eq!((v4.usable_bytes, v4.devices_per_chip), (33_017_561_088, 1));
        // Smallest usable first.
        assert!(TPUS
            .windows(2)
            .all(|w| w[0].usable_bytes <= w[1].usable_bytes));
        // Names and aliases are unique.
        let mut all: Vec<&str> = TPUS
            .iter()
            .flat_map(|t| std::iter::once(t.name).chain(t.aliases.iter().copied()))
            .collect();
        all.sort_unstable();
        let n = all.len();
        all.dedup();
        assert_eq!(all.len(), n);
    }
}
