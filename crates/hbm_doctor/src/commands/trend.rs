//! `hbm-doctor trend FILE...`: leak / spike / step / sawtooth verdicts per device with OOM
//! forecasts (crate `hbm_doctor_trend`), and the live detector hook for `top`/`record`/`exporter`.

use crate::cli::{GlobalArgs, OutputFormat};
use crate::exit;
use anyhow::{bail, Context, Result};
use clap::Args;
use hbm_doctor_log::format_size;
use hbm_doctor_monitor::sample::DeviceKey;
use hbm_doctor_monitor::trend::{TrendHook, TrendView};
use hbm_doctor_render::render_trend;
use hbm_doctor_trend::detect::Params;
use hbm_doctor_trend::live::Live;
use hbm_doctor_trend::reader::{Collected, Reader};
use hbm_doctor_trend::report::report;
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
pub fn run(args: &TrendArgs, global: &GlobalArgs) -> Result<u8> {
    let c = collect(&args.files)?;
    let rep = report(&c, &Params::default());
    let text = render_trend(&rep, args.format.render(), global.style(args.format));
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(if rep.any_leak() {
        exit::FOUND
    } else {
        exit::OK
    })
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
