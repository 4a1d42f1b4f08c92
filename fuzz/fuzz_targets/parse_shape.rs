//! Fuzz target: shape parsing and padding arithmetic never panic or overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(shape) = hbm_doctor_hlo::Shape::parse(text) {
            let _ = (shape.padded_bytes(), shape.unpadded_bytes(), shape.estimated_tpu_padded_bytes());
            let _ = (shape.aligned_dims(true), shape.aligned_dims(false), shape.without_layout());
        }
    }
});
