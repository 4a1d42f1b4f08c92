//! Live-range text (`HloLiveRange::ToString`), formats A (2023–2025) and B (2025+), formats.md §3.3.
//!
//! Times are positions in the flattened schedule; a range `start-end` is inclusive on both ends.

use crate::text::{parse_bytes, Diagnostic};

/// One `name{idx}:start-end` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range<'a> {
    /// Instruction name.
    pub name: &'a str,
    /// ShapeIndex as printed (`{}` or `{1}`).
    pub index: &'a str,
    /// First time the value is live.
    pub start: u64,
    /// Last time the value is live (inclusive).
    pub end: u64,
}

/// One line under `Live ranges at N (peak):`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeakEntry<'a> {
    /// `name{idx}` (format B) or `name` (format A).
    pub key: &'a str,
    /// Bytes as XLA sized it (logical `ByteSizeOf`, not padded).
    pub bytes: u64,
    /// Running total (format B only).
    pub cumulative: Option<u64>,
}

/// One node of the "Stack trace breakdown" tree (format B).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakdownNode<'a> {
    /// Nesting depth (0 = the entry computation).
    pub depth: usize,
    /// Node name (an op_name, a computation or a pytree part).
    pub name: &'a str,
    /// Bytes under this node.
    pub total: u64,
    /// Bytes attributed to exactly this node.
    pub current: u64,
}

/// A parsed live-range dump.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveRange<'a> {
    /// `max N`: the schedule's end time.
    pub max: u64,
    /// The flattened instruction sequence, by time.
    pub sequence: Vec<&'a str>,
    /// Buffer live ranges.
    pub ranges: Vec<Range<'a>>,
    /// The peak time XLA chose.
    pub peak_time: Option<u64>,
    /// The values XLA lists as live at the peak.
    pub peak: Vec<PeakEntry<'a>>,
    /// `Stack trace breakdown for peak usage: N bytes` (format B).
    pub breakdown_total: Option<u64>,
    /// The breakdown tree, pre-order.
    pub breakdown: Vec<BreakdownNode<'a>>,
}

impl LiveRange<'_> {
    /// XLA's stated peak: the breakdown total, else the last cumulative, else the sum of entries.
    pub fn stated_peak_bytes(&self) -> Option<u64> {
        self.peak_time?;
        self.breakdown_total
            .or_else(|| self.peak.last().and_then(|e| e.cumulative))
            .or_else(|| {
                Some(
                    self.peak
                        .iter()
                        .fold(0u64, |a, e| a.saturating_add(e.bytes)),
                )
            })
    }
}

/// Parses live-range text (the whole `-live-range.txt`, or the tail of a buffer assignment).
pub fn parse_live_range(text: &str) -> (LiveRange<'_>, Vec<Diagnostic>) {
    let mut lr = LiveRange::default();
    let mut diags = Vec::new();
    let mut section = 0u8;
    let mut offset = 0usize;
    for raw in text.split('\n') {
        let line_start = offset;
        offset += raw.len() + 1;
        let line = raw.trim_end_matches('\r');
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(rest) = t.strip_prefix("HloLiveRange (max ") {
            lr.max = rest.trim_end_matches("):").trim().parse().unwrap_or(0);
            continue;
        }
        if t.starts_with("HloLiveRange not available") {
            diags.push(Diagnostic {
                line: 1,
                message: "XLA did not have the live range (finalized or from proto)".into(),
            });
            continue;
        }
        match t {
            "InstructionSequence:" => {
                section = 1;
                continue;
            }
            "BufferLiveRange:" => {
                section = 2;
                continue;
            }
            _ => {}
        }
        if let Some(rest) = t.strip_prefix("Live ranges at ") {
            lr.peak_time = rest.split_whitespace().next().and_then(|n| n.parse().ok());
            section = 3;
            continue;
        }
        if let Some(rest) = t.strip_prefix("Stack trace breakdown for peak usage:") {
            lr.breakdown_total = parse_bytes(rest);
            section = 4;
            continue;
        }
        let ok = match section {
            1 => t
                .split_once(':')
                .map(|(_, name)| lr.sequence.push(name))
                .is_some(),
            2 => parse_range(t).map(|r| lr.ranges.push(r)).is_some(),
            3 => parse_peak_entry(t).map(|e| lr.peak.push(e)).is_some(),
            4 => parse_node(line).map(|n| lr.breakdown.push(n)).is_some(),
            _ => false,
        };
        if !ok {
            diags.push(Diagnostic::at(
                text,
                line_start,
                format!(
                    "skipped live-range line: {}",
                    t.chars().take(80).collect::<String>()
                ),
            ));
        }
    }
    if let Some(d0) = lr.breakdown.iter().map(|n| n.depth).min() {
        for n in &mut lr.breakdown {
            n.depth -= d0;
        }
    }
    lr.ranges.shrink_to_fit();
    lr.sequence.shrink_to_fit();
    (lr, diags)
}

fn parse_range(t: &str) -> Option<Range<'_>> {
    let colon = t.rfind(':')?;
    let (key, span) = (&t[..colon], &t[colon + 1..]);
    let (s, e) = span.split_once('-')?;
    let (name, index) = match key.find('{') {
        Some(k) => (&key[..k], &key[k..]),
        None => (key, "{}"),
    };
    Some(Range {
        name,
        index,
        start: s.trim().parse().ok()?,
        end: e.trim().parse().ok()?,
    })
}

fn parse_peak_entry(t: &str) -> Option<PeakEntry<'_>> {
    // `name{idx}: N bytes (cumulative: M bytes)` or `name: N bytes`
    let k = t.find(": ")?;
    let key = &t[..k];
    let rest = &t[k + 2..];
    let (bytes_txt, cum) = match rest.find("(cumulative:") {
        Some(c) => (
            &rest[..c],
            rest[c + 12..]
                .trim_end_matches(')')
                .trim()
                .strip_suffix("bytes")
                .and_then(parse_bytes),
        ),
        None => (rest, None),
    };
    Some(PeakEntry {
        key,
        bytes: parse_bytes(bytes_txt.trim())?,
        cumulative: cum,
    })
}

fn parse_node(line: &str) -> Option<BreakdownNode<'_>> {
    // `<indent><connector>name (P%, total: N bytes, current: N bytes, remaining: N bytes)`
    let open = line.rfind(" (")?;
    let head = &line[..open];
    let stats = &line[open + 2..];
    let name_start = head
        .char_indices()
        .find(|&(_, c)| !matches!(c, ' ' | '│' | '├' | '└' | '─'))
        .map(|(k, _)| k)?;
    let depth = head[..name_start].chars().count() / 4;
    let field = |key: &str| -> Option<u64> {
        let k = stats.find(key)? + key.len();
        let e = stats[k..].find("bytes")?;
        parse_bytes(&stats[k..k + e])
    };
    Some(BreakdownNode {
        depth,
        name: &head[name_start..],
        total: field("total:")?,
        current: field("current:").unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_b() {
        let text = "HloLiveRange (max 4):
  InstructionSequence:
    0:paramA
    1:constant
  BufferLiveRange:
    paramA{}:0-4
    constant{1}:1-3
  Live ranges at 1 (peak):
    constant{}: 16 bytes (cumulative: 16 bytes)
    paramA{}: 1 234 bytes (cumulative: 1 250 bytes)
  Stack trace breakdown for peak usage: 1 250 bytes
    main (100.0%, total: 1 250 bytes, current: 0 bytes, remaining: 1 250 bytes)
      ├── constant (30.8%, total: 16 bytes, current: 16 bytes, remaining: 36 bytes)
      └── paramA (30.8%, total: 1 234 bytes, current: 1 234 bytes, remaining: 4 bytes)
";
        let (lr, diags) = parse_live_range(text);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(lr.max, 4);
        assert_eq!(lr.sequence, vec!["paramA", "constant"]);
        assert_eq!(
            lr.ranges[1],
            Range {
                name: "constant",
                index: "{1}",
                start: 1,
                end: 3
            }
        );
        assert_eq!(lr.peak_time, Some(1));
        assert_eq!(lr.peak[1].cumulative, Some(1250));
        assert_eq!(lr.stated_peak_bytes(), Some(1250));
        assert_eq!(lr.breakdown.len(), 3);
        assert_eq!(
            (
                lr.breakdown[2].depth,
                lr.breakdown[2].name,
                lr.breakdown[2].total
            ),
            (1, "paramA", 1234)
        );
    }

    #[test]
    fn format_a() {
        let text = "HloLiveRange (max 2):\n  InstructionSequence:\n    0:a\n  BufferLiveRange:\n    a{}:0-2\n  Live ranges at 0 (peak):\n    a: 8 bytes\n    a: 8 bytes\n";
        let (lr, _) = parse_live_range(text);
        assert_eq!(lr.stated_peak_bytes(), Some(16));
        assert_eq!(lr.peak[0].cumulative, None);
    }
}
