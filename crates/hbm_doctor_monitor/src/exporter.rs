//! Prometheus / OpenMetrics exposition of snapshots, and a minimal HTTP server for `/metrics`.
//!
//! Families (contract.md "Exporter metric families"), labels `host`, `accelerator`, `chip_type`,
//! `device`, `source`:
//! `hbm_doctor_device_memory_{used,limit,peak,floor,ceiling}_bytes` (gauges; `peak` only when the
//! source reports one, `floor`/`ceiling` = min/max of used over the last 5 minutes),
//! `hbm_doctor_device_memory_trend_bytes_per_second`, `hbm_doctor_device_memory_oom_eta_seconds`
//! and `hbm_doctor_leak_state` (stateset) when the trend hook has a view (absent otherwise),
//! `hbm_doctor_process_resident_bytes{host}` (the `--pid` trainer), `hbm_doctor_samples_total` and
//! `hbm_doctor_source_errors_total{host,source}`, `hbm_doctor_up{host}` (1 when a source answered
//! on the last round), `hbm_doctor_build_info{version}`.
//!
//! The server answers `GET /metrics` (OpenMetrics 1.0 when the `Accept` header asks for it, else
//! the Prometheus 0.0.4 text format), `/-/ready` (503 until the first round), `/-/healthy`. It
//! handles one connection at a time with short timeouts, allocates per scrape only the response,
//! and closes every connection: its memory stays flat however often it is scraped.

use crate::monitor::Snapshot;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `application/openmetrics-text` content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Prometheus text format content type.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{k}=\"{}\"", escape(v));
    }
    s.push('}');
    s
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

struct Family {
    name: &'static str,
    kind: &'static str,
    unit: Option<&'static str>,
    help: &'static str,
    samples: Vec<(String, String)>,
}

impl Family {
    fn new(
        name: &'static str,
        kind: &'static str,
        unit: Option<&'static str>,
        help: &'static str,
    ) -> Self {
        Family {
            name,
            kind,
            unit,
            help,
            samples: Vec::new(),
        }
    }
    fn add(&mut self, labels: String, v: f64) {
        self.samples.push((labels, number(v)));
    }
    fn render(&self, out: &mut String, om: bool) {
        if self.samples.is_empty() {
            return;
        }
        // OpenMetrics names counter/info families without their suffix; 0.0.4 has no info or
        // stateset types.
        let (family, suffix, kind) = match (self.kind, om) {
            ("counter", true) => (self.name.trim_end_matches("_total"), "_total", "counter"),
            ("counter", false) => (self.name, "", "counter"),
            ("info", true) => (self.name.trim_end_matches("_info"), "_info", "info"),
            ("info" | "stateset", false) => (self.name, "", "gauge"),
            (k, _) => (self.name, "", k),
        };
        let _ = writeln!(out, "# TYPE {family} {kind}");
        if let (Some(u), true) = (self.unit, om) {
            let _ = writeln!(out, "# UNIT {family} {u}");
        }
        let _ = writeln!(out, "# HELP {family} {}", self.help);
        for (l, v) in &self.samples {
            let _ = writeln!(out, "{family}{suffix}{l} {v}");
        }
    }
}

/// Renders a snapshot (or "nothing yet") in OpenMetrics (`om`) or Prometheus 0.0.4 text.
pub fn render(snapshot: Option<&Snapshot>, host: &str, om: bool) -> String {
    let mut used = Family::new(
        "hbm_doctor_device_memory_used_bytes",
        "gauge",
        Some("bytes"),
        "Device memory in use.",
    );
    let mut limit = Family::new(
        "hbm_doctor_device_memory_limit_bytes",
        "gauge",
        Some("bytes"),
        "Device memory capacity or allocator limit.",
    );
    let mut peak = Family::new(
        "hbm_doctor_device_memory_peak_bytes",
        "gauge",
        Some("bytes"),
        "The process's high-water mark as the source reports it.",
    );
    let mut floor = Family::new(
        "hbm_doctor_device_memory_floor_bytes",
        "gauge",
        Some("bytes"),
        "Minimum of used over the last 5 minutes.",
    );
    let mut ceiling = Family::new(
        "hbm_doctor_device_memory_ceiling_bytes",
        "gauge",
        Some("bytes"),
        "Maximum of used over the last 5 minutes.",
    );
    let mut slope = Family::new(
        "hbm_doctor_device_memory_trend_bytes_per_second",
        "gauge",
        None,
        "Growth of the floor of used memory, bytes per second.",
    );
    let mut eta = Family::new(
        "hbm_doctor_device_memory_oom_eta_seconds",
        "gauge",
        Some("seconds"),
        "Seconds until the ceiling reaches the limit at the current growth.",
    );
    let mut state = Family::new(
        "hbm_doctor_leak_state",
        "stateset",
        None,
        "Leak detector state.",
    );
    let mut rss = Family::new(
        "hbm_doctor_process_resident_bytes",
        "gauge",
        Some("bytes"),
        "Resident host memory of the watched training process.",
    );
    let mut samples = Family::new(
        "hbm_doctor_samples_total",
        "counter",
        None,
        "Device samples taken.",
    );
    let mut errors = Family::new(
        "hbm_doctor_source_errors_total",
        "counter",
        None,
        "Sampling rounds on which a source failed.",
    );
    let mut up = Family::new(
        "hbm_doctor_up",
        "gauge",
        None,
        "1 when at least one source answered on the last round.",
    );
    let mut build = Family::new(
        "hbm_doctor_build_info",
        "info",
        None,
        "hbm-doctor build information.",
    );
    build.add(labels(&[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
    let mut any_up = false;
    if let Some(s) = snapshot {
        for d in &s.devices {
            let x = &d.sample;
            let id = match &x.endpoint {
                Some(ep)
                    if s.devices.iter().any(|o| {
                        o.sample.id == x.id
                            && o.sample.source == x.source
                            && o.sample.endpoint != x.endpoint
                    }) =>
                {
                    format!("{ep}/{}", x.id)
                }
                _ => x.id.clone(),
            };
            let base = [
                ("host", s.host.as_str()),
                ("accelerator", x.accelerator.as_str()),
                ("chip_type", x.chip_type.as_deref().unwrap_or("")),
                ("device", id.as_str()),
                ("source", x.source.as_str()),
            ];
            let l = labels(&base);
            if let Some(v) = x.used_bytes {
                used.add(l.clone(), v as f64);
            }
            if let Some(v) = x.limit_bytes {
                limit.add(l.clone(), v as f64);
            }
            if let Some(v) = x.peak_bytes {
                peak.add(l.clone(), v as f64);
            }
            if let Some(v) = d.floor_bytes {
                floor.add(l.clone(), v as f64);
            }
            if let Some(v) = d.ceiling_bytes {
                ceiling.add(l.clone(), v as f64);
            }
            if let Some(t) = &d.trend {
                if let Some(v) = t.bytes_per_second {
                    slope.add(l.clone(), v);
                }
                if let Some(v) = t.oom_eta_seconds {
                    eta.add(l.clone(), v);
                }
                if let Some(cur) = t.leak_state {
                    for st in ["ok", "warming_up", "step_change", "leak_suspected", "leak"] {
                        let mut with = base.to_vec();
                        with.push(("hbm_doctor_leak_state", st));
                        state.add(labels(&with), if st == cur { 1.0 } else { 0.0 });
                    }
                }
            }
        }
        if let Some(p) = &s.process {
            if let (Some(v), true) = (p.rss_bytes, p.alive) {
                rss.add(labels(&[("host", &s.host)]), v as f64);
            }
        }
        let mut by_kind: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for st in &s.sources {
            any_up |= st.up;
            let kind = st
                .kind
                .unwrap_or_else(|| match st.name.split_whitespace().next() {
                    Some("libtpu") => "libtpu",
                    Some("nvml") => "nvml",
                    Some("metrics_file") => "metrics_file",
                    _ => "jax",
                });
            let e = by_kind.entry(kind).or_default();
            e.0 += st.samples_total;
            e.1 += st.errors_total;
        }
        for (kind, (n, err)) in by_kind {
            samples.add(labels(&[("host", &s.host), ("source", kind)]), n as f64);
            errors.add(labels(&[("host", &s.host), ("source", kind)]), err as f64);
        }
    }
    up.add(labels(&[("host", host)]), if any_up { 1.0 } else { 0.0 });
    let mut out = String::with_capacity(4096);
    for f in [
        &used, &limit, &peak, &floor, &ceiling, &slope, &eta, &state, &rss, &samples, &errors, &up,
        &build,
    ] {
        f.render(&mut out, om);
    }
    if om {
        out.push_str("# EOF\n");
    }
    out
}

/// The latest snapshot, shared between the sampling thread and the server.
pub type Shared = Arc<Mutex<Option<Snapshot>>>;

fn respond(
    stream: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &[u8],
    extra: &str,
) -> std::io::Result<()> {
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n", body.len());
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

/// Connections served at once; more are answered 503 at once.
const MAX_CONNECTIONS: usize = 64;
/// The whole request head must arrive within this (an idle or trickling client is cut off).
const HEADER_DEADLINE: Duration = Duration::from_secs(2);

fn handle(mut stream: TcpStream, shared: &Shared, host: &str) -> std::io::Result<()> {
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let deadline = std::time::Instant::now() + HEADER_DEADLINE;
    let mut buf = [0u8; 8192];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return respond(
                &mut stream,
                "408 Request Timeout",
                "text/plain",
                b"request head not received in time\n",
                "",
            );
        }
        stream.set_read_timeout(Some(left))?;
        if len == buf.len() {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request too large\n",
                "",
            );
        }
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(());
        }
        len += n;
    }
    let req = String::from_utf8_lossy(&buf[..len]);
    let mut first = req.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or("/"));
    let path = path.split('?').next().unwrap_or(path);
    let accept_om = req.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("accept:") && l.contains("application/openmetrics-text")
    });
    if method != "GET" && method != "HEAD" {
        return respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            b"only GET\n",
            "Allow: GET\r\n",
        );
    }
    match path {
        "/metrics" => {
            let body = {
                let guard = shared.lock().unwrap_or_else(|e| e.into_inner());
                render(guard.as_ref(), host, accept_om)
            };
            respond(&mut stream, "200 OK", if accept_om { OPENMETRICS } else { PROMETHEUS_TEXT }, body.as_bytes(), "")
        }
        "/-/ready" => {
            let ready = shared.lock().unwrap_or_else(|e| e.into_inner()).is_some();
            if ready {
                respond(&mut stream, "200 OK", "text/plain", b"ready\n", "")
            } else {
                respond(&mut stream, "503 Service Unavailable", "text/plain", b"no sample yet\n", "Retry-After: 1\r\n")
            }
        }
        "/-/healthy" => respond(&mut stream, "200 OK", "text/plain", b"ok\n", ""),
        "/" => respond(&mut stream, "200 OK", "text/html; charset=utf-8", b"<html><body><h1>hbm-doctor exporter</h1><p><a href=\"/metrics\">/metrics</a></p></body></html>\n", ""),
        _ => respond(&mut stream, "404 Not Found", "text/plain", b"not found: try /metrics\n", ""),
    }
}

/// Serves until the listener fails: each connection on its own thread (at most
/// `MAX_CONNECTIONS` at once), so an idle or slow client never delays a scrape.
pub fn serve(listener: TcpListener, shared: Shared, host: String) -> std::io::Result<()> {
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let host = Arc::new(host);
    for stream in listener.incoming() {
        match stream {
            Ok(mut s) => {
                use std::sync::atomic::Ordering::SeqCst;
                if active.load(SeqCst) >= MAX_CONNECTIONS {
                    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = respond(
                        &mut s,
                        "503 Service Unavailable",
                        "text/plain",
                        b"too many connections\n",
                        "Retry-After: 1\r\n",
                    );
                    continue;
                }
                active.fetch_add(1, SeqCst);
                let (shared, host, done) =
                    (Arc::clone(&shared), Arc::clone(&host), Arc::clone(&active));
                let spawned = std::thread::Builder::new()
                    .name("exporter-connection".into())
                    .spawn(move || {
                        let _ = handle(s, &shared, &host);
                        done.fetch_sub(1, SeqCst);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, SeqCst);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::{DeviceView, SourceStatus};
    use crate::sample::{DeviceSample, SourceKind};

    fn snap() -> Snapshot {
        let mut d = DeviceSample::new("0", "tpu", SourceKind::Libtpu);
        d.used_bytes = Some(9_663_676_416);
        d.limit_bytes = Some(16_909_336_576);
        d.chip_type = Some("v5e".into());
        Snapshot {
            ts: 0.0,
            host: "vm-\"0\"".into(),
            devices: vec![DeviceView {
                sample: d,
                max_seen_bytes: None,
                floor_bytes: Some(1),
                ceiling_bytes: Some(2),
                last_ts: 0.0,
                trend: None,
            }],
            new_samples: vec![],
            process: None,
            counters: vec![],
            events: vec![],
            sources: vec![SourceStatus {
                name: "libtpu 127.0.0.1:8431".into(),
                up: true,
                message: None,
                samples_total: 3,
                errors_total: 0,
                kind: Some("libtpu"),
            }],
        }
    }

    #[test]
    fn openmetrics_text() {
        let t = render(Some(&snap()), "h", true);
        assert!(t.contains("# TYPE hbm_doctor_device_memory_used_bytes gauge\n# UNIT hbm_doctor_device_memory_used_bytes bytes\n"));
        assert!(t.contains(r#"hbm_doctor_device_memory_used_bytes{host="vm-\"0\"",accelerator="tpu",chip_type="v5e",device="0",source="libtpu"} 9663676416"#), "{t}");
        assert!(t.contains("# TYPE hbm_doctor_samples counter\n"));
        assert!(t.contains(r#"hbm_doctor_samples_total{host="vm-\"0\"",source="libtpu"} 3"#));
        assert!(t.contains("# TYPE hbm_doctor_build info\n"));
        assert!(t.ends_with("# EOF\n"));
        assert!(!t.contains("peak_bytes{"));
    }

    #[test]
    fn prometheus_text() {
        let t = render(None, "h", false);
        assert!(t.contains("# TYPE hbm_doctor_build_info gauge\n"));
        assert!(t.contains("hbm_doctor_up{host=\"h\"} 0\n"));
        assert!(!t.contains("# EOF"));
    }
}
