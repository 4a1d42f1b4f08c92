//! Small text helpers shared by the views: truncation with an ellipsis, markdown table cells and
//! inline code, shares of a whole.

/// `s` cut to `n` characters, the last one an ellipsis when anything was cut.
pub(crate) fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let head: String = s.chars().take(n.saturating_sub(1)).collect();
        format!("{head}…")
    }
}

/// A table cell: pipes escaped, newlines folded, empty shown as `—`.
pub(crate) fn cell(s: &str) -> String {
    let s = s.replace('|', "\\|").replace(['\n', '\r'], " ");
    if s.trim().is_empty() {
        "—".into()
    } else {
        s
    }
}

/// Inline code for a cell (backticks in the text fall back to plain text).
pub(crate) fn code(s: &str) -> String {
    if s.is_empty() {
        "—".into()
    } else if s.contains('`') {
        cell(s)
    } else {
        format!("`{}`", cell(s))
    }
}

/// `part` as a percentage of `whole`, one decimal.
pub(crate) fn share(part: u64, whole: u64) -> String {
    format!("{:.1}%", part as f64 * 100.0 / whole.max(1) as f64)
}
