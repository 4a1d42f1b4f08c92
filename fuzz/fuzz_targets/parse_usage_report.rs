//! Fuzz target: memory-usage report parsing never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (r, _) = hbm_doctor_hlo::usage_report::parse_usage_report(&text);
    let _ = r.total_for_color(0);
});
