//! Real GPU failures (`tests/corpus/gpu`, recorded on an H100 by `tests/corpus/gpu/generate.py`):
//! every broken program's log is one fatal event with the figures its message prints; every
//! fixed twin, which ran to the end, is no OOM at all; the recordings `hbm-doctor record` made
//! of the two leaks (NVML) show the leak and the death at the limit. The diagnosis of each case
//! is scored by the accuracy harness (set `gpu_log`).

mod support;

use hbm_doctor_log::scan_all;
use hbm_doctor_log::size::parse_size;
use std::path::PathBuf;
use support::bin;

fn gpu(rel: &str) -> PathBuf {
    support::root().join("tests/corpus/gpu").join(rel)
}

fn cases() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(gpu(""))
        .expect("tests/corpus/gpu")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("meta.json").is_file())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    names
}

fn size(s: &str) -> u64 {
    parse_size(s).unwrap_or_else(|| panic!("size {s}"))
}

#[test]
fn every_broken_program_is_one_oom_and_every_fixed_twin_none() {
    let names = cases();
    assert_eq!(names.len(), 24, "{names:?}");
    for name in names {
        let log = std::fs::read(gpu(&format!("{name}/stderr.log"))).expect("log");
        let fatal: Vec<_> = scan_all(&log).into_iter().filter(|e| e.fatal).collect();
        if name.ends_with("_fixed") {
            assert!(
                fatal.is_empty(),
                "{name} ran to the end, yet: {:?}",
                fatal.iter().map(|e| &e.message).collect::<Vec<_>>()
            );
        } else {
            assert!(!fatal.is_empty(), "{name}: no OOM found");
            let e = fatal.last().expect("one");
            assert_eq!(
                e.backend,
                Some(hbm_doctor_log::Backend::Gpu),
                "{name}: {}",
                e.message
            );
        }
    }
}

/// The figures PyTorch's message prints, read exactly (both rounding and units as printed).
#[test]
fn pytorch_messages_figures() {
    // (case, requested, total capacity, free, process in use, reserved but unallocated)
    let table = [
        (
            "torch_batch",
            "7.41 GiB",
            "79.18 GiB",
            "2.41 GiB",
            "76.76 GiB",
            "768.00 KiB",
        ),
        (
            "torch_fragmentation",
            "15.91 GiB",
            "79.18 GiB",
            "11.66 GiB",
            "67.51 GiB",
            "8.50 GiB",
        ),
        (
            "torch_leak",
            "264.00 MiB",
            "79.18 GiB",
            "134.19 MiB",
            "79.04 GiB",
            "244.10 MiB",
        ),
        (
            "torch_other_process",
            "1.97 GiB",
            "79.18 GiB",
            "916.62 MiB",
            "30.26 GiB",
            "768.00 KiB",
        ),
    ];
    for (case, req, total, free, process, idle) in table {
        let log = std::fs::read(gpu(&format!("{case}/stderr.log"))).expect("log");
        let events = scan_all(&log);
        let e = events.iter().rev().find(|e| e.fatal).expect("event");
        assert_eq!(e.family.as_str(), "pytorch_cuda_oom", "{case}");
        assert_eq!(e.requested_bytes, Some(size(req)), "{case} requested");
        assert_eq!(e.limit_bytes, Some(size(total)), "{case} total");
        assert_eq!(e.free_bytes, Some(size(free)), "{case} free");
        assert_eq!(e.process_bytes, Some(size(process)), "{case} process");
        assert_eq!(e.fragmentation_bytes, Some(size(idle)), "{case} idle");
    }
}

#[test]
fn jax_and_cupy_messages_figures() {
    let log = std::fs::read(gpu("jax_batch/stderr.log")).expect("log");
    let events = scan_all(&log);
    let e = events.iter().rev().find(|e| e.fatal).expect("event");
    // `50.06GiB (rounded to 53754205952)`: the exact bytes win.
    assert_eq!(e.requested_bytes, Some(53_754_205_952));
    assert_eq!(e.program.as_deref(), Some("jit_loss_fn"));

    let log = std::fs::read(gpu("cupy_pairwise/stderr.log")).expect("log");
    let events = scan_all(&log);
    let e = events.iter().rev().find(|e| e.fatal).expect("event");
    assert_eq!(e.requested_bytes, Some(302_304_460_800));
}

#[test]
fn recorded_leak_is_suspected_and_ends_at_the_limit() {
    let out = bin()
        .args(["trend", "--format", "json"])
        .arg(gpu("torch_leak/record.jsonl"))
        .output()
        .expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let s = &v["series"][0];
    assert_eq!(s["source"], "nvml");
    assert_eq!(s["limit_bytes"], 85_520_809_984u64);
    assert_eq!(s["leak_suspected"], true, "{s}");
    let h = &v["hosts"][0];
    assert_eq!(h["hbm_at_limit"][0], "0", "{h}");
    assert_eq!(h["causes"][0]["cause"], "memory_leak", "{h}");
    let reason = s["reason"].as_str().unwrap_or("");
    assert!(reason.contains("the growth filled the device"), "{reason}");
}

/// JAX's leak recorded through NVML: the pool JAX preallocated (75% of the H100) is all the
/// readings show, and the memory the dying process let go at the end is its teardown, not a
/// second process.
#[test]
fn recorded_jax_pool_is_a_plateau_and_its_teardown_no_restart() {
    let out = bin()
        .args(["trend", "--format", "json"])
        .arg(gpu("jax_leak/record.jsonl"))
        .output()
        .expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let s = &v["series"][0];
    assert_eq!(s["restarts"], 0, "{s}");
    assert!(s["samples"].as_u64().unwrap_or(0) > 900, "{s}");
    let plateau = s["pool_plateau_bytes"].as_u64().expect("a plateau");
    let limit = s["limit_bytes"].as_u64().expect("limit");
    assert!(
        (0.74..0.76).contains(&(plateau as f64 / limit as f64)),
        "{s}"
    );
}
