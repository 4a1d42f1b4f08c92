//! Accelerator memory sizes: which chip a limit points to, and where a requirement fits.
//!
//! Usable HBM per device as the TPU compiler counts it was read off jax 0.10.2 / libtpu 0.0.42.1
//! deviceless compiles (docs/deviceless-tpu.md); physical sizes are the vendor's.

/// A TPU generation as users name it in `--target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpuGeneration {
    /// Short name (`v5e`).
    pub name: &'static str,
    /// Marketing name.
    pub long_name: &'static str,
    /// Physical HBM per device as JAX sees it (per chip; per core on v2/v3 and v4 outside megacore).
    pub physical_bytes: u64,
    /// HBM the compiler lets a program use on one device, when measured.
    pub usable_bytes: u64,
}

const GIB: u64 = 1 << 30;

/// Known TPU generations, smallest memory first.
pub const TPUS: &[TpuGeneration] = &[
    TpuGeneration {
        name: "v2",
        long_name: "TPU v2",
        physical_bytes: 8 * GIB,
        usable_bytes: 8_031_043_584,
    },
    TpuGeneration {
        name: "v4-core",
        long_name: "TPU v4 TensorCore (non-megacore mode)",
        physical_bytes: 16 * GIB,
        usable_bytes: 16_373_514_240,
    },
    TpuGeneration {
        name: "v3",
        long_name: "TPU v3",
        physical_bytes: 16 * GIB,
        usable_bytes: 16_621_830_144,
    },
    TpuGeneration {
        name: "v5e",
        long_name: "TPU v5e (v5 lite)",
        physical_bytes: 16 * GIB,
        usable_bytes: 16_909_336_576,
    },
    TpuGeneration {
        name: "v4",
        long_name: "TPU v4 (megacore)",
        physical_bytes: 32 * GIB,
        // `of 30.75G hbm` in users' messages: one JAX device per chip, both TensorCores.
        usable_bytes: 33_017_561_088,
    },
    TpuGeneration {
        name: "v6e",
        long_name: "TPU v6e (Trillium)",
        physical_bytes: 32 * GIB,
        usable_bytes: 33_550_237_696,
    },
    TpuGeneration {
        name: "v5p",
        long_name: "TPU v5p",
        physical_bytes: 95 * GIB,
        usable_bytes: 102_803_439_616,
    },
    TpuGeneration {
        name: "v7-core",
        long_name: "TPU v7 (Ironwood) TensorCore, one JAX device (two per chip)",
        physical_bytes: 96 * GIB,
        // A deviceless `tpu7x:2x2x1` compile (jax 0.10.2 / libtpu 0.0.42.1) shows 8 devices
        // (2 per chip) and `exceeds available HBM (94.75G)`; the largest donated f32 program that
        // compiles is 101,732,712,448 B, plus the 128 KiB the compiler keeps on every generation
        // (the same bisection gives v5e's and v6e's figures above exactly).
        usable_bytes: 101_732_843_520,
    },
    TpuGeneration {
        name: "v7",
        long_name: "TPU v7 (Ironwood)",
        physical_bytes: 192 * GIB,
        usable_bytes: 192 * GIB - 2 * GIB,
    },
];

/// Looks a generation up by the name users type (`v5e`, `v5litepod`, `v6e`, `trillium`...).
pub fn tpu_by_name(name: &str) -> Option<&'static TpuGeneration> {
    let n = name.to_ascii_lowercase();
    let n = n.trim_start_matches("tpu").trim_start_matches('-').trim();
    let n = n.split(['-', ':']).next().unwrap_or(n);
    let n = match n {
        "v5lite" | "v5litepod" | "v5 lite" => "v5e",
        "trillium" => "v6e",
        "ironwood" | "v7x" => "v7",
        other => other,
    };
    TPUS.iter().find(|t| t.name == n)
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
                    hbm_doctor_log::size::format_size_iec(t.physical_bytes)
                ),
                t.physical_bytes,
            ));
        }
    }
    let total = limit + reserved.unwrap_or(0);
    let physical = [8 * GIB, 16 * GIB, 32 * GIB, 95 * GIB, 96 * GIB, 192 * GIB]
        .into_iter()
        .find(|&p| total <= p && total as f64 >= p as f64 * 0.85)?;
    let names = match physical / GIB {
        8 => "TPU v2 core",
        16 => "TPU v3 core, v4 core or v5e",
        32 => "TPU v3 chip, v4 chip or v6e",
        95 | 96 => "TPU v5p",
        _ => "TPU v7 (Ironwood)",
    };
    Some((
        format!(
            "{names} ({} HBM per device)",
            hbm_doctor_log::size::format_size_iec(physical)
        ),
        physical,
    ))
}

/// The TPU generations whose usable HBM holds `bytes` on one device.
pub fn tpus_that_fit(bytes: u64) -> Vec<String> {
    let mut out: Vec<&TpuGeneration> = TPUS
        .iter()
        .filter(|t| {
            t.usable_bytes >= bytes && !matches!(t.name, "v2" | "v3" | "v4-core" | "v7-core")
        })
        .collect();
    out.sort_by_key(|t| t.usable_bytes);
    out.into_iter()
        .map(|t| {
            format!(
                "{} ({} usable)",
                t.name,
                hbm_doctor_log::format_size(t.usable_bytes)
            )
        })
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
            infer_tpu(hbm_doctor_log::parse_size("15.75G").expect("size"), None)
                .expect("v5e")
                .0
                .contains("v5e")
        );
        assert!(
            infer_tpu(hbm_doctor_log::parse_size("95.74G").expect("size"), None)
                .expect("v5p")
                .0
                .contains("v5p")
        );
        let (name, physical) = infer_tpu(
            hbm_doctor_log::parse_size("30.75G").expect("size"),
            hbm_doctor_log::parse_size("1.25G"),
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
            infer_tpu(hbm_doctor_log::parse_size("30.75G").expect("size"), None).expect("v4");
        assert!(name.contains("v4") && physical == 32 * GIB, "{name}");
        // A deviceless compile for a v4 topology sees each TensorCore (15.25G).
        let (name, _) =
            infer_tpu(hbm_doctor_log::parse_size("15.25G").expect("size"), None).expect("core");
        assert!(name.contains("TensorCore"), "{name}");
        assert!(!tpus_that_fit(15 * GIB)
            .iter()
            .any(|t| t.starts_with("v4-core")));
        // A deviceless `tpu7x:2x2x1` compile: one JAX device per TensorCore, 94.75G each.
        let (name, physical) =
            infer_tpu(hbm_doctor_log::parse_size("94.75G").expect("size"), None).expect("v7");
        assert!(name.contains("v7") && physical == 96 * GIB, "{name}");
    }
}
