//! The generated trend test set (`tests/corpus/trend/gen`, written by
//! `cargo run --release -p hbm_doctor_trend --example trend_corpus -- tests/corpus/trend/gen 2 600 1`):
//! two files of every scenario of the simulation study (sparse and aliased series, rows
//! swapped, bad values, shuffled rows, restarts with and without a step reset, eval plateaus,
//! staircase leaks, several hosts, JAX and PyTorch/XLA logs), scored against `truth.json`.

use hbm_doctor_trend::detect::Params;
use hbm_doctor_trend::reader::Collected;
use hbm_doctor_trend::report::report;
use hbm_doctor_trend::simulate::{score, Case, Score};
use std::path::PathBuf;
use std::process::Command;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/trend/gen")
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(dir().join("truth.json")).expect("truth.json");
    serde_json::from_str(&text).expect("truth")
}

#[test]
fn generated_set_meets_the_goals() {
    let mut all = Score::default();
    let cases = cases();
    assert_eq!(cases.len(), 68);
    for mut c in cases {
        c.text = std::fs::read_to_string(dir().join(&c.file)).expect("file");
        let mut col = Collected::default();
        hbm_doctor_trend::read_all(&mut col, "", &c.file, c.text.as_bytes());
        let rep = report(&col, &Params::default());
        all.add(&score(&c, &rep));
    }
    let misses = all.misses.join("\n");
    // Verdict right on >= 95% of devices, no false alarm, every leak and spike found, the
    // diverging device named in every multi-device file.
    assert!(
        all.right * 100 >= all.devices * 95,
        "{}/{}\n{misses}",
        all.right,
        all.devices
    );
    assert_eq!(all.nonleak.1, 0, "{misses}");
    for (i, (n, found)) in all.leaks.iter().enumerate() {
        assert_eq!(n, found, "leak size {i}: {misses}");
    }
    assert_eq!(all.spikes.0, all.spikes.1, "{misses}");
    assert_eq!(all.diverging.0, all.diverging.1, "{misses}");
    let mut e = all.forecast_errors.clone();
    e.sort_by(f64::total_cmp);
    assert!(e[e.len() / 2] <= 0.15, "median forecast error {:?}", e);
}

#[test]
fn cli_on_generated_files() {
    let bin = env!("CARGO_BIN_EXE_hbm-doctor");
    for c in cases() {
        if !matches!(
            c.scenario.as_str(),
            "bad values, leak" | "shuffled/reversed, flat" | "multi-host, one device leaks"
        ) {
            continue;
        }
        let out = Command::new(bin)
            .args(["trend", "--format", "json"])
            .arg(dir().join(&c.file))
            .output()
            .expect("runs");
        let leak = c.devices.iter().any(|d| d.leak.is_some());
        assert_eq!(out.status.code(), Some(i32::from(leak)), "{}", c.file);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        for s in v["series"].as_array().expect("series") {
            assert_eq!(s["restarts"], 0, "{}: {s}", c.file);
        }
        if c.bad_values > 0 {
            assert_eq!(
                v["series"][0]["invalid_samples"], c.bad_values,
                "{}",
                c.file
            );
        }
    }
}
