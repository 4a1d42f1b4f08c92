//! `hbm-doctor trend` on series users posted in public issues (tests/corpus/trend/MANIFEST.toml
//! names each source and what a careful reader takes from it).

use std::path::PathBuf;
use std::process::Command;

fn trend(name: &str) -> (serde_json::Value, i32) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus/trend")
        .join(name);
    let out = Command::new(env!("CARGO_BIN_EXE_hbm-doctor"))
        .arg("trend")
        .arg(&p)
        .args(["--format", "json"])
        .output()
        .expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    (v, out.status.code().unwrap_or(-1))
}

fn causes(h: &serde_json::Value) -> Vec<String> {
    h["causes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["cause"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn jax_25184_rss_staircase_is_suspected_not_judged() {
    let (v, code) = trend("jax_25184_usage_kb.log");
    assert_eq!(code, 0);
    let s = &v["series"][0];
    assert_eq!(s["verdict"], "insufficient_data");
    assert_eq!(s["samples"], 62);
    assert_eq!(s["leak_suspected"], true);
    assert_eq!(s["last_bytes"], 462_352u64 * 1024);
    let r = s["reason"].as_str().expect("reason");
    assert!(r.contains("62 readings rise"), "{r}");
    // ~2 MB per reading (Sen's slope; 132 MB over 61 readings is 2.2 MB).
    assert!(r.contains("1.96M per reading"), "{r}");
}

#[test]
fn jax_5927_host_memory_rises_every_reading() {
    let (v, code) = trend("jax_5927_memory_used_gb.log");
    assert_eq!(code, 0);
    let s = &v["series"][0];
    assert_eq!(s["verdict"], "insufficient_data");
    assert_eq!(s["samples"], 10);
    assert_eq!(s["leak_suspected"], true);
    // 13.506678784 read in the file name's unit (GiB).
    let last = s["last_bytes"].as_f64().expect("last");
    assert!(
        (last - 13.506_678_784 * 1024f64.powi(3)).abs() < 2.0,
        "{last}"
    );
}

#[test]
fn numpyro_539_five_readings_are_too_few() {
    let (v, _) = trend("numpyro_539_gpu_memory_mb.log");
    let s = &v["series"][0];
    assert_eq!(s["verdict"], "insufficient_data");
    assert_eq!(s["samples"], 5);
    assert_eq!(s["leak_suspected"], false);
    assert_eq!(s["last_bytes"], (2321.94f64 * 1048576.0) as u64);
}

#[test]
fn pytorch_xla_3545_tpu_and_host_readings() {
    let (v, _) = trend("pytorch_xla_3545_blocks.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 3);
    assert_eq!(s["last_bytes"], 12_415u64 * 1_048_576);
    assert_eq!(v["hosts"][0]["host_rss_bytes"], 165_231_292_579u64);
}

#[test]
fn pytorch_xla_4863_sigkill_is_host_oom() {
    let (v, _) = trend("pytorch_xla_4863_memory_gb.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 5);
    assert_eq!(s["first_step"], 0);
    assert_eq!(s["last_step"], 1);
    let h = &v["hosts"][0];
    assert_eq!(h["ending"], "host_oom");
    assert_eq!(causes(h), ["host_oom"]);
}

#[test]
fn pytorch_xla_1368_more_compilations_than_steps() {
    let (v, code) = trend("pytorch_xla_1368_metrics.txt");
    assert_eq!(code, 0);
    assert_eq!(v["framework"], "pytorch_xla");
    let h = &v["hosts"][0];
    assert_eq!(causes(h), ["recompilation"]);
    let ev = h["causes"][0]["evidence"].as_str().expect("evidence");
    assert!(ev.starts_with("92 compilations by step 9"), "{ev}");
}

#[test]
fn pytorch_xla_3354_eleven_compilations_are_fine() {
    let (v, code) = trend("pytorch_xla_3354_metrics.txt");
    assert_eq!(code, 0);
    assert_eq!(v["framework"], "pytorch_xla");
    for h in v["hosts"].as_array().expect("hosts") {
        assert!(causes(h).is_empty(), "{h}");
    }
}
