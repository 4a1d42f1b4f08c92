//! HLO module text (`HloModule::ToString`, long and short printing styles), formats.md §1.
//!
//! [`parse_module`] borrows everything from the input: names, shapes, attribute values and
//! metadata strings are `&str` slices into it (escaped as printed; [`crate::text::unescape`] them
//! when showing). Unknown syntax is skipped with a [`Diagnostic`]; nothing fails wholesale.

use crate::text::{
    ident_end, parse_shape_index, skip_balanced, split_top_level, strip_comments, Diagnostic,
};

/// One `input_output_alias` entry: output leaf `output_index` reuses parameter `param` at
/// `param_index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// ShapeIndex in the entry's result.
    pub output_index: Vec<u64>,
    /// Parameter number.
    pub param: u32,
    /// ShapeIndex inside the parameter.
    pub param_index: Vec<u64>,
    /// `may-alias` or `must-alias` (empty when not printed).
    pub kind: String,
}

/// `FileLocations` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileLocation {
    /// 1-based index into `FileNames`.
    pub file_name_id: u32,
    /// 1-based index into `FunctionNames`.
    pub function_name_id: u32,
    /// Line.
    pub line: u32,
    /// Column.
    pub column: u32,
}

/// `StackFrames` row, with the printed parent already converted (printed `k` is parent `k-1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StackFrame {
    /// 1-based index into `FileLocations`.
    pub file_location_id: u32,
    /// 1-based parent frame, 0 for none.
    pub parent: u32,
}

/// The module-level stack-frame index (formats.md §1.3).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackFrameIndex<'a> {
    /// `FileNames`, still escaped.
    pub file_names: Vec<&'a str>,
    /// `FunctionNames`, still escaped.
    pub function_names: Vec<&'a str>,
    /// `FileLocations`.
    pub file_locations: Vec<FileLocation>,
    /// `StackFrames`.
    pub frames: Vec<StackFrame>,
}

/// One resolved source location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceLoc<'a> {
    /// File name as printed (escaped).
    pub file: &'a str,
    /// Line.
    pub line: u32,
    /// Function name, when known.
    pub function: &'a str,
}

impl<'a> StackFrameIndex<'a> {
    /// The frames of `stack_frame_id`, innermost first.
    pub fn resolve(&self, id: u32) -> Vec<SourceLoc<'a>> {
        let mut out = Vec::new();
        let mut id = id;
        while id != 0 && out.len() < 256 {
            let Some(frame) = self.frames.get(id as usize - 1) else {
                break;
            };
            if let Some(loc) = frame
                .file_location_id
                .checked_sub(1)
                .and_then(|i| self.file_locations.get(i as usize))
            {
                let file = loc
                    .file_name_id
                    .checked_sub(1)
                    .and_then(|i| self.file_names.get(i as usize))
                    .copied()
                    .unwrap_or("");
                let function = loc
                    .function_name_id
                    .checked_sub(1)
                    .and_then(|i| self.function_names.get(i as usize))
                    .copied()
                    .unwrap_or("");
                out.push(SourceLoc {
                    file,
                    line: loc.line,
                    function,
                });
            }
            if frame.parent >= id {
                break; // malformed: parents come first, avoid cycles
            }
            id = frame.parent;
        }
        out
    }
}

/// The metadata keys memory analysis needs (others are skipped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Metadata<'a> {
    /// `op_type`, escaped.
    pub op_type: &'a str,
    /// `op_name`, escaped.
    pub op_name: &'a str,
    /// `source_file`, escaped.
    pub source_file: &'a str,
    /// `source_line` (0 when absent).
    pub source_line: u32,
    /// `stack_frame_id` (0 when absent).
    pub stack_frame_id: u32,
}

/// One instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction<'a> {
    /// Name without `%`.
    pub name: &'a str,
    /// Marked `ROOT`.
    pub is_root: bool,
    /// Result shape text, with layout (`f32[8]{0:T(128)}` or a tuple `(...)`).
    pub shape: &'a str,
    /// Opcode (`fusion`, `all-gather-start`, ...).
    pub opcode: &'a str,
    /// Operand names without `%` (for `parameter`/`constant`, the literal text instead).
    pub operands: Vec<&'a str>,
    /// Every `key=value` attribute in order, values raw.
    pub attrs: Vec<(&'a str, &'a str)>,
    /// Parsed metadata.
    pub metadata: Metadata<'a>,
}

impl<'a> Instruction<'a> {
    /// The raw value of attribute `key`.
    pub fn attr(&self, key: &str) -> Option<&'a str> {
        self.attrs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
    /// `parameter(N)`'s number.
    pub fn parameter_number(&self) -> Option<u32> {
        if self.opcode != "parameter" {
            return None;
        }
        self.operands.first()?.trim().parse().ok()
    }
    /// The `sharding=` value, if any.
    pub fn sharding(&self) -> Option<&'a str> {
        self.attr("sharding")
    }
    /// Names of the computations this instruction calls (`calls=`, `to_apply=`, `body=`, ...).
    pub fn called(&self) -> Vec<&'a str> {
        let mut out = Vec::new();
        for (k, v) in &self.attrs {
            if matches!(
                *k,
                "calls"
                    | "to_apply"
                    | "body"
                    | "condition"
                    | "true_computation"
                    | "false_computation"
                    | "select"
                    | "scatter"
                    | "branch_computations"
                    | "called_computations"
            ) {
                for part in v.trim_matches(|c| c == '{' || c == '}').split(',') {
                    let n = part.trim().trim_start_matches('%');
                    if !n.is_empty() {
                        out.push(n);
                    }
                }
            }
        }
        out
    }
}

/// One computation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Computation<'a> {
    /// Name without `%`.
    pub name: &'a str,
    /// Marked `ENTRY` (or the last computation when none is marked).
    pub is_entry: bool,
    /// `execution_thread=` after the closing brace, if any.
    pub execution_thread: Option<&'a str>,
    /// Instructions in printed order (schedule order when the module is scheduled).
    pub instructions: Vec<Instruction<'a>>,
}

/// A parsed HLO module.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HloModule<'a> {
    /// Name from the `HloModule` line.
    pub name: &'a str,
    /// `is_scheduled=true`.
    pub is_scheduled: bool,
    /// `num_partitions` (1 when not printed).
    pub num_partitions: u32,
    /// `replica_count` (1 when not printed).
    pub replica_count: u32,
    /// `input_output_alias`.
    pub input_output_alias: Vec<Alias>,
    /// `buffer_donor` `(param, index)` pairs.
    pub buffer_donor: Vec<(u32, Vec<u64>)>,
    /// `entry_computation_layout` raw value.
    pub entry_computation_layout: Option<&'a str>,
    /// Every header attribute, raw.
    pub header_attrs: Vec<(&'a str, &'a str)>,
    /// Stack-frame tables.
    pub stack_frames: StackFrameIndex<'a>,
    /// Computations in printed order (callees first).
    pub computations: Vec<Computation<'a>>,
}

impl<'a> HloModule<'a> {
    /// The entry computation.
    pub fn entry(&self) -> Option<&Computation<'a>> {
        self.computations
            .iter()
            .find(|c| c.is_entry)
            .or(self.computations.last())
    }
    /// The user's source of an instruction: `source_file`/`source_line` when printed, otherwise
    /// the stack-frame chain, innermost frame first.
    pub fn source_frames(&self, md: &Metadata<'a>) -> Vec<SourceLoc<'a>> {
        if !md.source_file.is_empty() {
            return vec![SourceLoc {
                file: md.source_file,
                line: md.source_line,
                function: "",
            }];
        }
        if md.stack_frame_id != 0 {
            return self.stack_frames.resolve(md.stack_frame_id);
        }
        Vec::new()
    }
    /// The innermost frame outside framework code (jax, flax, site-packages), else the innermost.
    pub fn user_source(&self, md: &Metadata<'a>) -> Option<SourceLoc<'a>> {
        let frames = self.source_frames(md);
        frames
            .iter()
            .find(|f| !is_framework_file(f.file))
            .or(frames.first())
            .copied()
    }
}

/// Whether a path belongs to a framework rather than the user's program.
pub fn is_framework_file(path: &str) -> bool {
    [
        "/site-packages/",
        "/dist-packages/",
        "/jax/_src/",
        "/flax/",
        "/optax/",
        "/torch_xla/",
        "/tensorflow/python/",
        "<frozen ",
    ]
    .iter()
    .any(|p| path.contains(p))
}

/// Parses HLO module text. Returns the module (possibly partial) and what was skipped.
pub fn parse_module(text: &str) -> (HloModule<'_>, Vec<Diagnostic>) {
    let mut diags = Vec::new();
    let mut m = HloModule {
        num_partitions: 1,
        replica_count: 1,
        ..Default::default()
    };
    let b = text.as_bytes();
    let mut i = match memchr::memmem::find(b, b"HloModule ") {
        Some(k) => k,
        None => {
            diags.push(Diagnostic {
                line: 1,
                message: "no `HloModule` header: not HLO text".into(),
            });
            return (m, diags);
        }
    };
    i = parse_header(text, i + "HloModule ".len(), &mut m, &mut diags);
    let mut saw_entry = false;
    while i < b.len() {
        let line_end = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |k| i + k);
        let line = text[i..line_end].trim();
        if line.is_empty() || line.starts_with("//") {
            i = line_end + 1;
            continue;
        }
        match line {
            "FileNames" | "FunctionNames" | "FileLocations" | "StackFrames" => {
                i = parse_table(text, line_end + 1, line, &mut m.stack_frames);
                continue;
            }
            _ => {}
        }
        // A computation header ends in `{` at depth 0.
        match parse_computation(text, i, &mut diags) {
            Some((comp, next)) => {
                saw_entry |= comp.is_entry;
                m.computations.push(comp);
                i = next;
            }
            None => {
                diags.push(Diagnostic::at(
                    text,
                    i,
                    format!("skipped unrecognised line: {}", truncate(line, 80)),
                ));
                i = line_end + 1;
            }
        }
    }
    if !saw_entry {
        if let Some(last) = m.computations.last_mut() {
            last.is_entry = true;
        }
    }
    (m, diags)
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((k, _)) => &s[..k],
        None => s,
    }
}

fn parse_header<'a>(
    text: &'a str,
    mut i: usize,
    m: &mut HloModule<'a>,
    diags: &mut Vec<Diagnostic>,
) -> usize {
    let b = text.as_bytes();
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    let e = ident_end(b, i);
    m.name = &text[i..e];
    i = e;
    loop {
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t' || b[i] == b'\r') {
            i += 1;
        }
        if i >= b.len() || b[i] != b',' {
            break;
        }
        i += 1;
        let (key, value, next) = read_attr(text, i);
        i = next;
        if key.is_empty() {
            diags.push(Diagnostic::at(
                text,
                i,
                "unreadable module header attribute",
            ));
            break;
        }
        m.header_attrs.push((key, value));
        match key {
            "is_scheduled" => m.is_scheduled = value == "true",
            "num_partitions" => m.num_partitions = value.parse().unwrap_or(1),
            "replica_count" => m.replica_count = value.parse().unwrap_or(1),
            "entry_computation_layout" => m.entry_computation_layout = Some(value),
            "input_output_alias" => m.input_output_alias = parse_aliases(value),
            "buffer_donor" => m.buffer_donor = parse_donors(value),
            _ => {}
        }
    }
    memchr::memchr(b'\n', &b[i.min(b.len())..]).map_or(b.len(), |k| i + k + 1)
}

/// Reads `key=value` starting at `i` (leading whitespace allowed). Values are balanced groups,
/// strings, or plain text up to `,`/newline/`}` at depth 0.
fn read_attr(text: &str, mut i: usize) -> (&str, &str, usize) {
    let b = text.as_bytes();
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    let ks = i;
    while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() && b[i] != b',' && b[i] != b'}'
    {
        i += 1;
    }
    if i >= b.len() || b[i] != b'=' {
        return ("", "", i);
    }
    let key = &text[ks..i];
    i += 1;
    let vs = i;
    if i < b.len() && matches!(b[i], b'{' | b'(' | b'[' | b'"') {
        i = skip_balanced(b, i);
    }
    // Plain values (or a group followed by more text, e.g. `T(8,128)` style) run to a delimiter.
    while i < b.len() && !matches!(b[i], b',' | b'\n' | b'\r') {
        if matches!(b[i], b'{' | b'(' | b'[' | b'"') {
            i = skip_balanced(b, i);
            continue;
        }
        if b[i] == b'}' {
            break;
        }
        i += 1;
    }
    (key, text[vs..i].trim_end(), i)
}

/// The text inside a group that opens at `open` and whose [`skip_balanced`] end is `end` (the
/// closer excluded when present: a truncated group runs to the end of the text).
fn group_inner(s: &str, open: usize, end: usize) -> &str {
    let closed = end > open + 1 && matches!(s.as_bytes()[end - 1], b')' | b'}' | b']');
    &s[(open + 1).min(end)..if closed { end - 1 } else { end }]
}

fn parse_aliases(v: &str) -> Vec<Alias> {
    let inner = v.trim().trim_start_matches('{').trim_end_matches('}');
    let mut out = Vec::new();
    // entries: `{0}: (0, {}, may-alias)`
    let mut rest = inner;
    while let Some(colon) = rest.find("}:") {
        let Some(open) = rest[..colon].rfind('{') else {
            break;
        };
        let output_index = parse_shape_index(&rest[open..=colon]).unwrap_or_default();
        let after = &rest[colon + 2..];
        let Some(po) = after.find('(') else { break };
        let pe = skip_balanced(after.as_bytes(), po);
        let parts = split_top_level(group_inner(after, po, pe));
        if let Some(param) = parts.first().and_then(|p| p.trim().parse().ok()) {
            out.push(Alias {
                output_index,
                param,
                param_index: parts
                    .get(1)
                    .and_then(|p| parse_shape_index(p))
                    .unwrap_or_default(),
                kind: parts
                    .get(2)
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
            });
        }
        rest = &after[pe..];
    }
    out
}

fn parse_donors(v: &str) -> Vec<(u32, Vec<u64>)> {
    let b = v.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(k) = memchr::memchr(b'(', &b[i..]) {
        let s = i + k;
        let e = skip_balanced(b, s);
        let parts = split_top_level(group_inner(v, s, e));
        if let Some(p) = parts.first().and_then(|p| p.trim().parse().ok()) {
            out.push((
                p,
                parts
                    .get(1)
                    .and_then(|x| parse_shape_index(x))
                    .unwrap_or_default(),
            ));
        }
        i = e;
    }
    out
}

fn parse_table<'a>(
    text: &'a str,
    mut i: usize,
    kind: &str,
    idx: &mut StackFrameIndex<'a>,
) -> usize {
    let b = text.as_bytes();
    while i < b.len() {
        let end = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |k| i + k);
        let line = text[i..end].trim();
        if line.is_empty() || !line.as_bytes()[0].is_ascii_digit() {
            return if line.is_empty() { end + 1 } else { i };
        }
        let rest = line.split_once(' ').map_or("", |(_, r)| r.trim());
        match kind {
            "FileNames" => idx.file_names.push(rest.trim_matches('"')),
            "FunctionNames" => idx.function_names.push(rest.trim_matches('"')),
            "FileLocations" => {
                let mut loc = FileLocation::default();
                for (k, v) in kv_pairs(rest) {
                    let v: u32 = v.parse().unwrap_or(0);
                    match k {
                        "file_name_id" => loc.file_name_id = v,
                        "function_name_id" => loc.function_name_id = v,
                        "line" => loc.line = v,
                        "column" => loc.column = v,
                        _ => {}
                    }
                }
                idx.file_locations.push(loc);
            }
            _ => {
                let mut f = StackFrame::default();
                for (k, v) in kv_pairs(rest) {
                    let v: u32 = v.parse().unwrap_or(0);
                    match k {
                        "file_location_id" => f.file_location_id = v,
                        // Printed as proto value + 1 (formats.md §1.3).
                        "parent_frame_id" => f.parent = v.saturating_sub(1),
                        _ => {}
                    }
                }
                idx.frames.push(f);
            }
        }
        i = end + 1;
    }
    b.len()
}

/// `{a=1 b=2}` → pairs (whitespace or comma separated, strings kept raw without quotes).
fn kv_pairs(s: &str) -> impl Iterator<Item = (&str, &str)> {
    s.trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .split([' ', ','])
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
}

fn parse_computation<'a>(
    text: &'a str,
    start: usize,
    diags: &mut Vec<Diagnostic>,
) -> Option<(Computation<'a>, usize)> {
    let b = text.as_bytes();
    let (is_entry, name, mut i) = keyword_and_name(text, start, "ENTRY ")?;
    // Optional signature `(params) -> shape`, then `{`.
    loop {
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
            i += 1;
        }
        if i >= b.len() || b[i] == b'\n' {
            return None;
        }
        match b[i] {
            b'{' => break,
            b'(' | b'[' | b'"' => i = skip_balanced(b, i),
            _ => {
                // `->`, shape tokens and their layouts
                if b[i] == b'-' && b.get(i + 1) == Some(&b'>') {
                    i += 2;
                } else {
                    let e = ident_end(b, i);
                    i = if e == i { i + 1 } else { e };
                    // A layout `{...}` right after a shape's `]` belongs to the shape.
                    if i < b.len() && b[i] == b'{' && i > 0 && b[i - 1] == b']' {
                        i = skip_balanced(b, i);
                    }
                }
            }
        }
        if i < b.len() && b[i] == b'{' && i > 0 && b[i - 1] == b']' {
            i = skip_balanced(b, i);
        }
    }
    i += 1; // past `{`
            // One instruction per line up to the closing `}` line: reserve that many at once (growing a
            // 40k-instruction entry by doubling costs 1.5x its size, and leaves holes in the heap).
    let body_end = memchr::memmem::find(&b[i..], b"\n}").map_or(b.len(), |k| i + k);
    let mut instructions = Vec::with_capacity(memchr::memchr_iter(b'\n', &b[i..body_end]).count());
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= b.len() {
            diags.push(Diagnostic::at(
                text,
                i,
                format!("computation `{name}` is truncated (no closing brace)"),
            ));
            break;
        }
        if b[i] == b'}' {
            i += 1;
            break;
        }
        let line_end = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |k| i + k);
        match parse_instruction(text, i) {
            Some((inst, next)) => {
                instructions.push(inst);
                i = next;
            }
            None => {
                diags.push(Diagnostic::at(
                    text,
                    i,
                    format!(
                        "skipped unreadable instruction: {}",
                        truncate(text[i..line_end].trim(), 80)
                    ),
                ));
                i = line_end;
            }
        }
    }
    instructions.shrink_to_fit();
    // `}, execution_thread="host"`
    let mut execution_thread = None;
    let line_end = memchr::memchr(b'\n', &b[i.min(b.len())..]).map_or(b.len(), |k| i + k);
    let tail = text[i.min(line_end)..line_end].trim();
    if let Some(t) = tail.strip_prefix(',') {
        if let Some(v) = t.trim().strip_prefix("execution_thread=") {
            execution_thread = Some(v.trim_matches('"'));
        }
    }
    Some((
        Computation {
            name,
            is_entry,
            execution_thread,
            instructions,
        },
        line_end.min(b.len()),
    ))
}

/// An optional keyword (`ENTRY `, `ROOT `), spaces, an optional `%`, then a name: whether the
/// keyword was there, the name, and the index after the name. The caller has skipped whitespace.
fn keyword_and_name<'a>(
    text: &'a str,
    mut i: usize,
    keyword: &str,
) -> Option<(bool, &'a str, usize)> {
    let b = text.as_bytes();
    let has_keyword = text[i..].starts_with(keyword);
    if has_keyword {
        i += keyword.len();
    }
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    if i < b.len() && b[i] == b'%' {
        i += 1;
    }
    let end = ident_end(b, i);
    (end > i).then(|| (has_keyword, &text[i..end], end))
}

/// Parses one instruction starting at `i`; returns it and the index after it.
fn parse_instruction(text: &str, mut i: usize) -> Option<(Instruction<'_>, usize)> {
    let b = text.as_bytes();
    let (is_root, name, end) = keyword_and_name(text, i, "ROOT ")?;
    i = end;
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    if i >= b.len() || b[i] != b'=' {
        return None;
    }
    i += 1;
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    // Shape: a tuple `( ... )`, `b( ... )`, or `type[dims]{layout}`.
    let ss = i;
    if i < b.len() && b[i] == b'(' {
        i = skip_balanced(b, i);
    } else {
        let e = ident_end(b, i);
        if e == i {
            return None;
        }
        i = e;
        if i < b.len() && (b[i] == b'[' || b[i] == b'(') {
            i = skip_balanced(b, i);
        }
        if i < b.len() && b[i] == b'{' {
            i = skip_balanced(b, i);
        }
    }
    let shape = &text[ss..i];
    while i < b.len() && b[i] == b' ' {
        i += 1;
    }
    let os = i;
    let oe = ident_end(b, i);
    if oe == os || oe >= b.len() || b[oe] != b'(' {
        return None;
    }
    let opcode = &text[os..oe];
    let pe = skip_balanced(b, oe);
    // Unbalanced (a truncated line): everything to the end, which may end inside a
    // multi-byte character; only a closing parenthesis is cut off.
    let inner_end = if pe > oe + 1 && b[pe - 1] == b')' {
        pe - 1
    } else {
        pe
    };
    let inner = &text[oe + 1..inner_end.max(oe + 1)];
    let literal = matches!(opcode, "parameter" | "constant" | "iota");
    let mut operands = Vec::new();
    if literal {
        operands.push(inner.trim());
    } else {
        for part in split_top_level(inner) {
            let part = part.trim();
            if part.is_empty() || part.starts_with("...") {
                continue;
            }
            // Long style prints `shape %name`; the name is the last token. Comments
            // (`/*index=5*/`) precede it.
            let tok = part.rsplit([' ', '/']).next().unwrap_or(part);
            let tok = if tok.is_empty() {
                strip_tail_name(part)
            } else {
                tok
            };
            operands.push(tok.trim_start_matches('%'));
        }
    }
    i = pe;
    let mut attrs = Vec::new();
    let mut metadata = Metadata::default();
    loop {
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t' || b[i] == b'\r') {
            i += 1;
        }
        if i >= b.len() || b[i] != b',' {
            break;
        }
        i += 1;
        let (k, v, next) = read_attr(text, i);
        if k.is_empty() {
            i = next;
            break;
        }
        if k == "metadata" {
            metadata = parse_metadata(v);
        }
        attrs.push((k, v));
        i = next;
    }
    // Exact capacity: a module holds 100k+ instructions, most with one or two of each.
    operands.shrink_to_fit();
    attrs.shrink_to_fit();
    Some((
        Instruction {
            name,
            is_root,
            shape,
            opcode,
            operands,
            attrs,
            metadata,
        },
        i,
    ))
}

fn strip_tail_name(part: &str) -> &str {
    let cleaned = strip_comments(part);
    let last = cleaned.rsplit(' ').next().unwrap_or("").to_string();
    match part.rfind(last.as_str()) {
        Some(k) if !last.is_empty() => &part[k..k + last.len()],
        _ => part,
    }
}

/// Parses `{op_type="..." op_name="..." source_file="..." source_line=N stack_frame_id=N}`.
pub fn parse_metadata(v: &str) -> Metadata<'_> {
    let b = v.as_bytes();
    let mut md = Metadata::default();
    let mut i = usize::from(b.first() == Some(&b'{'));
    while i < b.len() {
        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
            i += 1;
        }
        let ks = i;
        while i < b.len() && b[i] != b'=' && b[i] != b'}' {
            i += 1;
        }
        if i >= b.len() || b[i] != b'=' {
            break;
        }
        let key = v[ks..i].trim();
        i += 1;
        let (val, next) = if i < b.len() && b[i] == b'"' {
            let e = crate::text::skip_string(b, i);
            // An unterminated string runs to the end, which may fall inside a multi-byte
            // character: only a closing quote is cut off.
            let end = if e > i + 1 && b[e - 1] == b'"' {
                e - 1
            } else {
                e
            };
            (&v[i + 1..end.max(i + 1)], e)
        } else if i < b.len() && b[i] == b'{' {
            let e = skip_balanced(b, i);
            (&v[i..e], e)
        } else {
            let s = i;
            while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'}' && b[i] != b',' {
                i += 1;
            }
            (&v[s..i], i)
        };
        i = next;
        match key {
            "op_type" => md.op_type = val,
            "op_name" => md.op_name = val,
            "source_file" => md.source_file = val,
            "source_line" => md.source_line = val.parse().unwrap_or(0),
            "stack_frame_id" => md.stack_frame_id = val.parse().unwrap_or(0),
            _ => {}
        }
    }
    md
}

/// Leaf shapes of a printed shape, with their ShapeIndex: an array is one leaf at `{}`; a tuple's
/// leaves are numbered (nested tuples recurse). Returns `(index, text)` pairs.
pub fn shape_leaves(shape: &str) -> Vec<(Vec<u64>, &str)> {
    let mut out = Vec::new();
    collect_leaves(shape.trim(), &mut Vec::new(), &mut out);
    out
}

fn collect_leaves<'a>(s: &'a str, prefix: &mut Vec<u64>, out: &mut Vec<(Vec<u64>, &'a str)>) {
    if let Some(inner) = s.strip_prefix('(').and_then(|x| x.strip_suffix(')')) {
        for (k, part) in split_top_level(inner).into_iter().enumerate() {
            prefix.push(k as u64);
            collect_leaves(strip_comment_prefix(part.trim()), prefix, out);
            prefix.pop();
        }
    } else {
        out.push((prefix.clone(), s));
    }
}

fn strip_comment_prefix(s: &str) -> &str {
    let mut s = s;
    while let Some(rest) = s.strip_prefix("/*") {
        s = rest.find("*/").map_or("", |k| rest[k + 2..].trim_start());
    }
    s
}

/// The top-level element texts of a tuple shape (`None` for an array shape).
pub fn tuple_elements(shape: &str) -> Option<Vec<&str>> {
    let inner = shape.trim().strip_prefix('(')?.strip_suffix(')')?;
    if inner.trim().is_empty() {
        return Some(Vec::new());
    }
    Some(
        split_top_level(inner)
            .into_iter()
            .map(|p| strip_comment_prefix(p.trim()))
            .collect(),
    )
}

/// How many devices hold each element of an array with this `sharding=` value in a module of
/// `n` partitions: `n` when it is replicated, the replicated last tile dimension of a partial
/// tiling (`devices=[1,2,1,8]<=[16] last_tile_dim_replicate`: 8), else 1.
pub fn sharding_copies(s: &str, n: u64) -> u64 {
    if sharding_is_replicated(s) {
        return n;
    }
    if !s.contains("last_tile_dim_replicate") {
        return 1;
    }
    tile_dims(s).and_then(|d| d.last().copied()).unwrap_or(1)
}

/// Whether a `sharding=` value splits an array along some dimension but not its leading one
/// (`devices=[1,4,1]<=[4]`): model state split along its weight axes (FSDP, tensor parallelism).
/// A data batch is split along its leading (batch) dimension.
pub fn sharding_splits_inner_only(s: &str) -> bool {
    split_dims(s).is_some_and(|t| t.len() >= 2 && t[0] == 1 && t[1..].iter().any(|&d| d > 1))
}

/// How many pieces each dimension is split into: the tile assignment's dimensions without the
/// replicated last one of a partial tiling. `None` without a tile assignment.
fn split_dims(s: &str) -> Option<Vec<u64>> {
    let mut dims = tile_dims(s)?;
    if s.contains("last_tile_dim_replicate") || s.contains("last_tile_dims") {
        dims.pop();
    }
    Some(dims)
}

/// The tile assignment's dimensions of a `sharding=` value (`devices=[1,2,1,8]<=[16]`: 1, 2, 1,
/// 8), `None` without one.
fn tile_dims(s: &str) -> Option<Vec<u64>> {
    let rest = &s[s.find("devices=[")? + 9..];
    Some(
        rest[..rest.find(']')?]
            .split(',')
            .filter_map(|d| d.trim().parse().ok())
            .collect(),
    )
}

/// Whether a `sharding=` value leaves every element whole on each device (`{replicated}`, a
/// tiling whose only non-trivial axis is the replicated last one, or a tuple of those).
pub fn sharding_is_replicated(s: &str) -> bool {
    let s = s.trim();
    if s.contains("maximal") || s.contains("manual") {
        return false;
    }
    if s.contains("replicated") && !s.contains("devices=") {
        return true;
    }
    split_dims(s).is_some_and(|t| t.iter().product::<u64>() <= 1)
}

/// Removes the attribute `, key=value` from one printed instruction line (the value skipped as
/// a balanced group, string or plain token), borrowing when the line has none. Readers that keep
/// large modules in memory drop `backend_config` this way: a third of a TPU module's text, and
/// nothing a memory analysis reads.
pub fn strip_attribute<'l>(line: &'l str, key: &str) -> std::borrow::Cow<'l, str> {
    let b = line.as_bytes();
    let mut i = 0;
    while let Some(k) = memchr::memchr2(b'"', b',', &b[i..]).map(|k| i + k) {
        if b[k] == b'"' {
            i = crate::text::skip_string(b, k);
            continue;
        }
        i = k + 1;
        let rest = &b[k + 1..];
        let rest_trim = rest.iter().take_while(|c| **c == b' ').count();
        let at = k + 1 + rest_trim;
        if !b[at..].starts_with(key.as_bytes()) || b.get(at + key.len()) != Some(&b'=') {
            continue;
        }
        let mut e = at + key.len() + 1;
        if e < b.len() && matches!(b[e], b'{' | b'(' | b'[' | b'"') {
            e = skip_balanced(b, e);
        } else {
            while e < b.len() && !matches!(b[e], b',' | b'\n' | b'\r') {
                e += 1;
            }
        }
        let mut out = String::with_capacity(line.len() - (e - k));
        out.push_str(&line[..k]);
        out.push_str(&line[e..]);
        return std::borrow::Cow::Owned(out);
    }
    std::borrow::Cow::Borrowed(line)
}

/// Drops the bodies of fusion computations from HLO module text as it streams by, in two passes
/// over its lines, so that a memory analysis of a large module never holds them: they define no
/// buffers (buffer assignments, live ranges and schedules only name instructions of sequential
/// computations) and are most of a large module's text (59% of a 24 MB, 121k-instruction one).
///
/// Pass 1 ([`FusionBodyFilter::scan`] on every line) collects the computations called by
/// `fusion` instructions and the bytes of each computation; pass 2 ([`FusionBodyFilter::keep`] on
/// every line, in the same order) says which lines to keep. A computation header is a line that
/// starts in column 0 and ends with `{`; its body ends at a line starting with `}`. No I/O.
#[derive(Debug, Default, Clone)]
pub struct FusionBodyFilter {
    fused: crate::hash::FxHashSet<String>,
    sizes: Vec<(String, u64)>,
    current: Option<(String, u64)>,
    total: u64,
    skipping: bool,
    dropped: usize,
}

fn computation_header_name(line: &str) -> Option<&str> {
    let first = *line.as_bytes().first()?;
    if first.is_ascii_whitespace() || first == b'}' || !line.trim_end().ends_with('{') {
        return None;
    }
    let rest = line.strip_prefix("ENTRY ").unwrap_or(line).trim_start();
    let rest = rest.strip_prefix('%').unwrap_or(rest);
    let end = ident_end(rest.as_bytes(), 0);
    (end > 0).then(|| &rest[..end])
}

impl FusionBodyFilter {
    /// Pass 1: one line (with or without its newline).
    pub fn scan(&mut self, line: &str) {
        let len = line.len() as u64;
        self.total += len;
        if let Some(name) = computation_header_name(line) {
            self.current = Some((name.to_string(), 0));
        }
        if let Some((_, bytes)) = &mut self.current {
            *bytes += len;
        }
        if line.starts_with('}') {
            if let Some(done) = self.current.take() {
                self.sizes.push(done);
            }
            return;
        }
        if line.contains(" fusion(") {
            if let Some(k) = line.find("calls=") {
                let v = &line[k + 6..];
                let v = v.strip_prefix('%').unwrap_or(v);
                let e = ident_end(v.as_bytes(), 0);
                if e > 0 {
                    self.fused.insert(v[..e].to_string());
                }
            }
        }
    }

    /// After pass 1: the bytes pass 2 will keep (to size the buffer exactly).
    pub fn kept_bytes(&self) -> u64 {
        let dropped: u64 = self
            .sizes
            .iter()
            .filter(|(n, _)| self.fused.contains(n))
            .map(|(_, b)| b)
            .sum();
        self.total.saturating_sub(dropped)
    }

    /// Pass 2: whether to keep this line (the lines of pass 1, in order).
    pub fn keep(&mut self, line: &str) -> bool {
        if let Some(name) = computation_header_name(line) {
            self.skipping = self.fused.contains(name);
            self.dropped += usize::from(self.skipping);
        }
        if self.skipping {
            if line.starts_with('}') {
                self.skipping = false;
            }
            return false;
        }
        true
    }

    /// After pass 2: how many fusion computations were dropped.
    pub fn dropped_computations(&self) -> usize {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: &str = r#"HloModule jit_f, is_scheduled=true, input_output_alias={ {0}: (0, {}, may-alias), {1}: (2, {1}, must-alias) }, buffer_donor={ (1, {}) }, entry_computation_layout={(f32[4]{0}, f32[4]{0})->f32[4]{0}}, num_partitions=8

FileNames
1 "/p/model.py"

FunctionNames
1 "<module>"
2 "top"

FileLocations
1 {file_name_id=1 function_name_id=1 line=19 end_line=19 column=6 end_column=42}
2 {file_name_id=1 function_name_id=2 line=17 end_line=17 column=11 end_column=32}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}

%fused (p.0: f32[4]) -> f32[4] {
  %p.0 = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(f32[4]{0} %p.0), metadata={op_name="jit(f)/neg" stack_frame_id=2}
}

ENTRY %main (a: f32[4], b: f32[4]) -> (f32[4], s32[]) {
  %a = f32[4]{0:T(128)} parameter(0), sharding={replicated}, metadata={op_name="w"}
  %b = f32[4]{0} parameter(1), sharding={devices=[4,2]<=[8] last_tile_dim_replicate}
  %f = f32[4]{0} fusion(f32[4]{0} %a, /*index=1*/f32[4]{0} %b), kind=kLoop, calls=%fused, metadata={op_type="X" op_name="jit(f)/a\"b" source_file="t.py" source_line=9}, backend_config={"x":{"y":"}"}}
  %c = s32[]{:T(128)S(6)} constant(3)
  ROOT %t = (f32[4]{0}, s32[]) tuple(%f, %c)
}
"#;

    /// Found by the whole-dump fuzz target: a truncated instruction ending inside a multi-byte
    /// character sliced the text off a character boundary.
    #[test]
    fn inner_only_splits() {
        assert!(sharding_splits_inner_only("{devices=[1,4,1]<=[4]}"));
        assert!(!sharding_splits_inner_only("{devices=[4,1]<=[4]}"));
        assert!(!sharding_splits_inner_only("{replicated}"));
        assert!(sharding_splits_inner_only(
            "{devices=[1,2,8]<=[16] last_tile_dim_replicate}"
        ));
        assert!(!sharding_splits_inner_only(
            "{devices=[1,1,8]<=[8] last_tile_dim_replicate}"
        ));
    }

    #[test]
    fn truncated_operands_ending_in_a_multibyte_character() {
        let text = "HloModule m\n\nENTRY e {\n  x = f32[] add(\u{2500}";
        let (m, _) = parse_module(text);
        assert!(m.computations.len() <= 1);
    }

    #[test]
    fn sharding_copies_counts_the_replicated_devices() {
        assert_eq!(sharding_copies("{replicated}", 16), 16);
        assert_eq!(
            sharding_copies("{devices=[1,2,1,8]<=[16] last_tile_dim_replicate}", 16),
            8
        );
        assert_eq!(sharding_copies("{devices=[16,1]<=[16]}", 16), 1);
    }

    #[test]
    fn long_style_module() {
        let (m, diags) = parse_module(LONG);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(m.name, "jit_f");
        assert!(m.is_scheduled);
        assert_eq!(m.num_partitions, 8);
        assert_eq!(m.input_output_alias.len(), 2);
        assert_eq!(
            m.input_output_alias[1],
            Alias {
                output_index: vec![1],
                param: 2,
                param_index: vec![1],
                kind: "must-alias".into()
            }
        );
        assert_eq!(m.buffer_donor, vec![(1, vec![])]);
        assert_eq!(m.computations.len(), 2);
        let entry = m.entry().expect("entry");
        assert_eq!(entry.name, "main");
        let f = &entry.instructions[2];
        assert_eq!(f.opcode, "fusion");
        assert_eq!(f.operands, vec!["a", "b"]);
        assert_eq!(f.called(), vec!["fused"]);
        assert_eq!(f.metadata.source_line, 9);
        assert_eq!(crate::text::unescape(f.metadata.op_name), "jit(f)/a\"b");
        assert_eq!(f.attr("backend_config"), Some(r#"{"x":{"y":"}"}}"#));
        assert_eq!(entry.instructions[0].parameter_number(), Some(0));
        assert!(sharding_is_replicated(
            entry.instructions[0].sharding().expect("sharding")
        ));
        assert!(!sharding_is_replicated(
            entry.instructions[1].sharding().expect("sharding")
        ));
        assert_eq!(entry.instructions[3].shape, "s32[]{:T(128)S(6)}");
        let n = &m.computations[0].instructions[1];
        let src = m.user_source(&n.metadata).expect("source");
        assert_eq!(
            (src.file, src.line, src.function),
            ("/p/model.py", 17, "top")
        );
        assert_eq!(m.source_frames(&n.metadata).len(), 2);
        assert_eq!(shape_leaves("(f32[4]{0}, (s32[], pred[2]))").len(), 3);
    }

    #[test]
    fn short_style_and_garbage() {
        let text = "HloModule m\n\nadd {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n\nENTRY e {\n  p = f32[4]{0} parameter(0)\n  ??? nonsense\n  ROOT r = f32[] reduce(p, p), dimensions={0}, to_apply=add\n}\n";
        let (m, diags) = parse_module(text);
        assert_eq!(diags.len(), 1, "{diags:?}");
        let e = m.entry().expect("entry");
        assert_eq!(e.instructions.len(), 2);
        assert_eq!(e.instructions[1].called(), vec!["add"]);
        for cut in 0..text.len() {
            let _ = parse_module(&text[..cut]);
        }
    }

    #[test]
    fn fusion_bodies_filtered() {
        let mut f = FusionBodyFilter::default();
        let lines: Vec<&str> = LONG.split_inclusive('\n').collect();
        for l in &lines {
            f.scan(l);
        }
        let kept: String = lines.iter().filter(|l| f.keep(l)).copied().collect();
        assert_eq!(f.dropped_computations(), 1);
        assert_eq!(f.kept_bytes(), kept.len() as u64);
        assert!(!kept.contains("%fused (p.0") && kept.contains("ENTRY %main"));
        let (m, diags) = parse_module(&kept);
        assert!(diags.is_empty(), "{diags:?}");
        let (full, _) = parse_module(LONG);
        assert_eq!(m.entry(), full.entry());
        assert_eq!(m.stack_frames, full.stack_frames);
        assert_eq!(m.computations.len(), 1);
    }

    #[test]
    fn strip_backend_config() {
        let l = "  %a = f32[] add(%x, %y), metadata={op_name=\"a, backend_config=1\"}, backend_config={\"x\":{\"y\":\"}\"}}, sharding={replicated}\n";
        let s = strip_attribute(l, "backend_config");
        assert_eq!(
            s,
            "  %a = f32[] add(%x, %y), metadata={op_name=\"a, backend_config=1\"}, sharding={replicated}\n"
        );
        assert_eq!(
            strip_attribute("%b = f32[] c(), backend_config=\"q\"", "backend_config"),
            "%b = f32[] c()"
        );
        assert!(matches!(
            strip_attribute("%c = f32[] d()", "backend_config"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn fusion_filter_crlf_and_truncation() {
        let crlf = LONG.replace('\n', "\r\n");
        let mut f = FusionBodyFilter::default();
        let lines: Vec<&str> = crlf.split_inclusive('\n').collect();
        lines.iter().for_each(|l| f.scan(l));
        let kept: String = lines.iter().filter(|l| f.keep(l)).copied().collect();
        assert_eq!(f.dropped_computations(), 1);
        assert!(!kept.contains("%p.0 = f32[4]{0} parameter(0)") && kept.contains("ENTRY %main"));
        // Cut anywhere: the filter never panics and keeps what precedes the fusion body.
        for cut in 0..LONG.len() {
            let text = &LONG[..cut];
            let mut f = FusionBodyFilter::default();
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            lines.iter().for_each(|l| f.scan(l));
            let kept: String = lines.iter().filter(|l| f.keep(l)).copied().collect();
            assert!(f.kept_bytes() >= kept.len() as u64);
            let _ = parse_module(&kept);
            // Regression: a header cut inside `input_output_alias={ {0}: (` sliced backwards.
            let _ = parse_module(text);
        }
    }
}
