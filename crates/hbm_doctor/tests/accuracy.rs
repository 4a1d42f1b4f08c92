//! The accuracy harness: every labelled real case in `tests/corpus` is diagnosed and scored the
//! way a classifier is evaluated. `bash scripts/accuracy.sh` prints the full report.
//!
//! Sets:
//! - `posts`: messages users posted in public issues (`tests/corpus/issues`), labelled in
//!   `tests/corpus/issues/labels/*.toml` from the thread's own resolution (docs/accuracy.md).
//! - `compiler_log`, `compiler_exception`: real TPU compiler failures (`tests/corpus/tpu`), the
//!   libtpu log and the Python exception, labelled in `meta.json` by the fix that was compiled
//!   and measured (the `-fixed` twin).
//! - `compiler_dump`: `analyze` on those cases' dumps (with the generation as `--target`).
//! - `compiler_joined`: `explain stderr.log --dump dump/`.
//! - `gpu_log`: real GPU failures (`tests/corpus/gpu`: PyTorch, JAX, CuPy, Numba programs run on
//!   an H100 until they failed), `explain stderr.log`, labelled in `meta.json` by the fixed twin
//!   that ran to the end.
//!
//! Per set: category accuracy, cause@1 (the first cause is one the label accepts), cause@3 (one
//! of the first three is), over the cases whose label names causes. The figures may only rise:
//! the test fails when one falls below the figure recorded in ACCURACY.md's ratchet block.

use hbm_doctor::commands::analyze::{analyze_files, budget_options, discover};
use hbm_doctor_analysis::rank::RankInput;
use hbm_doctor_analysis::{explain_with_warnings, join::join_dump};
use hbm_doctor_log::scan_all_with_warnings;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[derive(Debug, Clone, Deserialize)]
struct Label {
    file: String,
    #[serde(default)]
    source: String,
    category: String,
    #[serde(default)]
    category_also: Vec<String>,
    #[serde(default)]
    causes: Vec<String>,
    #[serde(default)]
    basis: String,
    #[serde(default)]
    stage: String,
}

#[derive(Debug, Deserialize)]
struct LabelFile {
    #[serde(default)]
    label: Vec<Label>,
}

/// One scored case.
#[derive(Debug)]
struct Case {
    set: &'static str,
    label: Label,
    category: String,
    causes: Vec<String>,
    /// For a dump with a compiled fixed twin: the savings the label's first cause predicts (its
    /// what-if) and what the twin measured (peak before minus the twin's peak).
    savings: Option<(u64, u64)>,
    /// What explain's re-ranker saw (features, candidates), for `scripts/train_ranker.py`.
    rank: Option<RankInput>,
    /// The group the case belongs to for cross-validation: the label file (a batch of posts,
    /// collected together) or the generated corpus.
    group: String,
    /// The stage explain stated, in the labels' vocabulary ([`stage_of`]).
    stage: &'static str,
}

impl Case {
    /// A post the tool takes for an OOM whose label states the stage it failed in.
    fn stage_known(&self) -> bool {
        self.category != "none" && !matches!(self.label.stage.as_str(), "" | "unknown")
    }

    fn category_ok(&self) -> bool {
        self.category == self.label.category
            || self.label.category_also.contains(&self.category)
            // labelling.md: a runtime device OOM is runtime_allocation, "a sub-class the figures
            // support (e.g. one tensor over half the limit) is acceptable too".
            || (self.label.category == "runtime_allocation"
                && self.category == "single_large_allocation")
    }
    fn hit(&self, k: usize) -> bool {
        self.causes
            .iter()
            .take(k)
            .any(|c| self.label.causes.contains(c))
    }
}

const SETS: [&str; 6] = [
    "posts",
    "compiler_log",
    "compiler_exception",
    "compiler_dump",
    "compiler_joined",
    "gpu_log",
];

/// Category and cause names of an explain run on `text` (events and warnings, as the CLI reads
/// them); "none" when no fatal event is found.
fn explain_text(text: &[u8]) -> (String, Vec<String>, Option<RankInput>, &'static str) {
    let (events, warnings) = scan_all_with_warnings(text);
    if !events.iter().any(|e| e.fatal) {
        return ("none".into(), Vec::new(), None, "unknown");
    }
    let report = explain_with_warnings(events, warnings);
    let d = report.diagnosis.expect("a diagnosis when events exist");
    let stage = report.events.get(d.event).map_or("unknown", stage_of);
    (
        d.category.as_str().to_string(),
        d.causes
            .iter()
            .map(|c| c.cause.as_str().to_string())
            .collect(),
        d.rank_input,
        stage,
    )
}

/// The stage of the labelling vocabulary (docs/accuracy.md) that explain's event states: the
/// compiler's phase, the stage read from the traceback and the text, and for a training step the
/// step it failed at (`train`: a step, which one unstated).
fn stage_of(e: &hbm_doctor_log::Event) -> &'static str {
    use hbm_doctor_log::{Phase, Stage};
    if e.phase == Phase::Compile {
        return "compile";
    }
    match e.stage {
        Some(Stage::Init) => "init",
        Some(Stage::Restore) => "restore",
        Some(Stage::Eval) => "eval",
        Some(Stage::CheckpointSave) => "checkpoint",
        Some(Stage::Generation) => "generation",
        Some(Stage::Train) => match e.step {
            Some(0 | 1) => "first_step",
            Some(_) => "step_n",
            None => "train",
        },
        None => match e.step {
            Some(n) if n > 1 => "step_n",
            _ => "unknown",
        },
    }
}

/// Does the stage explain stated agree with the label's? (`train` agrees with either step.)
/// Loading a model's weights is both its creation and a restore: `init` and `restore` agree.
fn stage_agrees(got: &str, want: &str) -> bool {
    got == want
        || (got == "train" && matches!(want, "first_step" | "step_n"))
        || (matches!(got, "init" | "restore") && matches!(want, "init" | "restore"))
}

fn post_cases() -> Vec<Case> {
    let dir = root().join("tests/corpus/issues/labels");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
    files.sort();
    let mut cases = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("accuracy harness input");
        let parsed: LabelFile =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for label in parsed.label {
            let path = root().join("tests/corpus/issues").join(&label.file);
            let text = std::fs::read(&path).unwrap_or_else(|e| {
                panic!("{} (labelled in {}): {e}", path.display(), f.display())
            });
            let (category, causes, rank, stage) = explain_text(&text);
            let group = f
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            cases.push(Case {
                set: "posts",
                label,
                category,
                causes,
                savings: None,
                rank,
                group,
                stage,
            });
        }
    }
    cases
}

/// The case folders of a generated corpus (those with a `meta.json`), sorted: path, name, meta.
fn case_dirs(rel: &str) -> Vec<(PathBuf, String, serde_json::Value)> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join(rel))
        .expect("accuracy harness input")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("meta.json").is_file())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|d| {
            let name = d
                .file_name()
                .expect("accuracy harness input")
                .to_string_lossy()
                .to_string();
            let meta = serde_json::from_str(
                &std::fs::read_to_string(d.join("meta.json")).expect("accuracy harness input"),
            )
            .expect("accuracy harness input");
            (d, name, meta)
        })
        .collect()
}

/// The GPU cases: each broken program's log, labelled by its fixed twin (meta.json `label`).
fn gpu_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (d, name, meta) in case_dirs("tests/corpus/gpu") {
        let Some(mut label) = meta_label(&name, &meta) else {
            continue;
        };
        label.source = "tests/corpus/gpu/generate.py".into();
        label.stage = meta["label"]["stage"].as_str().unwrap_or("").to_string();
        let log = std::fs::read(d.join("stderr.log")).expect("accuracy harness input");
        let (category, causes, rank, stage) = explain_text(&log);
        cases.push(Case {
            set: "gpu_log",
            label,
            category,
            causes,
            savings: None,
            rank,
            group: format!("gpu/{name}"),
            stage,
        });
    }
    cases
}

fn meta_label(case: &str, meta: &serde_json::Value) -> Option<Label> {
    let l = meta.get("label")?;
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    Some(Label {
        file: case.to_string(),
        source: "tests/corpus/tpu/generate.py".into(),
        category: l["category"].as_str()?.to_string(),
        category_also: strings(&l["category_also"]),
        causes: strings(&l["causes"]),
        basis: l["basis"].as_str().unwrap_or("").to_string(),
        stage: "compile".into(),
    })
}

/// The generation a topology such as `v5e:2x2` names, as `--target` takes it.
fn generation(topology: &str) -> &str {
    topology.split(':').next().unwrap_or(topology)
}

fn compiler_cases() -> Vec<Case> {
    let dir = root().join("tests/corpus/tpu");
    let mut cases = Vec::new();
    for (d, name, meta) in case_dirs("tests/corpus/tpu") {
        let Some(label) = meta_label(&name, &meta) else {
            continue;
        };
        let log = std::fs::read(d.join("stderr.log")).unwrap_or_default();
        let (category, causes, rank, stage) = explain_text(&log);
        cases.push(Case {
            set: "compiler_log",
            label: label.clone(),
            category,
            causes,
            savings: None,
            rank,
            group: format!("tpu/{name}"),
            stage,
        });
        if let Ok(exc) = std::fs::read(d.join("exception.txt")) {
            let (category, causes, rank, stage) = explain_text(&exc);
            // The exception alone is a headline: labelling.md's category for a headline without
            // its listing is `unknown`.
            let mut label = label.clone();
            if !String::from_utf8_lossy(&exc).contains("Largest program allocations")
                && label.category != "none"
            {
                label.category_also.push("unknown".into());
            }
            cases.push(Case {
                set: "compiler_exception",
                label,
                category,
                causes,
                savings: None,
                rank,
                group: format!("tpu/{name}"),
                stage,
            });
        }
        let dump = d.join("dump");
        if dump.is_dir() {
            // The limit the compile ran against (a deviceless v4 compile sees one TensorCore),
            // else the generation's usable HBM.
            let topology = meta["topology"].as_str().unwrap_or("");
            // (Only an HBM limit: a vmem failure's limit is the kernel's scoped memory.)
            let limit = meta["figures"]["limit"].as_str().filter(|_| {
                meta["figures"]["oom_memory_space"]
                    .as_str()
                    .unwrap_or("hbm")
                    == "hbm"
            });
            let fixed = meta["label"]["fixed"]
                .as_str()
                .map(|f| dir.join(f))
                .filter(|f| {
                    f.join("dump").is_dir()
                        && std::fs::read_to_string(f.join("meta.json"))
                            .ok()
                            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                            .is_some_and(|m| m["topology"] == meta["topology"])
                });
            cases.push(analyze_case(
                &dump,
                generation(topology),
                limit,
                fixed.as_deref(),
                label.clone(),
            ));
            cases.push(joined_case(&log, &dump, label));
        }
    }
    cases
}

fn hbm_peak(report: &hbm_doctor_analysis::analyze::AnalyzeReport) -> u64 {
    report
        .modules
        .iter()
        .filter_map(|m| m.memory_spaces.iter().find(|s| s.color == 0))
        .map(|s| s.peak_bytes)
        .max()
        .unwrap_or(0)
}

fn analyze_case(
    dump: &Path,
    target: &str,
    limit: Option<&str>,
    fixed: Option<&Path>,
    label: Label,
) -> Case {
    let files = discover(dump).expect("accuracy harness input");
    let opts = match limit {
        Some(l) => budget_options(Some(l), None),
        None => budget_options(None, Some(target)),
    }
    .unwrap_or_default();
    let report = analyze_files(&files, &opts).expect("accuracy harness input");
    let d = &report.diagnosis;
    let category = if d.fits == Some(true) {
        "none".to_string()
    } else {
        d.category.as_str().to_string()
    };
    let savings = fixed.and_then(|f| {
        let first = label.causes.first()?;
        let predicted = d
            .causes
            .iter()
            .find(|c| c.cause.as_str() == first)?
            .savings_bytes?;
        let files = discover(&f.join("dump")).ok()?;
        let twin = analyze_files(&files, &Default::default()).ok()?;
        let measured = hbm_peak(&report).saturating_sub(hbm_peak(&twin));
        (measured > 0).then_some((predicted, measured))
    });
    Case {
        set: "compiler_dump",
        label,
        category,
        causes: d
            .causes
            .iter()
            .map(|c| c.cause.as_str().to_string())
            .collect(),
        savings,
        rank: None,
        group: "tpu".into(),
        stage: "compile",
    }
}

fn joined_case(log: &[u8], dump: &Path, label: Label) -> Case {
    let (events, warnings) = scan_all_with_warnings(log);
    let (category, causes) = if events.iter().any(|e| e.fatal) {
        let mut report = explain_with_warnings(events, warnings);
        let files = discover(dump).expect("accuracy harness input");
        let analysis = analyze_files(&files, &Default::default()).expect("accuracy harness input");
        join_dump(&mut report, &analysis);
        let d = report.diagnosis.expect("accuracy harness input");
        (
            d.category.as_str().to_string(),
            d.causes
                .iter()
                .map(|c| c.cause.as_str().to_string())
                .collect(),
        )
    } else {
        ("none".to_string(), Vec::new())
    };
    Case {
        set: "compiler_joined",
        label,
        category,
        causes,
        savings: None,
        rank: None,
        group: "tpu".into(),
        stage: "compile",
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Score {
    n: usize,
    category: usize,
    with_causes: usize,
    at1: usize,
    at3: usize,
    /// Posts whose label states a stage (not `unknown`), and those explain states rightly.
    stage_n: usize,
    stage_right: usize,
}

impl Score {
    fn rate(num: usize, den: usize) -> f64 {
        if den == 0 {
            0.0
        } else {
            num as f64 / den as f64
        }
    }
    fn figures(&self) -> Vec<(&'static str, f64)> {
        let mut f = vec![
            ("category", Self::rate(self.category, self.n)),
            ("cause@1", Self::rate(self.at1, self.with_causes)),
            ("cause@3", Self::rate(self.at3, self.with_causes)),
        ];
        if self.stage_n > 0 {
            f.push(("stage", Self::rate(self.stage_right, self.stage_n)));
        }
        f
    }
}

fn score(cases: &[Case]) -> BTreeMap<&'static str, Score> {
    let mut out: BTreeMap<&'static str, Score> = BTreeMap::new();
    for c in cases {
        let s = out.entry(c.set).or_default();
        s.n += 1;
        s.category += c.category_ok() as usize;
        if !c.label.causes.is_empty() {
            s.with_causes += 1;
            s.at1 += c.hit(1) as usize;
            s.at3 += c.hit(3) as usize;
        }
        if c.set == "posts" && c.stage_known() {
            s.stage_n += 1;
            s.stage_right += stage_agrees(c.stage, &c.label.stage) as usize;
        }
    }
    out
}

/// The stage of the failure (the traceback's phase, issue 10's evidence), on the posts whose
/// label states one: how often explain states it, how often rightly, and the confusion.
fn stage_report(cases: &[Case]) -> String {
    let mut out = String::new();
    let known: Vec<&Case> = cases
        .iter()
        .filter(|c| c.set == "posts" && c.stage_known())
        .collect();
    let stated = known.iter().filter(|c| c.stage != "unknown").count();
    let right = known
        .iter()
        .filter(|c| stage_agrees(c.stage, &c.label.stage))
        .count();
    let wrong_stated = cases
        .iter()
        .filter(|c| c.set == "posts" && c.stage != "unknown")
        .filter(|c| !matches!(c.label.stage.as_str(), "" | "unknown"))
        .filter(|c| !stage_agrees(c.stage, &c.label.stage))
        .count();
    let _ = writeln!(
        out,
        "\nStage, posts whose label states one ({}): stated {} ({:.1}%), right {} ({:.1}%), stated wrongly {}",
        known.len(),
        stated,
        Score::rate(stated, known.len()) * 100.0,
        right,
        Score::rate(right, known.len()) * 100.0,
        wrong_stated
    );
    let mut pairs: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for c in &known {
        *pairs.entry((c.label.stage.as_str(), c.stage)).or_default() += 1;
    }
    for ((want, got), n) in pairs {
        let mark = if stage_agrees(got, want) { " " } else { "x" };
        let _ = writeln!(out, "  {mark} {want:<12} -> {got:<12} {n}");
    }
    if std::env::var_os("HBM_DOCTOR_STAGE_MISSES").is_some() {
        for c in known
            .iter()
            .filter(|c| !stage_agrees(c.stage, &c.label.stage))
        {
            let _ = writeln!(
                out,
                "  stage-miss {} want {} got {}",
                c.label.file, c.label.stage, c.stage
            );
        }
    }
    out
}

fn report(cases: &[Case], scores: &BTreeMap<&'static str, Score>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Accuracy (labels: docs/accuracy.md)\n");
    let _ = writeln!(
        out,
        "{:<20} {:>5} {:>16} {:>16} {:>16}",
        "set", "cases", "category", "cause@1", "cause@3"
    );
    for set in SETS {
        let Some(s) = scores.get(set) else {
            let _ = writeln!(out, "{set:<20} {:>5}  (no labelled case)", 0);
            continue;
        };
        let cell = |num: usize, den: usize| {
            format!(
                "{:5.1}% {:>3}/{:<3}",
                Score::rate(num, den) * 100.0,
                num,
                den
            )
        };
        let _ = writeln!(
            out,
            "{set:<20} {:>5} {:>16} {:>16} {:>16}",
            s.n,
            cell(s.category, s.n),
            cell(s.at1, s.with_causes),
            cell(s.at3, s.with_causes)
        );
    }
    let _ = write!(out, "{}", stage_report(cases));
    for set in SETS {
        let in_set: Vec<&Case> = cases.iter().filter(|c| c.set == set).collect();
        if in_set.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "\nConfusion of categories, {set} (rows: label, columns: predicted)"
        );
        let mut labels: Vec<&str> = in_set.iter().map(|c| c.label.category.as_str()).collect();
        let mut preds: Vec<&str> = in_set.iter().map(|c| c.category.as_str()).collect();
        labels.sort();
        labels.dedup();
        preds.sort();
        preds.dedup();
        let short = |s: &str| s.chars().take(9).collect::<String>();
        let _ = write!(out, "{:<24}", "");
        for p in &preds {
            let _ = write!(out, " {:>9}", short(p));
        }
        let _ = writeln!(out);
        for l in &labels {
            let _ = write!(out, "{l:<24}");
            for p in &preds {
                let n = in_set
                    .iter()
                    .filter(|c| c.label.category == *l && c.category == *p)
                    .count();
                let _ = write!(
                    out,
                    " {:>9}",
                    if n == 0 { ".".into() } else { n.to_string() }
                );
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(
            out,
            "\nFirst cause, {set} (label's first cause -> predicted first cause)"
        );
        let mut pairs: BTreeMap<(String, String), usize> = BTreeMap::new();
        for c in in_set.iter().filter(|c| !c.label.causes.is_empty()) {
            let want = c.label.causes[0].clone();
            let got = c.causes.first().cloned().unwrap_or_else(|| "(none)".into());
            *pairs.entry((want, got)).or_default() += 1;
        }
        for ((want, got), n) in pairs {
            let mark = if want == got { " " } else { "x" };
            let _ = writeln!(out, "  {mark} {want:<26} -> {got:<26} {n}");
        }
    }
    let mut errors: Vec<(f64, &Case)> = cases
        .iter()
        .filter_map(|c| {
            c.savings
                .map(|(p, m)| ((p as f64 - m as f64).abs() / m as f64, c))
        })
        .collect();
    if !errors.is_empty() {
        errors.sort_by(|a, b| a.0.total_cmp(&b.0));
        let within = errors.iter().filter(|e| e.0 <= 0.15).count();
        let _ = writeln!(
            out,
            "\nSavings of the label's first cause (what-if) vs the compiled fixed twin: {} cases, median error {:.1}%, within 15%: {within}/{}",
            errors.len(),
            errors[errors.len() / 2].0 * 100.0,
            errors.len()
        );
        for (_, c) in errors.iter().filter(|e| e.0 > 0.15) {
            let (p, m) = c.savings.unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<44} {:<28} predicted {:>9} measured {:>9} ({:+.0}%)",
                c.label.file,
                c.label.causes[0],
                hbm_doctor_log::format_size(p),
                hbm_doctor_log::format_size(m),
                (p as f64 / m as f64 - 1.0) * 100.0
            );
        }
    }
    let _ = writeln!(out, "\nMisses");
    for c in cases {
        let cat = !c.category_ok();
        let cause = !c.label.causes.is_empty() && !c.hit(1);
        if !cat && !cause {
            continue;
        }
        let _ = writeln!(
            out,
            "  {:<18} {:<44} {}{} want {} [{}] got {} [{}]  ({}, {}{})",
            c.set,
            c.label.file,
            if cat { "C" } else { " " },
            if cause {
                if c.hit(3) {
                    "3"
                } else {
                    "X"
                }
            } else {
                " "
            },
            c.label.category,
            c.label.causes.join(","),
            c.category,
            c.causes
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(","),
            c.label.basis,
            c.label.stage,
            if c.label.source.is_empty() {
                String::new()
            } else {
                format!(", {}", c.label.source)
            }
        );
    }
    let _ = writeln!(
        out,
        "  (C: category wrong; 3: right cause in the top 3 but not first; X: not in the top 3)"
    );
    out
}

/// One posted memory series of tests/corpus/trend/MANIFEST.toml whose `thread` field says what its
/// thread settled (`leak` or `not_leak`): the real-series set.
#[derive(Deserialize)]
struct SeriesLabel {
    file: String,
    #[serde(default)]
    thread: Option<String>,
    #[serde(default)]
    samples: Option<u64>,
    #[serde(default)]
    shape: Option<String>,
}

#[derive(Deserialize)]
struct SeriesManifest {
    case: Vec<SeriesLabel>,
}

/// How `trend` does on the real series: is a leak called (`verdict` leak, or `leak_suspected` on a
/// series too short to judge) exactly where the thread settled one, and are all the readings read.
#[derive(Default)]
struct SeriesScore {
    n: usize,
    right: usize,
    leaks: usize,
    leaks_found: usize,
    false_alarms: usize,
    /// Not-leaks whose input gave no series at all: "right" only because nothing was called.
    not_leaks_unread: usize,
    with_samples: usize,
    samples_exact: usize,
    misses: Vec<String>,
}

impl SeriesScore {
    fn figures(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("leak_call", Score::rate(self.right, self.n)),
            (
                "readings",
                Score::rate(self.samples_exact, self.with_samples),
            ),
        ]
    }
}

fn series_score() -> SeriesScore {
    let dir = root().join("tests/corpus/trend");
    let text = std::fs::read_to_string(dir.join("MANIFEST.toml")).expect("accuracy harness input");
    let manifest: SeriesManifest = toml::from_str(&text).expect("tests/corpus/trend/MANIFEST.toml");
    let mut s = SeriesScore::default();
    for c in manifest.case {
        let Some(thread) = c.thread.as_deref() else {
            continue;
        };
        let bytes = std::fs::read(dir.join(&c.file)).expect("accuracy harness input");
        let mut col = hbm_doctor_trend::reader::Collected::default();
        let name = Path::new(&c.file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        hbm_doctor_trend::read_all(&mut col, "", &name, &bytes);
        let rep =
            hbm_doctor_trend::report::report(&col, &hbm_doctor_trend::detect::Params::default());
        let v = serde_json::to_value(&rep).expect("trend report");
        let series = v["series"].as_array().cloned().unwrap_or_default();
        let called = series
            .iter()
            .any(|x| x["verdict"] == "leak" || x["leak_suspected"] == true);
        let read: Vec<u64> = series
            .iter()
            .filter_map(|x| x["samples"].as_u64())
            .collect();
        let leak = thread == "leak";
        s.n += 1;
        s.leaks += usize::from(leak);
        s.leaks_found += usize::from(leak && called);
        s.false_alarms += usize::from(!leak && called);
        s.not_leaks_unread += usize::from(!leak && series.is_empty());
        let ok = leak == called;
        s.right += usize::from(ok);
        if let Some(want) = c.samples {
            s.with_samples += 1;
            // Every reading read: in one series, or across the series its keys make
            // (`memory_allocated` and `memory_reserved` lines interleaved).
            let total: u64 = read.iter().sum();
            s.samples_exact += usize::from(read.contains(&want) || total == want);
        }
        let verdicts: Vec<String> = series
            .iter()
            .map(|x| {
                format!(
                    "{}{}",
                    x["verdict"].as_str().unwrap_or("?"),
                    if x["leak_suspected"] == true {
                        "+suspected"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        let total: u64 = read.iter().sum();
        if !ok || c.samples.is_some_and(|w| !read.contains(&w) && total != w) {
            s.misses.push(format!(
                "  series {:<45} want {} ({}, {} readings) got [{}] read {:?}",
                c.file,
                thread,
                c.shape.as_deref().unwrap_or("?"),
                c.samples.map_or("?".into(), |n| n.to_string()),
                verdicts.join(","),
                read
            ));
        }
    }
    s
}

fn series_report(s: &SeriesScore) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nReal memory series (tests/corpus/trend/MANIFEST.toml, thread settled): {} series, leak called right {}/{} ({:.1}%); leaks found {}/{}, false alarms {}/{} (of the not-leaks, {} right only because nothing was read); readings read exactly {}/{}",
        s.n,
        s.right,
        s.n,
        Score::rate(s.right, s.n) * 100.0,
        s.leaks_found,
        s.leaks,
        s.false_alarms,
        s.n - s.leaks,
        s.not_leaks_unread,
        s.samples_exact,
        s.with_samples
    );
    for m in &s.misses {
        let _ = writeln!(out, "{m}");
    }
    out
}

/// `set.figure value` lines between `<!-- ratchet -->` and `<!-- /ratchet -->` in ACCURACY.md.
fn ratchet() -> Vec<(String, f64)> {
    let text = std::fs::read_to_string(root().join("ACCURACY.md")).unwrap_or_default();
    let Some(start) = text.find("<!-- ratchet -->") else {
        return Vec::new();
    };
    let end = text[start..]
        .find("<!-- /ratchet -->")
        .map_or(text.len(), |e| start + e);
    text[start..end]
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let key = it.next()?;
            let value: f64 = it.next()?.parse().ok()?;
            key.contains('.').then(|| (key.to_string(), value))
        })
        .collect()
}

#[test]
fn accuracy_on_every_labelled_case() {
    let mut cases = post_cases();
    cases.extend(compiler_cases());
    cases.extend(gpu_cases());
    let scores = score(&cases);
    // The re-ranker's training data: every explained case with its label and what the ranker
    // saw (scripts/train_ranker.py sets this).
    if let Some(path) = std::env::var_os("HBM_DOCTOR_RANK_DUMP") {
        let mut out = String::new();
        for c in &cases {
            let Some(rank) = &c.rank else { continue };
            let row = serde_json::json!({
                "set": c.set,
                "group": c.group,
                "file": c.label.file,
                "category": c.label.category,
                "causes": c.label.causes,
                "rank": rank,
            });
            let _ = writeln!(out, "{row}");
        }
        std::fs::write(&path, out).expect("HBM_DOCTOR_RANK_DUMP is writable");
    }
    let series = series_score();
    let mut text = report(&cases, &scores);
    text.push_str(&series_report(&series));
    println!("{text}");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("accuracy.txt");
    let _ = std::fs::write(&out, &text);
    let mut block = String::new();
    for set in SETS {
        if let Some(s) = scores.get(set) {
            for (name, value) in s.figures() {
                let _ = writeln!(block, "{set}.{name} {value:.3}");
            }
        }
    }
    if series.n > 0 {
        for (name, value) in series.figures() {
            let _ = writeln!(block, "series.{name} {value:.3}");
        }
    }
    println!("ratchet block for ACCURACY.md (bash scripts/accuracy.sh):\n{block}");
    let mut fell = Vec::new();
    for (key, recorded) in ratchet() {
        let (set, name) = key.split_once('.').expect("accuracy harness input");
        let figures = if set == "series" {
            series.figures()
        } else {
            scores.get(set).map(Score::figures).unwrap_or_default()
        };
        let now = figures
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0.0, |(_, v)| *v);
        if now + 0.0005 < recorded {
            fell.push(format!("{key}: {now:.3} < {recorded:.3} recorded"));
        }
    }
    assert!(
        fell.is_empty(),
        "accuracy fell below ACCURACY.md's ratchet (a figure may only rise; when the corpus grows, re-record it there and say why):\n{}",
        fell.join("\n")
    );
}
