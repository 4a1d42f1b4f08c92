//! Real TPU compiler output (tests/corpus/tpu, made by tests/corpus/tpu/generate.py with jax[tpu]
//! compiling deviceless): every OOM is found in libtpu's stderr log and in the Python exception,
//! its figures equal what the compiler printed, the diagnosis follows the guide, and programs that
//! fit produce no OOM event.

mod support;

use support::corpus;

use hbm_doctor_analysis::{explain, Category};
use hbm_doctor_log::{parse_size, scan_all, Event};
use std::path::{Path, PathBuf};

fn meta(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).expect("meta.json"))
        .expect("meta parses")
}

fn close(want: &str, got: Option<u64>) -> bool {
    match (parse_size(want), got) {
        (Some(w), Some(g)) => {
            let (lo, hi) = (w.min(g) as f64, w.max(g) as f64);
            hi - lo <= hi * 0.006 + 1.0
        }
        _ => false,
    }
}

/// The categories the guide's decision tree may conclude for a case: meta.json "label"
/// (written by generate.py: `category`, `category_also`). `None` for a program that fits.
struct Expectation {
    categories: Vec<Category>,
}

fn expectation(case: &str, meta: &serde_json::Value) -> Option<Expectation> {
    let label = &meta["label"];
    let category = label["category"]
        .as_str()
        .unwrap_or_else(|| panic!("{case}: meta.json has no label (generate.py --relabel)"));
    if category == "none" {
        return None;
    }
    let parse_category = |v: &serde_json::Value| -> Category {
        serde_json::from_value(v.clone())
            .unwrap_or_else(|e| panic!("{case}: label category {v}: {e}"))
    };
    let mut categories = vec![parse_category(&label["category"])];
    if let Some(also) = label["category_also"].as_array() {
        categories.extend(also.iter().map(parse_category));
    }
    Some(Expectation { categories })
}

fn fatal(events: &[Event]) -> Vec<&Event> {
    events.iter().filter(|e| e.fatal).collect()
}

#[test]
fn tpu_compiler_output_is_read_and_diagnosed() {
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus("tpu"))
        .expect("corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("meta.json").is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        let case = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        let m = meta(&dir);
        if m["shows_expected"] != serde_json::Value::Bool(true) {
            continue;
        }
        let oom = m["expect"] == "oom";
        let figures = &m["figures"];
        // With --xla_tpu_no_crash_on_oom the exception is a later, derived error; the log has it all.
        let files: &[&str] = if case.contains("no_crash") {
            &["stderr.log"]
        } else {
            &["stderr.log", "exception.txt"]
        };
        for &file in files {
            let path = dir.join(file);
            let Ok(text) = std::fs::read(&path) else {
                continue;
            };
            let events = scan_all(&text);
            let fatal = fatal(&events);
            let mut err = |msg: String| failures.push(format!("{case}/{file}: {msg}"));
            // With --xla_tpu_no_crash_on_oom the compile "succeeds" but the OOM is still reported.
            if !oom && !case.contains("no_crash") {
                if !fatal.is_empty() {
                    err(format!(
                        "program fits, but {} OOM event(s) found: {:?}",
                        fatal.len(),
                        fatal.iter().map(|e| &e.message).collect::<Vec<_>>()
                    ));
                }
                continue;
            }
            if !oom {
                continue;
            }
            checked += 1;
            let report = explain(events.clone());
            let Some(e) = report.diagnosis.as_ref().map(|d| &report.events[d.event]) else {
                err("no OOM event found".into());
                continue;
            };
            for (key, got) in [
                ("used", e.used_bytes),
                ("limit", e.limit_bytes),
                ("exceeded_by", e.exceeded_bytes),
            ] {
                if let Some(want) = figures[key].as_str() {
                    // `exceeded` derived from two rounded figures carries both roundings.
                    let derived_ok = key == "exceeded_by"
                        && parse_size(want)
                            .zip(got)
                            .zip(e.used_bytes)
                            .is_some_and(|((w, g), u)| w.abs_diff(g) as f64 <= u as f64 * 0.006);
                    if !close(want, got) && !derived_ok {
                        err(format!("{key}: want {want}, got {got:?}"));
                    }
                }
            }
            if let (Some(size), Some(limit)) = (
                figures["allocation_size_bytes"].as_u64(),
                figures["allocation_memory_bytes"].as_u64(),
            ) {
                if !events
                    .iter()
                    .any(|x| x.requested_bytes == Some(size) && x.limit_bytes == Some(limit))
                {
                    err(format!(
                        "allocation: want {size} of {limit}, got {:?} of {:?}",
                        e.requested_bytes, e.limit_bytes
                    ));
                }
            }
            if let (Some(size), Some(limit)) = (
                figures["scoped_size"].as_str(),
                figures["scoped_limit"].as_str(),
            ) {
                if !close(size, e.requested_bytes) || !close(limit, e.limit_bytes) {
                    err(format!(
                        "scoped: want {size} of {limit}, got {:?} of {:?}",
                        e.requested_bytes, e.limit_bytes
                    ));
                }
            }
            // The full diagnosis is judged on libtpu's log, which carries the memory report.
            if file != "stderr.log" {
                continue;
            }
            let Some(d) = report.diagnosis.clone() else {
                err("no diagnosis".into());
                continue;
            };
            // The category is asserted here; the cause ranking is scored, with every other
            // labelled case, by the accuracy harness (tests/accuracy.rs, ACCURACY.md's ratchet).
            if let Some(want) = expectation(&case, &m) {
                if !want.categories.contains(&d.category) {
                    err(format!(
                        "category: want {:?}, got {:?}",
                        want.categories, d.category
                    ));
                }
            }
            let on_v5e = figures["limit"] == "15.75G";
            if on_v5e && !d.chip.as_deref().is_some_and(|c| c.contains("v5e")) {
                err(format!("chip: want v5e, got {:?}", d.chip));
            }
        }
    }
    assert!(
        checked >= 10,
        "expected at least 10 OOM fixtures, checked {checked}"
    );
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

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
