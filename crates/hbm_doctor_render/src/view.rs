//! `hbm-doctor view`: one self-contained, offline HTML page that draws an `analyze` report.
//!
//! The page embeds the report exactly as `analyze --format json` serializes it (in a
//! `<script type="application/json">` element, with `<`, `>` and `&` written as JSON `\u` escapes
//! so no text can close the element) and draws it with the inlined vanilla JavaScript and canvas
//! of `assets/view.{html,css,js}`. Nothing is fetched: a Content-Security-Policy of
//! `default-src 'none'` forbids every network load, so the page works on air-gapped machines.
//! Like every renderer here it computes no figure of the analysis: the page only draws, sorts,
//! filters and (in diff mode) subtracts the two reports' figures.

use hbm_doctor_analysis::analyze::AnalyzeReport;
use hbm_doctor_analysis::chips::TPUS;
use serde::Serialize;

const TEMPLATE: &str = include_str!("../assets/view.html");
const STYLE: &str = include_str!("../assets/view.css");
const SCRIPT: &str = include_str!("../assets/view.js");

/// One report shown by the page: the single report, or one side of a diff.
#[derive(Debug, Clone, Copy)]
pub struct ViewSide<'a> {
    /// What the user passed (a dump directory or file), shown in the title.
    pub label: &'a str,
    /// The analysis, as `analyze` computed it.
    pub report: &'a AnalyzeReport,
}

/// Options of the page.
#[derive(Debug, Clone, Default)]
pub struct ViewOptions {
    /// The module to open first (a substring of its name); by default the largest in HBM.
    pub module: Option<String>,
    /// The chip whose limit is drawn (`--target`), for the label.
    pub target: Option<String>,
    /// The limit line in bytes (`--target`'s usable HBM or `--budget`).
    pub limit_bytes: Option<u64>,
    /// `hbm-doctor <version>`, written into the page.
    pub generator: String,
}

#[derive(Serialize)]
struct Chip {
    name: &'static str,
    long_name: &'static str,
    usable_bytes: u64,
}

#[derive(Serialize)]
struct Meta<'a> {
    mode: &'a str,
    labels: Vec<&'a str>,
    module: Option<&'a str>,
    target: Option<&'a str>,
    limit_bytes: Option<u64>,
    chips: Vec<Chip>,
    generator: &'a str,
}

/// JSON that is safe inside a `<script>` element: `<`, `>` and `&` (which only occur inside
/// JSON strings) become `\u003c`, `\u003e`, `\u0026`; the value parses back unchanged.
pub fn script_safe_json<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    let s = serde_json::to_string(value)?;
    let mut out = String::with_capacity(s.len() + 64);
    for c in s.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Escapes text for HTML content and attribute values.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The id of the `<script type="application/json">` element holding side `k` of `n` sides:
/// `hbm-report` for a single report, `hbm-report-before` / `hbm-report-after` for a diff.
pub fn report_element_id(k: usize, n: usize) -> &'static str {
    match (n, k) {
        (1, _) => "hbm-report",
        (_, 0) => "hbm-report-before",
        _ => "hbm-report-after",
    }
}

/// Renders the page for one report, or for a diff when given two (before, after).
pub fn render_view(
    sides: &[ViewSide<'_>],
    opts: &ViewOptions,
) -> Result<String, serde_json::Error> {
    let mut chips: Vec<Chip> = TPUS
        .iter()
        .map(|t| Chip {
            name: t.name,
            long_name: t.long_name,
            usable_bytes: t.usable_bytes,
        })
        .collect();
    chips.sort_by_key(|c| c.usable_bytes);
    let meta = Meta {
        mode: if sides.len() > 1 { "diff" } else { "single" },
        labels: sides.iter().map(|s| s.label).collect(),
        module: opts.module.as_deref(),
        target: opts.target.as_deref(),
        limit_bytes: opts.limit_bytes,
        chips,
        generator: &opts.generator,
    };
    let mut reports = String::new();
    for (k, s) in sides.iter().enumerate() {
        reports.push_str(&format!(
            "<script type=\"application/json\" id=\"{}\" data-label=\"{}\">{}</script>\n",
            report_element_id(k, sides.len()),
            html_escape(s.label),
            script_safe_json(s.report)?
        ));
    }
    let title = match sides {
        [one] => format!("hbm-doctor view: {}", one.label),
        [a, b, ..] => format!("hbm-doctor view: {} → {}", a.label, b.label),
        [] => "hbm-doctor view".to_string(),
    };
    let values: [(&str, String); 6] = [
        ("GENERATOR", html_escape(&opts.generator)),
        ("TITLE", html_escape(&title)),
        ("STYLE", STYLE.to_string()),
        ("META", script_safe_json(&meta)?),
        ("REPORTS", reports),
        ("SCRIPT", SCRIPT.to_string()),
    ];
    Ok(fill(TEMPLATE, &values))
}

/// Replaces `{{NAME}}` placeholders in one pass (substituted text is never scanned again).
fn fill(template: &str, values: &[(&str, String)]) -> String {
    let mut out =
        String::with_capacity(template.len() + values.iter().map(|(_, v)| v.len()).sum::<usize>());
    let mut rest = template;
    while let Some(k) = rest.find("{{") {
        out.push_str(&rest[..k]);
        let after = &rest[k + 2..];
        match after.find("}}").and_then(|e| {
            values
                .iter()
                .find(|(n, _)| *n == &after[..e])
                .map(|(_, v)| (e, v))
        }) {
            Some((e, v)) => {
                out.push_str(v);
                rest = &after[e + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_script_safe_and_round_trips() {
        let v = serde_json::json!({"op": "</script><!-- & >", "n": 1});
        let s = script_safe_json(&v).expect("serializes");
        assert!(!s.contains('<') && !s.contains('>') && !s.contains('&'));
        let back: serde_json::Value = serde_json::from_str(&s).expect("parses");
        assert_eq!(back, v);
    }

    #[test]
    fn fill_does_not_rescan_substituted_text() {
        let out = fill(
            "a{{X}}b{{Y}}c{{Z}}",
            &[("X", "{{Y}}".into()), ("Y", "y".into())],
        );
        assert_eq!(out, "a{{Y}}byc{{Z}}");
    }
}
