//! The in-process Python hook (`python/hbm_doctor/sampler.py`) feeding `top --samples`, with
//! devices that answer `memory_stats()` like JAX's; and an `XLA_METRICS_FILE` followed as it
//! grows. Skipped with a message when `python3` is absent.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hbm-doctor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const SCRIPT: &str = r#"
import sys
from hbm_doctor import sampler

class Dev:
    platform = "tpu"
    device_kind = "TPU v5 lite"
    def __init__(self, i): self.id = i; self.used = (2 + i) << 30
    def memory_stats(self):
        self.used += 1 << 20
        return {"bytes_in_use": self.used, "bytes_limit": 16909336576,
                "peak_bytes_in_use": self.used + (1 << 28), "largest_free_block_bytes": 1 << 30}

s = sampler.Sampler(sys.argv[1], every_steps=10, devices=[Dev(0), Dev(1)])
for step in range(100):
    s.step(step)
s.stop()
"#;

#[test]
fn hook_lines_show_in_top_and_read_back_as_a_recording() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: python3 not found");
        return;
    }
    let dir = tmp("hook");
    let file = dir.join("samples.jsonl");
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(&file)
        .env("PYTHONPATH", repo().join("python"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let back = hbm_doctor_monitor::recording::read(&file).unwrap();
    assert_eq!(back.bad_lines, 0);
    let steps: Vec<u64> = back
        .samples()
        .filter(|d| d.id == "0")
        .filter_map(|d| d.step)
        .collect();
    assert_eq!(steps, (0..100).step_by(10).collect::<Vec<_>>());

    let out = Command::new(env!("CARGO_BIN_EXE_hbm-doctor"))
        .args([
            "top",
            "--format",
            "json",
            "--no-libtpu",
            "--no-nvml",
            "--samples",
            file.to_str().unwrap(),
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
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0]["source"], "jax");
    assert_eq!(devices[0]["kind"], "TPU v5 lite");
    assert_eq!(devices[0]["used_bytes"], (2u64 << 30) + 10 * (1 << 20));
    assert_eq!(
        devices[0]["peak_bytes"],
        (2u64 << 30) + 10 * (1 << 20) + (1 << 28)
    );
    assert_eq!(devices[1]["limit_bytes"], 16_909_336_576u64);
    // The same round as people read it: the --once table and the streamed lines.
    let human = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hbm-doctor"))
            .args(["top", "--no-libtpu", "--no-nvml", "--samples"])
            .arg(&file)
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8(out.stdout).unwrap()
    };
    let table = human(&["--once"]);
    let row = table
        .lines()
        .find(|l| l.starts_with("0 "))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..2], ["0", "jax"], "{table}");
    assert!(
        row.contains("TPU v5 lite") && row.contains(" 2.01G "),
        "{table}"
    );
    let lines = human(&["--count", "1"]);
    assert!(
        lines
            .lines()
            .any(|l| l.contains(" jax dev 0 used 2.01G limit ") && l.contains(" peak 2.26G ")),
        "{lines}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn xla_metrics_file_is_followed_as_it_grows() {
    let dir = tmp("metrics");
    let file = dir.join("metrics.txt");
    let block = |step: u64, uncached: u64| {
        format!("[MetricsData; step={step}]\nMetric: CompileTime\n  TotalSamples: 3\nCounter: UncachedCompile\n  Value: {uncached}\nCounter: CreateDataHandles\n  Value: {}\nCounter: DestroyDataHandles\n  Value: 100\n", 100 + step * 3)
    };
    std::fs::write(&file, block(1, 2) + &block(2, 2)).unwrap();
    let rec = dir.join("rec.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hbm-doctor"))
        .args([
            "record",
            "-o",
            rec.to_str().unwrap(),
            "--interval",
            "100ms",
            "--no-libtpu",
            "--no-nvml",
            "--metrics-file",
            file.to_str().unwrap(),
            "--count",
            "8",
        ])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(350));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap();
    std::io::Write::write_all(&mut f, block(3, 5).as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    let back = hbm_doctor_monitor::recording::read(&rec).unwrap();
    let counters: Vec<_> = back
        .records
        .iter()
        .filter_map(|r| match r {
            hbm_doctor_monitor::recording::Record::Counters { counters, .. } => {
                Some(counters.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(counters.first().unwrap().step, Some(2));
    let last = counters.last().unwrap();
    assert_eq!(
        (last.step, last.uncached_compiles, last.live_data_handles),
        (Some(3), Some(5), Some(9))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A restarted `record --samples` resumes after the last sample it wrote: killing and restarting
/// the recorder six times leaves every hook sample in the recording once.
#[test]
fn restarted_recorder_does_not_replay_the_hook_file() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: python3 not found");
        return;
    }
    let dir = tmp("resume");
    let file = dir.join("samples.jsonl");
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(&file)
        .env("PYTHONPATH", repo().join("python"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = dir.join("rec.jsonl");
    for _ in 0..6 {
        let out = Command::new(env!("CARGO_BIN_EXE_hbm-doctor"))
            .args([
                "record",
                "--no-libtpu",
                "--no-nvml",
                "--count",
                "1",
                "--interval",
                "10ms",
            ])
            .arg("--samples")
            .arg(&file)
            .arg("-o")
            .arg(&rec)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let back = hbm_doctor_monitor::recording::read(&rec).unwrap();
    let hook = hbm_doctor_monitor::recording::read(&file).unwrap();
    assert_eq!(back.samples().count(), hook.samples().count());
    std::fs::remove_dir_all(&dir).unwrap();
}
