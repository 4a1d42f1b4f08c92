//! `hbm-doctor trend` end to end: real JAX CPU recordings, the contract CSV, multi-host
//! divergence, PyTorch/XLA metrics files, exit codes.

mod support;

use support::bin;

use std::io::Write;
use std::path::PathBuf;

fn trend_json(files: &[PathBuf]) -> (serde_json::Value, i32) {
    let out = bin()
        .arg("trend")
        .args(files)
        .args(["--format", "json"])
        .output()
        .expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    (v, out.status.code().unwrap_or(-1))
}

fn tmp(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hbm-trend-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let p = dir.join(name);
    std::fs::File::create(&p)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .expect("write");
    p
}

fn noise(i: u64) -> f64 {
    // Deterministic pseudo-noise in [-1, 1].
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let x = ((z ^ (z >> 31)) % 1000) as f64;
    x / 500.0 - 1.0
}

#[test]
fn contract_csv_multi_host_divergence() {
    let l: u64 = 16_909_336_576;
    let mut csv = String::from("step,time,host,device,bytes_in_use,bytes_limit\n");
    for s in (0..20_000u64).step_by(10) {
        for h in 0..4u64 {
            for d in 0..2u64 {
                let mut v =
                    8.0e9 + 2.0e8 * ((s % 100) as f64 / 100.0) + 2.0e7 * noise(s * 8 + h * 2 + d);
                if h == 3 && d == 1 {
                    v += 2.0e6 * s as f64 / 100.0; // 20 MB per 1k steps
                }
                let t = 1_795_255_200 + s / 2;
                csv.push_str(&format!("{s},{t},vm-{h},{d},{},{l}\n", v as u64));
            }
        }
    }
    let p = tmp("multi.csv", &csv);
    let (v, code) = trend_json(&[p]);
    assert_eq!(code, 1);
    let series = v["series"].as_array().expect("series");
    assert_eq!(series.len(), 8);
    for s in series {
        let leak = s["host"] == "vm-3" && s["device"] == "1";
        assert_eq!(s["verdict"], if leak { "leak" } else { "stable" }, "{s}");
    }
    assert_eq!(
        v["diverging"],
        serde_json::json!([{"host": "vm-3", "device": "1"}])
    );
    let leak = series
        .iter()
        .find(|s| s["verdict"] == "leak")
        .expect("leak");
    let g = leak["growth_bytes_per_1k_steps"].as_f64().expect("g");
    assert!((g - 2.0e7).abs() < 2.0e6, "{g}");
    // 2 steps per second: per hour = per 1k steps * 7.2.
    let h = leak["growth_bytes_per_hour"].as_f64().expect("h");
    assert!((h / g - 7.2).abs() < 0.1, "{h} {g}");
}

#[test]
fn spike_and_step_and_insufficient() {
    let l: u64 = 17_179_869_184;
    let mut spike = String::from("step,bytes_in_use,bytes_limit\n");
    let mut step = spike.clone();
    for s in 0..10_000u64 {
        let base = 8.0e9 + 5.0e7 * noise(s);
        let sp = if s == 6_000 { base + 3.0e9 } else { base };
        spike.push_str(&format!("{s},{},{l}\n", sp as u64));
        let st = if s >= 5_000 { base + 1.0e9 } else { base };
        step.push_str(&format!("{s},{},{l}\n", st as u64));
    }
    let (v, code) = trend_json(&[tmp("spike.csv", &spike)]);
    assert_eq!(code, 0);
    assert_eq!(v["series"][0]["verdict"], "spikes");
    assert_eq!(v["series"][0]["spikes"][0]["step"], 6000);
    let (v, _) = trend_json(&[tmp("step.csv", &step)]);
    assert_eq!(v["series"][0]["verdict"], "step");
    let at = v["series"][0]["step_change"]["step"]
        .as_u64()
        .expect("step");
    assert!((4_700..=5_300).contains(&at), "{at}");
    let (v, code) = trend_json(&[tmp("short.csv", "step,bytes_in_use\n1,100\n2,200\n")]);
    assert_eq!(code, 0);
    assert_eq!(v["series"][0]["verdict"], "insufficient_data");
}

#[test]
fn xla_metrics_file_recompilation_storm_and_handles() {
    let mut text = String::new();
    for s in 1..=400u64 {
        let uncached = if s < 20 { 3 } else { 3 + s / 40 };
        let created = 1000 + s * 50 + s * 3; // 3 handles kept per step
        let destroyed = s * 50;
        text.push_str(&format!(
            "[MetricsData; step={s}]\nMetric: CompileTime\n  TotalSamples: {uncached}\n  Accumulator: {:02}s000ms000.000us\nCounter: CachedCompile\n  Value: {s}\nCounter: UncachedCompile\n  Value: {uncached}\nCounter: CreateDataHandles\n  Value: {created}\nCounter: DestroyDataHandles\n  Value: {destroyed}\n",
            uncached * 10 % 60
        ));
    }
    let p = tmp("metrics.txt", &text);
    let out = bin()
        .args(["trend", "--format", "json"])
        .arg(&p)
        .output()
        .expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["framework"], "pytorch_xla");
    let h = &v["hosts"][0];
    assert!(
        h["compiles_after_warmup"].as_u64().is_some_and(|n| n >= 8),
        "{h}"
    );
    let causes: Vec<&str> = h["causes"]
        .as_array()
        .expect("c")
        .iter()
        .filter_map(|c| c["cause"].as_str())
        .collect();
    assert!(causes.contains(&"recompilation"), "{causes:?}");
    assert!(causes.contains(&"memory_leak"), "{causes:?}");
    let g = h["live_data_handles_per_1k_steps"].as_f64().expect("g");
    assert!((g - 3000.0).abs() < 100.0, "{g}");
}

#[test]
fn silent_death_with_host_oom() {
    let mut log = String::new();
    for s in 0..3000u64 {
        let rss = 20.0 + s as f64 * 0.01;
        log.push_str(&format!(
            "2026-11-21 10:{:02}:{:02} step {s} loss 1.0 hbm 8.{:02}GiB rss {rss:.2}G\n",
            s / 60 % 60,
            s % 60,
            (s * 7) % 5
        ));
    }
    log.push_str("[12345.678] Out of memory: Killed process 4242 (python3) total-vm:1234kB\n");
    let (v, _) = trend_json(&[tmp("train.log", &log)]);
    let h = &v["hosts"][0];
    assert_eq!(h["ending"], "host_oom");
    assert_eq!(h["causes"][0]["cause"], "host_oom");
    assert_eq!(v["series"][0]["verdict"], "stable");
}

#[test]
fn bad_input_exits_2() {
    let out = bin()
        .args(["trend"])
        .arg(tmp("empty.txt", "nothing here\n"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bad_values_are_skipped_and_counted_and_an_empty_column_exits_2() {
    let l: u64 = 17_179_869_184;
    let mut csv = String::from("step,bytes_in_use,bytes_limit\n");
    let bad = ["NaN", "inf", "-1", "1e30", ""];
    let mut n_bad = 0;
    for s in (0..8000u64).step_by(5) {
        let i = s / 5;
        if i % 7 == 3 {
            csv.push_str(&format!("{s},{},{l}\n", bad[(i as usize / 7) % bad.len()]));
            n_bad += 1;
        } else {
            // 1% of the limit per 1k steps.
            let v = 0.5 * l as f64 + 0.01 * l as f64 * s as f64 / 1000.0 + 2.0e7 * noise(s);
            csv.push_str(&format!("{s},{},{l}\n", v as u64));
        }
    }
    let (v, code) = trend_json(&[tmp("badvals.csv", &csv)]);
    assert_eq!(code, 1, "{v}");
    let s = &v["series"][0];
    assert_eq!(s["verdict"], "leak", "{s}");
    assert_eq!(s["restarts"], 0);
    assert_eq!(s["invalid_samples"], n_bad);
    let mut all_nan = String::from("step,bytes_in_use\n");
    for s in 0..500 {
        all_nan.push_str(&format!("{s},{}\n", if s % 2 == 0 { "nan" } else { "-5" }));
    }
    let out = bin()
        .args(["trend"])
        .arg(tmp("allnan.csv", &all_nan))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no valid value"));
}

/// A log of nothing but the host's RSS (a CPU program, a posted `rss 576 MB` log) is judged as
/// the series `host RSS`: five readings each higher than the one before, ending 1.6x the first,
/// make a suspected leak; a dozen readings within 1% of each other make none.
#[test]
fn host_rss_alone_is_the_series() {
    let rising = tmp(
        "rss.log",
        "iteration 0: rss 576 MB\niteration 1: rss 640 MB\niteration 2: rss 700 MB\niteration 3: rss 800 MB\niteration 4: rss 900 MB\n",
    );
    let (v, _) = trend_json(&[rising]);
    let s = &v["series"][0];
    assert_eq!(s["device"], "host RSS", "{v}");
    assert_eq!(s["samples"], 5, "{v}");
    assert_eq!(s["leak_suspected"], true, "{v}");
    // The host's own fields keep their figures.
    assert_eq!(v["hosts"][0]["host_rss_bytes"], 900u64 << 20, "{v}");
    let flat = tmp(
        "flat.log",
        "Post-unload RSS across 6 cycles: 107.1, 107.3, 107.5, 107.6, 107.7, 107.8 MB\n",
    );
    let (v, _) = trend_json(&[flat]);
    assert_eq!(v["series"][0]["samples"], 6, "{v}");
    assert_eq!(v["series"][0]["leak_suspected"], false, "{v}");
}
