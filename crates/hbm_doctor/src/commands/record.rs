//! `hbm-doctor record -o FILE`: a sidecar that appends samples to a crash-safe JSON-lines file.
//!
//! Each sampling round goes to the file in one write of complete lines; a `kill -9` of the
//! recorder or of the trainer loses nothing already written, and a torn last line is skipped on
//! read-back (docs/recording.md). Files rotate by size (`FILE.1` newest, up to `--keep`).

use crate::cli::GlobalArgs;
use crate::cli::SourceArgs;
use crate::commands::top::{parse_interval, require_sources};
use crate::exit;
use anyhow::{Context, Result};
use clap::Args;
use hbm_doctor_monitor::json::records;
use hbm_doctor_monitor::recording::{RecordingWriter, WriterOptions};
use hbm_doctor_monitor::sample::Event;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// `hbm-doctor record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Sources.
    #[command(flatten)]
    pub sources: SourceArgs,
    /// The recording to append to (created if absent).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: PathBuf,
    /// Sampling interval: 1s, 500ms, 0.1s, 2m.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Rotate when the file reaches this size (e.g. 256MiB, 1G; 0 never rotates).
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub max_size: u64,
    /// Rotated files to keep (FILE.1 … FILE.N).
    #[arg(long, default_value_t = 20)]
    pub keep: usize,
    /// Stop after this long (e.g. 10m, 48h).
    #[arg(long, value_parser = parse_interval)]
    pub duration: Option<Duration>,
    /// Stop after this many sampling rounds.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    hbm_doctor_log::parse_size(s)
        .ok_or_else(|| format!("`{s}` is not a size: write e.g. 256MiB or 1G"))
}

/// Runs `record`.
pub fn run(args: &RecordArgs, _global: &GlobalArgs) -> Result<u8> {
    let mut monitor = args.sources.monitor()?;
    require_sources(&monitor)?;
    // A restarted recorder resumes after the last sample it wrote, instead of replaying the
    // hook file's tail into the recording again.
    if let Ok(back) = hbm_doctor_monitor::recording::read(&args.output) {
        let mut last: std::collections::HashMap<String, f64> = Default::default();
        for d in back.samples() {
            if let Some(t) = d.ts {
                let e = last.entry(d.id.clone()).or_insert(t);
                *e = e.max(t);
            }
        }
        monitor.resume_after(&last);
    }
    let opts = WriterOptions {
        max_bytes: args.max_size,
        keep: args.keep,
        interval_seconds: Some(args.interval.as_secs_f64()),
        pid: args.sources.pid,
        sources: monitor.source_names(),
        host: monitor.host().to_string(),
        ..WriterOptions::default()
    };
    let mut writer = RecordingWriter::create(&args.output, opts)
        .with_context(|| format!("cannot write recording `{}`", args.output.display()))?;
    let stop = hbm_doctor_monitor::tui::stop_flag()?;
    let mut err = std::io::stderr().lock();
    for n in &monitor.notes {
        writeln!(err, "hbm-doctor: {n}")?;
    }
    writeln!(
        err,
        "hbm-doctor: recording to {} every {:?} (Ctrl-C to stop)",
        args.output.display(),
        args.interval
    )?;
    drop(err);
    let started = Instant::now();
    let (mut rounds, mut samples) = (0u64, 0u64);
    let mut warned_empty = false;
    let mut failing_since: Option<Instant> = None;
    let mut exit_note = None;
    loop {
        let tick = Instant::now();
        let snap = monitor.sample();
        samples += snap.new_samples.len() as u64;
        if snap.devices.is_empty() && !warned_empty {
            warned_empty = true;
            for n in monitor.absent_summary() {
                eprintln!("hbm-doctor: {n} (still trying)");
            }
        }
        for e in &snap.events {
            if let Event::ProcessExit {
                pid,
                host_oom_killed,
                ..
            } = e
            {
                exit_note = Some(if *host_oom_killed {
                    format!("process {pid} was killed by the kernel OOM killer: host RAM ran out, not HBM")
                } else {
                    format!("process {pid} exited")
                });
            }
        }
        writer
            .write(&records(&snap))
            .with_context(|| format!("cannot write recording `{}`", writer.path().display()))?;
        // A full disk does not stop the recorder: it holds rounds in memory and retries.
        match (&writer.failing, failing_since.is_some()) {
            (Some(e), false) => {
                failing_since = Some(Instant::now());
                eprintln!(
                    "hbm-doctor: cannot write `{}` ({e}): keeping samples in memory (up to 16 MiB) and retrying every round",
                    writer.path().display()
                );
            }
            (None, true) => {
                failing_since = None;
                eprintln!(
                    "hbm-doctor: writing `{}` again; {} record(s) lost so far (counted in the recording)",
                    writer.path().display(),
                    writer.lost_total
                );
            }
            _ => {}
        }
        rounds += 1;
        let done = stop.load(Ordering::Relaxed)
            || args.count.is_some_and(|c| rounds >= c)
            || args.duration.is_some_and(|d| started.elapsed() >= d)
            || exit_note.is_some();
        if done {
            break;
        }
        let mut left = args.interval.saturating_sub(tick.elapsed());
        while !left.is_zero() && !stop.load(Ordering::Relaxed) {
            let step = left.min(Duration::from_millis(50));
            std::thread::sleep(step);
            left -= step;
        }
    }
    if writer.failing.is_some() {
        // One last try before giving up on what is held.
        writer.write(&[])?;
    }
    if let Some(e) = &writer.failing {
        eprintln!(
            "hbm-doctor: could not write `{}` ({e}): {} record(s) held in memory are lost, {} lost before",
            writer.path().display(),
            writer.held_lines(),
            writer.lost_total
        );
    } else {
        writer.sync()?;
    }
    if let Some(n) = exit_note {
        eprintln!("hbm-doctor: {n}");
    }
    eprintln!("Wrote {} ({samples} samples in {rounds} rounds). Read it back with any JSON-lines reader; format: docs/recording.md", args.output.display());
    Ok(exit::OK)
}
