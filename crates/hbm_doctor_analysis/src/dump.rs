//! An XLA dump's text files, already read, parsed and checked into an [`AnalyzeReport`]: the
//! orchestration behind `analyze`, `view` and `explain --dump` (the binary lists and reads the
//! files; this module touches none).
//!
//! The files of one module must come from one compile and hold what XLA writes: positions in a
//! live-range file bounded by the file's size, sizes bounded by [`crate::analyze::check_sizes`],
//! the buffer assignment naming instructions of the HLO text, and no more HBM assigned than the
//! memory-usage report states. A violation is a [`DumpError`] naming the file; what a parser
//! skipped is a note on the module.

use crate::analyze::{analyze, check_sizes, AnalyzeOptions, AnalyzeReport, ModuleInput};
use hbm_doctor_hlo::buffer_assignment::{parse_buffer_assignment, BufferAssignment};
use hbm_doctor_hlo::hlo::{parse_module, strip_attribute, FusionBodyFilter, HloModule};
use hbm_doctor_hlo::live_range::{parse_live_range, LiveRange};
use hbm_doctor_hlo::usage_report::{parse_usage_report, UsageReport};
use hbm_doctor_hlo::Diagnostic;
use hbm_doctor_log::format_size;

/// One text file of a dump: the name shown in messages (its path) and its text.
#[derive(Debug, Clone, Default)]
pub struct DumpText {
    /// The file's path as the user should read it in a message.
    pub name: String,
    /// The file's text.
    pub text: String,
}

impl DumpText {
    /// A file named `name` holding `text`.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> DumpText {
        DumpText {
            name: name.into(),
            text: text.into(),
        }
    }
}

/// The text files of one module in a dump.
#[derive(Debug, Clone, Default)]
pub struct ModuleTexts {
    /// File-name key (`module_0000.jit_f.after_optimizations`).
    pub key: String,
    /// `<stage>.txt`, as read (the binary leaves fusion bodies out).
    pub hlo: Option<DumpText>,
    /// How many fusion bodies the reader left out of `hlo`.
    pub fusion_bodies: usize,
    /// `-buffer-assignment.txt`.
    pub buffer_assignment: Option<DumpText>,
    /// `-live-range.txt`.
    pub live_range: Option<DumpText>,
    /// `-memory-usage-report.txt`.
    pub usage_report: Option<DumpText>,
}

/// Files that are not a dump, or not of one compile: one line naming the file and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpError(pub String);

impl std::fmt::Display for DumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DumpError {}

macro_rules! fail {
    ($($t:tt)*) => { return Err(DumpError(format!($($t)*))) };
}

/// HLO text as the binary reads it from a file (which it does in two streaming passes): without
/// the bodies of fusion computations and without `backend_config` attributes, which the analysis
/// never looks at; also returns how many fusion bodies were left out. For text already in memory.
pub fn hlo_without_fusion_bodies(text: &str) -> (String, usize) {
    let mut filter = FusionBodyFilter::default();
    text.split_inclusive('\n').for_each(|l| filter.scan(l));
    let kept = text
        .split_inclusive('\n')
        .filter(|l| filter.keep(l))
        .map(|l| strip_attribute(l, "backend_config"))
        .collect();
    (kept, filter.dropped_computations())
}

/// Module name from the file key: `module_0042.jit_f.cl_1.after_optimizations` -> `jit_f`.
pub fn name_from_key(key: &str) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    let start = parts
        .iter()
        .position(|p| p.starts_with("module_"))
        .map_or(0, |k| k + 1);
    let end = parts
        .iter()
        .rposition(|p| p.contains("after_optimizations") || p.starts_with("cl_"))
        .unwrap_or(parts.len());
    let mut end = end;
    while end > start && parts[end - 1].starts_with("cl_") {
        end -= 1;
    }
    if end > start {
        parts[start..end].join(".")
    } else {
        key.to_string()
    }
}

/// Positions in a live-range file are bounded by what the file can hold (one byte per position
/// at the very least): a header or an interval beyond that is a corrupt or foreign file, and
/// trusting it would allocate without bound.
pub fn check_live_range(lr: &LiveRange<'_>, bytes: usize, name: &str) -> Result<(), DumpError> {
    let bound = bytes as u64 + 1;
    if lr.max > bound {
        fail!("`{name}`: `HloLiveRange (max {})` is more positions than a file of {bytes} bytes can hold: the live-range file is corrupt; dump it again (--xla_dump_to) or remove it", lr.max);
    }
    let end = if lr.max > 0 { lr.max } else { bound };
    if let Some(r) = lr.ranges.iter().find(|r| r.end > end || r.start > r.end) {
        fail!("`{name}`: the live range `{}: {}-{}` lies outside the schedule (max {}): the live-range file is corrupt; dump it again (--xla_dump_to) or remove it", r.name, r.start, r.end, lr.max);
    }
    Ok(())
}

/// HBM (color 0) totals of the buffer assignment and of the memory-usage report, when both
/// state one.
fn hbm_totals(ba: &BufferAssignment<'_>, rep: &UsageReport<'_>) -> Option<(u64, u64)> {
    let ba0 = ba.totals_by_color().into_iter().find(|(c, _)| *c == 0)?.1;
    let rep0 = rep
        .spaces
        .iter()
        .find(|s| s.color.unwrap_or(0) == 0)?
        .total_bytes;
    Some((ba0, rep0))
}

fn name_of(f: &Option<DumpText>) -> String {
    f.as_ref().map(|d| d.name.clone()).unwrap_or_default()
}

/// The files of one module must come from one compile: the buffer assignment names instructions
/// of the HLO text, and the memory-usage report cannot hold less than the buffer assignment
/// assigns. A mismatch is an error naming the files; nothing that is not a dump is read as one.
pub fn check_consistent(
    f: &ModuleTexts,
    hlo: Option<&HloModule<'_>>,
    ba: Option<&BufferAssignment<'_>>,
    rep: Option<&UsageReport>,
) -> Result<(), DumpError> {
    let empty_hlo = hlo.is_none_or(|m| m.computations.iter().all(|c| c.instructions.is_empty()));
    let empty_ba = ba.is_none_or(|b| b.allocations.is_empty());
    if empty_hlo && empty_ba && rep.is_none_or(|r| r.spaces.is_empty()) {
        fail!(
            "`{}` is not an XLA dump (no HLO instruction, no buffer allocation): pass the directory given to --xla_dump_to, with its *after_optimizations* files",
            name_of(&f.hlo).max(name_of(&f.buffer_assignment))
        );
    }
    if let (Some(m), Some(b)) = (hlo, ba) {
        let names: std::collections::HashSet<&str> = m
            .computations
            .iter()
            .flat_map(|c| c.instructions.iter().map(|i| i.name))
            .collect();
        let values: Vec<&str> = b
            .allocations
            .iter()
            .flat_map(|a| a.values.iter().map(|v| v.name))
            .take(2000)
            .collect();
        let missing = values.iter().filter(|v| !names.contains(*v)).count();
        // Fusion bodies are not read, so a few names may be missing; most must be there.
        if values.len() >= 10 && missing * 2 > values.len() {
            fail!(
                "`{}` and `{}` are not from the same compile: {missing} of the first {} values the buffer assignment names are not instructions of the HLO text; keep the files of one --xla_dump_to run together",
                name_of(&f.buffer_assignment),
                name_of(&f.hlo),
                values.len()
            );
        }
    }
    if let (Some(b), Some(r)) = (ba, rep) {
        if let Some((x, y)) = hbm_totals(b, r) {
            if x > y.saturating_add(y / 100) {
                fail!(
                    "`{}` assigns {} of HBM but `{}` reports {}: the files are not from the same compile; keep the files of one --xla_dump_to run together",
                    name_of(&f.buffer_assignment),
                    format_size(x),
                    name_of(&f.usage_report),
                    format_size(y)
                );
            }
        }
    }
    Ok(())
}

/// `what: N line(s) skipped (first: line L: why)`, or nothing when the parser skipped nothing.
fn skipped(notes: &mut Vec<String>, what: &str, unit: &str, d: &[Diagnostic], extra: &str) {
    if let Some(first) = d.first() {
        notes.push(format!(
            "{what}: {} {unit} skipped (first: line {}{extra}: {})",
            d.len(),
            first.line,
            first.message
        ));
    }
}

type Parsed<'a> = (
    Option<HloModule<'a>>,
    Option<BufferAssignment<'a>>,
    Option<LiveRange<'a>>,
    Option<UsageReport<'a>>,
    Vec<String>,
);

/// Parses and checks the modules' texts, then analyzes them (the budget check is left to the
/// caller). What each parser skipped becomes a note on its module.
pub fn analyze_texts(
    files: &[ModuleTexts],
    opts: &AnalyzeOptions,
) -> Result<AnalyzeReport, DumpError> {
    let mut parsed: Vec<Parsed<'_>> = Vec::new();
    for f in files {
        let mut notes = Vec::new();
        let hlo = f.hlo.as_ref().map(|t| {
            let (m, d) = parse_module(&t.text);
            let extra = if f.fusion_bodies > 0 {
                format!(
                    " of the text without its {} fusion bodies, which are not read",
                    f.fusion_bodies
                )
            } else {
                String::new()
            };
            skipped(&mut notes, "HLO text", "part(s)", &d, &extra);
            m
        });
        let ba = f.buffer_assignment.as_ref().map(|t| {
            let (b, d) = parse_buffer_assignment(&t.text);
            skipped(&mut notes, "buffer assignment", "line(s)", &d, "");
            b
        });
        let lr = match &f.live_range {
            Some(t) => {
                let (lr, d) = parse_live_range(&t.text);
                check_live_range(&lr, t.text.len(), &t.name)?;
                skipped(&mut notes, "live ranges", "line(s)", &d, "");
                Some(lr)
            }
            None => None,
        };
        // XLA also prints the live ranges at the end of the buffer assignment.
        if let (Some(b), Some(t)) = (ba.as_ref(), f.buffer_assignment.as_ref()) {
            if let Some(embedded) = b.live_range.as_ref() {
                check_live_range(embedded, t.text.len(), &t.name)?;
            }
        }
        if let Err((which, e)) = check_sizes(hlo.as_ref(), ba.as_ref()) {
            let file = if which == "hlo" {
                &f.hlo
            } else {
                &f.buffer_assignment
            };
            let path = file
                .as_ref()
                .map_or_else(|| f.key.clone(), |t| t.name.clone());
            fail!(
                "`{path}` is not an XLA dump file: {e}; pass the files of --xla_dump_to unchanged"
            );
        }
        let rep = f.usage_report.as_ref().map(|t| {
            let (r, d) = parse_usage_report(&t.text);
            skipped(&mut notes, "memory-usage report", "line(s)", &d, "");
            r
        });
        parsed.push((hlo, ba, lr, rep, notes));
    }
    for (f, (hlo, ba, _, rep, _)) in files.iter().zip(&parsed) {
        check_consistent(f, hlo.as_ref(), ba.as_ref(), rep.as_ref())?;
    }
    let mut inputs = Vec::new();
    for (f, (hlo, ba, lr, rep, notes)) in files.iter().zip(&parsed) {
        let mut notes = notes.clone();
        let mut ba = ba.as_ref();
        if let (Some(b), Some(r)) = (ba, rep.as_ref()) {
            if let Some((x, y)) = hbm_totals(b, r) {
                if x < y {
                    notes.push(format!(
                        "`{}` holds {} of HBM allocations but the memory-usage report says {}: the buffer assignment looks cut short (truncated) and is left out; the figures come from the HLO text and the report",
                        name_of(&f.buffer_assignment),
                        format_size(x),
                        format_size(y)
                    ));
                    ba = None;
                }
            }
        }
        if ba.is_none() && f.buffer_assignment.is_none() {
            notes.push("no *-buffer-assignment.txt: run with XLA_FLAGS=\"--xla_dump_to=DIR --xla_dump_hlo_as_text\" for exact figures".into());
        }
        if hlo.is_none() {
            notes.push("no *after_optimizations.txt: source lines and most detectors need the HLO text (--xla_dump_hlo_as_text, without --xla_dump_disable_metadata)".into());
        }
        let name = hlo
            .as_ref()
            .map(|m| m.name.to_string())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| name_from_key(&f.key));
        inputs.push(ModuleInput {
            name,
            hlo: hlo.as_ref(),
            buffer_assignment: ba,
            live_range: lr.as_ref(),
            usage_report: rep.as_ref(),
            notes,
        });
    }
    Ok(analyze(&inputs, opts))
}

#[cfg(test)]
pub(crate) mod testdata {
    //! Real dumps and logs of `tests/corpus`, read the way the binary reads them.

    use super::{hlo_without_fusion_bodies, DumpText, ModuleTexts};
    use std::path::PathBuf;

    /// The text of `tests/corpus/<rel>`.
    pub fn read(rel: &str) -> String {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/corpus")
            .join(rel);
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// The after-optimizations modules of the dump directory `tests/corpus/<rel>`.
    pub fn dump(rel: &str) -> Vec<ModuleTexts> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/corpus")
            .join(rel);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{rel}: {e}"))
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("after_optimizations"))
            .collect();
        names.sort();
        let mut modules: Vec<ModuleTexts> = Vec::new();
        for n in names {
            let key = n
                .split("after_optimizations")
                .next()
                .unwrap_or("")
                .to_string()
                + "after_optimizations";
            if modules.last().is_none_or(|m| m.key != key) {
                modules.push(ModuleTexts {
                    key: key.clone(),
                    ..ModuleTexts::default()
                });
            }
            let Some(m) = modules.last_mut() else {
                continue;
            };
            let name = format!("tests/corpus/{rel}/{n}");
            let text = read(&format!("{rel}/{n}"));
            if n.ends_with("-buffer-assignment.txt") {
                m.buffer_assignment = Some(DumpText::new(name, text));
            } else if n.ends_with("-live-range.txt") {
                m.live_range = Some(DumpText::new(name, text));
            } else if n.ends_with("-memory-usage-report.txt") {
                m.usage_report = Some(DumpText::new(name, text));
            } else if n.ends_with("after_optimizations.txt") {
                let (kept, dropped) = hlo_without_fusion_bodies(&text);
                m.fusion_bodies = dropped;
                m.hlo = Some(DumpText::new(name, kept));
            }
        }
        modules
    }
}

#[cfg(test)]
mod tests {
    use super::testdata::dump;
    use super::*;
    use crate::CauseKind;

    const G: u64 = 1 << 30;

    #[test]
    fn module_names_from_file_keys() {
        assert_eq!(
            name_from_key("module_0042.jit_f.cl_1.after_optimizations"),
            "jit_f"
        );
        assert_eq!(
            name_from_key("module_0000.jit_step.cl_933746096.after_optimizations"),
            "jit_step"
        );
        assert_eq!(name_from_key("module_0001.a.b.after_optimizations"), "a.b");
        assert_eq!(name_from_key("weird"), "weird");
    }

    #[test]
    fn a_real_dump_analyzes_with_nothing_skipped() {
        let files = dump("tpu/debug_print_v5e/dump");
        assert_eq!(files.len(), 1);
        assert!(files[0].fusion_bodies > 0, "fusion bodies are left out");
        let r = analyze_texts(&files, &AnalyzeOptions::default()).expect("analyze");
        let m = &r.modules[0];
        assert_eq!(m.name, "jit_step");
        assert!(m.notes.is_empty(), "{:?}", m.notes);
        let hbm = &m.memory_spaces[0];
        assert_eq!(hbm.space, "hbm");
        assert_eq!(hbm.peak_bytes, 24 * G + 128 * 1024);
        assert!(r
            .diagnosis
            .causes
            .iter()
            .any(|c| c.cause == CauseKind::DebugPrint));
    }

    /// What the live-range and usage-report parsers skip is reported, not dropped.
    #[test]
    fn skipped_lines_of_every_file_become_notes() {
        let mut files = dump("tpu/debug_print_v5e/dump");
        let lr = files[0].live_range.as_mut().expect("live range");
        lr.text
            .push_str("BufferLiveRange:\nthis is not a live range\n");
        let rep = files[0].usage_report.as_mut().expect("usage report");
        rep.text = format!("garbage first line\n{}", rep.text);
        let r = analyze_texts(&files, &AnalyzeOptions::default()).expect("analyze");
        let notes = &r.modules[0].notes;
        assert!(
            notes.iter().any(
                |n| n.starts_with("live ranges: 1 line(s) skipped (first: line ")
                    && n.contains("this is not a live range")
            ),
            "{notes:?}"
        );
        assert!(
            notes.iter().any(|n| n.starts_with("memory-usage report: ")
                && n.contains("unknown memory-usage report format: garbage first line")),
            "{notes:?}"
        );
    }

    #[test]
    fn a_live_range_past_its_file_is_refused_naming_the_file() {
        let mut files = dump("tpu/debug_print_v5e/dump");
        let lr = files[0].live_range.as_mut().expect("live range");
        lr.text = "HloLiveRange (max 999999999):\n".into();
        let name = lr.name.clone();
        let e = analyze_texts(&files, &AnalyzeOptions::default()).expect_err("refused");
        assert!(
            e.to_string().starts_with(&format!("`{name}`: `HloLiveRange (max 999999999)` is more positions than a file of 30 bytes can hold")),
            "{e}"
        );
    }

    #[test]
    fn files_of_two_compiles_are_refused() {
        let mut files = dump("tpu/debug_print_v5e/dump");
        let other = dump("tpu/fits_v5e/dump");
        files[0].buffer_assignment = other[0].buffer_assignment.clone();
        let e = analyze_texts(&files, &AnalyzeOptions::default()).expect_err("refused");
        assert!(
            e.to_string().contains("are not from the same compile"),
            "{e}"
        );
    }

    #[test]
    fn nothing_readable_is_not_a_dump() {
        let files = vec![ModuleTexts {
            key: "module_0000.jit_f.after_optimizations".into(),
            hlo: Some(DumpText::new("x.txt", "")),
            ..ModuleTexts::default()
        }];
        let e = analyze_texts(&files, &AnalyzeOptions::default()).expect_err("refused");
        assert!(e.0.starts_with("`x.txt` is not an XLA dump"), "{e}");
    }
}
