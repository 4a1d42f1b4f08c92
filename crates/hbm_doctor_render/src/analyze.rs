//! Views of an `analyze` report: terminal text (per module and memory space: totals, the peak,
//! an area chart over program order, the buffers at the peak, the peak by source line and by
//! op_name; then the verdict, ledger, what-ifs and ranked causes), markdown to paste in an issue,
//! and the JSON contract.

use crate::text::{cell, code, share, trunc};
use crate::{json, Format, Style};
use hbm_doctor_analysis::analyze::{AnalyzeReport, ModuleReport, SpaceReport};
use hbm_doctor_log::format_size;
use std::fmt::Write as _;

/// Renders an analyze report; `top` buffers are listed per memory space.
pub fn render_analyze(report: &AnalyzeReport, format: Format, style: Style, top: usize) -> String {
    match format {
        Format::Json => json(report),
        Format::Human => human(report, top, style),
        Format::Markdown => markdown(report, top),
    }
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A one-line chart of bytes over program order (max per column).
pub fn sparkline(values: &[u64], width: usize) -> String {
    if values.is_empty() {
        return String::new();
    }
    let width = width.min(values.len()).max(1);
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    let min = values.iter().copied().min().unwrap_or(0);
    let span = (max - min).max(1);
    (0..width)
        .map(|c| {
            let a = c * values.len() / width;
            let b = ((c + 1) * values.len() / width).max(a + 1);
            let v = values[a..b].iter().copied().max().unwrap_or(0);
            BARS[(((v - min) as f64 / span as f64) * 7.0).round() as usize]
        })
        .collect()
}

/// A compact area chart of bytes over program order, `rows` lines high, from zero to the largest
/// of the values and `limit` (max per column): y labels on the left, the limit marked on its row,
/// and a last line with `^` under the peak position.
pub fn area_chart(
    values: &[u64],
    width: usize,
    rows: usize,
    limit: Option<u64>,
    peak: Option<u64>,
) -> Vec<String> {
    if values.is_empty() || rows == 0 {
        return Vec::new();
    }
    let width = width.min(values.len()).max(1);
    let vmax = values.iter().copied().max().unwrap_or(0);
    let ymax = vmax.max(limit.unwrap_or(0)).max(1);
    let cols: Vec<u64> = (0..width)
        .map(|c| {
            let a = c * values.len() / width;
            let b = ((c + 1) * values.len() / width).max(a + 1);
            values[a..b].iter().copied().max().unwrap_or(0)
        })
        .collect();
    let eighths: Vec<usize> = cols
        .iter()
        .map(|&v| ((v as f64 / ymax as f64) * (rows * 8) as f64).round() as usize)
        .collect();
    let limit_row = limit.map(|l| {
        let h = (l as f64 / ymax as f64) * rows as f64;
        rows - (h.ceil() as usize).clamp(1, rows)
    });
    let label_w = format_size(ymax).len().max(2);
    let mut out = Vec::with_capacity(rows + 1);
    for r in 0..rows {
        let base = (rows - 1 - r) * 8;
        let line: String = eighths
            .iter()
            .map(|&h| match h.saturating_sub(base) {
                0 => ' ',
                k if k >= 8 => '█',
                k => BARS[k - 1],
            })
            .collect();
        let label = match r {
            0 => format_size(ymax),
            _ if r == rows - 1 => "0B".to_string(),
            _ => String::new(),
        };
        let mark = match (limit_row, limit) {
            (Some(lr), Some(l)) if lr == r => format!(" ◂ limit {}", format_size(l)),
            _ => String::new(),
        };
        let line = if mark.is_empty() {
            line.trim_end()
        } else {
            &line
        };
        out.push(format!("{label:>label_w$} ┤{line}{mark}"));
    }
    let mut axis = format!("{:>label_w$} └", "");
    if let Some(t) = peak.filter(|&t| (t as usize) < values.len()) {
        let col = (t as usize * width / values.len()).min(width - 1);
        axis.push_str(&" ".repeat(col));
        axis.push_str(&format!(
            "^ peak {} at #{t}",
            format_size(values[t as usize])
        ));
    }
    out.push(axis);
    out
}

fn render_space(out: &mut String, s: &SpaceReport, top: usize, limit: Option<u64>, st: Style) {
    let _ = writeln!(
        out,
        "  {}: total {} (what the compiler reserves), peak {} live{}",
        st.bold(&s.space),
        format_size(s.total_bytes),
        format_size(s.peak_bytes),
        s.peak_instruction
            .as_deref()
            .map(|i| format!(" at #{} {i}", s.peak_time.unwrap_or(0)))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "    arguments {}  outputs {}  aliased {}  temporaries {}  padding {}{}",
        format_size(s.arguments_bytes),
        format_size(s.outputs_bytes),
        format_size(s.aliased_bytes),
        format_size(s.temp_bytes),
        format_size(s.padding_bytes),
        if s.fragmentation_bytes > 0 {
            format!("  fragmentation {}", format_size(s.fragmentation_bytes))
        } else {
            String::new()
        }
    );
    if s.timeline.len() > 1 {
        let _ = writeln!(
            out,
            "    memory over program order ({} schedule positions; `hbm-doctor view` draws it):",
            s.timeline.len()
        );
        let limit = limit.filter(|_| s.color == 0);
        for line in area_chart(&s.timeline, 64, 4, limit, s.peak_time) {
            let _ = writeln!(out, "      {line}");
        }
    }
    if s.buffers_at_peak.is_empty() {
        return;
    }
    let header = format!(
        "{:>9} {:>9}  {:<9} {:<26} {:<28} op_name / source",
        "size", "unpadded", "kind", "shape", "buffer"
    );
    let _ = writeln!(out, "    {}", st.dim(&header));
    for b in s.buffers_at_peak.iter().take(top) {
        let origin = match (&b.op_name, &b.source) {
            (Some(o), Some(src)) => format!("{} ({src})", trunc(o, 48)),
            (Some(o), None) => trunc(o, 60),
            (None, Some(src)) => src.clone(),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "    {:>9} {:>9}  {:<9} {:<26} {:<28} {}",
            format_size(b.size_bytes),
            format_size(b.unpadded_bytes),
            b.kind,
            trunc(&b.shape, 26),
            trunc(&b.name, 28),
            origin
        );
    }
    if s.buffers_at_peak.len() > top {
        let rest: u64 = s.buffers_at_peak[top..].iter().map(|b| b.size_bytes).sum();
        let _ = writeln!(
            out,
            "    ... {} more buffers, {}",
            s.buffers_at_peak.len() - top,
            format_size(rest)
        );
    }
    let with_source: Vec<_> = s
        .by_source
        .iter()
        .filter(|g| !g.key.starts_with('('))
        .take(5)
        .collect();
    if !with_source.is_empty() {
        let _ = writeln!(
            out,
            "    by source line: {}",
            with_source
                .iter()
                .map(|g| format!("{} {}", g.key, format_size(g.bytes)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let tree: Vec<_> = s
        .by_op_name
        .iter()
        .filter(|g| g.depth < 3 && g.bytes * 50 >= s.peak_bytes.max(1))
        .take(12)
        .collect();
    if !tree.is_empty() {
        let _ = writeln!(out, "    by op_name:");
        for g in tree {
            let leaf = g.key.rsplit('/').next().unwrap_or(&g.key);
            let _ = writeln!(
                out,
                "      {}{} {} ({})",
                "  ".repeat(g.depth),
                trunc(leaf, 60),
                format_size(g.bytes),
                g.buffers
            );
        }
    }
}

/// ` (N partitions, per-device figures)` for SPMD modules, else nothing.
fn partitions_note(m: &ModuleReport) -> String {
    if m.num_partitions > 1 {
        format!(" ({} partitions, per-device figures)", m.num_partitions)
    } else {
        String::new()
    }
}

/// The memory spaces that hold anything.
fn spaces_in_use(m: &ModuleReport) -> impl Iterator<Item = &SpaceReport> {
    m.memory_spaces
        .iter()
        .filter(|s| s.total_bytes > 0 || s.peak_bytes > 0)
}

fn render_module(out: &mut String, m: &ModuleReport, top: usize, limit: Option<u64>, st: Style) {
    let _ = writeln!(
        out,
        "{}{}{}",
        st.bold(&format!("module {}", m.name)),
        partitions_note(m),
        if m.estimate {
            st.yellow(" - ESTIMATE from the schedule (no buffer assignment)")
        } else {
            String::new()
        }
    );
    for s in spaces_in_use(m) {
        render_space(out, s, top, limit, st);
    }
    if let (Some(x), Some(o)) = (m.xla.live_range_peak_bytes, m.xla.recomputed_peak_bytes) {
        let _ = writeln!(
            out,
            "  XLA live-range peak (logical sizes, all spaces): {} at #{}{}",
            format_size(x),
            m.xla.live_range_peak_time.unwrap_or(0),
            if x == o {
                ", reproduced exactly".to_string()
            } else {
                format!(", recomputed {}", format_size(o))
            }
        );
    }
    for n in &m.notes {
        let _ = writeln!(out, "  {}", st.dim(&format!("note: {n}")));
    }
}

/// The human report.
fn human(r: &AnalyzeReport, top: usize, st: Style) -> String {
    let mut out = String::new();
    for m in &r.modules {
        render_module(&mut out, m, top, r.diagnosis.budget_bytes, st);
        out.push('\n');
    }
    let d = &r.diagnosis;
    let summary = match d.fits {
        Some(false) => st.red(&d.summary),
        Some(true) => st.green(&d.summary),
        None => st.bold(&d.summary),
    };
    let _ = writeln!(out, "{summary}");
    if !d.ledger.is_empty() {
        let _ = writeln!(out, "{}", st.bold("ledger (HBM of the main module):"));
        let w = d.ledger.iter().map(|l| l.part.len()).max().unwrap_or(0);
        for l in &d.ledger {
            let _ = writeln!(
                out,
                "  {:<w$}  {:>9}  {}",
                l.part,
                format_size(l.bytes),
                st.dim(&l.note)
            );
        }
    }
    for w in &d.what_if {
        let _ = writeln!(
            out,
            "what if {}: peak {} -> {} ({} buffers changed); total {}{}",
            w.change,
            format_size(w.peak_before_bytes),
            format_size(w.peak_bytes),
            w.buffers,
            format_size(w.total_bytes),
            match w.fits {
                Some(true) => st.green(" - fits the budget"),
                Some(false) => st.red(" - still does not fit the budget"),
                None => String::new(),
            }
        );
    }
    if d.causes.is_empty() {
        let _ = writeln!(out, "{}", st.green("no known waste found"));
    }
    for (k, c) in d.causes.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. {}{}: {}",
            k + 1,
            st.cyan(c.cause.as_str()),
            c.savings_bytes
                .map(|s| format!(" (saves ~{})", format_size(s)))
                .unwrap_or_default(),
            c.evidence
        );
        for a in &c.actions {
            let _ = writeln!(out, "   - {a}");
        }
    }
    out
}

fn markdown_space(out: &mut String, s: &SpaceReport, top: usize) {
    let _ = writeln!(out, "#### {} buffers live at the peak\n", s.space);
    if s.buffers_at_peak.is_empty() {
        let _ = writeln!(out, "_none known (no live ranges)_\n");
        return;
    }
    let _ = writeln!(
        out,
        "| # | size | unpadded | kind | shape | buffer | op | op_name | source |\n|---:|---:|---:|---|---|---|---|---|---|"
    );
    for (k, b) in s.buffers_at_peak.iter().take(top).enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            k + 1,
            format_size(b.size_bytes),
            format_size(b.unpadded_bytes),
            b.kind,
            code(&b.shape),
            code(&b.name),
            b.opcode.as_deref().map_or_else(|| "—".into(), code),
            b.op_name
                .as_deref()
                .map_or_else(|| "—".into(), |o| code(&trunc(o, 80))),
            b.source.as_deref().map_or_else(|| "—".into(), code),
        );
    }
    if s.buffers_at_peak.len() > top {
        let rest = &s.buffers_at_peak[top..];
        let bytes: u64 = rest.iter().map(|b| b.size_bytes).sum();
        let unpadded: u64 = rest.iter().map(|b| b.unpadded_bytes).sum();
        let _ = writeln!(
            out,
            "| | {} | {} | {} more buffers | | | | | |",
            format_size(bytes),
            format_size(unpadded),
            rest.len()
        );
    }
    out.push('\n');
    let sources: Vec<_> = s.by_source.iter().take(top).collect();
    if sources.iter().any(|g| !g.key.starts_with('(')) {
        let _ = writeln!(
            out,
            "#### {} peak by source line\n\n| source | bytes | share | buffers |\n|---|---:|---:|---:|",
            s.space
        );
        for g in sources {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                if g.key.starts_with('(') {
                    cell(&g.key)
                } else {
                    code(&g.key)
                },
                format_size(g.bytes),
                share(g.bytes, s.peak_bytes),
                g.buffers
            );
        }
        out.push('\n');
    }
    let tree: Vec<_> = s
        .by_op_name
        .iter()
        .filter(|g| g.depth < 4 && g.bytes * 50 >= s.peak_bytes.max(1))
        .take(3 * top)
        .collect();
    if !tree.is_empty() {
        let _ = writeln!(
            out,
            "#### {} peak by op_name path\n\n| op_name path | bytes | share | buffers |\n|---|---:|---:|---:|",
            s.space
        );
        for g in tree {
            let leaf = g.key.rsplit('/').next().unwrap_or(&g.key);
            let _ = writeln!(
                out,
                "| {}{} | {} | {} | {} |",
                "&nbsp;&nbsp;".repeat(g.depth),
                code(&trunc(leaf, 60)),
                format_size(g.bytes),
                share(g.bytes, s.peak_bytes),
                g.buffers
            );
        }
        out.push('\n');
    }
}

/// The markdown report: one table of figures per module and memory space, the buffers at the
/// peak, the peak by source line and by op_name path, and the ranked causes; to paste in an
/// issue or a pull request.
fn markdown(r: &AnalyzeReport, top: usize) -> String {
    let mut out = String::new();
    let d = &r.diagnosis;
    let _ = writeln!(out, "### hbm-doctor analyze: {}\n", cell(&d.summary));
    let _ = writeln!(
        out,
        "**Category:** `{}`{}\n",
        d.category.as_str(),
        d.budget_bytes
            .map(|b| format!(
                " · **budget:** {} · **fits:** {}",
                format_size(b),
                if d.fits == Some(true) { "yes" } else { "no" }
            ))
            .unwrap_or_default()
    );
    if !d.ledger.is_empty() {
        let _ = writeln!(out, "| part | bytes | what |\n|---|---:|---|");
        for l in &d.ledger {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                l.part,
                format_size(l.bytes),
                cell(&l.note)
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "| module | space | total | peak | arguments | outputs | aliased | temporaries | padding | fragmentation | method |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for m in &r.modules {
        for s in &m.memory_spaces {
            if s.total_bytes == 0 && s.peak_bytes == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                code(&m.name),
                s.space,
                format_size(s.total_bytes),
                format_size(s.peak_bytes),
                format_size(s.arguments_bytes),
                format_size(s.outputs_bytes),
                format_size(s.aliased_bytes),
                format_size(s.temp_bytes),
                format_size(s.padding_bytes),
                format_size(s.fragmentation_bytes),
                if m.estimate {
                    format!("{} (estimate)", m.method)
                } else {
                    m.method.clone()
                }
            );
        }
    }
    out.push('\n');
    if !d.causes.is_empty() {
        let _ = writeln!(
            out,
            "#### Causes\n\n| # | cause | saves | evidence |\n|---:|---|---:|---|"
        );
        for (k, c) in d.causes.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | `{}` | {} | {} |",
                k + 1,
                c.cause.as_str(),
                c.savings_bytes
                    .map_or_else(|| "—".into(), |b| format!("~{}", format_size(b))),
                cell(&c.evidence)
            );
        }
        out.push('\n');
        for (k, c) in d.causes.iter().enumerate() {
            if c.actions.is_empty() {
                continue;
            }
            let _ = writeln!(out, "{}. **`{}`**", k + 1, c.cause.as_str());
            for a in &c.actions {
                let _ = writeln!(out, "   - {}", a.replace('\n', " "));
            }
        }
        out.push('\n');
    } else {
        let _ = writeln!(out, "No known waste found.\n");
    }
    for m in &r.modules {
        let _ = writeln!(
            out,
            "### Module `{}`{}{}\n",
            m.name,
            partitions_note(m),
            if m.estimate {
                " — estimate from the schedule (no buffer assignment)"
            } else {
                ""
            }
        );
        for s in spaces_in_use(m) {
            if let Some(i) = &s.peak_instruction {
                let _ = writeln!(
                    out,
                    "**{}** peak {} at schedule position {} (`{}`) of {}.\n",
                    s.space,
                    format_size(s.peak_bytes),
                    s.peak_time.unwrap_or(0),
                    cell(i),
                    s.timeline.len()
                );
            }
            markdown_space(&mut out, s, top);
        }
        if let (Some(x), Some(o)) = (m.xla.live_range_peak_bytes, m.xla.recomputed_peak_bytes) {
            let _ = writeln!(
                out,
                "XLA's live-range peak (logical sizes, all spaces): {} at #{}{}.\n",
                format_size(x),
                m.xla.live_range_peak_time.unwrap_or(0),
                if x == o {
                    ", reproduced exactly".to_string()
                } else {
                    format!(", recomputed {}", format_size(o))
                }
            );
        }
        for n in &m.notes {
            let _ = writeln!(out, "> **note:** {}\n", cell(n));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata;
    use hbm_doctor_analysis::analyze::AnalyzeOptions;

    fn target(gen: &str) -> AnalyzeOptions {
        let chip = hbm_doctor_analysis::chips::tpu_by_name(gen).expect("chip");
        AnalyzeOptions {
            budget_bytes: Some(chip.usable_bytes),
            target: Some(chip.name.to_string()),
        }
    }

    fn plain() -> Style {
        Style::new(false)
    }

    /// Drops ANSI colour sequences.
    fn strip_ansi(s: &str) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find("\x1b[") {
            out.push_str(&rest[..i]);
            rest = &rest[i..];
            let end = rest.find('m').map_or(rest.len(), |k| k + 1);
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn human_debug_print_over_v5e() {
        let r = testdata::analyze("tpu/debug_print_v5e/dump", &target("v5e"));
        insta::assert_snapshot!(render_analyze(&r, Format::Human, plain(), 10));
    }

    #[test]
    fn markdown_debug_print_over_v5e() {
        let r = testdata::analyze("tpu/debug_print_v5e/dump", &target("v5e"));
        insta::assert_snapshot!(render_analyze(&r, Format::Markdown, plain(), 3));
    }

    #[test]
    fn human_fits_v5e() {
        let r = testdata::analyze("tpu/fits_v5e/dump", &target("v5e"));
        insta::assert_snapshot!(render_analyze(&r, Format::Human, plain(), 5));
    }

    #[test]
    fn human_and_markdown_of_a_sharded_cpu_program() {
        let r = testdata::analyze("cpu/sharded_mlp/dump", &AnalyzeOptions::default());
        insta::assert_snapshot!(
            "human_sharded_mlp",
            render_analyze(&r, Format::Human, plain(), 5)
        );
        insta::assert_snapshot!(
            "markdown_sharded_mlp",
            render_analyze(&r, Format::Markdown, plain(), 5)
        );
    }

    #[test]
    fn colour_only_adds_escapes_and_markdown_and_json_never_colour() {
        let r = testdata::analyze("tpu/debug_print_v5e/dump", &target("v5e"));
        let coloured = render_analyze(&r, Format::Human, Style::new(true), 10);
        let plain_text = render_analyze(&r, Format::Human, plain(), 10);
        assert_ne!(coloured, plain_text);
        assert!(coloured.contains("\x1b[1;31m"), "the verdict is red");
        assert_eq!(strip_ansi(&coloured), plain_text);
        for f in [Format::Markdown, Format::Json] {
            assert_eq!(
                render_analyze(&r, f, Style::new(true), 10),
                render_analyze(&r, f, plain(), 10)
            );
        }
        let json = render_analyze(&r, Format::Json, plain(), 10);
        assert_eq!(json, serde_json::to_string_pretty(&r).expect("json") + "\n");
    }

    #[test]
    fn charts() {
        assert_eq!(sparkline(&[], 8), "");
        assert_eq!(sparkline(&[0, 1, 2, 3, 4, 5, 6, 7], 8), "▁▂▃▄▅▆▇█");
        assert_eq!(sparkline(&[5, 5, 5], 8), "▁▁▁");
        let chart = area_chart(
            &[0, 1 << 30, 2 << 30, 1 << 30],
            4,
            2,
            Some(3 << 30),
            Some(2),
        );
        assert_eq!(
            chart,
            [
                "3.00G ┤  ▃  ◂ limit 3.00G",
                "   0B ┤ ▅█▅",
                "      └  ^ peak 2.00G at #2",
            ]
        );
    }
}
