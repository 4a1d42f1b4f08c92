//! The table of `top --once` (human): one row per device with its source, used, limit, share,
//! peak and process, and the trainer's RSS. The monitor comes after this crate in the pipeline,
//! so the binary copies its snapshot into a [`TopTable`] and passes the monitor's byte spelling.

use crate::Style;
use std::fmt::Write as _;

/// One device's row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopDevice {
    /// Device id as the source names it.
    pub id: String,
    /// Source name (`libtpu`, `nvml`, `inprocess`...).
    pub source: String,
    /// Device kind, when known.
    pub kind: Option<String>,
    /// Bytes in use.
    pub used_bytes: Option<u64>,
    /// Bytes the device can hold.
    pub limit_bytes: Option<u64>,
    /// Highest bytes in use seen.
    pub peak_bytes: Option<u64>,
    /// Process holding the device.
    pub pid: Option<u32>,
}

/// The trainer process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopProcess {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub comm: Option<String>,
    /// Resident set size.
    pub rss_bytes: Option<u64>,
    /// Whether it was still running.
    pub alive: bool,
}

/// One snapshot, as `top --once` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopTable {
    /// Host name.
    pub host: String,
    /// When the snapshot was taken (RFC 3339).
    pub time: String,
    /// One row per device.
    pub devices: Vec<TopDevice>,
    /// The trainer, when `--pid` was given.
    pub process: Option<TopProcess>,
}

/// Renders the table; `bytes` spells a byte count (the monitor's `fmt_bytes`).
pub fn render_top(t: &TopTable, style: Style, bytes: fn(u64) -> String) -> String {
    let st = style;
    let mut out = String::new();
    let _ = writeln!(out, "{}  {}", st.bold(&t.host), st.dim(&t.time));
    if t.devices.is_empty() {
        let _ = writeln!(out, "{}", st.yellow("no devices"));
        return out;
    }
    let header = format!(
        "{:<6} {:<10} {:<14} {:>9} {:>9} {:>5} {:>9} {:>8}",
        "dev", "source", "kind", "used", "limit", "use", "peak", "pid"
    );
    let _ = writeln!(out, "{}", st.dim(&header));
    let b = |v: Option<u64>| v.map_or_else(|| "-".to_string(), bytes);
    for x in &t.devices {
        let (pct, share) = match (x.used_bytes, x.limit_bytes) {
            (Some(u), Some(l)) if l > 0 => {
                let share = u as f64 / l as f64;
                (format!("{:.0}%", share * 100.0), share)
            }
            _ => ("-".into(), 0.0),
        };
        let pct = format!("{pct:>5}");
        let pct = if share >= 0.95 {
            st.red(&pct)
        } else if share >= 0.8 {
            st.yellow(&pct)
        } else {
            pct
        };
        let _ = writeln!(
            out,
            "{:<6} {:<10} {:<14} {:>9} {:>9} {} {:>9} {:>8}",
            x.id,
            x.source,
            x.kind.as_deref().unwrap_or("-"),
            b(x.used_bytes),
            b(x.limit_bytes),
            pct,
            b(x.peak_bytes),
            x.pid.map_or("-".into(), |p| p.to_string())
        );
    }
    if let Some(p) = &t.process {
        let _ = writeln!(
            out,
            "process {} {}: RSS {}{}",
            p.pid,
            p.comm.as_deref().unwrap_or(""),
            p.rss_bytes.map_or("-".into(), bytes),
            if p.alive { "" } else { " (exited)" }
        );
    }
    out
}
