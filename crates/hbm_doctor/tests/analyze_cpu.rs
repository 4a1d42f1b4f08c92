//! `analyze` on real XLA CPU-backend dumps (tests/corpus/cpu, made by its generate.py): layouts
//! without tiles, a multi-module dump of a real training program (init, train step, eval, and
//! the small modules JAX compiles itself), and an SPMD module over 4 host devices. The figures
//! agree with the memory-usage report, the live-range peak and `Compiled.memory_analysis()`.

mod support;

use support::cpu;

use hbm_doctor::commands::analyze::{analyze_files, discover};
use hbm_doctor_analysis::analyze::{AnalyzeOptions, AnalyzeReport, ModuleReport, SpaceReport};
use hbm_doctor_analysis::CauseKind;

fn run(case: &str) -> AnalyzeReport {
    let files = discover(&cpu(case).join("dump")).expect("discover");
    analyze_files(&files, &AnalyzeOptions::default()).expect("analyze")
}

fn meta(case: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(cpu(case).join("meta.json")).expect("meta.json"))
        .expect("json")
}

fn hbm(m: &ModuleReport) -> &SpaceReport {
    m.memory_spaces
        .iter()
        .find(|s| s.color == 0)
        .expect("color 0")
}

fn module<'r>(r: &'r AnalyzeReport, name: &str) -> &'r ModuleReport {
    r.modules
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no module {name}"))
}

/// Every module: exact against the dump's own figures, and no padding without tiles.
fn agrees_with_dump(r: &AnalyzeReport) {
    for m in &r.modules {
        assert_eq!(m.method, "buffer_assignment", "{}", m.name);
        assert!(!m.estimate, "{}", m.name);
        // The live-range peak, time and bytes, recomputed from buffer assignment + ranges.
        assert!(m.xla.live_range_peak_bytes.is_some(), "{}", m.name);
        assert_eq!(
            m.xla.recomputed_peak_time, m.xla.live_range_peak_time,
            "{}",
            m.name
        );
        assert_eq!(
            m.xla.recomputed_peak_bytes, m.xla.live_range_peak_bytes,
            "{}",
            m.name
        );
        for s in &m.memory_spaces {
            // total = the memory-usage report's `Total bytes` of that color.
            let stated = m.xla.report_totals.iter().find(|(c, _)| *c == s.color);
            assert_eq!(
                Some(s.total_bytes),
                stated.map(|(_, t)| *t),
                "{} {}",
                m.name,
                s.space
            );
            assert!(s.peak_bytes <= s.total_bytes, "{}", m.name);
            // CPU layouts have no tiles: nothing is padded.
            assert_eq!(s.padding_bytes, 0, "{}", m.name);
            for b in s.buffers_at_peak.iter().chain(&s.largest_buffers) {
                assert_eq!(b.size_bytes, b.unpadded_bytes, "{} {}", m.name, b.name);
                assert!(!b.layout_shape.contains(":T("), "{}", b.layout_shape);
            }
        }
        // Our physical peak counts parameter/output/constant allocations for the whole program,
        // XLA's live-range peak only from their definition: ours is never below it (no padding
        // on CPU, so the sizes are the same).
        let h = hbm(m);
        let lr = m.xla.live_range_peak_bytes.unwrap_or(0);
        assert!(
            h.peak_bytes >= lr,
            "{}: peak {} < {lr}",
            m.name,
            h.peak_bytes
        );
    }
}

/// The jitted functions named in meta.json: `Compiled.memory_analysis()` of the executable that
/// ran (and was dumped) against our split, exactly.
fn agrees_with_memory_analysis(case: &str, r: &AnalyzeReport) -> usize {
    let meta = meta(case);
    let funcs = meta["functions"].as_object().expect("functions");
    for (f, v) in funcs {
        let name = v["module"].as_str().expect("module");
        let ma = &v["memory_analysis"];
        let h = hbm(module(r, name));
        let get = |k: &str| ma[k].as_u64().unwrap_or_else(|| panic!("{f}: {k}"));
        assert_eq!(h.arguments_bytes, get("argument_size_in_bytes"), "{f}");
        assert_eq!(
            h.outputs_bytes + h.aliased_bytes,
            get("output_size_in_bytes"),
            "{f}"
        );
        assert_eq!(h.aliased_bytes, get("alias_size_in_bytes"), "{f}");
        assert_eq!(h.temp_bytes, get("temp_size_in_bytes"), "{f}");
        // On the CPU backend peak_memory_in_bytes is arguments + outputs - aliased + constants
        // (the temp arena is not in it): exactly the part of our peak that lives throughout.
        assert_eq!(
            h.arguments_bytes + h.outputs_bytes + h.constants_bytes,
            get("peak_memory_in_bytes"),
            "{f}"
        );
        // ... and the rest of our peak is the temp arena's occupancy, within its size.
        let temp_at_peak = h.peak_bytes - (h.arguments_bytes + h.outputs_bytes + h.constants_bytes);
        assert!(temp_at_peak <= h.temp_bytes, "{f}");
    }
    funcs.len()
}

#[test]
fn mlp_training_program_several_modules() {
    let r = run("mlp_train");
    let names: Vec<&str> = r.modules.iter().map(|m| m.name.as_str()).collect();
    for want in ["jit_init", "jit_train_step", "jit_eval_step"] {
        assert!(names.contains(&want), "{names:?}");
    }
    assert!(r.modules.len() >= 4, "{names:?}");
    agrees_with_dump(&r);
    assert_eq!(agrees_with_memory_analysis("mlp_train", &r), 3);

    // The train step donates params and momentum: aliased, and no_donation stays silent.
    let train = module(&r, "jit_train_step");
    let h = hbm(train);
    assert!(h.aliased_bytes * 10 > h.arguments_bytes * 8, "{h:?}");
    assert!(!train
        .causes
        .iter()
        .any(|c| c.cause == CauseKind::NoDonation));
    // The eval step does not donate (its outputs are a scalar pair): nothing to report either.
    assert!(!module(&r, "jit_eval_step")
        .causes
        .iter()
        .any(|c| c.cause == CauseKind::NoDonation));
    // The diagnosis speaks about the largest module (init holds the PRNG arena).
    assert!(
        r.diagnosis.summary.starts_with("jit_init:"),
        "{}",
        r.diagnosis.summary
    );
    // Source lines resolve to the generator through the stack-frame tables (the largest temp
    // is a layout copy without metadata; the next ones come from the user's code).
    let with_source: Vec<_> = h
        .buffers_at_peak
        .iter()
        .filter(|b| b.kind == "temp" && b.source.is_some())
        .collect();
    assert!(!with_source.is_empty());
    assert!(
        with_source.iter().all(|b| b
            .source
            .as_deref()
            .is_some_and(|s| s.starts_with("generate.py:"))),
        "{with_source:?}"
    );
    // `--module` style selection by key works on CPU file names (`cpu_after_optimizations`).
    let files = discover(&cpu("mlp_train").join("dump")).expect("discover");
    assert!(files
        .iter()
        .all(|f| f.key.ends_with("cpu_after_optimizations") && f.live_range.is_some()));
}

#[test]
fn sharded_cpu_module() {
    let r = run("sharded_mlp");
    assert_eq!(r.modules.len(), 1);
    let m = &r.modules[0];
    assert_eq!(m.name, "jit_sgd_step");
    assert_eq!(m.num_partitions, 4);
    agrees_with_dump(&r);
    assert_eq!(agrees_with_memory_analysis("sharded_mlp", &r), 1);
    // Per-device figures: w1 f32[1024,2048] is split over 'model' (2), w2 f32[2048,1024] is
    // replicated, x f32[512,1024] is split over 'data' (2).
    let h = hbm(m);
    let param = |shape: &str| {
        h.buffers_at_peak
            .iter()
            .any(|b| b.kind == "parameter" && b.shape == shape)
    };
    assert!(param("f32[1024,1024]") && param("f32[2048,1024]") && param("f32[256,1024]"));
    assert_eq!(h.arguments_bytes, (4 << 20) + (8 << 20) + (1 << 20));
}
