//! A whole dump, mutated together: the HLO text, buffer assignment, live ranges and memory-usage
//! report are cut from one input at `\x00` bytes and analyzed as one module. Nothing may panic,
//! abort or allocate without bound (a live-range header claiming 2^32 positions once did).
#![no_main]

use hbm_doctor_analysis::analyze::{analyze, AnalyzeOptions, ModuleInput};
use hbm_doctor_hlo::{buffer_assignment, hlo, live_range, usage_report};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
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
        name: "fuzz".into(),
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
});
