//! `*-buffer-assignment.txt` (`BufferAssignment::ToString`), older and newer XLA, formats.md §3.1,
//! and the `Used values` listing (also `*-buffer-assignment-values.txt`).
//!
//! Values in one `preallocated-temp` allocation share offsets over time: never sum their sizes.

use crate::live_range::{parse_live_range, LiveRange};
use crate::text::{parse_shape_index, Diagnostic};

/// One value assigned to an allocation: `value: <id name{idx} @color> (size=S,offset=O): shape`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value<'a> {
    /// `HloValue` id.
    pub id: u64,
    /// Defining instruction name.
    pub name: &'a str,
    /// ShapeIndex text as printed (`{1}`), empty when not printed (non-tuple instruction).
    pub index: &'a str,
    /// A phi value.
    pub phi: bool,
    /// Color (memory space).
    pub color: u32,
    /// Bytes reserved (backend size: padded on TPU).
    pub size: u64,
    /// Offset inside the allocation.
    pub offset: u64,
    /// Shape with layout.
    pub shape: &'a str,
}

impl Value<'_> {
    /// The live-range key: `name{idx}`, with `{}` when no index was printed.
    pub fn key(&self) -> String {
        if self.index.is_empty() {
            format!("{}{{}}", self.name)
        } else {
            format!("{}{}", self.name, self.index)
        }
    }
}

/// One `allocation N: size S, ...:` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation<'a> {
    /// Allocation index.
    pub index: u64,
    /// Size in bytes.
    pub size: u64,
    /// Color (0 = device memory).
    pub color: u32,
    /// Entry parameter number, if it holds one.
    pub parameter: Option<u32>,
    /// The parameter's shape (no layout), as printed between `|...|`.
    pub parameter_shape: Option<&'a str>,
    /// ShapeIndex of the parameter leaf.
    pub parameter_index: Vec<u64>,
    /// `output shape is |...|`.
    pub output_shape: Option<&'a str>,
    /// `constant`.
    pub constant: bool,
    /// `thread-local`.
    pub thread_local: bool,
    /// `maybe-live-out`.
    pub maybe_live_out: bool,
    /// `preallocated-temp`.
    pub preallocated_temp: bool,
    /// The values assigned to it.
    pub values: Vec<Value<'a>>,
}

impl Allocation<'_> {
    /// The accounting kind: `parameter`, `output`, `thread_local`, `constant` or `temp` (XProf's
    /// priority order).
    pub fn kind(&self) -> &'static str {
        if self.parameter.is_some() {
            "parameter"
        } else if self.maybe_live_out || self.output_shape.is_some() {
            "output"
        } else if self.thread_local {
            "thread_local"
        } else if self.constant {
            "constant"
        } else {
            "temp"
        }
    }
}

/// One block of the `Used values` listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsedValue<'a> {
    /// Value id.
    pub id: u64,
    /// Positions (`name` or `name {idx}`).
    pub positions: Vec<&'a str>,
    /// Uses (`name, operand N`).
    pub uses: Vec<&'a str>,
    /// The `from instruction:` text.
    pub from_instruction: &'a str,
}

/// A parsed buffer assignment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BufferAssignment<'a> {
    /// Allocations in printed order.
    pub allocations: Vec<Allocation<'a>>,
    /// `Total bytes used:` when printed (absent in some TPU dumps).
    pub total_bytes_used: Option<u64>,
    /// `Used values` blocks.
    pub used_values: Vec<UsedValue<'a>>,
    /// Live-range text appended to the file (~2024-2025 XLA).
    pub live_range: Option<LiveRange<'a>>,
}

impl BufferAssignment<'_> {
    /// Sum of allocation sizes per color, sorted by color.
    pub fn totals_by_color(&self) -> Vec<(u32, u64)> {
        let mut out: Vec<(u32, u64)> = Vec::new();
        for a in &self.allocations {
            match out.iter_mut().find(|(c, _)| *c == a.color) {
                Some((_, t)) => *t += a.size,
                None => out.push((a.color, a.size)),
            }
        }
        out.sort_unstable();
        out
    }
}

/// Parses `*-buffer-assignment.txt` (or `*-buffer-assignment-values.txt`).
pub fn parse_buffer_assignment(text: &str) -> (BufferAssignment<'_>, Vec<Diagnostic>) {
    let mut ba = BufferAssignment::default();
    let mut diags = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    let mut in_used = false;
    while i < b.len() {
        let end = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |k| i + k);
        let raw = &text[i..end];
        let line = raw.trim_end_matches('\r');
        let t = line.trim();
        if t.starts_with("HloLiveRange") {
            let (lr, d) = parse_live_range(&text[i..]);
            ba.live_range = Some(lr);
            diags.extend(d.into_iter().map(|mut x| {
                x.line += line_of(text, i) - 1;
                x
            }));
            break;
        }
        if let Some(rest) = t.strip_prefix("allocation ") {
            in_used = false;
            match parse_allocation_header(rest) {
                Some(a) => ba.allocations.push(a),
                None => diags.push(Diagnostic::at(
                    text,
                    i,
                    format!("unreadable allocation header: {}", short(t)),
                )),
            }
        } else if let Some(rest) = t.strip_prefix("value: ") {
            match (parse_value(rest), ba.allocations.last_mut()) {
                (Some(v), Some(a)) => a.values.push(v),
                _ => diags.push(Diagnostic::at(
                    text,
                    i,
                    format!("unreadable value line: {}", short(t)),
                )),
            }
        } else if let Some(rest) = t.strip_prefix("Total bytes used:") {
            ba.total_bytes_used = rest.split_whitespace().next().and_then(|n| n.parse().ok());
        } else if t == "Used values:" {
            in_used = true;
        } else if in_used || (t.starts_with('<') && !line.starts_with(' ')) {
            i = parse_used_block(text, i, &mut ba.used_values);
            in_used = true;
            continue;
        } else if !(t.is_empty() || t == "BufferAssignment:") {
            diags.push(Diagnostic::at(text, i, format!("skipped: {}", short(t))));
        }
        i = end + 1;
    }
    // Exact capacities: a large module's temp allocation holds 40k+ values.
    for a in &mut ba.allocations {
        a.values.shrink_to_fit();
    }
    ba.allocations.shrink_to_fit();
    (ba, diags)
}

fn line_of(text: &str, offset: usize) -> usize {
    memchr::memchr_iter(b'\n', &text.as_bytes()[..offset]).count() + 1
}

fn short(s: &str) -> &str {
    match s.char_indices().nth(100) {
        Some((k, _)) => &s[..k],
        None => s,
    }
}

/// Parses a `Used values` block starting at `i` (a line `<id ...>`), returns the next index.
fn parse_used_block<'a>(text: &'a str, mut i: usize, out: &mut Vec<UsedValue<'a>>) -> usize {
    let b = text.as_bytes();
    let mut cur: Option<UsedValue<'a>> = None;
    let mut section = 0u8;
    while i < b.len() {
        let end = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |k| i + k);
        let line = text[i..end].trim_end_matches('\r');
        let t = line.trim();
        if t.starts_with("HloLiveRange") || t.starts_with("allocation ") {
            break;
        }
        if t.starts_with('<') && !line.starts_with(' ') {
            if let Some(c) = cur.take() {
                out.push(c);
            }
            let id = t[1..]
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            cur = Some(UsedValue {
                id,
                ..Default::default()
            });
            section = 0;
        } else if t == "positions:" {
            section = 1;
        } else if t == "uses:" {
            section = 2;
        } else if let Some(rest) = t.strip_prefix("from instruction:") {
            if let Some(c) = cur.as_mut() {
                c.from_instruction = rest.trim();
            }
            section = 0;
        } else if !t.is_empty() {
            if let Some(c) = cur.as_mut() {
                match section {
                    1 => c.positions.push(t),
                    2 => c.uses.push(t),
                    _ => {}
                }
            }
        }
        i = end + 1;
    }
    if let Some(c) = cur {
        out.push(c);
    }
    i
}

fn parse_allocation_header(rest: &str) -> Option<Allocation<'_>> {
    // `N: size S[, flags...]:`
    let (idx, mut rest) = rest.split_once(':')?;
    let mut a = Allocation {
        index: idx.trim().parse().ok()?,
        ..Default::default()
    };
    rest = rest.trim();
    rest = rest.strip_suffix(':').unwrap_or(rest);
    // Very old dumps: `0x7f..., size ...`.
    if rest.starts_with("0x") {
        rest = rest.split_once(',').map_or("", |(_, r)| r.trim());
    }
    let r = rest.strip_prefix("size ")?;
    let ne = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
    a.size = r[..ne].parse().ok()?;
    let mut r = &r[ne..];
    loop {
        r = r.trim_start_matches([',', ' ']);
        if r.is_empty() {
            break;
        }
        if let Some(x) = r.strip_prefix("color ") {
            let e = x.find(|c: char| !c.is_ascii_digit()).unwrap_or(x.len());
            a.color = x[..e].parse().unwrap_or(0);
            r = &x[e..];
        } else if let Some(x) = r.strip_prefix("parameter ") {
            let e = x.find(|c: char| !c.is_ascii_digit()).unwrap_or(x.len());
            a.parameter = x[..e].parse().ok();
            r = &x[e..];
            let x = r.trim_start_matches([',', ' ']);
            if let Some(s) = x.strip_prefix("shape |") {
                let close = s.find('|')?;
                a.parameter_shape = Some(&s[..close]);
                r = &s[close + 1..];
                if let Some(y) = r.trim_start().strip_prefix("at ShapeIndex ") {
                    let e = y.find('}').map_or(y.len(), |k| k + 1);
                    a.parameter_index = parse_shape_index(&y[..e]).unwrap_or_default();
                    r = &y[e..];
                }
            }
        } else if let Some(s) = r.strip_prefix("output shape is |") {
            let close = s.find('|')?;
            a.output_shape = Some(&s[..close]);
            r = &s[close + 1..];
        } else {
            let e = r.find(',').unwrap_or(r.len());
            match r[..e].trim() {
                "constant" => a.constant = true,
                "thread-local" => a.thread_local = true,
                "maybe-live-out" => a.maybe_live_out = true,
                "preallocated-temp" => a.preallocated_temp = true,
                _ => {} // unknown flag: tolerated
            }
            r = &r[e..];
        }
    }
    Some(a)
}

fn parse_value(rest: &str) -> Option<Value<'_>> {
    // `<id name{idx} (phi) @color> (size=S,offset=O): shape`
    let rest = rest.trim().strip_prefix('<')?;
    let close = rest.find('>')?;
    let head = &rest[..close];
    let mut parts = head.split_whitespace();
    let id = parts.next()?.parse().ok()?;
    let name_idx = parts.next()?;
    let mut phi = false;
    let mut color = 0;
    for p in parts {
        if p == "(phi)" {
            phi = true;
        } else if let Some(c) = p.strip_prefix('@') {
            color = c.parse().unwrap_or(0);
        }
    }
    let (name, index) = match name_idx.find('{') {
        Some(k) => (&name_idx[..k], &name_idx[k..]),
        None => (name_idx, ""),
    };
    let tail = rest[close + 1..].trim_start().strip_prefix("(size=")?;
    let ce = tail.find(',')?;
    let size = tail[..ce].parse().ok()?;
    let tail = tail[ce + 1..].strip_prefix("offset=")?;
    let pe = tail.find(')')?;
    let offset = tail[..pe].parse().ok()?;
    let shape = tail[pe + 1..]
        .trim_start()
        .strip_prefix(':')
        .unwrap_or("")
        .trim();
    Some(Value {
        id,
        name,
        index,
        phi,
        color,
        size,
        offset,
        shape,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "BufferAssignment:
allocation 0: size 16384, parameter 0, shape |(f32[64,64], s32[])| at ShapeIndex {0}:
 value: <0 p0.1{0} @0> (size=16384,offset=0): f32[64,64]{1,0}
allocation 1: size 16384, output shape is |f32[64,64]|, maybe-live-out:
 value: <4 add.4 @0> (size=16384,offset=0): f32[64,64]{1,0}
allocation 2: size 32768, color 1, preallocated-temp:
 value: <2 fusion.2 (phi) @1> (size=16384,offset=0): f32[64,64]{1,0}
 value: <3 dot.3 @1> (size=16384,offset=16384): f32[64,64]{1,0}
allocation 3: size 4, weird-new-flag, thread-local:

Total bytes used: 65540 (64.0KiB)

Used values:
<0 p0.1{0} @0>
 positions:
  p0.1 {0}
 uses:
  fusion.2, operand 0
 from instruction:%p0.1 = f32[64,64]{1,0} parameter(0), metadata={op_name=\"x\"}
<4 add.4 @0>
 positions:
  add.4
 uses:
 from instruction:%add.4 = f32[64,64]{1,0} add(%a, %b)


HloLiveRange (max 3):
  InstructionSequence:
    0:p0.1
  BufferLiveRange:
    p0.1{0}:0-3
  Live ranges at 0 (peak):
    p0.1: 16384 bytes
";

    #[test]
    fn parses_sample() {
        let (ba, diags) = parse_buffer_assignment(SAMPLE);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(ba.allocations.len(), 4);
        let a0 = &ba.allocations[0];
        assert_eq!(
            (a0.parameter, a0.parameter_shape, a0.parameter_index.clone()),
            (Some(0), Some("(f32[64,64], s32[])"), vec![0])
        );
        assert_eq!(a0.values[0].key(), "p0.1{0}");
        assert_eq!(ba.allocations[1].kind(), "output");
        let a2 = &ba.allocations[2];
        assert!(a2.preallocated_temp && a2.color == 1 && a2.values[0].phi);
        assert_eq!(a2.values[1].offset, 16384);
        assert_eq!(a2.values[1].key(), "dot.3{}");
        assert!(ba.allocations[3].thread_local);
        assert_eq!(ba.total_bytes_used, Some(65540));
        assert_eq!(ba.used_values.len(), 2);
        assert_eq!(ba.used_values[0].positions, vec!["p0.1 {0}"]);
        assert!(ba.used_values[1].from_instruction.starts_with("%add.4"));
        assert_eq!(ba.live_range.as_ref().map(|l| l.ranges.len()), Some(1));
        assert_eq!(ba.totals_by_color(), vec![(0, 32772), (1, 32768)]);
        for cut in 0..SAMPLE.len() {
            if SAMPLE.is_char_boundary(cut) {
                let _ = parse_buffer_assignment(&SAMPLE[..cut]);
            }
        }
    }
}
