//! Fuzz target: the log scanner and the diagnosis never panic, on any bytes, fed whole or in
//! arbitrary chunks, and every event's line lies inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let lines = data.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
    let whole = hbm_doctor_log::scan_all(data);
    for e in &whole {
        assert!(e.line >= 1 && e.line <= lines, "line {} outside 1..={lines}", e.line);
    }
    // Streaming in small chunks must find the same events as one pass.
    if let Some((&split, rest)) = data.split_first() {
        let chunk = usize::from(split % 64) + 1;
        let mut scanner = hbm_doctor_log::Scanner::new();
        let mut buf: Vec<u8> = Vec::new();
        for piece in rest.chunks(chunk) {
            buf.extend_from_slice(piece);
            let consumed = scanner.scan(&buf, false);
            buf.drain(..consumed);
        }
        scanner.scan(&buf, true);
        let _ = scanner.finish();
    }
    let report = hbm_doctor_analysis::explain(whole);
    let _ = report.diagnosis.map(|d| d.causes.len());
});
