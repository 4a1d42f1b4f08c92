//! `hbm-doctor top`: live device memory per chip, as a terminal UI, one snapshot, or a stream.
//!
//! The source options it shares with `record` and `exporter` are [`SourceArgs`] (in `cli.rs`).

use crate::cli::GlobalArgs;
use crate::cli::SourceArgs;
use crate::exit;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use hbm_doctor_monitor::host::rfc3339;
use hbm_doctor_monitor::json::snapshot_json;
use hbm_doctor_monitor::sample::Event;
use hbm_doctor_monitor::tui::fmt_bytes;
use hbm_doctor_monitor::{Monitor, Snapshot};
use hbm_doctor_render::{
    render_top, render_top_lines, Style, TopDevice, TopEvent, TopProcess, TopTable,
};
use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Parses `1s`, `500ms`, `0.1s`, `2m`, `1h`, or plain seconds.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration: write e.g. 1s, 500ms, 0.1s, 2m"))?;
    let secs = match unit.trim() {
        "" | "s" => v,
        "ms" => v / 1000.0,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{s}`: use ms, s, m or h"
            ))
        }
    };
    if !(secs > 0.0 && secs.is_finite()) {
        return Err(format!("`{s}` must be more than zero"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Output of `top`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum TopFormat {
    /// The terminal UI on a terminal; plain lines otherwise (or one table with --once).
    Human,
    /// One snapshot as JSON (contract.md "JSON of top --once").
    Json,
    /// One JSON snapshot per line, every interval (for logs and scripts).
    JsonLines,
}

/// `hbm-doctor top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Sources.
    #[command(flatten)]
    pub sources: SourceArgs,
    /// Sampling interval: 1s, 500ms, 0.1s, 2m.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Print one snapshot and exit.
    #[arg(long)]
    pub once: bool,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = TopFormat::Human)]
    pub format: TopFormat,
    /// Stop after this many snapshots (streaming output).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

fn say_notes(notes: &[String]) {
    let mut err = std::io::stderr().lock();
    for n in notes {
        let _ = writeln!(err, "hbm-doctor: {n}");
    }
}

/// The snapshot as the renderer's table.
fn table(s: &Snapshot) -> TopTable {
    TopTable {
        host: s.host.clone(),
        time: rfc3339(s.ts),
        devices: s
            .devices
            .iter()
            .map(|d| {
                let x = &d.sample;
                TopDevice {
                    id: x.id.clone(),
                    source: x.source.as_str().to_string(),
                    kind: x.kind.clone(),
                    used_bytes: x.used_bytes,
                    limit_bytes: x.limit_bytes,
                    peak_bytes: x.peak_bytes,
                    pid: x.pid,
                }
            })
            .collect(),
        process: s.process.as_ref().map(|p| TopProcess {
            pid: p.pid,
            comm: p.comm.clone(),
            rss_bytes: p.rss_bytes,
            alive: p.alive,
        }),
        events: s
            .events
            .iter()
            .map(|e| match e {
                Event::SourceUp { source } => TopEvent::SourceUp {
                    source: source.clone(),
                },
                Event::SourceDown { source, reason } => TopEvent::SourceDown {
                    source: source.clone(),
                    reason: reason.clone(),
                },
                Event::ProcessExit {
                    pid,
                    host_oom_killed,
                    ..
                } => TopEvent::ProcessExit {
                    pid: *pid,
                    host_oom_killed: *host_oom_killed,
                },
                Event::KernelOom { line, .. } => TopEvent::KernelOom { line: line.clone() },
                Event::RecordsLost { count, reason } => TopEvent::RecordsLost {
                    count: *count,
                    reason: reason.clone(),
                },
            })
            .collect(),
    }
}

/// Runs `top`.
pub fn run(args: &TopArgs, global: &GlobalArgs) -> Result<u8> {
    let mut monitor = args.sources.monitor()?;
    let once = args.once || args.format == TopFormat::Json;
    let tui = !once
        && args.format == TopFormat::Human
        && std::io::stdout().is_terminal()
        && args.count.is_none();
    if tui {
        hbm_doctor_monitor::tui::run(monitor, args.interval)?;
        return Ok(exit::OK);
    }
    say_notes(&monitor.notes);
    let style = Style::new(global.color.resolve_stdout());
    if once {
        let s = monitor.sample();
        if s.devices.is_empty() {
            say_notes(
                &monitor
                    .absent_summary()
                    .into_iter()
                    .filter(|n| !monitor.notes.contains(n))
                    .collect::<Vec<_>>(),
            );
            say_notes(&["no devices found".to_string()]);
        }
        let mut out = std::io::stdout().lock();
        match args.format {
            TopFormat::Human => {
                out.write_all(render_top(&table(&s), style, fmt_bytes).as_bytes())?
            }
            TopFormat::Json => {
                writeln!(out, "{}", serde_json::to_string_pretty(&snapshot_json(&s))?)?
            }
            TopFormat::JsonLines => {
                writeln!(out, "{}", serde_json::to_string(&snapshot_json(&s))?)?
            }
        }
        return Ok(exit::OK);
    }
    let stop = hbm_doctor_monitor::tui::stop_flag()?;
    let mut n = 0u64;
    let mut warned_empty = false;
    loop {
        let start = Instant::now();
        let s = monitor.sample();
        if s.devices.is_empty() && !warned_empty {
            warned_empty = true;
            say_notes(
                &monitor
                    .absent_summary()
                    .into_iter()
                    .filter(|n| !monitor.notes.contains(n))
                    .collect::<Vec<_>>(),
            );
        }
        {
            let mut out = std::io::stdout().lock();
            match args.format {
                TopFormat::JsonLines => {
                    writeln!(out, "{}", serde_json::to_string(&snapshot_json(&s))?)?
                }
                _ => out.write_all(render_top_lines(&table(&s), style, fmt_bytes).as_bytes())?,
            }
            out.flush()?;
        }
        n += 1;
        if args.count.is_some_and(|c| n >= c) || stop.load(Ordering::Relaxed) {
            return Ok(exit::OK);
        }
        if args.sources.pid.is_some() && monitor.process_exited() {
            return Ok(exit::OK);
        }
        let mut left = args.interval.saturating_sub(start.elapsed());
        while !left.is_zero() {
            if stop.load(Ordering::Relaxed) {
                return Ok(exit::OK);
            }
            let step = left.min(Duration::from_millis(50));
            std::thread::sleep(step);
            left -= step;
        }
    }
}

/// Fails with a usage error when no source is configured at all.
pub fn require_sources(monitor: &Monitor) -> Result<()> {
    if monitor.source_names().is_empty() {
        bail!("no source to read: drop --no-libtpu/--no-nvml, or pass --samples FILE or --metrics-file FILE");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_interval;
    use std::time::Duration;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("0.1s"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("fast").is_err());
    }
}
