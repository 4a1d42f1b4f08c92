//! `*-memory-usage-report.txt` (`BufferAssignment::MemoryUsageReport`), formats.md §3.4.
//!
//! Variants read: the per-memory-space table of the newest libtpu (`Memory Space: default
//! (color=0)` / `Total bytes: N` / `cumulative_size; size; offset; used_by_n_values; shapes_list`),
//! the 2024 text report (`Total bytes used:` + `Allocations sorted by size`), the 2025 protobuf
//! text (`memory_space_allocation_entries { total_bytes: ... }`) and the third-party `Total bytes:`
//! form.

use crate::text::{parse_bytes, Diagnostic};

/// One offset-group row: `cum(pct%); size; offset; n; shapes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportRow<'a> {
    /// Size of the slot.
    pub size: u64,
    /// Offset within its allocation.
    pub offset: u64,
    /// Values sharing the slot.
    pub values: u64,
    /// Distinct shapes with counts (`2×f32[8192]`), as printed.
    pub shapes: &'a str,
}

/// The report for one memory space.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportSpace<'a> {
    /// Color, when stated (the 2024 text variant does not split by color).
    pub color: Option<u32>,
    /// Name as printed (`default`, `vmem`, `smem`), when stated.
    pub name: Option<&'a str>,
    /// `Total bytes` / `total_bytes`.
    pub total_bytes: u64,
    /// Table rows (offset groups), all allocations together.
    pub rows: Vec<ReportRow<'a>>,
}

/// A parsed memory-usage report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageReport<'a> {
    /// Which variant: `table` (newest libtpu), `text` (2024), `proto` (2025), `total` (third-party).
    pub variant: &'static str,
    /// Per memory space, in printed order.
    pub spaces: Vec<ReportSpace<'a>>,
}

impl UsageReport<'_> {
    /// Total bytes for color `c` (a report without colors counts as color 0).
    pub fn total_for_color(&self, c: u32) -> Option<u64> {
        self.spaces
            .iter()
            .find(|s| s.color.unwrap_or(0) == c)
            .map(|s| s.total_bytes)
    }
}

/// Parses a memory-usage report of any known variant.
pub fn parse_usage_report(text: &str) -> (UsageReport<'_>, Vec<Diagnostic>) {
    let mut rep = UsageReport::default();
    let mut diags = Vec::new();
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if first.starts_with("memory_space_allocation_entries") {
        rep.variant = "proto";
        parse_proto(text, &mut rep);
        return (rep, diags);
    }
    rep.variant = if first.starts_with("Memory Space:") {
        "table"
    } else if first.starts_with("Total bytes used:") {
        "text"
    } else if first.starts_with("Total bytes:") {
        "total"
    } else {
        diags.push(Diagnostic {
            line: 1,
            message: format!(
                "unknown memory-usage report format: {}",
                first.chars().take(60).collect::<String>()
            ),
        });
        "unknown"
    };
    let mut offset = 0usize;
    let mut in_rows = false;
    for raw in text.split('\n') {
        let start = offset;
        offset += raw.len() + 1;
        let t = raw.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(rest) = t.strip_prefix("Memory Space:") {
            // `default (color=0)`
            let rest = rest.trim();
            let name = rest.split_whitespace().next();
            let color = rest
                .find("color=")
                .and_then(|k| rest[k + 6..].trim_end_matches(')').trim().parse().ok());
            rep.spaces.push(ReportSpace {
                color,
                name,
                ..Default::default()
            });
            in_rows = false;
            continue;
        }
        if let Some(rest) = t
            .strip_prefix("Total bytes used:")
            .or_else(|| t.strip_prefix("Total bytes:"))
        {
            if rep.spaces.is_empty() {
                rep.spaces.push(ReportSpace::default());
            }
            let n = rest.split_whitespace().next().and_then(parse_bytes);
            if let (Some(n), Some(s)) = (n, rep.spaces.last_mut()) {
                s.total_bytes = n;
            }
            continue;
        }
        if t.starts_with("cumulative_size;") {
            in_rows = true;
            continue;
        }
        if t.starts_with("---")
            || t.starts_with("The rest ")
            || t.starts_with("Allocations sorted")
            || t.starts_with("allocation ")
            || t.contains("; allocation ")
        {
            continue;
        }
        if in_rows {
            match parse_row(t) {
                Some(r) => {
                    if let Some(s) = rep.spaces.last_mut() {
                        s.rows.push(r);
                    }
                }
                None => diags.push(Diagnostic::at(
                    text,
                    start,
                    format!(
                        "skipped report line: {}",
                        t.chars().take(80).collect::<String>()
                    ),
                )),
            }
        }
    }
    (rep, diags)
}

fn parse_row(t: &str) -> Option<ReportRow<'_>> {
    let mut parts = t.splitn(5, ';');
    let _cum = parts.next()?;
    let size = parse_bytes(parts.next()?.trim())?;
    let offset = parts.next()?.trim().parse().ok()?;
    let values = parts.next()?.trim().parse().ok()?;
    let shapes = parts.next().unwrap_or("").trim();
    Some(ReportRow {
        size,
        offset,
        values,
        shapes,
    })
}

fn parse_proto<'a>(text: &'a str, rep: &mut UsageReport<'a>) {
    let mut depth = 0usize;
    for raw in text.lines() {
        let t = raw.trim();
        if t.ends_with('{') {
            depth += 1;
            if depth == 1 {
                rep.spaces.push(ReportSpace {
                    color: Some(0),
                    ..Default::default()
                });
            }
            continue;
        }
        if t == "}" {
            depth = depth.saturating_sub(1);
            continue;
        }
        if depth == 1 {
            if let (Some(v), Some(s)) = (t.strip_prefix("total_bytes:"), rep.spaces.last_mut()) {
                s.total_bytes = v.trim().parse().unwrap_or(0);
            }
            if let (Some(v), Some(s)) =
                (t.strip_prefix("memory_space_color:"), rep.spaces.last_mut())
            {
                s.color = v.trim().parse().ok();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_variant() {
        let text = "Memory Space: default (color=0)
Total bytes: 19730009600 (18.38GiB)
  cumulative_size;       size;       offset; used_by_n_values; shapes_list
  ------------------------------------------------------------
    9.00GiB(100%);    9.00GiB;            0;                1; f32[49152,49152]
       512B(100%);       512B;            0;                2; 2×f32[]


Memory Space: vmem (color=1)
Total bytes: 0 (0B)
  cumulative_size;       size;       offset; used_by_n_values; shapes_list
  ------------------------------------------------------------
";
        let (r, d) = parse_usage_report(text);
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(r.variant, "table");
        assert_eq!(r.total_for_color(0), Some(19_730_009_600));
        assert_eq!(r.total_for_color(1), Some(0));
        assert_eq!(
            r.spaces[0].rows[1],
            ReportRow {
                size: 512,
                offset: 0,
                values: 2,
                shapes: "2×f32[]"
            }
        );
        assert_eq!(r.spaces[1].name, Some("vmem"));
    }

    #[test]
    fn proto_and_text_variants() {
        let p = "memory_space_allocation_entries {\n  total_bytes: 65536\n  allocation_entries {\n    index: 2\n    size: 32768\n  }\n}\nmemory_space_allocation_entries {\n  total_bytes: 7\n  memory_space_color: 1\n}\n";
        let (r, _) = parse_usage_report(p);
        assert_eq!(
            (r.total_for_color(0), r.total_for_color(1)),
            (Some(65536), Some(7))
        );
        let t = "Total bytes used: 1024 (1.0KiB)\n\nAllocations sorted by size:\n\ncumulative_size; total_size - cumulative_size; allocation\n";
        let (r, _) = parse_usage_report(t);
        assert_eq!((r.variant, r.total_for_color(0)), ("text", Some(1024)));
    }
}
