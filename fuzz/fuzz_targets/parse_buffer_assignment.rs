//! Fuzz target: buffer-assignment parsing (and the live range appended to it) never panics, and
//! the peak computation on whatever it returns stays in bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (ba, _) = hbm_doctor_hlo::buffer_assignment::parse_buffer_assignment(&text);
    let _ = ba.totals_by_color();
    let input = hbm_doctor_analysis::analyze::ModuleInput { name: "fuzz".into(), buffer_assignment: Some(&ba), ..Default::default() };
    let _ = hbm_doctor_analysis::analyze::analyze(&[input], &Default::default());
});
