//! `top` and `record` against a stand-in for libtpu: a gRPC server implementing
//! `tpu.monitoring.runtime.RuntimeMetricService` (from hbm_doctor_monitor's prost/tonic
//! definitions) on 127.0.0.1, in a child process that is SIGKILLed and restarted mid-test.
//!
//! The child is this test binary re-run with `FAKE_LIBTPU_PORT` set (see `fake_libtpu_child`).
//! Its scripted curve: device `i` uses `base + i GiB + 1 KiB per millisecond since start`, so
//! samples rise within one run and a restart (another `base`) is visible.

#![allow(clippy::unwrap_used)]

mod support;

use hbm_doctor_monitor::grpc::{RuntimeMetricService, RuntimeMetricServiceServer};
use hbm_doctor_monitor::proto::{
    names, Attr, AttrValue, Attribute, Gauge, GaugeValue, ListSupportedMetricsRequest,
    ListSupportedMetricsResponse, Measure, Metric, MetricRequest, MetricResponse, SupportedMetric,
    TpuMetric,
};
use hbm_doctor_monitor::recording::{self, Record};
use hbm_doctor_monitor::Event;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::bin;

const GIB: u64 = 1 << 30;
const LIMIT: u64 = 16_909_336_576;

struct Scripted {
    start: Instant,
    base: u64,
    devices: u32,
}

impl Scripted {
    fn gauge(&self, name: &str, id: u32) -> i64 {
        if name == names::HBM_TOTAL {
            LIMIT as i64
        } else {
            (self.base + u64::from(id) * GIB + self.start.elapsed().as_millis() as u64 * 1024)
                as i64
        }
    }
}

impl RuntimeMetricService for Scripted {
    async fn get_runtime_metric(
        &self,
        req: MetricRequest,
    ) -> Result<MetricResponse, tonic::Status> {
        if req.metric_name != names::HBM_USAGE && req.metric_name != names::HBM_TOTAL {
            return Err(tonic::Status::not_found(format!(
                "metric {} not supported",
                req.metric_name
            )));
        }
        let metrics = (0..self.devices)
            .map(|id| Metric {
                attribute: Some(Attribute {
                    key: "device-id".into(),
                    value: Some(AttrValue {
                        attr: Some(Attr::IntAttr(i64::from(id))),
                    }),
                }),
                measure: Some(Measure::Gauge(Gauge {
                    value: Some(GaugeValue::AsInt(self.gauge(&req.metric_name, id))),
                })),
                ..Default::default()
            })
            .collect();
        Ok(MetricResponse {
            metric: Some(TpuMetric {
                name: req.metric_name,
                description: String::new(),
                metrics,
            }),
        })
    }

    async fn list_supported_metrics(
        &self,
        _req: ListSupportedMetricsRequest,
    ) -> Result<ListSupportedMetricsResponse, tonic::Status> {
        Ok(ListSupportedMetricsResponse {
            supported_metric: [names::HBM_USAGE, names::HBM_TOTAL]
                .iter()
                .map(|n| SupportedMetric {
                    metric_name: n.to_string(),
                })
                .collect(),
        })
    }
}

/// Not a test of its own: the body of the fake libtpu child process.
#[test]
fn fake_libtpu_child() {
    let Ok(port) = std::env::var("FAKE_LIBTPU_PORT") else {
        return;
    };
    let base: u64 = std::env::var("FAKE_LIBTPU_BASE").unwrap().parse().unwrap();
    let devices: u32 = std::env::var("FAKE_LIBTPU_DEVICES").map_or(4, |d| d.parse().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let svc = RuntimeMetricServiceServer::new(Scripted {
            start: Instant::now(),
            base,
            devices,
        });
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve(addr)
            .await
            .unwrap();
    });
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Server(Child);

impl Server {
    fn start(port: u16, base: u64, devices: u32) -> Server {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fake_libtpu_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FAKE_LIBTPU_PORT", port.to_string())
            .env("FAKE_LIBTPU_BASE", base.to_string())
            .env("FAKE_LIBTPU_DEVICES", devices.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "fake libtpu did not start on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server(child)
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
    /// SIGKILL, like a trainer dying.
    fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hbm-doctor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn used_values(path: &Path, at_least: u64) -> Vec<u64> {
    recording::read(path)
        .map(|r| {
            r.samples()
                .filter(|d| d.id == "0")
                .filter_map(|d| d.used_bytes)
                .filter(|&u| u >= at_least)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn top_once_json_reads_the_service_and_its_owner() {
    let port = free_port();
    let server = Server::start(port, 4 * GIB, 4);
    let out = bin()
        .args([
            "top",
            "--format",
            "json",
            "--no-nvml",
            "--ports",
            &port.to_string(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert!(v["time"].as_str().unwrap().ends_with('Z'));
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 4);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["id"], i.to_string());
        assert_eq!(d["accelerator"], "tpu");
        assert_eq!(d["source"], "libtpu");
        assert_eq!(d["limit_bytes"], LIMIT);
        let used = d["used_bytes"].as_u64().unwrap();
        assert!(
            used >= 4 * GIB + i as u64 * GIB && used < 5 * GIB + i as u64 * GIB,
            "{used}"
        );
        assert!(d["peak_bytes"].is_null());
        // One sample: the live detector says it is too early to judge (or nothing yet).
        assert!(
            d["trend"].is_null() || d["trend"]["verdict"] == "insufficient_data",
            "{}",
            d["trend"]
        );
        // The owner of the listening port is found through /proc.
        assert_eq!(d["pid"], server.pid());
        for key in ["kind", "peak_bytes", "pid", "trend"] {
            assert!(d.get(key).is_some(), "missing {key}");
        }
    }
    server.kill();
}

#[test]
fn record_keeps_going_across_a_trainer_restart_and_loses_nothing() {
    let dir = tmp("restart");
    let file = dir.join("rec.jsonl");
    let port = free_port();
    let server = Server::start(port, 4 * GIB, 2);
    let mut rec = bin()
        .args([
            "record",
            "-o",
            file.to_str().unwrap(),
            "--interval",
            "100ms",
            "--no-nvml",
            "--ports",
            &port.to_string(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("first samples", 20, || used_values(&file, 0).len() >= 5);
    server.kill();
    let before_restart = std::fs::read(&file).unwrap();
    let n_before = used_values(&file, 0).len();
    std::thread::sleep(Duration::from_millis(700));
    let server = Server::start(port, 8 * GIB, 2);
    wait_until("samples after the restart", 20, || {
        used_values(&file, 8 * GIB).len() >= 5
    });
    assert!(Command::new("kill")
        .args(["-TERM", &rec.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = rec.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    server.kill();

    let after = std::fs::read(&file).unwrap();
    assert!(
        after.starts_with(&before_restart),
        "bytes written before the restart changed"
    );
    let back = recording::read(&file).unwrap();
    assert!(!back.torn_tail);
    assert_eq!(back.bad_lines, 0);
    let all = used_values(&file, 0);
    assert!(all.len() >= n_before + 5);
    // Within each run of the trainer the curve rises; the restart shows as a new base.
    let first_run: Vec<u64> = all.iter().copied().filter(|&u| u < 8 * GIB).collect();
    let second_run: Vec<u64> = all.iter().copied().filter(|&u| u >= 8 * GIB).collect();
    assert!(first_run.len() >= n_before && second_run.len() >= 5);
    assert!(first_run.windows(2).all(|w| w[1] > w[0]), "{first_run:?}");
    assert!(second_run.windows(2).all(|w| w[1] > w[0]), "{second_run:?}");
    let events: Vec<&Event> = back
        .records
        .iter()
        .filter_map(|r| {
            if let Record::Event { event, .. } = r {
                Some(event)
            } else {
                None
            }
        })
        .collect();
    let downs = events
        .iter()
        .filter(|e| matches!(e, Event::SourceDown { .. }))
        .count();
    let ups = events
        .iter()
        .filter(|e| matches!(e, Event::SourceUp { .. }))
        .count();
    assert!(downs >= 1 && ups >= 2, "{events:?}");
    assert!(matches!(back.records.first(), Some(Record::Header { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn top_json_lines_keeps_going_across_a_trainer_restart() {
    let port = free_port();
    let server = Server::start(port, 4 * GIB, 1);
    let mut top = bin()
        .args([
            "top",
            "--format",
            "json-lines",
            "--interval",
            "100ms",
            "--no-nvml",
            "--ports",
            &port.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let stdout = top.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    let used = |v: &serde_json::Value| v["devices"].get(0).and_then(|d| d["used_bytes"].as_u64());
    let mut seen = Vec::new();
    let next = |seen: &mut Vec<serde_json::Value>| {
        let v = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(v["schema_version"], 1);
        seen.push(v);
    };
    while seen.iter().filter(|v| used(v).is_some()).count() < 3 {
        next(&mut seen);
    }
    server.kill();
    while seen.last().and_then(used).is_some() {
        next(&mut seen);
    }
    let server = Server::start(port, 8 * GIB, 1);
    while seen.last().and_then(used).is_none_or(|u| u < 8 * GIB) {
        next(&mut seen);
    }
    let _ = top.kill();
    let _ = top.wait();
    server.kill();
    let values: Vec<Option<u64>> = seen.iter().map(used).collect();
    let gap = values.iter().position(Option::is_none).unwrap();
    assert!(values[..gap].iter().all(|u| u.unwrap() < 8 * GIB));
    assert!(values.last().unwrap().unwrap() >= 8 * GIB);
}

#[test]
fn recording_killed_mid_write_reads_back_every_complete_sample() {
    let dir = tmp("sigkill");
    let file = dir.join("rec.jsonl");
    let port = free_port();
    // 512 devices: each round is one write of ~130 KB, so kills land inside writes often.
    let server = Server::start(port, 4 * GIB, 512);
    let kills = 6;
    let mut prefix = Vec::new();
    for k in 0..kills {
        let mut rec = bin()
            .args([
                "record",
                "-o",
                file.to_str().unwrap(),
                "--interval",
                "1ms",
                "--no-nvml",
                "--ports",
                &port.to_string(),
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let grown = prefix.len() as u64 + 200_000 + k * 50_000;
        wait_until("samples", 30, || {
            std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) > grown
        });
        rec.kill().unwrap(); // SIGKILL
        rec.wait().unwrap();
        let now = std::fs::read(&file).unwrap();
        assert!(
            now.starts_with(&prefix),
            "a kill changed bytes already written"
        );
        prefix = now;
    }
    server.kill();
    let back = recording::read(&file).unwrap();
    // Every line that was completely written is read; at most one torn line per kill.
    assert!(
        back.bad_lines + usize::from(back.torn_tail) <= kills as usize,
        "{} bad, torn {}",
        back.bad_lines,
        back.torn_tail
    );
    let complete_lines = prefix.split(|&b| b == b'\n').count() - 1;
    assert_eq!(back.records.len() + back.bad_lines, complete_lines);
    let samples: Vec<_> = back.samples().collect();
    eprintln!(
        "{} samples read back after {kills} SIGKILLs; {} torn lines skipped",
        samples.len(),
        back.bad_lines + usize::from(back.torn_tail)
    );
    assert!(samples.len() > 1000);
    assert!(samples
        .iter()
        .all(|d| d.used_bytes.is_some() && d.limit_bytes == Some(LIMIT)));
    std::fs::remove_dir_all(&dir).unwrap();
}
