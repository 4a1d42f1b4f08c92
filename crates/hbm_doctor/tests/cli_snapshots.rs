//! The binary as users run it, snapshotted whole: the command, exit code, stdout and stderr of a
//! few representative runs (explain, analyze, trend, pad, top, and errors), with temporary paths,
//! host names and clocks redacted. Also: the same input gives byte-identical JSON twice.

mod support;

use support::{run, scratch, transcript};

/// Snapshots one run under `name`, with `filters` (regex, replacement) applied.
fn snap(name: &str, args: &[&str], filters: Vec<(String, &str)>) {
    let out = run(args);
    let text = transcript(args, &out);
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    for (re, to) in &filters {
        settings.add_filter(re, *to);
    }
    settings.bind(|| insta::assert_snapshot!(name, text));
}

#[test]
fn explain_a_tpu_compile_failure() {
    snap(
        "explain_tpu_debug_print",
        &["explain", "tests/corpus/tpu/debug_print_v5e/stderr.log"],
        Vec::new(),
    );
}

#[test]
fn explain_an_issue_post_as_markdown() {
    snap(
        "explain_markdown_easydel_166",
        &[
            "explain",
            "--format",
            "markdown",
            "tests/corpus/issues/erfanzar-EasyDeL-166.txt",
        ],
        Vec::new(),
    );
}

#[test]
fn analyze_a_dump_over_its_target() {
    snap(
        "analyze_debug_print_v5e",
        &[
            "analyze",
            "tests/corpus/tpu/debug_print_v5e/dump",
            "--target",
            "v5e",
            "--top",
            "3",
            "--what-if",
            "debug_print",
        ],
        Vec::new(),
    );
}

#[test]
fn analyze_a_cpu_dump_as_markdown() {
    snap(
        "analyze_markdown_mlp_train",
        &[
            "analyze",
            "--format",
            "markdown",
            "--top",
            "3",
            "tests/corpus/cpu/mlp_train/dump",
        ],
        Vec::new(),
    );
}

#[test]
fn analyze_errors_are_one_line() {
    snap(
        "analyze_unknown_target",
        &[
            "analyze",
            "tests/corpus/tpu/fits_v5e/dump",
            "--target",
            "v99",
        ],
        Vec::new(),
    );
    let dir = scratch("snap-empty");
    let empty = dir.join("module_0000.jit_f.after_optimizations.txt");
    std::fs::write(&empty, "").expect("write");
    let path = empty.display().to_string();
    snap(
        "analyze_empty_dump_file",
        &["analyze", &path],
        vec![(regex_escape(&dir.display().to_string()), "[TMP]")],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn trend_of_a_leaking_recording() {
    snap(
        "trend_jax_cpu_leak",
        &["trend", "tests/corpus/trend/jax_cpu_leak.jsonl"],
        Vec::new(),
    );
}

#[test]
fn pad_human_and_json() {
    snap("pad_f32_129_1024", &["pad", "f32[129,1024]"], Vec::new());
    snap(
        "pad_json_bf16_tiled",
        &["pad", "--format", "json", "bf16[3,1000]{1,0:T(8,128)(2,1)}"],
        Vec::new(),
    );
}

#[test]
fn top_once_without_sources() {
    snap(
        "top_once_no_sources",
        &["top", "--once", "--no-libtpu", "--no-nvml"],
        vec![(
            r"(?m)^\S+  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$".to_string(),
            "[HOST]  [TIME]",
        )],
    );
}

#[test]
fn colour_when_asked_for_and_never_in_json() {
    let dump = "tests/corpus/tpu/debug_print_v5e/dump";
    let coloured = run(&["analyze", "--color", "always", "--target", "v5e", dump]);
    assert!(
        String::from_utf8_lossy(&coloured.stdout).contains("\x1b[1;31m"),
        "analyze --color always paints the verdict"
    );
    let plain = run(&["analyze", "--target", "v5e", dump]);
    assert!(!plain.stdout.contains(&0x1b), "no colour on a pipe");
    let json = run(&["analyze", "--color", "always", "-f", "json", dump]);
    assert!(!json.stdout.contains(&0x1b), "JSON never coloured");
    let trend = run(&[
        "trend",
        "--color",
        "always",
        "tests/corpus/trend/jax_cpu_leak.jsonl",
    ]);
    assert!(String::from_utf8_lossy(&trend.stdout).contains("\x1b[1;31mLEAK"));
}

/// Same input, byte-identical JSON (ARCHITECTURE.md: the diagnosis is deterministic).
#[test]
fn same_input_gives_byte_identical_json() {
    let runs: [&[&str]; 4] = [
        &[
            "explain",
            "-f",
            "json",
            "tests/corpus/tpu/debug_print_v5e/stderr.log",
            "--dump",
            "tests/corpus/tpu/debug_print_v5e/dump",
        ],
        &[
            "explain",
            "-f",
            "json",
            "tests/corpus/issues/erfanzar-EasyDeL-166.txt",
        ],
        &[
            "analyze",
            "-f",
            "json",
            "--target",
            "v5e",
            "--what-if",
            "bf16",
            "tests/corpus/tpu/replicated_v5e/dump",
        ],
        &["analyze", "-f", "json", "tests/corpus/cpu/sharded_mlp/dump"],
    ];
    for args in runs {
        let a = run(args);
        let b = run(args);
        assert!(
            a.stdout.len() > 100,
            "{args:?}: {}",
            String::from_utf8_lossy(&a.stderr)
        );
        assert!(a.stdout == b.stdout, "{args:?}: two runs differ");
        assert_eq!(a.status.code(), b.status.code(), "{args:?}");
    }
}

/// `s` with regex metacharacters escaped.
fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}
