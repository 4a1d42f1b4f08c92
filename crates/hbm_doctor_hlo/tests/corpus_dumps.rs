//! Every parser on every real dump in tests/corpus/tpu and tests/corpus/cpu: no diagnostics, and
//! the buffer assignment's per-color totals equal the memory-usage report's `Total bytes`. One
//! test per dump, named after its case (`cargo test -p hbm_doctor_hlo --test corpus_dumps CASE`).

use hbm_doctor_hlo::buffer_assignment::parse_buffer_assignment;
use hbm_doctor_hlo::hlo::parse_module;
use hbm_doctor_hlo::live_range::parse_live_range;
use hbm_doctor_hlo::usage_report::parse_usage_report;
use libtest_mimic::{Arguments, Trial};
use std::path::{Path, PathBuf};

fn dumps() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus");
    let mut out = Vec::new();
    for backend in ["tpu", "cpu"] {
        let Ok(rd) = std::fs::read_dir(root.join(backend)) else {
            continue;
        };
        for e in rd.flatten() {
            let d = e.path().join("dump");
            if d.is_dir() {
                out.push(d);
            }
        }
    }
    out.sort();
    out
}

fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}

/// Every file of one dump parses cleanly, and its totals agree.
fn check_dump(dir: &Path) {
    for f in files(dir, "after_optimizations.txt") {
        let text = std::fs::read_to_string(&f).expect("read");
        let (m, diags) = parse_module(&text);
        assert!(diags.is_empty(), "{}: {diags:?}", f.display());
        let entry = m.entry().expect("entry");
        assert!(
            entry.is_entry && !entry.instructions.is_empty(),
            "{}",
            f.display()
        );
        assert!(m.is_scheduled, "{}", f.display());
    }
    for f in files(dir, "-buffer-assignment.txt") {
        let text = std::fs::read_to_string(&f).expect("read");
        let (ba, diags) = parse_buffer_assignment(&text);
        assert!(diags.is_empty(), "{}: {diags:?}", f.display());
        assert!(!ba.allocations.is_empty());
        let report = f
            .to_string_lossy()
            .replace("-buffer-assignment.txt", "-memory-usage-report.txt");
        if let Ok(rtext) = std::fs::read_to_string(&report) {
            let (rep, rd) = parse_usage_report(&rtext);
            assert!(rd.is_empty(), "{report}: {rd:?}");
            for (color, total) in ba.totals_by_color() {
                assert_eq!(
                    rep.total_for_color(color),
                    Some(total),
                    "{report}: color {color}"
                );
            }
        }
    }
    for f in files(dir, "-live-range.txt") {
        let text = std::fs::read_to_string(&f).expect("read");
        let (lr, diags) = parse_live_range(&text);
        assert!(diags.is_empty(), "{}: {diags:?}", f.display());
        assert!(
            lr.peak_time.is_some() && lr.stated_peak_bytes().is_some(),
            "{}",
            f.display()
        );
        assert_eq!(lr.sequence.len() as u64, lr.max, "{}", f.display());
    }
}

fn main() {
    let args = Arguments::from_args();
    let dirs = dumps();
    let found = !dirs.is_empty();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus");
    let mut trials = vec![Trial::test("corpus_has_dumps", move || {
        if found {
            Ok(())
        } else {
            Err("no corpus dumps found".into())
        }
    })];
    for dir in dirs {
        // `tpu/debug_print_v5e`: the case the dump belongs to.
        let name = dir
            .parent()
            .and_then(|p| p.strip_prefix(&root).ok())
            .map_or_else(|| dir.display().to_string(), |p| p.display().to_string());
        trials.push(Trial::test(name, move || {
            check_dump(&dir);
            Ok(())
        }));
    }
    libtest_mimic::run(&args, trials).exit();
}
