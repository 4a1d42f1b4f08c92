//! Fuzz target: HLO module text parsing never panics, and resolving sources stays in bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (m, _) = hbm_doctor_hlo::hlo::parse_module(&text);
    for c in &m.computations {
        for i in &c.instructions {
            let _ = (m.user_source(&i.metadata), i.called(), i.parameter_number());
            let _ = hbm_doctor_hlo::hlo::shape_leaves(i.shape);
            if let Some(s) = i.sharding() {
                let _ = hbm_doctor_hlo::hlo::sharding_is_replicated(s);
            }
        }
    }
});
