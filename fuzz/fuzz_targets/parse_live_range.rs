//! Fuzz target: live-range text parsing never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (lr, _) = hbm_doctor_hlo::live_range::parse_live_range(&text);
    let _ = lr.stated_peak_bytes();
});
