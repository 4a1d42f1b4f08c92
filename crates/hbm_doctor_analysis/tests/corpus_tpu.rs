//! Real TPU compiler output (tests/corpus/tpu, made by tests/corpus/tpu/generate.py with jax[tpu]
//! compiling deviceless): every OOM is found in libtpu's stderr log and in the Python exception,
//! its figures equal what the compiler printed, the diagnosis follows the guide, and programs that
//! fit produce no OOM event. One test per case, named after its directory
//! (`cargo test -p hbm_doctor_analysis --test corpus_tpu CASE`).

use hbm_doctor_analysis::{explain, Category};
use hbm_doctor_log::{parse_size, scan_all, Event};
use libtest_mimic::{Arguments, Trial};
use std::path::{Path, PathBuf};

fn corpus_tpu() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/tpu")
}

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

/// Every check of one case: its failures, one line each.
fn check_case(dir: &Path, case: &str) -> Vec<String> {
    let mut failures: Vec<String> = Vec::new();
    let m = meta(dir);
    if m["shows_expected"] != serde_json::Value::Bool(true) {
        return failures;
    }
    let oom = m["expect"] == "oom";
    let figures = &m["figures"];
    for &file in files(case) {
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
        if let Some(want) = expectation(case, &m) {
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
    failures
}

/// The files of a case its events are read from.
fn files(case: &str) -> &'static [&'static str] {
    // With --xla_tpu_no_crash_on_oom the exception is a later, derived error; the log has it all.
    if case.contains("no_crash") {
        &["stderr.log"]
    } else {
        &["stderr.log", "exception.txt"]
    }
}

fn main() {
    let args = Arguments::from_args();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus_tpu())
        .expect("corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("meta.json").is_file())
        .collect();
    dirs.sort();
    let mut trials = Vec::new();
    let mut oom_files = 0;
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
        if m["expect"] == "oom" {
            oom_files += files(&case)
                .iter()
                .filter(|f| dir.join(f).is_file())
                .count();
        }
        trials.push(Trial::test(case.clone(), move || {
            let failures = check_case(&dir, &case);
            if failures.is_empty() {
                Ok(())
            } else {
                Err(failures.join("\n").into())
            }
        }));
    }
    trials.push(Trial::test("at_least_10_oom_fixtures", move || {
        if oom_files >= 10 {
            Ok(())
        } else {
            Err(format!("expected at least 10 OOM fixtures, found {oom_files}").into())
        }
    }));
    libtest_mimic::run(&args, trials).exit();
}
