//! Byte sizes as XLA, TSL, the TPU compiler, PyTorch/XLA and TensorFlow print them: the one
//! parser and the one human formatter of the project.
//!
//! Parsing accepts `28.50G`, `28.50GiB`, `1.2K`, `512B`, `0B`, `30601641984 bytes`,
//! `1 234 567 bytes`, `14.30GiB (15360000000B)` (the exact count in parentheses wins), `1.5 GB`.
//! Units are binary (`G` = 2^30), as XLA means them.
//!
//! Formatting (ARCHITECTURE.md, "Units"): every human output (terminal, markdown, TUI, the HTML
//! viewer, the Python package's messages) prints sizes with [`format_size`], TSL's
//! `HumanReadableNumBytes` without the `iB` suffix, the way TPU messages print them: `512B`,
//! `4.0K` (one decimal in K), `528.00M`, `28.50G` (two decimals above). Signed figures (deltas,
//! savings) use [`format_signed`]. JSON and Prometheus never carry formatted sizes: they carry
//! exact integer bytes in `*_bytes` fields and metrics. `tests/vectors.json` holds the cases the
//! Rust and Python implementations must agree on.

/// Parses one size token. Returns `None` for anything that is not a size.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Some(open) = text.find('(') {
        // `14.30GiB (15360000000B)`: prefer the exact count.
        let inner = text[open + 1..].trim_end_matches(')');
        if let Some(exact) = parse_plain_bytes(inner) {
            return Some(exact);
        }
        return parse_size(&text[..open]);
    }
    if let Some(exact) = parse_plain_bytes(text) {
        return Some(exact);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    if number.is_sign_negative() || !number.is_finite() {
        return None;
    }
    let value = number * unit_bytes(unit)? as f64;
    if value > u64::MAX as f64 {
        return None;
    }
    Some(value.round() as u64)
}

/// Bytes per unit, binary as XLA means them: `""`, `B`, `byte(s)` are 1; `K`, `KB`, `KiB` are
/// 2^10; and so on up to `E`. Case does not matter. `None` for anything else.
pub fn unit_bytes(unit: &str) -> Option<u64> {
    let u = unit.trim().to_ascii_lowercase();
    if matches!(u.as_str(), "" | "b" | "byte" | "bytes") {
        return Some(1);
    }
    let mut chars = u.chars();
    let power = match chars.next()? {
        'k' => 1,
        'm' => 2,
        'g' => 3,
        't' => 4,
        'p' => 5,
        'e' => 6,
        _ => return None,
    };
    if !matches!(chars.as_str(), "" | "b" | "ib") {
        return None;
    }
    Some(1u64 << (10 * power))
}

/// `12345 bytes`, `12345B`, `1 234 567 bytes`, `1,234,567 bytes`: an exact count.
fn parse_plain_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .strip_suffix("bytes")
        .or_else(|| text.strip_suffix("Bytes"))
        .or_else(|| text.strip_suffix("byte"))
        .or_else(|| text.strip_suffix('B'))?
        .trim();
    if digits.is_empty() || digits.contains('.') {
        return None;
    }
    let mut value: u64 = 0;
    for c in digits.chars() {
        match c {
            '0'..='9' => {
                value = value
                    .checked_mul(10)?
                    .checked_add(u64::from(c as u8 - b'0'))?;
            }
            ' ' | ',' | '\u{a0}' | '_' => {}
            _ => return None,
        }
    }
    Some(value)
}

/// Formats bytes like the TPU compiler does: `512B`, `4.0K`, `528.00M`, `28.50G`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["K", "M", "G", "T", "P", "E"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.1}{}", UNITS[unit])
    } else {
        format!("{value:.2}{}", UNITS[unit])
    }
}

/// A signed size (a delta, a saving): [`format_size`] of the magnitude with `-` before negative
/// values (`-1.50G`, `512B`).
pub fn format_signed(bytes: i128) -> String {
    let magnitude = u64::try_from(bytes.unsigned_abs()).unwrap_or(u64::MAX);
    if bytes < 0 {
        format!("-{}", format_size(magnitude))
    } else {
        format_size(magnitude)
    }
}

/// [`format_signed`] of a figure computed in floating point (rounded to whole bytes).
pub fn format_signed_f64(bytes: f64) -> String {
    if !bytes.is_finite() {
        return "-".to_string();
    }
    format_signed(bytes.round() as i128)
}

/// Thin wrapper kept so that older callers compile: the `iB` spelling (`28.50 GiB`) is no longer
/// printed anywhere; use [`format_size`].
pub fn format_size_iec(bytes: u64) -> String {
    format_size(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_from_the_contract() {
        assert_eq!(parse_size("28.50G"), Some(30_601_641_984));
        assert_eq!(parse_size("28.50GiB"), Some(30_601_641_984));
        assert_eq!(parse_size("1.2K"), Some(1229));
        assert_eq!(parse_size("512B"), Some(512));
        assert_eq!(parse_size("0B"), Some(0));
        assert_eq!(parse_size("30601641984 bytes"), Some(30_601_641_984));
        assert_eq!(parse_size("1 234 567 bytes"), Some(1_234_567));
        assert_eq!(parse_size("14.30GiB (15360000000B)"), Some(15_360_000_000));
        assert_eq!(parse_size("15.75G"), Some(16_911_433_728));
        assert_eq!(parse_size("3.84T"), Some(4_222_124_650_660));
        assert_eq!(parse_size("4.0K"), Some(4096));
        assert_eq!(parse_size("1.5 GB"), Some(1_610_612_736));
        assert_eq!(parse_size("6.00MiB"), Some(6_291_456));
        assert_eq!(unit_bytes("KiB"), Some(1024));
        assert_eq!(unit_bytes("gb"), Some(1 << 30));
        assert_eq!(unit_bytes("bytes"), Some(1));
        assert_eq!(unit_bytes("Ki"), None);
    }

    #[test]
    fn rejects_non_sizes() {
        // `1\u{fffd}` was found by the parse_log fuzz target (a multi-byte unit).
        for t in [
            "",
            "G",
            "abc",
            "1.2.3G",
            "12Q",
            "-5G",
            "NaNG",
            "1e400G",
            "1\u{fffd}",
            "2é",
        ] {
            assert_eq!(parse_size(t), None, "{t}");
        }
    }

    #[test]
    fn formats_like_xla() {
        assert_eq!(format_size(0), "0B");
        assert_eq!(format_size(4096), "4.0K");
        assert_eq!(format_size(30_601_641_984), "28.50G");
        assert_eq!(format_size(553_648_128), "528.00M");
        assert_eq!(format_signed(-1_610_612_736), "-1.50G");
        assert_eq!(format_signed(512), "512B");
    }

    /// The cases `python/hbm_doctor/_size.py` is held to as well (python/tests/test_package.py).
    #[test]
    fn shared_vectors() {
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../tests/vectors.json")).expect("vectors.json");
        for case in v["format"].as_array().expect("format") {
            let (n, text) = (case[0].as_u64().expect("n"), case[1].as_str().expect("s"));
            assert_eq!(format_size(n), text);
        }
        for case in v["parse"].as_array().expect("parse") {
            let text = case[0].as_str().expect("s");
            assert_eq!(parse_size(text), case[1].as_u64(), "{text}");
        }
    }
}
