//! `hbm-doctor exporter`: the exposition over HTTP, flat memory over 1,000 scrapes, and a real
//! Prometheus scraping it (scripts/prometheus-e2e.sh; skipped with a message when the
//! `prometheus` binary is absent).

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Exporter {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(name: &str) -> Exporter {
    let dir = std::env::temp_dir().join(format!("hbm-doctor-exp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let samples = dir.join("samples.jsonl");
    let mut lines = String::new();
    for id in 0..8u64 {
        lines.push_str(&format!(
            "{{\"type\":\"sample\",\"host\":\"t\",\"id\":\"{id}\",\"accelerator\":\"tpu\",\"kind\":\"TPU v5 lite\",\"source\":\"jax\",\"used_bytes\":{},\"limit_bytes\":16909336576,\"peak_bytes\":null,\"pid\":1}}\n",
            (id + 1) << 30
        ));
    }
    std::fs::write(&samples, lines).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hbm-doctor"))
        .args([
            "exporter",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "100ms",
            "--no-libtpu",
            "--no-nvml",
            "--samples",
            samples.to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut port = None;
    let mut line = String::new();
    while port.is_none() {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "exporter exited before listening"
        );
        port = line
            .split("http://127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .and_then(|p| p.parse().ok());
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    Exporter {
        child,
        port: port.unwrap(),
        dir,
    }
}

fn get(port: u16, path: &str, accept: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn serves_families_in_both_formats() {
    let e = start("formats");
    let mut ready = false;
    for _ in 0..100 {
        if get(e.port, "/-/ready", "*/*").0.starts_with("HTTP/1.1 200") {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ready);
    let (head, body) = get(
        e.port,
        "/metrics",
        "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
    );
    assert!(
        head.contains("application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"));
    assert!(body.contains("# UNIT hbm_doctor_device_memory_used_bytes bytes"));
    assert!(body.contains(r#"hbm_doctor_device_memory_used_bytes{host=""#));
    assert!(
        body.contains(r#"accelerator="tpu",chip_type="v5e",device="7",source="jax"} 8589934592"#),
        "{body}"
    );
    assert!(body.contains("hbm_doctor_samples_total{"));
    assert!(body.contains("hbm_doctor_build_info{version="));
    let (head, body) = get(e.port, "/metrics", "text/plain");
    assert!(head.contains("text/plain; version=0.0.4"));
    assert!(body.contains("# TYPE hbm_doctor_samples_total counter"));
    assert!(!body.contains("# EOF"));
    assert!(get(e.port, "/nope", "*/*").0.starts_with("HTTP/1.1 404"));
}

#[test]
fn memory_stays_flat_over_1000_scrapes() {
    let e = start("flat");
    std::thread::sleep(Duration::from_millis(300));
    let pid = e.child.id();
    for _ in 0..100 {
        get(e.port, "/metrics", "application/openmetrics-text");
    }
    let before = rss_kib(pid);
    let mut bytes = 0;
    for i in 0..1000 {
        let accept = if i % 2 == 0 {
            "application/openmetrics-text"
        } else {
            "text/plain"
        };
        bytes += get(e.port, "/metrics", accept).1.len();
    }
    let after = rss_kib(pid);
    eprintln!("exporter RSS {before} KiB -> {after} KiB over 1000 scrapes ({bytes} bytes served)");
    assert!(
        after <= before + 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
}

#[test]
fn real_prometheus_scrapes_it() {
    let has_prometheus = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("prometheus").is_file()));
    if !has_prometheus {
        eprintln!("skipped: the `prometheus` binary is not installed (apt-get install -y prometheus), so scripts/prometheus-e2e.sh cannot run");
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/prometheus-e2e.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_hbm-doctor"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "prometheus-e2e.sh failed:\n{text}");
    assert!(text.contains("all checks passed"));
}

/// 20 idle clients and one that trickles a byte every 200 ms do not delay a scrape: each
/// connection has its own thread, and a request head must arrive within 2 s.
#[test]
fn idle_and_trickling_clients_do_not_block_scrapes() {
    let e = start("idle");
    // Wait until a sample is there (the exposition then has device lines).
    for _ in 0..50 {
        if get(e.port, "/-/ready", "text/plain").0.contains("200") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let idle: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(("127.0.0.1", e.port)).unwrap())
        .collect();
    let port = e.port;
    let trickle = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        for b in b"GET /metrics HTTP/1.1\r\n" {
            if s.write_all(&[*b]).is_err() {
                break; // cut off by the header deadline
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    for _ in 0..3 {
        // `get` gives up after 5 s; a blocked server (one connection at a time) fails here.
        let (head, body) = get(e.port, "/metrics", "text/plain");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(body.contains("hbm_doctor_device_memory_used_bytes"));
    }
    drop(idle);
    trickle.join().unwrap();
}

#[test]
fn listen_takes_a_host_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_hbm-doctor"))
        .args([
            "exporter",
            "--listen",
            "no-such-host.invalid:9842",
            "--no-libtpu",
            "--no-nvml",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("localhost:9842"), "{err}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hbm-doctor"))
        .args([
            "exporter",
            "--listen",
            "localhost:0",
            "--no-libtpu",
            "--no-nvml",
            "--samples",
            "/nonexistent/samples.jsonl",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let mut line = String::new();
    while err.read_line(&mut line).unwrap_or(0) > 0 {
        seen.push_str(&line);
        if line.contains("listening on http://") {
            break;
        }
        line.clear();
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.contains("listening on http://127.0.0.1:")
            || seen.contains("listening on http://[::1]:"),
        "{seen}"
    );
}
