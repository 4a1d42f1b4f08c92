//! Whole-dump inputs that once crashed the `analyze_dump` fuzz target (tests/corpus/fuzz/dump-*)
//! parse without panic: the HLO text, buffer assignment, live ranges and memory-usage report are
//! cut from the input at `\0` bytes, as the target does.

use hbm_doctor_hlo::{buffer_assignment, hlo, live_range, usage_report};

#[test]
fn dump_fuzz_regressions_do_not_panic() {
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
        let text = String::from_utf8_lossy(&data);
        let mut parts = text.splitn(4, '\0');
        let (h, b, l, r) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let _ = hlo::parse_module(h);
        let _ = buffer_assignment::parse_buffer_assignment(b);
        let _ = live_range::parse_live_range(l);
        let _ = usage_report::parse_usage_report(r);
        n += 1;
    }
    assert!(n >= 2, "the dump-* regressions are in tests/corpus/fuzz");
}
