//! `hbm-doctor trend FILE...`: leak / spike / step / sawtooth verdicts per device with OOM
//! forecasts (crate `hbm_doctor_trend`), and the live detector hook for `top`/`record`/`exporter`.

use crate::cli::{GlobalArgs, OutputFormat};
use crate::exit;
use anyhow::{bail, Context, Result};
use clap::Args;
use hbm_doctor_log::format_size;
use hbm_doctor_monitor::sample::DeviceKey;
use hbm_doctor_monitor::trend::{TrendHook, TrendView};
use hbm_doctor_trend::detect::Params;
use hbm_doctor_trend::live::Live;
use hbm_doctor_trend::reader::{Collected, Reader};
use hbm_doctor_trend::report::{report, TrendReport};
use std::io::{Read, Write};
use std::path::PathBuf;

/// `hbm-doctor trend`.
#[derive(Debug, Args)]
pub struct TrendArgs {
    /// Recordings, CSV, TensorBoard exports, XLA_METRICS_FILE outputs or training logs (`.gz`
    /// too; `-` is standard input). Several files: one per host of a multi-host job, or the
    /// rotated parts of one recording, oldest first.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = OutputFormat::Human)]
    pub format: OutputFormat,
}

/// Reads every input into one collection.
pub fn collect(files: &[PathBuf]) -> Result<Collected> {
    let mut c = Collected::default();
    let many = files.len() > 1;
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        let (mut rd, name) = crate::input::open(Some(f.as_path()))?;
        let stem = f
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        let host_default = if many {
            stem.split('.').next().unwrap_or("").to_string()
        } else {
            String::new()
        };
        let mut r = Reader::new(&host_default, &stem);
        loop {
            let n = rd
                .read(&mut buf)
                .with_context(|| format!("cannot read `{name}`"))?;
            if n == 0 {
                break;
            }
            r.feed(&mut c, &buf[..n]);
        }
        r.finish(&mut c);
    }
    if let Some(e) = c.errors.first() {
        bail!("{e}: nothing to judge; check how the series is written");
    }
    if c.devices.is_empty()
        && c.hosts
            .values()
            .all(|h| h.counters.is_empty() && h.rss.current().is_none())
    {
        bail!("no memory series found in the input: pass an hbm-doctor recording, a CSV with step/time and bytes_in_use columns, an XLA_METRICS_FILE, or a log with memory figures (docs/trend.md lists the patterns)");
    }
    Ok(c)
}

/// Runs `trend`.
pub fn run(args: &TrendArgs, _global: &GlobalArgs) -> Result<u8> {
    let c = collect(&args.files)?;
    let rep = report(&c, &Params::default());
    let mut out = std::io::stdout().lock();
    match args.format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&rep)?)?,
        OutputFormat::Human | OutputFormat::Markdown => write_human(&mut out, &rep)?,
    }
    Ok(if rep.any_leak() {
        exit::FOUND
    } else {
        exit::OK
    })
}

fn sz(v: i64) -> String {
    if v < 0 {
        format!("-{}", format_size(v.unsigned_abs()))
    } else {
        format_size(v as u64)
    }
}

fn write_human(out: &mut impl Write, rep: &TrendReport) -> Result<()> {
    for s in &rep.series {
        let name = if s.host.is_empty() {
            format!("device {}", s.device)
        } else {
            format!("{} device {}", s.host, s.device)
        };
        let steps = match (s.first_step, s.last_step) {
            (Some(a), Some(b)) => format!(", steps {a}-{b}"),
            _ => String::new(),
        };
        writeln!(
            out,
            "{name}: {} ({} samples{steps})",
            s.verdict.to_uppercase(),
            s.samples
        )?;
        if let Some(r) = &s.reason {
            writeln!(out, "  {r}")?;
        }
        if s.verdict != "insufficient_data" {
            let mut g = Vec::new();
            if let Some(v) = s.growth_bytes_per_1k_steps {
                let ci = s
                    .growth_ci_bytes_per_1k_steps
                    .map_or(String::new(), |[l, h]| format!(" [{} .. {}]", sz(l), sz(h)));
                g.push(format!("{}/1k steps{ci}", sz(v)));
            }
            if let Some(v) = s.growth_bytes_per_hour {
                g.push(format!("{}/hour", sz(v)));
            }
            if let Some(v) = s.growth_bytes_per_1k_samples {
                g.push(format!("{}/1k samples", sz(v)));
            }
            writeln!(
                out,
                "  floor {}  ceiling {}{}  growth {}",
                format_size(s.floor_bytes.unwrap_or(0)),
                format_size(s.ceiling_bytes.unwrap_or(0)),
                s.limit_bytes
                    .map_or(String::new(), |l| format!(" of {}", format_size(l))),
                if g.is_empty() {
                    "-".into()
                } else {
                    g.join(", ")
                }
            )?;
        }
        if s.verdict == "leak" {
            match (s.oom_step_forecast, &s.oom_time_forecast) {
                (Some(st), Some(t)) => writeln!(
                    out,
                    "  OOM forecast: step {st} ({t}); cautious: step {}",
                    s.oom_step_forecast_early
                        .map_or("-".into(), |v| v.to_string())
                )?,
                (Some(st), None) => writeln!(out, "  OOM forecast: step {st}")?,
                (None, Some(t)) => writeln!(out, "  OOM forecast: {t}")?,
                _ if s.limit_bytes.is_none() => {
                    writeln!(out, "  no limit in the input: no OOM forecast")?
                }
                _ => {}
            }
        }
        if let Some(sc) = &s.step_change {
            writeln!(
                out,
                "  level change {} at step {}{}",
                sz(sc.delta_bytes),
                sc.step.map_or("?".into(), |v| v.to_string()),
                sc.near.map_or(String::new(), |n| format!(" near {n}"))
            )?;
        }
        for sp in s.spikes.iter().take(10) {
            writeln!(
                out,
                "  spike at step {}: {} (+{}){}",
                sp.step.map_or("?".into(), |v| v.to_string()),
                format_size(sp.bytes),
                format_size(sp.above_bytes),
                sp.near.map_or(String::new(), |n| format!(" near {n}"))
            )?;
        }
        if s.restarts > 0 {
            writeln!(
                out,
                "  {} restart(s): figures describe the last process",
                s.restarts
            )?;
        }
        let mut fixed = Vec::new();
        if s.invalid_samples > 0 {
            fixed.push(format!(
                "{} bad value(s) skipped (NaN, infinite, negative or beyond any device)",
                s.invalid_samples
            ));
        }
        if s.reordered_samples > 0 {
            fixed.push(format!(
                "{} row(s) out of order put back in place",
                s.reordered_samples
            ));
        }
        if s.duplicate_samples > 0 {
            fixed.push(format!("{} duplicate row(s) merged", s.duplicate_samples));
        }
        if !fixed.is_empty() {
            writeln!(out, "  {}", fixed.join("; "))?;
        }
        for c in &s.causes {
            writeln!(out, "  cause {}: {}", c.cause.as_str(), c.evidence)?;
            for a in &c.actions {
                writeln!(out, "    - {a}")?;
            }
        }
    }
    if !rep.diverging.is_empty() {
        let d: Vec<String> = rep
            .diverging
            .iter()
            .map(|d| format!("{}:{}", d.host, d.device))
            .collect();
        writeln!(
            out,
            "diverging: {} grow(s) differently from the others",
            d.join(", ")
        )?;
    }
    for h in &rep.hosts {
        if h.causes.is_empty() && h.ending == "unknown" {
            continue;
        }
        let name = if h.host.is_empty() {
            "run".to_string()
        } else {
            format!("host {}", h.host)
        };
        writeln!(
            out,
            "{name}: ending {}{}",
            h.ending,
            if h.hbm_at_limit.is_empty() {
                String::new()
            } else {
                format!(", HBM at the limit on {}", h.hbm_at_limit.join(", "))
            }
        )?;
        for c in &h.causes {
            writeln!(out, "  cause {}: {}", c.cause.as_str(), c.evidence)?;
            for a in &c.actions {
                writeln!(out, "    - {a}")?;
            }
        }
    }
    writeln!(out, "next debug switches (cheapest first):")?;
    for s in &rep.next_switches {
        writeln!(out, "  - {}: {} (cost: {})", s.switch, s.why, s.cost)?;
    }
    Ok(())
}

/// The live detector as the monitor's [`TrendHook`].
#[derive(Debug, Default)]
pub struct LiveTrend {
    live: std::sync::Mutex<Live<DeviceKey>>,
}

impl TrendHook for LiveTrend {
    fn observe(
        &mut self,
        key: &DeviceKey,
        ts: f64,
        used: u64,
        limit: Option<u64>,
        step: Option<u64>,
    ) {
        if let Ok(mut l) = self.live.lock() {
            l.observe(key, ts, used, limit, step);
        }
    }

    fn view(&self, key: &DeviceKey) -> Option<TrendView> {
        let mut l = self.live.lock().ok()?;
        let v = l.view(key)?;
        let mut report = v.report;
        report.device = key.id.clone();
        let warning = (v.leak_state == "leak").then(|| {
            format!(
                "leak: +{}/hour, OOM {}",
                format_size(report.growth_bytes_per_hour.unwrap_or(0).max(0) as u64),
                report
                    .oom_time_forecast
                    .clone()
                    .unwrap_or_else(|| "not forecast (no limit)".into())
            )
        });
        Some(TrendView {
            json: serde_json::to_value(&report).ok()?,
            bytes_per_second: v.bytes_per_second,
            oom_eta_seconds: v.oom_eta_seconds,
            leak_state: Some(v.leak_state),
            warning,
        })
    }
}
