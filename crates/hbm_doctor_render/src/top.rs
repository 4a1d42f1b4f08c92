//! Views of `top` without its terminal UI: the table of `--once` (one row per device with its
//! source, used, limit, share, peak and process, and the trainer's RSS) and the plain lines it
//! streams when stdout is not a terminal (one per event and per device each round). The monitor
//! comes after this crate in the pipeline, so the binary copies its snapshot into a [`TopTable`]
//! and passes the monitor's byte spelling.

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

/// Something that happened during a round (the monitor's events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopEvent {
    /// A source started answering.
    SourceUp {
        /// The source.
        source: String,
    },
    /// A source stopped answering.
    SourceDown {
        /// The source.
        source: String,
        /// What the error said.
        reason: String,
    },
    /// The watched process is gone.
    ProcessExit {
        /// Its pid.
        pid: u32,
        /// Killed by the kernel's OOM killer (host RAM, not HBM).
        host_oom_killed: bool,
    },
    /// A kernel OOM-killer line.
    KernelOom {
        /// The line as the kernel wrote it.
        line: String,
    },
    /// Records the recorder could not write.
    RecordsLost {
        /// How many.
        count: u64,
        /// The write error.
        reason: String,
    },
}

/// One snapshot, as `top` prints it.
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
    /// Events of the round (streamed lines only).
    pub events: Vec<TopEvent>,
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

/// Renders one round as plain lines (`top` on a pipe): one per event, then one per device.
pub fn render_top_lines(t: &TopTable, style: Style, bytes: fn(u64) -> String) -> String {
    let st = style;
    let mut out = String::new();
    let time = st.dim(&t.time);
    for e in &t.events {
        let text = match e {
            TopEvent::SourceUp { source } => st.green(&format!("{source} answering")),
            TopEvent::SourceDown { source, reason } => {
                st.yellow(&format!("{source} stopped answering: {reason}"))
            }
            TopEvent::ProcessExit {
                pid,
                host_oom_killed: true,
            } => st.red(&format!(
                "process {pid} exited: killed by the kernel OOM killer (host RAM, not HBM)"
            )),
            TopEvent::ProcessExit { pid, .. } => format!("process {pid} exited"),
            TopEvent::KernelOom { line } => st.red(&format!("kernel: {line}")),
            TopEvent::RecordsLost { count, reason } => {
                st.yellow(&format!("recording: {count} record(s) lost ({reason})"))
            }
        };
        let _ = writeln!(out, "{time} {} event {text}", t.host);
    }
    let b = |v: Option<u64>| v.map_or_else(|| "-".to_string(), bytes);
    for x in &t.devices {
        let _ = writeln!(
            out,
            "{time} {} {} dev {} used {} limit {} peak {} pid {}",
            t.host,
            x.source,
            x.id,
            b(x.used_bytes),
            b(x.limit_bytes),
            b(x.peak_bytes),
            x.pid.map_or("-".into(), |p| p.to_string())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hbm_doctor_log::format_size;

    fn table() -> TopTable {
        let gib = 1u64 << 30;
        TopTable {
            host: "tpu-vm-0".into(),
            time: "2026-01-02T03:04:05Z".into(),
            devices: vec![
                TopDevice {
                    id: "0".into(),
                    source: "libtpu".into(),
                    kind: Some("TPU v5 lite".into()),
                    used_bytes: Some(15 * gib),
                    limit_bytes: Some(16 * gib),
                    peak_bytes: Some(15 * gib + gib / 2),
                    pid: Some(4242),
                },
                TopDevice {
                    id: "1".into(),
                    source: "inprocess".into(),
                    kind: None,
                    used_bytes: Some(3 * gib),
                    limit_bytes: None,
                    peak_bytes: None,
                    pid: None,
                },
            ],
            process: Some(TopProcess {
                pid: 4242,
                comm: Some("python3".into()),
                rss_bytes: Some(7 * gib),
                alive: false,
            }),
            events: vec![
                TopEvent::SourceUp {
                    source: "libtpu 127.0.0.1:8431".into(),
                },
                TopEvent::SourceDown {
                    source: "nvml".into(),
                    reason: "library not found".into(),
                },
                TopEvent::ProcessExit {
                    pid: 4242,
                    host_oom_killed: true,
                },
                TopEvent::KernelOom {
                    line: "Out of memory: Killed process 4242 (python3)".into(),
                },
                TopEvent::RecordsLost {
                    count: 3,
                    reason: "No space left on device".into(),
                },
            ],
        }
    }

    #[test]
    fn once_table() {
        insta::assert_snapshot!(render_top(&table(), Style::new(false), format_size));
    }

    #[test]
    fn streamed_lines() {
        insta::assert_snapshot!(render_top_lines(&table(), Style::new(false), format_size));
    }

    #[test]
    fn no_devices() {
        let t = TopTable {
            devices: Vec::new(),
            process: None,
            ..table()
        };
        assert_eq!(
            render_top(&t, Style::new(false), format_size),
            "tpu-vm-0  2026-01-02T03:04:05Z\nno devices\n"
        );
    }

    #[test]
    fn a_device_near_its_limit_is_marked() {
        let coloured = render_top(&table(), Style::new(true), format_size);
        assert!(coloured.contains("\x1b[33m  94%\x1b[0m"), "{coloured}");
        let mut full = table();
        full.devices[0].used_bytes = full.devices[0].limit_bytes;
        let coloured = render_top(&full, Style::new(true), format_size);
        assert!(coloured.contains("\x1b[1;31m 100%\x1b[0m"), "{coloured}");
    }
}
