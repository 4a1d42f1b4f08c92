//! Inputs that once crashed the `parse_log` fuzz target (tests/corpus/fuzz) scan without panic,
//! whole and in small chunks.

#[test]
fn fuzz_regressions_do_not_panic() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/fuzz");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz corpus") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            continue;
        }
        let data = std::fs::read(&path).expect("read");
        let _ = hbm_doctor_log::scan_all(&data);
        let mut scanner = hbm_doctor_log::Scanner::new();
        let mut buf = Vec::new();
        for piece in data.chunks(7) {
            buf.extend_from_slice(piece);
            let consumed = scanner.scan(&buf, false);
            buf.drain(..consumed);
        }
        scanner.scan(&buf, true);
        let _ = scanner.finish();
        n += 1;
    }
    assert!(n >= 1);
}
