//! Whole-dump inputs that once crashed the `analyze_dump` fuzz target (tests/corpus/fuzz/dump-*)
//! are analyzed without panic, exactly as the target does: the HLO text, buffer assignment, live
//! ranges and memory-usage report cut from the input at `\0` bytes, analyzed as one module against
//! a 16 GiB budget, then the `bf16` what-if.

use hbm_doctor_analysis::analyze::{analyze, AnalyzeOptions, ModuleInput};
use hbm_doctor_hlo::{buffer_assignment, hlo, live_range, usage_report};

#[test]
fn dump_fuzz_regressions_analyze_without_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/fuzz");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz corpus") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if !name.starts_with("dump-") {
            continue;
        }
        let data = std::fs::read(&path).expect("read");
        let Ok(text) = std::str::from_utf8(&data) else {
            continue;
        };
        let mut parts = text.splitn(4, '\0');
        let (h, b, l, r) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let m = hlo::parse_module(h).0;
        let ba = buffer_assignment::parse_buffer_assignment(b).0;
        let lr = live_range::parse_live_range(l).0;
        let rep = usage_report::parse_usage_report(r).0;
        let input = ModuleInput {
            name: name.clone(),
            hlo: Some(&m),
            buffer_assignment: Some(&ba),
            live_range: Some(&lr),
            usage_report: Some(&rep),
            notes: Vec::new(),
        };
        let report = analyze(
            &[input],
            &AnalyzeOptions {
                budget_bytes: Some(16 << 30),
                target: None,
            },
        );
        let _ = hbm_doctor_analysis::whatif::named(&report, "bf16");
        n += 1;
    }
    assert!(n >= 3, "the dump-* regressions are in tests/corpus/fuzz");
}
