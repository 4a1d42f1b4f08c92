//! Every real message in `tests/corpus/issues` (posted by users in public issues; sources in
//! MANIFEST.toml) is found, its figures are read exactly, and its family is recognized: one test
//! per fixture, named after its file (`cargo test -p hbm_doctor_log --test corpus_issues NAME`).
//!
//! The expected figures in the manifest were transcribed by a person from the text, independently
//! of the parser, as the strings printed; they are compared within the rounding of two decimals.

use hbm_doctor_log::{parse_size, scan_all, Event, Family};
use libtest_mimic::{Arguments, Failed, Trial};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Deserialize)]
struct Manifest {
    fixture: Vec<Fixture>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Fixture {
    file: String,
    source: String,
    family: String,
    oom: bool,
    #[serde(default)]
    backend: String,
    #[serde(default)]
    phase: String,
    #[serde(default)]
    framework: String,
    #[serde(default)]
    memory_space: String,
    #[serde(default)]
    events: usize,
    /// What the parser does not read yet in this fixture: reported, not failed (and a fixture
    /// that passes while marked fails, so the list stays true).
    #[serde(default)]
    known_gap: Option<String>,
    used: Option<String>,
    limit: Option<String>,
    exceeded: Option<String>,
    requested: Option<String>,
    free: Option<String>,
    tensorcore: Option<String>,
    sparsecore: Option<String>,
    #[serde(default)]
    largest_allocations: usize,
    largest_first_size: Option<String>,
}

fn corpus_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/corpus")
        .join(name)
}

fn families(name: &str) -> &'static [Family] {
    use Family::*;
    match name {
        "tpu_compile_hbm" => &[TpuCompileHbm, TpuHloTemporaries],
        "tpu_compile_hbm_old" => &[TpuCompileHbmOld],
        "tpu_hlo_temporaries" => &[TpuHloTemporaries, TpuCompileHbm],
        "tpu_tc_sc" => &[TpuTcSc],
        "tpu_abort_early" => &[TpuAbortEarly],
        "tpu_compile_vmem" | "tpu_scoped_vmem" | "tpu_smem" => {
            &[TpuCompileVmem, TpuAllocationExceeds]
        }
        "tpu_allocation_exceeds" => &[TpuAllocationExceeds],
        "tpu_runtime_alloc" => &[TpuRuntimeAlloc],
        "tpu_program_load" => &[TpuProgramLoad],
        "gpu_buffer_assignment" | "gpu_oom_allocate" => &[GpuOomAllocate, BfcAllocator],
        "gpu_failed_request" => &[GpuFailedRequest, GpuOomAllocate, BfcAllocator],
        "bfc_allocator" | "tf_oom_tensor" => &[BfcAllocator, TfOomTensor, GpuOomAllocate],
        "host_oom" => &[HostOom],
        "pytorch_cuda_oom" => &[PytorchCudaOom],
        "cuda_oom" => &[CudaOom, PytorchCudaOom],
        "vllm_kv_cache" => &[VllmKvCache],
        "gpu_shared_memory" => &[GpuSharedMemory],
        _ => &[],
    }
}

fn close(expected: &str, got: Option<u64>) -> bool {
    // Sizes some messages print in hexadecimal bytes (`size = 0xc0fb4000`).
    let hex = expected
        .strip_prefix("0x")
        .and_then(|h| u64::from_str_radix(h, 16).ok());
    let Some(want) = hex.or_else(|| parse_size(expected)) else {
        return false;
    };
    let Some(got) = got else { return false };
    let (lo, hi) = (want.min(got) as f64, want.max(got) as f64);
    hi - lo <= hi * 0.006 + 1.0
}

fn main_event(events: &[Event]) -> Option<&Event> {
    events.iter().rev().find(|e| e.fatal)
}

fn check(f: &Fixture) -> Vec<String> {
    let mut errors = Vec::new();
    let path = corpus_dir("issues").join(&f.file);
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let events = scan_all(&text);
    let fatal: Vec<&Event> = events.iter().filter(|e| e.fatal).collect();
    if !f.oom {
        if !fatal.is_empty() {
            errors.push(format!(
                "negative fixture, but found {} fatal event(s): {:?}",
                fatal.len(),
                fatal.iter().map(|e| &e.message).collect::<Vec<_>>()
            ));
        }
        return errors;
    }
    if fatal.len() != f.events {
        errors.push(format!(
            "events: want {}, got {} ({:?})",
            f.events,
            fatal.len(),
            fatal.iter().map(|e| (e.line, e.family)).collect::<Vec<_>>()
        ));
    }
    let Some(e) = main_event(&events) else {
        errors.push("no event found".into());
        return errors;
    };
    let want = families(&f.family);
    // A listing pasted without its headline cannot tell the old message format from the new.
    let partial_ok =
        e.partial && f.family == "tpu_compile_hbm_old" && e.family == Family::TpuCompileHbm;
    if !want.is_empty() && !want.contains(&e.family) && !partial_ok {
        errors.push(format!("family: want {} got {:?}", f.family, e.family));
    }
    let figures = [
        ("used", &f.used, e.used_bytes),
        ("limit", &f.limit, e.limit_bytes),
        ("exceeded", &f.exceeded, e.exceeded_bytes),
        ("requested", &f.requested, e.requested_bytes),
        ("free", &f.free, e.free_bytes),
        ("tensorcore", &f.tensorcore, e.tensorcore_bytes),
        ("sparsecore", &f.sparsecore, e.sparsecore_bytes),
    ];
    for (name, want, got) in figures {
        if let Some(w) = want.as_deref().filter(|w| !w.is_empty()) {
            if !close(w, got) {
                errors.push(format!("{name}: want {w} got {got:?}"));
            }
        }
    }
    // The allocation that failed (TensorFlow's tensor, a scoped vmem block) is listed too.
    let failed_one = e.allocations.len() == f.largest_allocations + 1
        && e.allocations.first().is_some_and(|a| {
            e.requested_bytes
                .is_some_and(|r| a.size_bytes == r || a.unpadded_bytes == Some(r))
                // An old TensorFlow tensor printed with its shape alone (no type, no request).
                // (The allocator's request above it rounds the size up.)
                || (e.requested_bytes.is_none_or(|r| r.abs_diff(a.size_bytes) <= (r / 100).max(4096))
                    && a.allocation_type.as_deref() == Some("tensor")
                    && a.shape.as_deref().is_some_and(|s| s.starts_with('[')))
        });
    if e.allocations.len() != f.largest_allocations && !failed_one {
        errors.push(format!(
            "allocations: want {} got {}",
            f.largest_allocations,
            e.allocations.len()
        ));
    }
    if let Some(w) = f.largest_first_size.as_deref().filter(|w| !w.is_empty()) {
        if !close(w, e.allocations.first().map(|a| a.size_bytes)) {
            errors.push(format!(
                "first allocation: want {w} got {:?}",
                e.allocations.first().map(|a| a.size_bytes)
            ));
        }
    }
    let got_space = e
        .memory_space
        .map(|s| format!("{s:?}").to_lowercase())
        .unwrap_or_default();
    // `device` is a GPU's memory in the contract; on a TPU the same message means HBM.
    let want_space = if f.memory_space == "device" && f.backend == "tpu" {
        "hbm"
    } else {
        f.memory_space.as_str()
    };
    let unknown_device = got_space.is_empty() && e.backend.is_none();
    if !want_space.is_empty() && want_space != got_space && !unknown_device {
        errors.push(format!(
            "memory_space: want {} got {got_space}",
            f.memory_space
        ));
    }
    let got_phase = format!("{:?}", e.phase).to_lowercase();
    if !f.phase.is_empty() && f.phase != got_phase {
        errors.push(format!("phase: want {} got {got_phase}", f.phase));
    }
    let got_backend = e
        .backend
        .map(|b| format!("{b:?}").to_lowercase())
        .unwrap_or_default();
    // A figure the text does not state is null, never a guess: only a wrong value fails.
    if !f.backend.is_empty() && !got_backend.is_empty() && f.backend != got_backend {
        errors.push(format!("backend: want {} got {got_backend}", f.backend));
    }
    let got_fw = match e.framework {
        Some(hbm_doctor_log::Framework::Jax) => "jax",
        Some(hbm_doctor_log::Framework::PytorchXla) => "pytorch_xla",
        Some(hbm_doctor_log::Framework::Tensorflow) => "tensorflow",
        Some(hbm_doctor_log::Framework::Pytorch) => "pytorch",
        None => "",
    };
    if matches!(f.framework.as_str(), "jax" | "pytorch_xla" | "tensorflow")
        && !got_fw.is_empty()
        && f.framework != got_fw
    {
        errors.push(format!("framework: want {} got {got_fw}", f.framework));
    }
    errors
}

/// MANIFEST.toml and every `manifest.d/*.toml` (one file per batch of collected posts).
fn all_fixtures() -> Vec<Fixture> {
    let dir = corpus_dir("issues");
    let mut files = vec![dir.join("MANIFEST.toml")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(dir.join("manifest.d"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    more.retain(|p| p.extension().is_some_and(|e| e == "toml"));
    more.sort();
    files.extend(more);
    let mut out = Vec::new();
    for f in files {
        let m: Manifest = toml::from_str(&std::fs::read_to_string(&f).expect("manifest"))
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        out.extend(m.fixture);
    }
    out
}

/// One fixture's verdict: a fixture marked `known_gap` is reported while it fails, and fails
/// once it is read exactly (so the mark is removed).
fn judge(f: &Fixture) -> Result<(), Failed> {
    let errors = check(f);
    match (&f.known_gap, errors.is_empty()) {
        (Some(_), true) => Err(format!(
            "{}: marked known_gap but read exactly now: remove known_gap",
            f.file
        )
        .into()),
        (Some(gap), false) => {
            eprintln!("KNOWN GAP {} ({gap}): {}", f.file, errors.join("; "));
            Ok(())
        }
        (None, false) => {
            Err(format!("{} ({}):\n    {}", f.file, f.family, errors.join("\n    ")).into())
        }
        (None, true) => Ok(()),
    }
}

fn main() {
    let args = Arguments::from_args();
    let fixtures = all_fixtures();
    let count = fixtures.len();
    let mut trials = vec![Trial::test(
        "corpus_holds_at_least_40_real_messages",
        move || {
            if count >= 40 {
                Ok(())
            } else {
                Err(format!("the corpus must hold at least 40 real messages, not {count}").into())
            }
        },
    )];
    trials.extend(
        fixtures
            .into_iter()
            .map(|f| Trial::test(f.file.clone(), move || judge(&f))),
    );
    libtest_mimic::run(&args, trials).exit();
}
