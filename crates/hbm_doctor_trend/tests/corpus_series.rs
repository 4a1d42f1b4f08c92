//! The trend detector on every series of tests/corpus/trend, one test per file: series users
//! posted in public issues (MANIFEST.toml names each source and what a careful reader takes from
//! it) and recordings of real JAX runs.

use hbm_doctor_trend::detect::Params;
use hbm_doctor_trend::reader::Collected;
use hbm_doctor_trend::report::report;
use std::path::PathBuf;

fn corpus_trend() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/trend")
}

/// The report of one series as JSON, and the exit code `hbm-doctor trend` gives it (1 for a leak).
fn trend(name: &str) -> (serde_json::Value, i32) {
    let bytes = std::fs::read(corpus_trend().join(name)).expect("series");
    let mut c = Collected::default();
    hbm_doctor_trend::read_all(&mut c, "", name, &bytes);
    assert!(c.errors.is_empty(), "{name}: {:?}", c.errors);
    let rep = report(&c, &Params::default());
    let v = serde_json::to_value(&rep).expect("json");
    (v, i32::from(rep.any_leak()))
}

fn causes(h: &serde_json::Value) -> Vec<String> {
    h["causes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["cause"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn jax_25184_rss_staircase_is_suspected_not_judged() {
    let (v, code) = trend("jax_25184_usage_kb.log");
    assert_eq!(code, 0);
    let s = &v["series"][0];
    assert_eq!(s["verdict"], "insufficient_data");
    assert_eq!(s["samples"], 62);
    assert_eq!(s["leak_suspected"], true);
    assert_eq!(s["last_bytes"], 462_352u64 * 1024);
    let r = s["reason"].as_str().expect("reason");
    assert!(r.contains("62 readings rise"), "{r}");
    // ~2 MB per reading (Sen's slope; 132 MB over 61 readings is 2.2 MB).
    assert!(r.contains("1.96M per reading"), "{r}");
}

#[test]
fn jax_5927_host_memory_rises_every_reading() {
    let (v, code) = trend("jax_5927_memory_used_gb.log");
    assert_eq!(code, 0);
    let s = &v["series"][0];
    assert_eq!(s["verdict"], "insufficient_data");
    assert_eq!(s["samples"], 10);
    assert_eq!(s["leak_suspected"], true);
    // 13.506678784 read in the file name's unit (GiB).
    let last = s["last_bytes"].as_f64().expect("last");
    assert!(
        (last - 13.506_678_784 * 1024f64.powi(3)).abs() < 2.0,
        "{last}"
    );
}

#[test]
fn numpyro_539_five_readings_are_too_few() {
    let (v, _) = trend("numpyro_539_gpu_memory_mb.log");
    let s = &v["series"][0];
    assert_eq!(s["verdict"], "insufficient_data");
    assert_eq!(s["samples"], 5);
    assert_eq!(s["leak_suspected"], false);
    assert_eq!(s["last_bytes"], (2321.94f64 * 1048576.0) as u64);
}

#[test]
fn pytorch_xla_3545_tpu_and_host_readings() {
    let (v, _) = trend("pytorch_xla_3545_blocks.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 3);
    assert_eq!(s["last_bytes"], 12_415u64 * 1_048_576);
    assert_eq!(v["hosts"][0]["host_rss_bytes"], 165_231_292_579u64);
}

#[test]
fn pytorch_xla_4863_sigkill_is_host_oom() {
    let (v, _) = trend("pytorch_xla_4863_memory_gb.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 5);
    assert_eq!(s["first_step"], 0);
    assert_eq!(s["last_step"], 1);
    let h = &v["hosts"][0];
    assert_eq!(h["ending"], "host_oom");
    assert_eq!(causes(h), ["host_oom"]);
}

#[test]
fn pytorch_xla_1368_more_compilations_than_steps() {
    let (v, code) = trend("pytorch_xla_1368_metrics.txt");
    assert_eq!(code, 0);
    assert_eq!(v["framework"], "pytorch_xla");
    let h = &v["hosts"][0];
    assert_eq!(causes(h), ["recompilation"]);
    let ev = h["causes"][0]["evidence"].as_str().expect("evidence");
    assert!(ev.starts_with("92 compilations by step 9"), "{ev}");
}

#[test]
fn pytorch_xla_3354_eleven_compilations_are_fine() {
    let (v, code) = trend("pytorch_xla_3354_metrics.txt");
    assert_eq!(code, 0);
    assert_eq!(v["framework"], "pytorch_xla");
    for h in v["hosts"].as_array().expect("hosts") {
        assert!(causes(h).is_empty(), "{h}");
    }
}

#[test]
fn real_jax_cpu_leak_is_a_leak_with_its_rate() {
    let (v, code) = trend("jax_cpu_leak.jsonl");
    assert_eq!(code, 1);
    let s = &v["series"][0];
    assert_eq!(s["verdict"], "leak");
    assert_eq!(s["host"], "cpu-0");
    // One f32[256] (1 KiB) kept per step.
    let g = s["growth_bytes_per_1k_steps"].as_i64().expect("growth");
    assert!((g - 1_024_000).abs() < 30_000, "{g}");
    let oom = s["oom_step_forecast"].as_u64().expect("forecast");
    // (16 MiB - ceiling ~3.2 MiB) / 1 KiB per step after step 2995.
    assert!((15_000..17_500).contains(&oom), "{oom}");
    assert_eq!(s["causes"][0]["cause"], "memory_leak");
    assert!(s["oom_time_forecast"]
        .as_str()
        .is_some_and(|t| t.starts_with("2026-11-21T")));
}

#[test]
fn real_jax_cpu_clean_is_stable() {
    let (v, code) = trend("jax_cpu_clean.jsonl");
    assert_eq!(code, 0);
    assert_eq!(v["series"][0]["verdict"], "stable");
    assert!(v["series"][0]["oom_step_forecast"].is_null());
    assert!(v["diverging"].as_array().is_some_and(Vec::is_empty));
}

/// tensorflow/tensorflow#46475: `<epoch> <memory>` lines with no key and no unit, a leak the
/// thread traced (the readings rise ~58 per epoch for 50 epochs).
#[test]
fn tensorflow_46475_bare_columns_rise() {
    let (v, _) = trend("posted/tensorflow-tensorflow-46475.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 50);
    assert_eq!(s["leak_suspected"], true);
    assert_eq!(s["last_bytes"], 7064u64 << 20);
    assert!(s["source"]
        .as_str()
        .is_some_and(|t| t.contains("bare numbers")));
}

/// uxlfoundation/oneDNN#489: a primitive cache filling up (the maintainer: bounded), read from
/// `memory growth (kb)` lines: the rise slows, so no leak is suspected; the summary line under
/// another key is a series of its own.
#[test]
fn onednn_489_cache_rise_slows_down() {
    let (v, _) = trend("posted/uxlfoundation-oneDNN-489.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 9);
    assert_eq!(s["leak_suspected"], false);
    assert!(
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains("slow down")),
        "{s}"
    );
    assert_eq!(v["series"][1]["device"], "0 (memory)");
    let (v, _) = trend("posted/uxlfoundation-oneDNN-489-2.log");
    assert_eq!(v["series"][0]["samples"], 8);
    assert_eq!(v["series"][0]["leak_suspected"], false);
}

/// donnyyou/torchcv#159: one high first iteration (cudnn benchmark), then flat.
#[test]
fn torchcv_159_first_iteration_peak_then_flat() {
    let (v, _) = trend("posted/donnyyou-torchcv-159.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 12);
    assert_eq!(s["leak_suspected"], false);
}

/// Posted formats of batch series3, figures as printed: nvidia-smi's `used / total` cell after
/// `Epoch N/10:`, `memory_allocated` / `memory_reserved` lines in GiB without a unit (two
/// series), `ALLOCATED:` in GiB without a unit, Lasagne's `memory use:` under `Epoch N of 500`,
/// a markdown table of `usedMiB/totalMiB` with a row that holds no reading.
#[test]
fn series3_formats_read_with_their_figures() {
    let gib = |v: f64| (v * (1u64 << 30) as f64) as u64;
    let (v, _) = trend("posted/lhnguyen102-cuTAGI-71.log");
    let s = &v["series"][0];
    assert_eq!(
        (s["samples"].as_u64(), s["last_step"].as_u64()),
        (Some(4), Some(3))
    );
    assert_eq!(s["last_bytes"], 13683u64 << 20);
    assert_eq!(s["limit_bytes"], 16384u64 << 20);
    assert_eq!(
        s["leak_suspected"], true,
        "each reading higher, 3149 to 13683 MiB"
    );
    let (v, _) = trend("posted/huggingface-sentence-transformers-3204.log");
    assert_eq!(v["series"][0]["device"], "0");
    assert_eq!(v["series"][0]["last_bytes"], gib(1.2575721740722656));
    assert_eq!(v["series"][1]["device"], "0 (memory_reserved)");
    assert_eq!(v["series"][1]["last_bytes"], gib(1.33984375));
    assert!(v["series"][0]["source"]
        .as_str()
        .is_some_and(|t| t.contains("GiB, by their size")));
    let (v, _) = trend("posted/pytorch-pytorch-16655.log");
    assert_eq!(v["series"][0]["last_bytes"], gib(1.005));
    assert_eq!(v["series"][0]["leak_suspected"], false);
    let (v, _) = trend("posted/Theano-Theano-6162.log");
    let s = &v["series"][0];
    assert_eq!(
        (s["samples"].as_u64(), s["last_step"].as_u64()),
        (Some(4), Some(500))
    );
    assert_eq!(s["last_bytes"], (1232.207 * (1u64 << 20) as f64) as u64);
    let (v, _) = trend("posted/NVIDIA-DALI-328.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 3);
    assert_eq!(s["limit_bytes"], 12196u64 << 20);
    assert_eq!(
        s["leak_suspected"], false,
        "9713 to 11133 MiB: +15%, a cache growing"
    );
}

/// Readings told in sentences (series9, series10) are read when the post gives no other: two
/// readings are too few to judge, but their figures are reported.
#[test]
fn readings_told_in_sentences() {
    let gib = |v: f64| (v * (1u64 << 30) as f64) as u64;
    // `Initially, the used memery is about 4.8GB. After about 1000 iters, ... up to 9.2GB.`
    let (v, _) = trend("posted/yuleiniu-vc-1.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 2);
    assert_eq!(s["last_bytes"], gib(9.2));
    assert_eq!(s["verdict"], "insufficient_data");
    // An arrow between two readings (`~6.0 → 6.57 GiB`); `==` quoted in a sentence is not code.
    let (v, _) = trend("posted/vllm-project-vllm-44490.log");
    assert_eq!(v["series"][0]["samples"], 2);
    assert_eq!(v["series"][0]["last_bytes"], gib(6.57));
    let (v, _) = trend("posted/raullenchai-Rapid-MLX-1024.log");
    assert_eq!(
        v["series"][0]["samples"], 2,
        "`~5 GB per cluster` is a rate"
    );
    assert_eq!(v["series"][0]["last_bytes"], gib(32.7));
    // `7000+MiB ... 10000+MiB`.
    let (v, _) = trend("posted/ppengtang-pcl.pytorch-32.log");
    assert_eq!(v["series"][0]["last_bytes"], 10000u64 << 20);
}

/// Under a dozen readings a rise of a few hundredths of the level is not called, unless every
/// one of eight or more is higher than the one before (a sign test's p < 0.01).
#[test]
fn every_reading_higher_is_suspected_however_small() {
    let (v, _) = trend("posted/pytorch-pytorch-96937.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 10);
    assert_eq!(
        s["leak_suspected"], true,
        "+0.5% over 10 readings, each higher"
    );
    // Six readings each higher by 0.1 MB (headroom#211, the thread's "no drift"): not called.
    let (v, _) = trend("posted/headroomlabs-ai-headroom-211-2.log");
    assert_eq!(v["series"][0]["leak_suspected"], false);
}

/// The unit said in the key, between the step and the colon (`Memory usage after 3 run(s) (in
/// MiB): 993.359`; tensorflow#63701): read in it, and a rise that slows down is not a leak.
#[test]
fn the_unit_said_in_the_key() {
    let (v, _) = trend("posted/tensorflow-tensorflow-63701.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 22);
    assert_eq!(s["first_step"], 0);
    assert_eq!(s["leak_suspected"], false, "the rise slows down");
    let (v, _) = trend("posted/tensorflow-tensorflow-63701-2.log");
    assert_eq!(v["series"][0]["samples"], 7);
    assert_eq!(
        v["series"][0]["last_bytes"],
        (5611.828 * (1u64 << 20) as f64) as u64
    );
}

#[test]
fn a_device_that_holds_nothing_leaves_the_host_series() {
    // `Allocated: 0.00 MB, Reserved: 0.00 MB, CPU: 955.15 MB` per epoch: the program runs on
    // the CPU; its host memory is the series, and it rises at every epoch (the thread's leak).
    let (v, _) = trend("posted/pyg-team-pytorch_geometric-10356.log");
    let s = &v["series"][0];
    assert_eq!(v["series"].as_array().map(Vec::len), Some(1));
    assert_eq!(s["device"], "host RSS");
    assert_eq!(s["samples"], 20);
    assert_eq!(s["last_bytes"], (6550.65 * 1_048_576.0) as u64);
    assert_eq!(s["leak_suspected"], true);
}

#[test]
fn a_table_aligned_with_spaces() {
    // `req  resident   delta` / `  10    22.0G    +1.5G`: the resident column, not the change.
    let (v, _) = trend("posted/ollama-ollama-17924.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 4);
    assert_eq!(s["last_bytes"], (24.9 * 1_073_741_824.0) as u64);
    assert_eq!(s["leak_suspected"], false, "four readings are too few");
}

#[test]
fn one_line_of_numbers_is_a_run_of_readings() {
    // faiss#2996: `0.34 0.57 0.79 ... 2.37`, RSS in GiB printed with end=' ': ten readings of
    // one series, not ten series of one reading.
    let (v, _) = trend("posted/facebookresearch-faiss-2996.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 10);
    assert_eq!(s["last_bytes"], (2.37 * 1_073_741_824.0) as u64);
    assert_eq!(
        s["leak_suspected"], true,
        "each reading higher than the last"
    );
}

#[test]
fn a_list_pasted_in_backticks() {
    // faiss#3810: `` `[0.49, 0.82, ..., 5.28]` `` without the fix, `[0.52, 0.7, ...]` with it.
    let (v, _) = trend("posted/facebookresearch-faiss-3810.log");
    assert_eq!(v["series"][0]["samples"], 20);
    assert_eq!(v["series"][0]["leak_suspected"], true);
    let (v, _) = trend("posted/facebookresearch-faiss-3810-2.log");
    assert_eq!(v["series"][0]["samples"], 20);
    assert_eq!(
        v["series"][0]["leak_suspected"], false,
        "flat after the first"
    );
}

#[test]
fn a_markdown_table_whose_header_names_the_unit() {
    // marin#6908: `| step | max current (GB) | max peak (GB) | % cap |`, rows of bare numbers.
    let (v, _) = trend("posted/marin-community-marin-6908.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 7);
    assert_eq!(s["first_step"], 2735);
    assert_eq!(s["last_step"], 3000);
    assert_eq!(s["last_bytes"], (249.9 * 1_073_741_824.0) as u64);
    assert_eq!(s["leak_suspected"], true);
}

/// A series added to the corpus comes with its test here.
#[test]
fn every_series_in_the_corpus_has_a_test() {
    let tested = [
        "jax_25184_usage_kb.log",
        "jax_5927_memory_used_gb.log",
        "jax_cpu_clean.jsonl",
        "jax_cpu_leak.jsonl",
        "numpyro_539_gpu_memory_mb.log",
        "pytorch_xla_1368_metrics.txt",
        "pytorch_xla_3354_metrics.txt",
        "pytorch_xla_3545_blocks.log",
        "pytorch_xla_4863_memory_gb.log",
    ];
    let mut files: Vec<String> = std::fs::read_dir(corpus_trend())
        .expect("corpus")
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "MANIFEST.toml" && !n.ends_with(".md"))
        .collect();
    files.sort();
    assert_eq!(files, tested, "a series without a test in this file");
}

#[test]
fn two_readings_far_apart_are_a_suspicion_not_a_verdict() {
    // pytorch#4661: nvidia-smi after a first and a second run, 2417MiB then 4417MiB (1.8x):
    // the thread settled a leak. Two readings cannot judge one, but they can suspect it.
    let (v, _) = trend("posted/pytorch-pytorch-4661.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 2);
    assert_eq!(s["verdict"], "insufficient_data");
    assert_eq!(s["leak_suspected"], true);
    // A second reading under 1.5x the first is no suspicion (vllm#44490: 6.0 -> 6.57 GiB).
    let (v, _) = trend("posted/vllm-project-vllm-44490.log");
    assert_eq!(v["series"][0]["leak_suspected"], false);
}

#[test]
fn a_stepwise_climb_read_before_and_after_each_step() {
    // jax#11448: `Resident memory: 115 MB`, `1171 MB` before and after the first call, `1171`,
    // `2196` around the second: level between its rises, never lower, 19x in all. A leak
    // (buffers kept by a tracing cache), suspected from four readings.
    let (v, _) = trend("posted/jax-ml-jax-11448.log");
    let s = &v["series"][0];
    assert_eq!(s["samples"], 4);
    assert_eq!(s["leak_suspected"], true);
}
