//! `hbm-doctor explain` from the outside: exit codes, bad input, formats, streams, noise.

mod support;

use support::{bin, corpus};

use std::io::Write;
use std::process::{Output, Stdio};

fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    if let Some(data) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
    } else {
        drop(child.stdin.take());
    }
    child.wait_with_output().expect("wait")
}

fn tmp(name: &str, data: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hbm-doctor-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join(name);
    std::fs::write(&path, data).expect("write tmp");
    path
}

fn stderr_one_line(out: &Output) -> String {
    let s = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        s.trim_end().lines().count(),
        1,
        "one-line error expected, got: {s}"
    );
    s
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let empty = tmp("empty.log", b"");
    let out = run(&["explain", empty.to_str().expect("utf8")], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_one_line(&out).contains("is empty"));

    let dir = std::env::temp_dir();
    let out = run(&["explain", dir.to_str().expect("utf8")], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_one_line(&out).contains("is a directory"));

    let mut binary = vec![0u8; 4096];
    for (i, b) in binary.iter_mut().enumerate() {
        *b = (i * 7 % 256) as u8;
    }
    let bin_file = tmp("core.bin", &binary);
    let out = run(&["explain", bin_file.to_str().expect("utf8")], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_one_line(&out).contains("looks binary"));

    let out = run(&["explain", "/nonexistent/train.log"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_one_line(&out).contains("cannot read"));

    let out = run(&["explain", "--format", "yaml", "x"], None);
    assert_eq!(out.status.code(), Some(2));

    let out = run(&["pad", "not a shape"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_one_line(&out).contains("cannot read shape"));
}

#[test]
fn no_oom_exits_0_and_says_so() {
    let out = run(
        &["explain", "-"],
        Some(b"step 1 loss 2.3\nstep 2 loss 2.1\nXLA::TPU program HBM usage: 1.13G / 15.75G\n"),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("no out-of-memory"));
}

#[test]
fn oom_exits_1_in_every_format() {
    let f = corpus("issues/erfanzar-EasyDeL-166.txt");
    for format in ["human", "json", "markdown"] {
        let out = run(
            &[
                "explain",
                f.to_str().expect("utf8"),
                "--format",
                format,
                "--color",
                "never",
            ],
            None,
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "{format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("63.80G") || text.contains("68504728371"),
            "{format}: {text}"
        );
        assert!(!text.contains('\x1b'), "no colour when asked for none");
    }
}

#[test]
fn json_follows_the_contract() {
    let f = corpus("issues/erfanzar-EasyDeL-166.txt");
    let out = run(
        &["explain", f.to_str().expect("utf8"), "--format", "json"],
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["schema_version"], 1);
    let e = &v["events"][0];
    for key in [
        "line",
        "phase",
        "backend",
        "framework",
        "memory_space",
        "used_bytes",
        "limit_bytes",
        "exceeded_bytes",
        "requested_bytes",
        "free_bytes",
        "tensorcore_bytes",
        "sparsecore_bytes",
        "allocations",
    ] {
        assert!(e.get(key).is_some(), "event lacks `{key}`");
    }
    assert_eq!(e["phase"], "compile");
    assert_eq!(e["backend"], "tpu");
    assert_eq!(e["memory_space"], "hbm");
    assert_eq!(
        e["used_bytes"].as_u64(),
        hbm_doctor_log::parse_size("63.80G")
    );
    assert_eq!(
        e["limit_bytes"].as_u64(),
        hbm_doctor_log::parse_size("30.75G")
    );
    let a = &e["allocations"][0];
    for key in [
        "size_bytes",
        "unpadded_bytes",
        "shape",
        "op_name",
        "source",
        "label",
        "allocation_type",
    ] {
        assert!(a.get(key).is_some(), "allocation lacks `{key}`");
    }
    assert_eq!(a["shape"], "f32[32,4096,4096]{1,2,0:T(8,128)}");
    assert!(a["source"]
        .as_str()
        .is_some_and(|s| s.ends_with("attention_module.py:1059")));
    let d = &v["diagnosis"];
    assert_eq!(d["event"], 0);
    assert_eq!(d["category"], "aggregate");
    let c = &d["causes"][0];
    for key in ["cause", "savings_bytes", "evidence", "actions"] {
        assert!(c.get(key).is_some(), "cause lacks `{key}`");
    }
    let vocabulary = [
        "batch_too_large",
        "replicated_tensor",
        "debug_print",
        "padding",
        "no_donation",
        "no_remat",
        "large_activation",
        "f32_precision",
        "optimizer_state_unsharded",
        "arguments_exceed",
        "sparsecore_stack",
        "sparsecore_padding",
        "kernel_tiling",
        "shape_bug",
        "fragmentation",
        "preallocation",
        "other_process",
        "memory_leak",
        "memory_spike",
        "recompilation",
        "host_oom",
        "device_too_small",
    ];
    for c in d["causes"].as_array().expect("causes") {
        assert!(
            vocabulary.contains(&c["cause"].as_str().expect("cause")),
            "{c}"
        );
    }
}

#[test]
fn stdin_gzip_and_noise_give_the_same_figures() {
    let plain = std::fs::read(corpus("issues/erfanzar-EasyDeL-166.txt")).expect("fixture");
    let want = run(&["explain", "-", "--format", "json"], Some(&plain));
    let want: serde_json::Value = serde_json::from_slice(&want.stdout).expect("json");

    // The same message buried in a big noisy log: CRLF, ANSI colours, glog prefixes, 200k lines.
    let mut noisy = Vec::new();
    for i in 0..100_000 {
        writeln!(noisy, "I1121 23:09:{:02}.211174 2507 train.py:{i}] \x1b[32mstep {i}\x1b[0m loss=2.{i} memory ok\r", i % 60).expect("write");
    }
    for line in plain.split(|&b| b == b'\n') {
        noisy.extend_from_slice(b"E1121 23:09:56.211174 2507 tpu_compiler.cc:3781] ");
        noisy.extend_from_slice(line);
        noisy.extend_from_slice(b"\r\n");
    }
    for i in 0..100_000 {
        writeln!(
            noisy,
            "I1121 23:10:00.000000 2507 train.py:{i}] shutting down {i}"
        )
        .expect("write");
    }
    let got = run(&["explain", "-", "--format", "json"], Some(&noisy));
    assert_eq!(got.status.code(), Some(1));
    let got: serde_json::Value = serde_json::from_slice(&got.stdout).expect("json");
    assert_eq!(got["events"].as_array().map(Vec::len), Some(1));
    for key in [
        "used_bytes",
        "limit_bytes",
        "exceeded_bytes",
        "reserved_bytes",
        "hlo_temp_bytes",
    ] {
        assert_eq!(got["events"][0][key], want["events"][0][key], "{key}");
    }
    assert_eq!(
        got["events"][0]["allocations"],
        want["events"][0]["allocations"]
    );
    assert_eq!(
        got["events"][0]["line"].as_u64(),
        Some(100_000 + want["events"][0]["line"].as_u64().expect("line"))
    );

    let gz = {
        let mut enc = flate2_write(&noisy);
        std::mem::take(&mut enc)
    };
    let path = tmp("train.log.gz", &gz);
    let out = run(
        &["explain", path.to_str().expect("utf8"), "--format", "json"],
        None,
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        v["events"][0]["used_bytes"],
        want["events"][0]["used_bytes"]
    );
}

fn flate2_write(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).expect("gzip");
    enc.finish().expect("gzip")
}

#[test]
fn pad_prints_the_aligned_shape() {
    let out = run(
        &["pad", "f32[129,1024]{1,0:T(8,128)}", "--format", "json"],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["padded_bytes"], 557_056);
    assert_eq!(v["unpadded_bytes"], 528_384);
    assert_eq!(v["aligned_down"], "f32[128,1024]");
    assert_eq!(v["aligned_up"], "f32[136,1024]");
}

#[test]
fn runtime_oom_late_in_training_points_at_growth_or_spike() {
    let log = b"I1121 10:00:00.000 1 train.py:1] step 23400 loss 1.2\n\
I1121 10:00:01.000 1 train.py:1] Running eval at step 23400\n\
RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 1.50G. That was not possible. There are 1.06G free.; (0x0x0_HBM0)\n";
    let out = run(&["explain", "-", "--format", "json"], Some(log));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let e = &v["events"][0];
    assert_eq!(e["step"], 23400);
    assert_eq!(e["near"], "eval");
    assert_eq!(e["framework"], "pytorch_xla");
    assert_eq!(v["diagnosis"]["category"], "runtime_allocation");
    let causes: Vec<&str> = v["diagnosis"]["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter_map(|c| c["cause"].as_str())
        .collect();
    assert_eq!(&causes[..2], &["memory_spike", "memory_leak"], "{causes:?}");
}

/// The two example messages of XLA's TPU HBM OOM debugging guide (../shared/seeds, the French
/// translation of openxla's "HBM OOM" error page), classified as the guide says.
#[test]
fn the_guides_own_examples() {
    let out = run(&["explain", "-", "--format", "json"], Some(b"RESOURCE_EXHAUSTED: TPU TensorCore Hbm usage: 34.82G, SparseCore Hbm usage 174.10G, exceeding available bytes: 95.74G\n"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let e = &v["events"][0];
    assert_eq!(
        e["tensorcore_bytes"].as_u64(),
        hbm_doctor_log::parse_size("34.82G")
    );
    assert_eq!(
        e["sparsecore_bytes"].as_u64(),
        hbm_doctor_log::parse_size("174.10G")
    );
    assert_eq!(
        e["limit_bytes"].as_u64(),
        hbm_doctor_log::parse_size("95.74G")
    );
    assert_eq!(v["diagnosis"]["category"], "tc_sc_imbalance");
    assert_eq!(v["diagnosis"]["causes"][0]["cause"], "sparsecore_stack");
    assert!(v["diagnosis"]["chip"]
        .as_str()
        .is_some_and(|c| c.contains("v5p")));

    let out = run(&["explain", "-", "--format", "json"], Some(b"RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 49.34G of 32.00G hbm. Exceeded hbm capacity by 17.34G.\n"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let e = &v["events"][0];
    assert_eq!(
        e["used_bytes"].as_u64(),
        hbm_doctor_log::parse_size("49.34G")
    );
    assert_eq!(
        e["exceeded_bytes"].as_u64(),
        hbm_doctor_log::parse_size("17.34G")
    );
    // A headline alone does not say what makes up the requirement (../shared/docs/labelling.md):
    // `unknown`, and the diagnosis says what to collect.
    assert_eq!(v["diagnosis"]["category"], "unknown");
    assert!(v["diagnosis"]["missing"][0]
        .as_str()
        .is_some_and(|m| m.contains("--xla_dump_to")));
}

/// PyTorch/XLA's PT_XLA_DEBUG "Post Compilation Analysis" lines (format from
/// ../shared/docs/monitoring.md §4.4) printed before a runtime OOM give the graph's inputs,
/// outputs, aliasing and intermediates to the event.
#[test]
fn ptxla_post_compilation_analysis_feeds_the_event() {
    let log = b"pt-xla-profiler: Post Compilation Analysis: Graph input size: 1.548000 GB\n\
Post Compilation Analysis: Graph output size: 7.922460 GB\n\
Post Compilation Analysis: Aliased Input size: 0.000000 GB\n\
Post Compilation Analysis: Intermediate tensor size: 12.124478 GB\n\
Post Compilation Analysis: Compiled program size: 0.028210 GB\n\
RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 7.92G. That was not possible. There are 5.10G free.; (0x0x0_HBM0)\n";
    let out = run(&["explain", "-", "--format", "json"], Some(log));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let e = &v["events"][0];
    assert_eq!(e["framework"], "pytorch_xla");
    assert_eq!(
        e["arguments_bytes"].as_u64(),
        Some((1.548 * 1073741824.0_f64).round() as u64)
    );
    assert_eq!(
        e["output_bytes"].as_u64(),
        Some((7.92246 * 1073741824.0_f64).round() as u64)
    );
    assert_eq!(e["output_aliased_bytes"], 0);
    let causes: Vec<&str> = v["diagnosis"]["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter_map(|c| c["cause"].as_str())
        .collect();
    assert!(causes.contains(&"no_donation"), "{causes:?}");
}

/// Compiler flags come last in their cause, marked as a last resort, and always through
/// LIBTPU_INIT_ARGS (XLA_FLAGS aborts on TPU flags).
#[test]
fn compiler_flags_are_a_marked_last_resort() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let inputs = [
        "examples/jax-tpu-v5e-oom.log",
        "tests/corpus/tpu/scoped_vmem_pallas/stderr.log",
        "tests/corpus/tpu/vmem_pallas/exception.txt",
    ];
    let mut seen = 0;
    for input in inputs {
        let path = root.join(input);
        let out = run(
            &["explain", path.to_str().expect("utf8"), "--format", "json"],
            None,
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        for c in v["diagnosis"]["causes"].as_array().expect("causes") {
            let actions: Vec<&str> = c["actions"]
                .as_array()
                .expect("actions")
                .iter()
                .filter_map(|a| a.as_str())
                .collect();
            for (i, a) in actions.iter().enumerate() {
                if a.contains("--xla_") {
                    seen += 1;
                    assert!(a.starts_with("Last resort"), "{input}: {a}");
                    assert_eq!(
                        i,
                        actions.len() - 1,
                        "{input}: flags must be the last action: {actions:?}"
                    );
                    assert!(
                        a.contains("LIBTPU_INIT_ARGS") && !a.contains("XLA_FLAGS="),
                        "{input}: {a}"
                    );
                }
            }
        }
    }
    assert!(
        seen >= 3,
        "every input here gets compiler flags as a marked last resort ({seen})"
    );
}

/// `--evidence FILE.json` (docs/evidence.md): what the failing process captured decides the
/// cause the text cannot; a bad file is one line and exit 2.
#[test]
fn evidence_names_the_holder() {
    let dir = std::env::temp_dir().join(format!("hbm-doctor-evidence-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let ev = dir.join("ev.json");
    std::fs::write(
        &ev,
        r#"{"schema_version":1,"kind":"hbm_doctor_evidence","framework":"jax","step":4000,
        "exception":{"type":"XlaRuntimeError","message":"RESOURCE_EXHAUSTED: Out of memory while trying to allocate 67108864 bytes."},
        "devices":[{"id":0,"bytes_in_use":16800000000,"bytes_limit":16909336576,"largest_free_block_bytes":50000000}],
        "live_arrays":[{"shape":"f32[512,512]","count":15000,"total_bytes":15728640000,"devices":1}],
        "holders":[{"name":"history","kind":"list","where":"train.py:main","arrays":15000,"bytes":15728640000,"example":"f32[512,512]"}]}"#,
    )
    .expect("write");
    // The log has no error line: the exception in the evidence is the event.
    let log = dir.join("train.log");
    std::fs::write(&log, "step 3999 loss 0.1\nstep 4000 loss 0.1\n").expect("write");
    let out = run(
        &[
            "explain",
            log.to_str().expect("utf-8"),
            "--evidence",
            ev.to_str().expect("utf-8"),
            "--format",
            "json",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let c = &v["diagnosis"]["causes"][0];
    assert_eq!(c["cause"], "memory_leak", "{v}");
    assert!(c["evidence"]
        .as_str()
        .is_some_and(|e| e.contains("`history`")));
    assert!(v["diagnosis"]["ledger"]
        .as_array()
        .is_some_and(|l| l.iter().any(|p| p["part"] == "held_by_python")));
    std::fs::write(&ev, "not json").expect("write");
    let out = run(
        &[
            "explain",
            log.to_str().expect("utf-8"),
            "--evidence",
            ev.to_str().expect("utf-8"),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pad` refuses sizes past 64 bits in one line (it printed `2.00E` and aligned to `[0,0]`), and
/// keeps the element type as written (`u64` is not `s64`).
#[test]
fn pad_overflow_and_type_names() {
    let out = run(
        &["pad", "f32[18446744073709551615,18446744073709551615]"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("2^64"), "{err}");
    let out = run(&["pad", "u64[3,1000]"], None);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("u64[8,1024]") && !text.contains("s64"),
        "{text}"
    );
}

/// More non-fatal warnings than the old 100,000-piece cap, then one real TPU OOM: the OOM is the
/// diagnosis, and every view says how many warnings it summarised (issue: a log that hides its
/// OOM among a million warnings).
#[test]
fn oom_after_many_warnings_is_reported_and_warnings_summarised() {
    use std::fmt::Write as _;
    let n = 120_000u64;
    let mut log = String::with_capacity(n as usize * 220);
    for i in 0..n {
        let target = 10_000_000_000 + i * 1_000;
        let reached = target + 1_000_000 + (i % 977) * 1_000_000;
        let _ = writeln!(
            log,
            "W1121 12:00:00.{:06} 4436 hlo_rematerialization.cc:3231] Can't reduce memory use below {:.2}GiB ({target} bytes) by rematerialization; only reduced to {:.2}GiB ({reached} bytes)",
            i % 1_000_000,
            target as f64 / (1u64 << 30) as f64,
            reached as f64 / (1u64 << 30) as f64,
        );
    }
    let oom = std::fs::read_to_string(
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/jax-tpu-v5e-oom.log"),
    )
    .expect("example");
    log.push_str(&oom);
    let path = tmp("many-warnings.log", log.as_bytes());
    let path = path.to_str().expect("utf8");

    let out = run(&["explain", path, "--format", "json"], None);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let events = v["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "warnings are not listed one by one");
    assert_eq!(events[0]["family"], "tpu_compile_hbm");
    assert_eq!(events[0]["used_bytes"], 19_059_158_528u64);
    assert_eq!(events[0]["remat"]["target_bytes"], 13_372_150_681u64);
    assert_eq!(v["diagnosis"]["event"], 0);
    let w = &v["warnings"][0];
    assert_eq!(w["kind"], "remat_warning");
    // The generated ones and the one in the compiler's own output.
    assert_eq!(w["count"], n + 1);
    assert_eq!(w["first_line"], 1);
    // The worst shortfall is the compiler's own (3.00G short, line 58 of the example).
    assert_eq!(w["worst"]["line"], n + 58);
    assert_eq!(w["worst"]["exceeded_bytes"], 3_002_413_671u64);

    let out = run(&["explain", path, "--color", "never"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("✗ Out of HBM"), "{text}");
    assert!(!text.contains("no out-of-memory error"), "{text}");
    assert!(
        text.contains("120,001 rematerialization warnings (remat_warning), lines 1-"),
        "{text}"
    );
    let out = run(&["explain", path, "--format", "markdown"], None);
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(md.contains("#### Warnings"), "{md}");
    assert!(md.contains("- 120,001 rematerialization warnings"), "{md}");
}

/// A failure told only in words asks for the message itself first; a PyTorch CUDA failure is told
/// how to log memory with PyTorch's own API.
#[test]
fn missing_evidence_names_the_cheapest_thing_to_collect() {
    let told = b"### Describe the bug\nI am using GTX 1050Ti of 4GB.\nHowever, after run about two days I saw it stopped because of OOM error.\n";
    let out = run(&["explain", "-", "--format", "json"], Some(told));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let missing = v["diagnosis"]["missing"].as_array().expect("missing");
    assert!(
        missing[0]
            .as_str()
            .is_some_and(|m| m.starts_with("the error itself")),
        "{missing:?}"
    );
    let torch = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 14.75 GiB of which 3.06 MiB is free. Including non-PyTorch memory, this process has 14.74 GiB memory in use. Of the allocated memory 14.51 GiB is allocated by PyTorch, and 98.79 MiB is reserved by PyTorch but unallocated.\n";
    let out = run(&["explain", "-", "--format", "json"], Some(torch));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let text = v["diagnosis"]["missing"].to_string();
    assert!(text.contains("torch.cuda.memory_allocated()"), "{text}");
    assert!(!text.contains("jax.devices()"), "{text}");
}
