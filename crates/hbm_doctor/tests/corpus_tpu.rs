//! `explain LOG --dump DIR` on real TPU compiler output (tests/corpus/tpu pairs of log and dump
//! from the same compile); the logs alone are checked case by case in
//! `crates/hbm_doctor_analysis/tests/corpus_tpu.rs`.

mod support;

use support::corpus;

/// `explain LOG --dump DIR`: the dump names the buffers' source lines and its measured causes
/// lead the plan (tests/corpus/tpu pairs of log and dump from the same compile).
#[test]
fn explain_with_dump_joins_source_lines_and_measured_causes() {
    let cases = [
        ("debug_print_v5e", "debug_print"),
        ("replicated_v5e", "replicated_tensor"),
        ("padding_v5e", "padding"),
        ("remat_v6e", "no_remat"),
    ];
    for (case, cause) in cases {
        let dir = corpus("tpu").join(case);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hbm-doctor"))
            .args(["explain", "--format", "json", "--dump"])
            .arg(dir.join("dump"))
            .arg(dir.join("stderr.log"))
            .output()
            .expect("run");
        assert_eq!(
            out.status.code(),
            Some(1),
            "{case}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let d = &v["diagnosis"];
        assert!(
            d["dump_module"].as_str().is_some(),
            "{case}: no module joined"
        );
        let e = &v["events"][d["event"].as_u64().expect("event") as usize];
        assert!(
            e["allocations"]
                .as_array()
                .expect("allocations")
                .iter()
                .any(|a| a["source"].as_str().is_some_and(|s| s.contains(".py:"))),
            "{case}: no Python source line among the allocations"
        );
        let top: Vec<&str> = d["causes"]
            .as_array()
            .expect("causes")
            .iter()
            .take(2)
            .filter_map(|c| c["cause"].as_str())
            .collect();
        assert!(
            top.contains(&cause),
            "{case}: {cause} not in the top two: {top:?}"
        );
    }
}
