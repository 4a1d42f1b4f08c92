//! The CLI reads a log in 8 MiB chunks on a second thread and hands the scanner what it has not
//! consumed in front of the next chunk. Whatever the chunk boundaries cut (an OOM line, a BFC
//! dump longer than the room kept in front of a chunk), the events are those of one scan of the
//! whole text, from a file and from standard input alike.

mod support;

use hbm_doctor_log::scan_all;
use std::io::Write;
use std::process::Stdio;
use support::{bin, scratch};

/// Filler lines, then a BFC dump of `dump_lines` chunk lines ending in the OOM it belongs to,
/// placed so that it straddles the first 8 MiB boundary; then more filler and a second OOM cut
/// by the second boundary.
fn log(dump_lines: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut step = 0u64;
    let filler = |s: &mut String, until: usize, step: &mut u64| {
        while s.len() < until {
            s.push_str(&format!(
                "I1126 10:00:00.000000 1 train.py:88] step {step} loss 1.{:04} lr 3e-4\n",
                *step % 9973
            ));
            *step += 1;
        }
    };
    let chunk = 8 * 1024 * 1024;
    filler(&mut s, chunk - dump_lines * 60, &mut step);
    s.push_str("W1126 10:00:01.000000 1 bfc_allocator.cc:479] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.00GiB (rounded to 2147483648)requested by op dot\n");
    for i in 0..dump_lines {
        s.push_str(&format!(
            "I1126 10:00:01.000000 1 bfc_allocator.cc:1066] InUse at 7f{i:010x} of size 1048576 next {i}\n"
        ));
    }
    s.push_str("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2147483648 bytes.\n");
    filler(&mut s, 2 * chunk - 40, &mut step);
    s.push_str("RuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4294967296 bytes.\n");
    filler(&mut s, 2 * chunk + 4096, &mut step);
    s.into_bytes()
}

fn events_json(v: &serde_json::Value) -> Vec<(u64, u64)> {
    v["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            (
                e["line"].as_u64().unwrap_or(0),
                e["requested_bytes"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[test]
fn chunk_boundaries_change_nothing() {
    let dir = scratch("chunks");
    // 2,000 dump lines fit in the room kept before a chunk; 80,000 (about 7 MiB) do not.
    for dump_lines in [2_000usize, 80_000] {
        let text = log(dump_lines);
        let want: Vec<(u64, u64)> = scan_all(&text)
            .iter()
            .map(|e| (e.line, e.requested_bytes.unwrap_or(0)))
            .collect();
        assert!(want.len() >= 2, "{want:?}");
        let path = dir.join(format!("train-{dump_lines}.log"));
        std::fs::write(&path, &text).expect("write");
        let out = bin()
            .args(["explain", "--format", "json"])
            .arg(&path)
            .output()
            .expect("runs");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(events_json(&v), want, "file, {dump_lines} dump lines");

        let mut child = bin()
            .args(["explain", "-", "--format", "json"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut stdin = child.stdin.take().expect("stdin");
        let writer = std::thread::spawn(move || stdin.write_all(&text));
        let out = child.wait_with_output().expect("output");
        writer.join().expect("writer").expect("write stdin");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(events_json(&v), want, "stdin, {dump_lines} dump lines");
    }
}

/// A file of 64 MiB or more is scanned through a memory map, in windows, its scanned pages
/// released as it goes: the same events as one scan of the whole text, and the same output as
/// the streamed read (`HBM_DOCTOR_NO_MMAP=1`), whatever the windows cut.
#[test]
fn mapped_file_reads_like_the_stream() {
    let dir = scratch("mapped");
    let mut text = log(80_000);
    let oom = b"jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes.\n";
    let line = b"I1126 10:00:02.000000 1 train.py:88] step 9 loss 1.0000 lr 3e-4\n";
    // OOMs cut by later window boundaries (every 8 MiB) and the last line of the file.
    for boundary in [5usize, 8, 9] {
        while text.len() < boundary * 8 * 1024 * 1024 - 30 {
            text.extend_from_slice(line);
        }
        text.extend_from_slice(oom);
    }
    text.extend_from_slice(oom);
    assert!(text.len() >= 64 * 1024 * 1024);
    let want: Vec<(u64, u64)> = scan_all(&text)
        .iter()
        .map(|e| (e.line, e.requested_bytes.unwrap_or(0)))
        .collect();
    assert!(want.len() >= 5, "{want:?}");
    let path = dir.join("train-mapped.log");
    std::fs::write(&path, &text).expect("write");
    let run = |no_mmap: bool| {
        let mut cmd = bin();
        cmd.args(["explain", "--format", "json"]).arg(&path);
        if no_mmap {
            cmd.env("HBM_DOCTOR_NO_MMAP", "1");
        }
        cmd.output().expect("runs").stdout
    };
    let mapped = run(false);
    let v: serde_json::Value = serde_json::from_slice(&mapped).expect("json");
    assert_eq!(events_json(&v), want, "mapped");
    assert_eq!(
        String::from_utf8_lossy(&mapped),
        String::from_utf8_lossy(&run(true)),
        "mapped and streamed"
    );
    let _ = std::fs::remove_file(&path);
}
