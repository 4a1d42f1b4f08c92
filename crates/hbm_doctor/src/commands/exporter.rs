//! `hbm-doctor exporter --listen 127.0.0.1:PORT`: Prometheus/OpenMetrics on `/metrics`.
//!
//! A sampling thread polls the sources every `--interval` and keeps the latest snapshot; each
//! scrape renders it (hbm_doctor_monitor::exporter). Prometheus does the fleet distribution;
//! this serves one host, on loopback unless told otherwise.

use crate::cli::GlobalArgs;
use crate::cli::SourceArgs;
use crate::commands::top::{parse_interval, require_sources};
use crate::exit;
use anyhow::{Context, Result};
use clap::Args;
use hbm_doctor_monitor::exporter::{serve, Shared};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `hbm-doctor exporter`.
#[derive(Debug, Args)]
pub struct ExporterArgs {
    /// Sources.
    #[command(flatten)]
    pub sources: SourceArgs,
    /// Address to serve on; a port of 0 picks a free one (printed on stderr).
    #[arg(long, default_value = "127.0.0.1:9842", value_name = "ADDR:PORT", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Sampling interval: 1s, 500ms, 5s.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
}

/// `127.0.0.1:9842`, `[::1]:9842` or a host name such as `localhost:9842` (its first address).
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    s.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("`{s}` is not an address to listen on: write HOST:PORT, e.g. 127.0.0.1:9842 or localhost:9842"))
}

/// Runs `exporter`.
pub fn run(args: &ExporterArgs, _global: &GlobalArgs) -> Result<u8> {
    let mut monitor = args.sources.monitor()?;
    require_sources(&monitor)?;
    let listener = TcpListener::bind(args.listen).with_context(|| {
        format!(
            "cannot listen on {} (is another exporter running? pick another port with --listen)",
            args.listen
        )
    })?;
    let addr = listener.local_addr()?;
    for n in &monitor.notes {
        eprintln!("hbm-doctor: {n}");
    }
    if !addr.ip().is_loopback() {
        eprintln!("hbm-doctor: serving on {addr}, reachable from other machines (use --listen 127.0.0.1:PORT to keep it local)");
    }
    eprintln!("hbm-doctor: exporter listening on http://{addr}/metrics");
    let shared: Shared = Arc::new(Mutex::new(None));
    let host = monitor.host().to_string();
    let writer = Arc::clone(&shared);
    let interval = args.interval;
    std::thread::Builder::new()
        .name("sampler".into())
        .spawn(move || loop {
            let start = Instant::now();
            let snap = monitor.sample();
            *writer.lock().unwrap_or_else(|e| e.into_inner()) = Some(snap);
            std::thread::sleep(interval.saturating_sub(start.elapsed()));
        })?;
    serve(listener, shared, host).context("exporter server failed")?;
    Ok(exit::OK)
}
