//! `hbm-doctor view` without a browser: the page embeds exactly the JSON of `analyze --format
//! json`, loads nothing from the network, names its file after the input, refuses to overwrite,
//! and handles a diff and a dump with 100k buffers.

mod support;

use support::{bin, tpu_dump};

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tmpdir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("view_html-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run hbm-doctor")
}

/// The text of `<script type="application/json" id="ID" ...>TEXT</script>`.
fn embedded(html: &str, id: &str) -> Value {
    let start = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element {id}"));
    let open = start + html[start..].find('>').expect("tag end") + 1;
    let close = open + html[open..].find("</script>").expect("script end");
    serde_json::from_str(&html[open..close]).expect("embedded JSON parses")
}

fn analyze_json(path: &Path, extra: &[&str]) -> Value {
    let out = run(bin()
        .arg("analyze")
        .arg(path)
        .args(extra)
        .args(["--format", "json"]));
    serde_json::from_slice(&out.stdout).expect("analyze JSON")
}

/// Every external load a page could make, looked for outside the embedded data.
fn assert_offline(html: &str) {
    assert!(
        html.contains("Content-Security-Policy") && html.contains("default-src 'none'"),
        "the page must forbid network loads with its CSP"
    );
    // Drop the embedded JSON (data, never loaded) before looking for URLs.
    let mut code = String::new();
    let mut rest = html;
    while let Some(k) = rest.find("<script type=\"application/json\"") {
        code.push_str(&rest[..k]);
        let end = rest[k..].find("</script>").expect("end") + k;
        rest = &rest[end..];
    }
    code.push_str(rest);
    for bad in [
        "http://", "https://", "//cdn", "src=", "href=", "@import", "url(",
    ] {
        assert!(!code.contains(bad), "the page's code contains `{bad}`");
    }
    for api in [
        "fetch(",
        "XMLHttpRequest",
        "WebSocket",
        "EventSource",
        "sendBeacon",
        "import(",
        "<iframe",
        "<img",
        "<link",
    ] {
        assert!(!code.contains(api), "the page's code uses `{api}`");
    }
}

#[test]
fn embeds_the_analyze_json_and_loads_nothing() {
    let dir = tmpdir("embeds");
    for case in ["aggregate_v5e", "fits_v5e", "padding_v5e", "remat_v6e"] {
        let dump = tpu_dump(case);
        let page = dir.join(format!("{case}.html"));
        let out = run(bin()
            .arg("view")
            .arg(&dump)
            .args(["--target", "v5e", "-o"])
            .arg(&page));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{case}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let html = std::fs::read_to_string(&page).expect("page written");
        let want = analyze_json(&dump, &["--target", "v5e"]);
        assert_eq!(embedded(&html, "hbm-report"), want, "{case}: embedded JSON");
        let meta = embedded(&html, "hbm-view-meta");
        assert_eq!(meta["mode"], "single");
        assert_eq!(meta["limit_bytes"], 16_909_336_576u64);
        assert_offline(&html);
        assert!(html.starts_with("<!DOCTYPE html>"));
        // The new fields the page draws from.
        let hbm = &want["modules"][0]["memory_spaces"][0];
        let kinds = hbm["timeline_by_kind"]
            .as_array()
            .expect("timeline_by_kind");
        let timeline = hbm["timeline"].as_array().expect("timeline");
        for t in 0..timeline.len() {
            let sum: u64 = kinds
                .iter()
                .map(|k| k["bytes"][t].as_u64().expect("bytes"))
                .sum();
            assert_eq!(
                Some(sum),
                timeline[t].as_u64(),
                "{case}: kinds add up at {t}"
            );
        }
        assert!(!hbm["largest_buffers"]
            .as_array()
            .expect("largest")
            .is_empty());
        assert_eq!(
            want["modules"][0]["schedule"].as_array().map(Vec::len),
            Some(timeline.len()),
            "{case}: one instruction per schedule position"
        );
    }
}

#[test]
fn default_name_refuses_to_overwrite_and_force() {
    let dir = tmpdir("names");
    let dump = tpu_dump("aggregate_v5e");
    let out = run(bin().current_dir(&dir).arg("view").arg(&dump));
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Wrote aggregate_v5e-dump.memory.html"),
        "{err}"
    );
    assert!(err.contains("file://"), "says how to open it: {err}");
    assert!(out.stdout.is_empty(), "nothing on stdout in human mode");
    assert!(dir.join("aggregate_v5e-dump.memory.html").is_file());

    let again = run(bin().current_dir(&dir).arg("view").arg(&dump));
    assert_eq!(again.status.code(), Some(2));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("already exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one-line error: {err}");

    let forced = run(bin()
        .current_dir(&dir)
        .arg("view")
        .arg(&dump)
        .arg("--force"));
    assert_eq!(forced.status.code(), Some(0));

    // One file of the dump: named after its module.
    let file = std::fs::read_dir(&dump)
        .expect("dump")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with("after_optimizations.txt"))
        .expect("hlo file");
    let out = run(bin().current_dir(&dir).arg("view").arg(&file));
    assert_eq!(out.status.code(), Some(0));
    assert!(dir.join("jit_train_step.memory.html").is_file());

    // JSON mode says what was written on stdout.
    let out = run(bin()
        .current_dir(&dir)
        .arg("view")
        .arg(&dump)
        .args(["-o", "j.html", "--format", "json"]));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["output"], "j.html");
    assert_eq!(v["mode"], "single");

    // `-o -` writes the page to stdout.
    let out = run(bin().arg("view").arg(&dump).args(["-o", "-"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("<!DOCTYPE html>"));

    // Bad input: one line, exit 2.
    let out = run(bin().current_dir(&dir).arg("view").arg(dir.join("missing")));
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn diff_embeds_both_reports() {
    let dir = tmpdir("diff");
    let before = tpu_dump("no_donation_v5e");
    let after = tpu_dump("no_donation_fixed_v5e");
    let out = run(bin().current_dir(&dir).arg("view").arg(&before).arg(&after));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = dir.join("no_donation_v5e-dump-vs-no_donation_fixed_v5e-dump.memory.html");
    let html = std::fs::read_to_string(&page).expect("diff page");
    assert_eq!(
        embedded(&html, "hbm-report-before"),
        analyze_json(&before, &[])
    );
    assert_eq!(
        embedded(&html, "hbm-report-after"),
        analyze_json(&after, &[])
    );
    assert_eq!(embedded(&html, "hbm-view-meta")["mode"], "diff");
    assert!(!html.contains("id=\"hbm-report\""));
    assert_offline(&html);
}

/// A dump with `n` temporaries in one arena whose live ranges all cover the middle of the
/// program, written as XLA writes the buffer assignment and the live ranges.
pub fn synthetic_dump(dir: &Path, n: usize) {
    use std::fmt::Write as _;
    let positions = 2000usize;
    let mut ba = String::from("BufferAssignment:\n");
    let size = |k: usize| 1024 * (1 + (k % 97) as u64);
    let total: u64 = (0..n).map(size).sum();
    let _ = writeln!(
        ba,
        "allocation 0: size 4194304, parameter 0, shape |f32[1024,1024]| at ShapeIndex {{}}:"
    );
    let _ = writeln!(
        ba,
        " value: <0 p @0> (size=4194304,offset=0): f32[1024,1024]{{1,0}}"
    );
    let _ = writeln!(ba, "allocation 1: size {total}, preallocated-temp:");
    let mut offset = 0u64;
    for k in 0..n {
        let z = size(k);
        let _ = writeln!(
            ba,
            " value: <{} fusion.{k} @0> (size={z},offset={offset}): f32[{}]{{0}}",
            k + 1,
            z / 4
        );
        offset += z;
    }
    let mut lr = format!("HloLiveRange (max {positions}):\n  InstructionSequence:\n");
    for t in 0..positions {
        let _ = writeln!(lr, "    {t}:fusion.{t}");
    }
    lr.push_str("  BufferLiveRange:\n    p{}:0-1999\n");
    for k in 0..n {
        let start = k % 900;
        let _ = writeln!(lr, "    fusion.{k}{{}}:{start}-{}", start + 1000);
    }
    let key = "module_0000.jit_big.cl_1.after_optimizations";
    std::fs::write(dir.join(format!("{key}-buffer-assignment.txt")), ba).expect("write ba");
    std::fs::write(dir.join(format!("{key}-live-range.txt")), lr).expect("write lr");
}

#[test]
fn a_dump_with_100k_buffers() {
    let dir = tmpdir("big");
    let dump = dir.join("dump");
    std::fs::create_dir_all(&dump).expect("dump dir");
    synthetic_dump(&dump, 100_000);
    let page = dir.join("big.html");
    let out = run(bin().arg("view").arg(&dump).arg("-o").arg(&page));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).expect("page");
    let r = embedded(&html, "hbm-report");
    let hbm = &r["modules"][0]["memory_spaces"][0];
    let at_peak = hbm["buffers_at_peak"].as_array().expect("buffers").len();
    assert!(at_peak > 99_000, "{at_peak} buffers at the peak");
    assert_eq!(hbm["buffer_count"], 100_001);
    assert_eq!(hbm["largest_buffers"].as_array().map(Vec::len), Some(500));
    assert_eq!(hbm["timeline"].as_array().map(Vec::len), Some(2000));
    assert_offline(&html);
}
