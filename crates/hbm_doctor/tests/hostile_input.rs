//! Input built to hurt: sizes and times read from a file that the file cannot hold, shapes past
//! 64 bits. Each is refused in one line with exit 2, at once and in flat memory.

mod support;

use support::bin;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `hbm-doctor ARGS` under a 1 GiB address-space limit (Linux), killing it after 60 s: an
/// input that makes it allocate by a number it read aborts or runs out of time instead of exiting 2.
fn run_bounded(args: &[&str]) -> Output {
    let mut cmd = if cfg!(target_os = "linux") {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_hbm-doctor"));
        c
    } else {
        bin()
    };
    let mut child = cmd
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("hbm-doctor {args:?} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hbm-doctor-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

/// A copy of a real dump whose live-range file went through `edit`.
fn dump_with_live_range(name: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    dump_edited(name, "-live-range.txt", edit)
}

fn assert_one_line_error(out: &Output, what: &str, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: {err}");
    assert!(
        err.starts_with("hbm-doctor: error: ") && err.contains(want),
        "{what}: {err}"
    );
    assert!(!err.contains("internal error"), "{what}: {err}");
}

#[test]
fn live_range_times_past_the_file_exit_2() {
    // (case, replacements in the live-range file, what the error says)
    type Edits<'a> = &'a [(&'a str, &'a str)];
    let cases: [(&str, Edits, &str); 5] = [
        (
            "max-2pow32",
            &[("(max 7)", "(max 4294967296)")],
            "is more positions than a file of",
        ),
        (
            "max-3e8",
            &[("(max 7)", "(max 300000000)")],
            "is more positions than a file of",
        ),
        (
            "max-2pow63",
            &[("(max 7)", "(max 9223372036854775808)")],
            "is more positions than a file of",
        ),
        (
            "end-past-max",
            &[("copy.2{}:6-7", "copy.2{}:6-18446744073709551615")],
            "lies outside the schedule (max 7)",
        ),
        (
            "end-past-2pow63",
            &[
                ("(max 7)", "(max 9223372036854775808)"),
                ("copy.2{}:6-7", "copy.2{}:6-9223372036854775809"),
            ],
            "is more positions than a file of",
        ),
    ];
    for (name, edits, want) in cases {
        let dir = dump_with_live_range(name, |t| {
            edits
                .iter()
                .fold(t.to_string(), |t, (from, to)| t.replace(from, to))
        });
        let d = dir.to_string_lossy().into_owned();
        let html = dir.join("out.html").to_string_lossy().into_owned();
        for args in [
            vec!["analyze", &d],
            vec!["analyze", "--format", "json", &d],
            vec!["view", &d, "-o", &html],
        ] {
            let out = run_bounded(&args);
            assert_one_line_error(&out, &format!("{name} {args:?}"), want);
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("-live-range.txt`"),
                "names the file"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn live_range_embedded_in_buffer_assignment_is_checked_too() {
    let dir = scratch("embedded");
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/tpu/padding_v5e/dump");
    for e in std::fs::read_dir(&src).expect("dump").flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        if file.ends_with("-buffer-assignment.txt") {
            let ba = std::fs::read_to_string(e.path()).expect("read");
            let lr = std::fs::read_to_string(
                e.path()
                    .to_string_lossy()
                    .replace("-buffer-assignment.txt", "-live-range.txt"),
            )
            .expect("live range");
            let lr = lr.replace("(max 7)", "(max 300000000)");
            std::fs::write(dir.join(&file), format!("{ba}\n{lr}")).expect("write");
        }
    }
    let out = run_bounded(&["analyze", &dir.to_string_lossy()]);
    assert_one_line_error(&out, "embedded", "-buffer-assignment.txt`");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A copy of a real dump with `edit` applied to every file whose name ends with `suffix`.
fn dump_edited(name: &str, suffix: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/tpu/padding_v5e/dump");
    let dir = scratch(name);
    for e in std::fs::read_dir(&src).expect("dump").flatten() {
        let text = std::fs::read_to_string(e.path()).expect("read");
        let file = e.file_name().to_string_lossy().into_owned();
        let text = if file.ends_with(suffix) {
            let edited = edit(&text);
            assert_ne!(edited, text, "{name}: the edit changed nothing");
            edited
        } else {
            text
        };
        std::fs::write(dir.join(file), text).expect("write");
    }
    dir
}

/// Byte sizes no device holds overflowed the figures (an internal error in debug builds, wrong
/// figures in release): such a file is refused, naming it.
#[test]
fn sizes_past_64_pib_exit_2() {
    let huge_value = |t: &str| {
        let k = t.find("(size=").expect("value") + 6;
        let e = k + t[k..].find(',').expect("comma");
        format!("{}18446744073709551615{}", &t[..k], &t[e..])
    };
    let huge_shape = |t: &str| t.replace("f32[4194304,3,3]", "f32[4194304000000000,3,3]");
    for (name, suffix, want, edit) in [
        (
            "value-size",
            "-buffer-assignment.txt",
            "value sizes add up to",
            &huge_value as &dyn Fn(&str) -> String,
        ),
        (
            "value-shape",
            "-buffer-assignment.txt",
            "value shapes add up to",
            &huge_shape,
        ),
        (
            "hlo-shape",
            "after_optimizations.txt",
            "instruction shapes add up to",
            &huge_shape,
        ),
    ] {
        let dir = dump_edited(name, suffix, edit);
        let out = run_bounded(&["analyze", &dir.to_string_lossy()]);
        assert_one_line_error(&out, name, want);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&format!("{suffix}`")),
            "{name}: names the file"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A FIFO named like a dump file is skipped, not opened (which waits for a writer forever).
#[cfg(unix)]
#[test]
fn fifo_in_a_dump_directory_is_skipped() {
    let dir = dump_edited("fifo", "-live-range.txt", |t| {
        t.replace("(max 7)", "(max 7) ")
    });
    let fifo = dir.join("module_0001.jit_g.cl_1.after_optimizations-buffer-assignment.txt");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipped: mkfifo unavailable");
        return;
    }
    let d = dir.to_string_lossy().into_owned();
    let out = run_bounded(&["analyze", "--format", "json", &d]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["modules"].as_array().map(Vec::len), Some(1));
    let out = run_bounded(&["analyze", &fifo.to_string_lossy()]);
    assert_one_line_error(&out, "fifo", "no XLA dump files");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pad_sizes_past_u64_exit_2() {
    let max = u64::MAX;
    for shape in [
        format!("f32[{max},{max}]"),
        format!("f32[{}]", max / 4 + 1),
        format!("u8[{max}]"),
        format!("bf16[{max},8]{{1,0:T(8,128)(2,1)}}"),
    ] {
        for format in ["human", "json"] {
            let out = run_bounded(&["pad", "--format", format, &shape]);
            assert_one_line_error(&out, &shape, "larger than 2^64 bytes");
            assert!(out.stdout.is_empty(), "{shape}");
        }
    }
}

#[test]
fn pad_keeps_the_element_type() {
    for (shape, aligned) in [
        ("u64[129,3]", "u64[136,128]"),
        ("f16[129,3]", "f16[136,128]"),
        ("u8[1,1]", "u8[8,128]"),
        ("f8e4m3fn[9,128]", "f8e4m3fn[16,128]"),
    ] {
        let out = bin()
            .args(["pad", "--format", "json", shape])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0), "{shape}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["aligned_up"], aligned, "{shape}");
    }
}

/// A buffer assignment cut in half (3.50G where the memory-usage report says 17.75G) is named
/// as truncated and left out: the figures come from the HLO text and the report, not from it.
#[test]
fn a_truncated_buffer_assignment_is_not_used() {
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/tpu/aggregate_v5e/dump");
    let dir = scratch("truncated-ba");
    for e in std::fs::read_dir(&src).expect("dump").flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let text = std::fs::read(e.path()).expect("read");
        let text = if file.ends_with("-buffer-assignment.txt") {
            text[..text.len() / 2].to_vec()
        } else {
            text
        };
        std::fs::write(dir.join(file), text).expect("write");
    }
    let json = |d: &std::path::Path| -> serde_json::Value {
        let out = bin()
            .args(["analyze", "--format", "json"])
            .arg(d)
            .output()
            .expect("run");
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let cut = json(&dir);
    let whole = json(&src);
    let hbm = |v: &serde_json::Value| {
        v["modules"][0]["memory_spaces"][0]["total_bytes"]
            .as_f64()
            .expect("total")
    };
    let (c, w) = (hbm(&cut), hbm(&whole));
    assert!((c - w).abs() / w < 0.01, "truncated {c} vs whole {w}");
    let notes = cut["modules"][0]["notes"].to_string();
    assert!(
        notes.contains("truncated") && notes.contains("left out"),
        "{notes}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
