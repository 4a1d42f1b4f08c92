//! Views of hbm-doctor reports: terminal text, markdown and JSON.
//!
//! One [`Format`] and one [`Style`] (colour on or off) for every command's view: `explain` (this
//! module, from an [`ExplainReport`]), [`analyze`], [`trend`], [`pad`] and [`top`]; [`view`] builds
//! the offline HTML page. Each renderer only formats what it is given; no renderer computes a
//! figure. JSON is the contract (docs/contract.md, docs/json-schema.md); the terminal view puts
//! the verdict first, then the figures, then the ranked plan, so a person reads it in ten seconds.

use hbm_doctor_analysis::explain::{short_op, short_source};
use hbm_doctor_analysis::{Cause, ExplainReport};
use hbm_doctor_log::{
    format_size, Allocation, Event, Framework, MemorySpace, Phase, WarningKind, WarningSummary,
};
use std::fmt::Write as _;

pub mod analyze;
pub mod pad;
mod text;
pub mod top;
pub mod trend;
pub mod view;

pub use analyze::render_analyze;
pub use pad::{render_pad, PadReport};
pub use top::{render_top, render_top_lines, TopDevice, TopEvent, TopProcess, TopTable};
pub use trend::render_trend;

/// Pretty JSON and a final newline: the contract's output for every command.
pub(crate) fn json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    let mut s =
        serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

/// Output format of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Terminal text (colour optional).
    Human,
    /// GitHub-flavoured markdown, for pasting into an issue or a PR.
    Markdown,
    /// The JSON contract.
    Json,
}

/// ANSI styling, or none.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    color: bool,
}

impl Style {
    /// Styling on or off.
    pub fn new(color: bool) -> Style {
        Style { color }
    }
    pub(crate) fn paint(self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    pub(crate) fn bold(self, s: &str) -> String {
        self.paint("1", s)
    }
    pub(crate) fn red(self, s: &str) -> String {
        self.paint("1;31", s)
    }
    pub(crate) fn green(self, s: &str) -> String {
        self.paint("32", s)
    }
    pub(crate) fn yellow(self, s: &str) -> String {
        self.paint("33", s)
    }
    pub(crate) fn dim(self, s: &str) -> String {
        self.paint("2", s)
    }
    pub(crate) fn cyan(self, s: &str) -> String {
        self.paint("36", s)
    }
}

/// Renders an explain report.
pub fn render_explain(
    report: &ExplainReport,
    format: Format,
    style: Style,
    source_name: &str,
) -> String {
    match format {
        Format::Json => json(report),
        Format::Human => human(report, style, source_name),
        Format::Markdown => markdown(report, source_name),
    }
}

fn framework_name(f: Option<Framework>) -> &'static str {
    match f {
        Some(Framework::Jax) => "JAX",
        Some(Framework::PytorchXla) => "PyTorch/XLA",
        Some(Framework::Tensorflow) => "TensorFlow",
        Some(Framework::Pytorch) => "PyTorch",
        None => "",
    }
}

fn opt(b: Option<u64>) -> Option<String> {
    b.map(format_size)
}

/// (label, value) rows of the figures an event states.
fn figures(e: &Event) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    let mut push = |k: &'static str, v: Option<String>| {
        if let Some(v) = v {
            rows.push((k, v));
        }
    };
    push("used", opt(e.used_bytes));
    push("limit", opt(e.limit_bytes));
    push("exceeded by", opt(e.exceeded_bytes));
    push("requested", opt(e.requested_bytes));
    push("free", opt(e.free_bytes));
    push("largest free block", opt(e.largest_free_bytes));
    push("TensorCore", opt(e.tensorcore_bytes));
    push("SparseCore", opt(e.sparsecore_bytes));
    push("reserved", opt(e.reserved_bytes));
    push("program", opt(e.program_bytes));
    push("arguments", opt(e.arguments_bytes));
    push(
        "outputs",
        e.output_bytes.map(|o| match e.output_aliased_bytes {
            Some(a) => format!(
                "{} ({} aliased with arguments)",
                format_size(o),
                format_size(a)
            ),
            None => format_size(o),
        }),
    );
    push(
        "HLO temporaries",
        e.hlo_temp_bytes.map(
            |t| match (e.hlo_temp_unpadded_bytes, e.hlo_temp_padded_bytes) {
                (Some(u), Some(p)) => format!(
                    "{} (unpadded {}, padded {})",
                    format_size(t),
                    format_size(u),
                    format_size(p)
                ),
                _ => format_size(t),
            },
        ),
    );
    push("fragmentation", opt(e.fragmentation_bytes));
    if let Some(r) = &e.remat {
        push(
            "rematerialization",
            Some(format!(
                "could not get below {}: reached {}{}",
                format_size(r.target_bytes),
                format_size(r.reduced_to_bytes),
                r.original_bytes
                    .map(|o| format!(" from {}", format_size(o)))
                    .unwrap_or_default()
            )),
        );
    }
    rows
}

fn space_name(e: &Event) -> &'static str {
    match e.memory_space {
        Some(MemorySpace::Hbm) => "hbm",
        Some(MemorySpace::Vmem) => "vmem",
        Some(MemorySpace::Smem) => "smem",
        Some(MemorySpace::Host) => "host",
        Some(MemorySpace::Device) => "device",
        None => "memory",
    }
}

fn context_line(e: &Event) -> String {
    let mut parts = vec![format!("line {}", e.line)];
    parts.push(match e.phase {
        Phase::Compile => "compile".into(),
        Phase::Runtime => "runtime".into(),
    });
    let fw = framework_name(e.framework);
    if !fw.is_empty() {
        parts.push(fw.into());
    }
    if let Some(b) = e.backend {
        parts.push(format!("{b:?}").to_uppercase());
    }
    parts.push(space_name(e).into());
    if let Some(p) = &e.program {
        parts.push(p.clone());
    }
    if e.repeats > 1 {
        parts.push(format!("printed {}x", e.repeats));
    }
    parts.join(" · ")
}

fn alloc_from(a: &Allocation) -> String {
    let mut parts = Vec::new();
    if let Some(s) = &a.source {
        parts.push(short_source(s));
    }
    if let Some(op) = &a.op_name {
        parts.push(short_op(op));
    }
    if let Some(l) = &a.label {
        if parts.is_empty() || l.len() < 40 {
            parts.push(l.chars().take(60).collect());
        }
    }
    parts.join("  ")
}

fn alloc_shape(a: &Allocation) -> String {
    a.shape
        .as_deref()
        .map(|s| {
            hbm_doctor_hlo::Shape::parse(s)
                .map_or_else(|| s.chars().take(50).collect(), |sh| sh.without_layout())
        })
        .unwrap_or_else(|| "-".into())
}

fn alloc_padding(a: &Allocation) -> String {
    match a.unpadded_bytes {
        Some(u) if u > 0 && a.size_bytes > u => format!("{:.1}x", a.size_bytes as f64 / u as f64),
        Some(_) => "-".into(),
        None => String::new(),
    }
}

/// Consecutive allocations with the same size, shape and origin, counted.
fn group_allocations(allocs: &[Allocation]) -> Vec<(&Allocation, usize)> {
    let mut rows: Vec<(&Allocation, usize)> = Vec::new();
    for a in allocs {
        match rows.last_mut() {
            Some((prev, n))
                if prev.size_bytes == a.size_bytes
                    && alloc_shape(prev) == alloc_shape(a)
                    && prev.source == a.source
                    && prev.op_name == a.op_name =>
            {
                *n += 1
            }
            _ => rows.push((a, 1)),
        }
    }
    rows
}

/// `1234567` -> `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One line for every warning of one kind: how many, where, and the worst one's figures.
fn warning_text(w: &WarningSummary) -> String {
    let (one, many) = match w.kind {
        WarningKind::RematWarning => ("rematerialization warning", "rematerialization warnings"),
        WarningKind::BfcNotAFailure => (
            "allocator warning (\"not a failure\")",
            "allocator warnings (\"not a failure\")",
        ),
        WarningKind::AllocatorRetry => ("allocator retry", "allocator retries"),
        WarningKind::SuppressedOom => (
            "suppressed out-of-memory error",
            "suppressed out-of-memory errors",
        ),
    };
    let lines = if w.first_line == w.last_line {
        format!("line {}", w.first_line)
    } else {
        format!("lines {}-{}", w.first_line, w.last_line)
    };
    let f = &w.worst;
    let figures = if let Some(r) = &f.remat {
        format!(
            "could not get below {}: reached {}{}",
            format_size(r.target_bytes),
            format_size(r.reduced_to_bytes),
            r.original_bytes
                .map(|o| format!(" from {}", format_size(o)))
                .unwrap_or_default()
        )
    } else {
        let mut parts = Vec::new();
        if let (Some(u), Some(l)) = (f.used_bytes, f.limit_bytes) {
            parts.push(format!("used {} of {}", format_size(u), format_size(l)));
        }
        if let Some(r) = f.requested_bytes {
            parts.push(format!("requested {}", format_size(r)));
        }
        parts.join(", ")
    };
    let worst = if w.count == 1 || figures.is_empty() {
        figures
    } else {
        format!("worst at line {}: {figures}", f.line)
    };
    format!(
        "{} {} ({}), {lines}{}{worst}",
        thousands(w.count),
        if w.count == 1 { one } else { many },
        w.kind.as_str(),
        if worst.is_empty() { "" } else { "; " },
    )
}

/// The warnings section of the terminal view: one line per kind.
fn human_warnings(out: &mut String, report: &ExplainReport, st: Style) {
    if report.warnings.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n{} {}",
        st.bold("Warnings"),
        st.dim("(not errors; counted, not listed one by one)")
    );
    for w in &report.warnings {
        let _ = writeln!(out, "  {} {}", st.yellow("!"), warning_text(w));
    }
}

/// The warnings section of the markdown view: one line per kind.
fn markdown_warnings(out: &mut String, report: &ExplainReport) {
    if report.warnings.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "#### Warnings (not errors; counted, not listed one by one)\n"
    );
    for w in &report.warnings {
        let _ = writeln!(out, "- {}", warning_text(w));
    }
}

fn savings_text(c: &Cause) -> String {
    match (c.savings_bytes, c.sufficient) {
        (Some(s), Some(true)) => format!("saves ~{}, enough to fit", format_size(s)),
        (Some(s), _) => format!("saves ~{}", format_size(s)),
        (None, _) => "savings unknown".into(),
    }
}

fn human(report: &ExplainReport, st: Style, source_name: &str) -> String {
    let mut out = String::new();
    let n = report.events.len();
    let Some(d) = &report.diagnosis else {
        let _ = writeln!(
            out,
            "{} no out-of-memory event found in {source_name}",
            st.green("✓")
        );
        human_warnings(&mut out, report, st);
        return out;
    };
    let e = &report.events[d.event];
    if !e.fatal {
        let _ = writeln!(
            out,
            "{} no out-of-memory error in {source_name}",
            st.green("✓")
        );
        let _ = writeln!(
            out,
            "{} warning (line {}): {}",
            st.yellow("!"),
            e.line,
            e.message
        );
        let _ = writeln!(out, "  {}", st.dim("the compiler could not bring the program under its memory target by rematerialization; it may still fit, or fail later in the same compile"));
        for (k, v) in figures(e) {
            let _ = writeln!(out, "  {k}: {v}");
        }
        human_warnings(&mut out, report, st);
        return out;
    }
    let _ = writeln!(out, "{} {}", st.red("✗"), st.bold(&d.summary));
    let _ = writeln!(
        out,
        "  {}  {}",
        st.yellow(d.category.as_str()),
        st.dim(&format!(
            "{} · {n} event{} in {source_name}",
            context_line(e),
            if n == 1 { "" } else { "s" }
        ))
    );
    if let Some(chip) = &d.chip {
        let _ = writeln!(out, "  {}", st.dim(&format!("device: {chip}")));
    }
    if let Some(m) = &d.dump_module {
        let _ = writeln!(
            out,
            "  {}",
            st.dim(&format!(
                "dump: module {m} (buffers at the peak and measured causes joined)"
            ))
        );
    }
    let rows = figures(e);
    if !rows.is_empty() {
        let _ = writeln!(out, "\n{}", st.bold("Figures"));
        let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        for (k, v) in &rows {
            let _ = writeln!(out, "  {k:<w$}  {v}");
        }
    }
    if !e.allocations.is_empty() {
        let _ = writeln!(out, "\n{}", st.bold("Largest allocations"));
        let _ = writeln!(
            out,
            "  {}",
            st.dim(&format!(
                "{:>2}  {:>9}  {:>6}  {:<28}  from",
                "#", "size", "pad", "shape"
            ))
        );
        // Identical rows (same size, shape and origin: slots of one activation) collapse into one.
        let rows = group_allocations(&e.allocations);
        for (i, (a, n)) in rows.iter().take(10).enumerate() {
            let count = if *n > 1 {
                format!("{n}×")
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  {:>2}  {:>9}  {:>6}  {:<28}  {}",
                i + 1,
                format!("{count}{}", format_size(a.size_bytes)),
                alloc_padding(a),
                alloc_shape(a),
                alloc_from(a)
            );
        }
        if rows.len() > 10 {
            let rest: usize = rows[10..].iter().map(|r| r.1).sum();
            let _ = writeln!(out, "  {}", st.dim(&format!("... and {rest} more")));
        }
    }
    if !d.ledger.is_empty() {
        let _ = writeln!(out, "\n{}", st.bold("Ledger"));
        let w = d.ledger.iter().map(|l| l.part.len()).max().unwrap_or(0);
        for l in &d.ledger {
            let _ = writeln!(
                out,
                "  {:<w$}  {:>9}  {}",
                l.part,
                format_size(l.bytes),
                st.dim(&format!("{}: {}", l.basis, l.note))
            );
        }
    }
    if !d.causes.is_empty() {
        let _ = writeln!(out, "\n{}", st.bold("Plan"));
        for (i, c) in d.causes.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {}. {}  {}",
                i + 1,
                st.cyan(c.cause.as_str()),
                st.dim(&savings_text(c))
            );
            let _ = writeln!(out, "     {}", c.evidence);
            for a in &c.actions {
                let _ = writeln!(out, "     → {a}");
            }
            for s in &c.snippets {
                let _ = writeln!(out, "     {}", st.dim(&format!("{}:", s.framework)));
                for line in s.code.lines() {
                    let _ = writeln!(out, "       {line}");
                }
            }
        }
    }
    if !d.missing.is_empty() {
        let _ = writeln!(
            out,
            "\n{}",
            st.bold("Not shown by the input (collect to be sure)")
        );
        for m in &d.missing {
            let _ = writeln!(out, "  - {m}");
        }
    }
    if !d.fits_on.is_empty() {
        let _ = writeln!(
            out,
            "\n{} {}",
            st.bold("Would fit on one device of:"),
            d.fits_on.join(", ")
        );
    }
    human_warnings(&mut out, report, st);
    if n > 1 {
        let _ = writeln!(out, "\n{}", st.bold("All events"));
        for (i, ev) in report.events.iter().enumerate() {
            let mark = if i == d.event { "*" } else { " " };
            let _ = writeln!(
                out,
                " {mark} line {:>6}  {:<24} {}",
                ev.line,
                format!("{:?}", ev.family).to_lowercase(),
                ev.message.chars().take(100).collect::<String>()
            );
        }
    }
    out
}

fn markdown(report: &ExplainReport, source_name: &str) -> String {
    let mut out = String::new();
    let Some(d) = &report.diagnosis else {
        let _ = writeln!(
            out,
            "**hbm-doctor**: no out-of-memory event found in `{source_name}`."
        );
        if !report.warnings.is_empty() {
            out.push('\n');
            markdown_warnings(&mut out, report);
        }
        return out;
    };
    let e = &report.events[d.event];
    let _ = writeln!(out, "### hbm-doctor: {}\n", d.summary);
    let _ = writeln!(
        out,
        "**Category:** `{}` · {}\n",
        d.category.as_str(),
        context_line(e)
    );
    if let Some(chip) = &d.chip {
        let _ = writeln!(out, "**Device:** {chip}\n");
    }
    let rows = figures(e);
    if !rows.is_empty() {
        let _ = writeln!(out, "| figure | value |\n|---|---|");
        for (k, v) in rows {
            let _ = writeln!(out, "| {k} | {v} |");
        }
        out.push('\n');
    }
    if !e.allocations.is_empty() {
        let _ = writeln!(
            out,
            "| # | size | padding | shape | from |\n|---|---|---|---|---|"
        );
        for (i, a) in e.allocations.iter().take(10).enumerate() {
            let _ = writeln!(
                out,
                "| {} | {} | {} | `{}` | {} |",
                i + 1,
                format_size(a.size_bytes),
                alloc_padding(a),
                alloc_shape(a),
                alloc_from(a).replace('|', "\\|")
            );
        }
        out.push('\n');
    }
    if !d.ledger.is_empty() {
        let _ = writeln!(out, "| part | bytes | basis |\n|---|---|---|");
        for l in &d.ledger {
            let _ = writeln!(
                out,
                "| {} | {} | {}: {} |",
                l.part,
                format_size(l.bytes),
                l.basis,
                l.note
            );
        }
        out.push('\n');
    }
    if !d.causes.is_empty() {
        let _ = writeln!(out, "#### Plan\n");
        for (i, c) in d.causes.iter().enumerate() {
            let _ = writeln!(
                out,
                "{}. **`{}`** ({}): {}",
                i + 1,
                c.cause.as_str(),
                savings_text(c),
                c.evidence
            );
            for a in &c.actions {
                let _ = writeln!(out, "   - {a}");
            }
            for s in &c.snippets {
                let lang = if s.framework == "shell" {
                    "sh"
                } else {
                    "python"
                };
                let _ = writeln!(out, "\n   ```{lang}\n   # {}", s.framework);
                for line in s.code.lines() {
                    let _ = writeln!(out, "   {line}");
                }
                let _ = writeln!(out, "   ```");
            }
        }
    }
    if !d.missing.is_empty() {
        let _ = writeln!(out, "\n**Not shown by the input (collect to be sure):**\n");
        for m in &d.missing {
            let _ = writeln!(out, "- {m}");
        }
    }
    if !d.fits_on.is_empty() {
        let _ = writeln!(
            out,
            "\nWould fit on one device of: {}",
            d.fits_on.join(", ")
        );
    }
    if !report.warnings.is_empty() {
        out.push('\n');
        markdown_warnings(&mut out, report);
    }
    out
}

#[cfg(test)]
pub(crate) mod testdata {
    //! Real inputs for the views' snapshot tests, read from `tests/corpus` the way the binary
    //! reads them (HLO text without fusion bodies and `backend_config`).

    use hbm_doctor_analysis::analyze::{AnalyzeOptions, AnalyzeReport};
    use hbm_doctor_analysis::dump::{
        analyze_texts, hlo_without_fusion_bodies, DumpText, ModuleTexts,
    };
    use hbm_doctor_analysis::ExplainReport;
    use hbm_doctor_trend::detect::Params;
    use hbm_doctor_trend::reader::{Collected, Reader};
    use hbm_doctor_trend::report::TrendReport;
    use std::path::PathBuf;

    /// `tests/corpus/<rel>`.
    pub fn corpus(rel: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/corpus")
            .join(rel)
    }

    /// The text of `tests/corpus/<rel>`.
    pub fn read(rel: &str) -> String {
        std::fs::read_to_string(corpus(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// The explain report of a corpus log, as `hbm-doctor explain` makes it.
    pub fn explain(rel: &str) -> ExplainReport {
        let (events, warnings) = hbm_doctor_log::scan_all_with_warnings(read(rel).as_bytes());
        hbm_doctor_analysis::explain_with_warnings(events, warnings)
    }

    /// The analyze report of a corpus dump directory (its after-optimizations modules).
    pub fn analyze(rel: &str, opts: &AnalyzeOptions) -> AnalyzeReport {
        let mut names: Vec<String> = std::fs::read_dir(corpus(rel))
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
            let path = format!("tests/corpus/{rel}/{n}");
            let text = read(&format!("{rel}/{n}"));
            if modules.last().is_none_or(|m| m.key != key) {
                modules.push(ModuleTexts {
                    key: key.clone(),
                    ..ModuleTexts::default()
                });
            }
            let Some(m) = modules.last_mut() else {
                continue;
            };
            let file = Some(DumpText::new(path, text));
            if n.ends_with("-buffer-assignment.txt") {
                m.buffer_assignment = file;
            } else if n.ends_with("-live-range.txt") {
                m.live_range = file;
            } else if n.ends_with("-memory-usage-report.txt") {
                m.usage_report = file;
            } else if n.ends_with("after_optimizations.txt") {
                let full = file.map(|f| f.text).unwrap_or_default();
                let (kept, dropped) = hlo_without_fusion_bodies(&full);
                m.fusion_bodies = dropped;
                m.hlo = Some(DumpText::new(format!("tests/corpus/{rel}/{n}"), kept));
            }
        }
        analyze_texts(&modules, opts).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// The trend report of one corpus series.
    pub fn trend(rel: &str) -> TrendReport {
        let mut c = Collected::default();
        let stem = rel.rsplit('/').next().unwrap_or(rel);
        let mut r = Reader::new("", stem);
        r.feed(&mut c, read(rel).as_bytes());
        r.finish(&mut c);
        hbm_doctor_trend::report::report(&c, &Params::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hbm_doctor_log::{Remat, WarningFigures};

    #[test]
    fn explain_tpu_compile_failure() {
        let r = testdata::explain("tpu/debug_print_v5e/stderr.log");
        let src = "stderr.log";
        insta::assert_snapshot!(
            "explain_human_debug_print_v5e",
            render_explain(&r, Format::Human, Style::new(false), src)
        );
        insta::assert_snapshot!(
            "explain_markdown_debug_print_v5e",
            render_explain(&r, Format::Markdown, Style::new(false), src)
        );
    }

    #[test]
    fn explain_issue_post() {
        let r = testdata::explain("issues/erfanzar-EasyDeL-166.txt");
        let src = "erfanzar-EasyDeL-166.txt";
        insta::assert_snapshot!(
            "explain_human_easydel_166",
            render_explain(&r, Format::Human, Style::new(false), src)
        );
        insta::assert_snapshot!(
            "explain_markdown_easydel_166",
            render_explain(&r, Format::Markdown, Style::new(false), src)
        );
    }

    #[test]
    fn explain_a_clean_log() {
        let r = testdata::explain("tpu/fits_v5e/stderr.log");
        insta::assert_snapshot!(render_explain(
            &r,
            Format::Human,
            Style::new(false),
            "stderr.log"
        ));
    }

    #[test]
    fn one_line_per_warning_kind() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
        let remat = Remat {
            target_bytes: 10 << 30,
            reduced_to_bytes: 50 << 30,
            original_bytes: Some(60 << 30),
        };
        let w = WarningSummary {
            kind: WarningKind::RematWarning,
            count: 1_000_000,
            first_line: 1,
            last_line: 1_000_001,
            worst: WarningFigures::of_remat(77, &remat),
        };
        assert_eq!(
            warning_text(&w),
            "1,000,000 rematerialization warnings (remat_warning), lines 1-1000001; worst at line 77: could not get below 10.00G: reached 50.00G from 60.00G"
        );
        let w = WarningSummary {
            kind: WarningKind::AllocatorRetry,
            count: 1,
            first_line: 9,
            last_line: 9,
            worst: WarningFigures {
                line: 9,
                requested_bytes: Some(3 << 30),
                ..WarningFigures::default()
            },
        };
        assert_eq!(
            warning_text(&w),
            "1 allocator retry (allocator_retry), line 9; requested 3.00G"
        );
        let report = ExplainReport {
            schema_version: 1,
            events: Vec::new(),
            diagnosis: None,
            warnings: vec![w],
        };
        let text = render_explain(&report, Format::Human, Style::new(false), "x.log");
        assert_eq!(
            text,
            "✓ no out-of-memory event found in x.log\n\nWarnings (not errors; counted, not listed one by one)\n  ! 1 allocator retry (allocator_retry), line 9; requested 3.00G\n"
        );
        let json = render_explain(&report, Format::Json, Style::new(false), "x.log");
        assert!(json.contains("\"warnings\": ["), "{json}");
        let md = render_explain(&report, Format::Markdown, Style::new(false), "x.log");
        assert!(md.ends_with("- 1 allocator retry (allocator_retry), line 9; requested 3.00G\n"));
    }
}
