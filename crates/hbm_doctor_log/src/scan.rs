//! Streaming search for OOM messages in logs of any size.
//!
//! [`Scanner`] is fed a buffer that the caller refills; it finds anchor strings with a SIMD
//! multi-pattern search (aho-corasick, Teddy), cuts a window of lines around each hit, merges
//! overlapping windows into one block, parses each block as soon as no later hit can extend it,
//! and tells the caller how many leading bytes it may drop. Memory stays flat: at most one
//! buffer plus one block, whatever the size of the log. Lines are counted with SIMD `bytecount`.
//!
//! A hit whose line is a known non-fatal warning of the usual shape (a rematerialization
//! shortfall, an allocator retry; see the `fast` module) cuts no block: its numbers are read in
//! place and counted, so a log where one line in five is such a warning scans at the speed of
//! one without. Pieces stream into a [`Merger`] as blocks close; warnings are summarised per kind.
//!
//! The anchor search may run on another thread: a [`HitFinder`] finds the first anchor of each
//! line of the ranges it is given and the scanner takes them ([`Scanner::push_hits`]), searching
//! the ranges no finder covered itself; the events are the same either way.

use crate::clean::clean_block;
use crate::event::{Event, WarningFigures, WarningSummary};
use crate::fast::{self, Fast};
use crate::merge::Merger;
use crate::parse::{parse_block, Piece};
use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};

/// Bytes of context kept before a hit.
pub const LOOKBEHIND_BYTES: usize = 64 * 1024;
/// Lines of context kept before a hit.
pub const LOOKBEHIND_LINES: usize = 80;
/// Bytes of context taken after a hit (reports such as `Largest program allocations` follow it).
pub const LOOKAHEAD_BYTES: usize = 256 * 1024;
/// Lines of context taken after a hit.
pub const LOOKAHEAD_LINES: usize = 400;
/// A block never grows past this; a new one starts instead.
pub const MAX_BLOCK_BYTES: usize = 4 * 1024 * 1024;

/// Strings whose presence marks a line worth parsing. Every family of formats.md §4 contains one.
pub(crate) const ANCHORS: &[&str] = &[
    // Chosen to start with bytes that are rare in ordinary log text, so the SIMD prefilter
    // (Teddy) proposes few false candidates: this search is the hot loop of a multi-GB log.
    "RESOURCE_EXHAUSTED",
    "Resource exh",
    "ResourceExh",
    "ut of memory",
    "ut of host",
    "OOM when",
    "Attempting to",
    "rror loading program",
    "would exceed memory",
    "exceeds available",
    "Hbm usage",
    "rematerialization",
    "ailed to alloc",
    "Scoped",
    "Killed process",
    "oom-kill",
    "Sum Total of in-use",
    "Largest program allocations",
    "Peak buffers",
    "BufferAssignment OOM",
    "bm requirement",
    "mem requirement",
    "usage >=",
    "Allocation type:",
    "memory_limit_",
    "cuMemAllocAsync",
    "pinned host",
    "enough memory",
    "Chunk State",
    "Graph input size",
    "OUT_OF_MEMORY",
    "ALLOC_FAILED",
    "ublas handle",
    "Shared memory size limit",
    "Shared memory requested",
    // Triton's `OutOfResources: out of resource: shared memory`.
    "OfResources",
    "too much shared data",
    "KV cache is needed",
    "JIT session error",
    "MaxInUse:",
    "AllocationError",
    "cache blocks",
    "KV cache (",
    "KV Cache is -",
    "KV cache memory: -",
    "new constant",
    "DEVMEM",
    "ut of Memory",
    // The shell's `Killed`, `zsh: killed`, quoted `"killed"`, SIGKILL: a process the kernel
    // killed (one lowercase anchor for the quoted and zsh spellings: fewer patterns keep the
    // SIMD search fast; the readers decide).
    "Killed",
    "killed",
    "SIGKILL",
    // NumPy's host array, Windows' paging file. (PyTorch's cudaMallocAsync and MPS headlines
    // carry `out of memory`; rarer shapes are read in small texts only: `told_failure`.)
    "yError: Unable",
    "paging file",
    // PyTorch's host allocator: `DefaultCPUAllocator: can't allocate memory`.
    "PUAllocator: ",
];

/// The multi-pattern searcher for [`ANCHORS`]: the packed SIMD searcher (Teddy) called
/// directly where the CPU has it (a hit every few lines makes the per-call cost count), else an
/// automaton.
#[derive(Debug)]
pub(crate) struct Anchors {
    packed: Option<aho_corasick::packed::Searcher>,
    automaton: AhoCorasick,
    /// The warning shape each anchor can start, by pattern index.
    shapes: Vec<fast::Shape>,
    /// The longest anchor's length minus one.
    reach: usize,
}

impl Anchors {
    /// The leftmost anchor in `haystack` (the first listed of those starting there): its start
    /// and its index in [`ANCHORS`].
    #[inline]
    pub(crate) fn find(&self, haystack: &[u8]) -> Option<(usize, usize)> {
        match &self.packed {
            Some(p) => p.find(haystack),
            None => self.automaton.find(haystack),
        }
        .map(|m| (m.start(), m.pattern().as_usize()))
    }
}

/// The searcher for [`ANCHORS`], built once.
pub(crate) fn anchors() -> &'static Anchors {
    static ANCHOR_SEARCHER: std::sync::OnceLock<Anchors> = std::sync::OnceLock::new();
    ANCHOR_SEARCHER.get_or_init(|| {
        let packed = aho_corasick::packed::Config::new()
            .match_kind(aho_corasick::packed::MatchKind::LeftmostFirst)
            .builder()
            .extend(ANCHORS)
            .build();
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostFirst)
            .kind(Some(AhoCorasickKind::DFA))
            .build(ANCHORS)
            .expect("anchors are valid");
        let shapes = ANCHORS.iter().map(|a| fast::Shape::of(a)).collect();
        Anchors {
            packed,
            automaton,
            shapes,
            reach: ANCHORS.iter().map(|a| a.len()).max().unwrap_or(1) - 1,
        }
    })
}

/// One anchor found in a stream: its absolute byte offset and its index in the scan's anchors.
pub type Hit = (u64, u32);

/// Finds the first anchor of every line (the leftmost, the first listed of those starting
/// there; the scanner goes on after a hit's line, so it never asks for another) in a text that
/// grows, so that the anchor search can run on another thread than the [`Scanner`],
/// ahead of it (the scanner takes the hits with [`Scanner::push_hits`]). A start is decided
/// once every anchor that could begin there fits in the bytes fed so far.
#[derive(Debug)]
pub struct HitFinder {
    anchors: &'static Anchors,
    /// How far into the text starts are decided.
    decided: usize,
}

impl Default for HitFinder {
    fn default() -> Self {
        Self::new()
    }
}

impl HitFinder {
    /// A finder at the start of a text.
    pub fn new() -> HitFinder {
        HitFinder {
            anchors: anchors(),
            decided: 0,
        }
    }

    /// Leaves the text up to `to` to the scanner (which searches what no hit covers itself):
    /// the next search starts there.
    pub fn skip_to(&mut self, to: usize) {
        self.decided = self.decided.max(to);
    }

    /// `text` is the text so far (a prefix that only grows); `end` says it is whole. Appends,
    /// in order, the hits whose start is now decided, and returns how far starts are decided.
    pub fn feed(&mut self, text: &[u8], end: bool, out: &mut Vec<Hit>) -> usize {
        let bound = if end {
            text.len()
        } else {
            text.len().saturating_sub(self.anchors.reach)
        };
        let mut at = self.decided;
        while at < bound {
            let Some((start, pattern)) = self.anchors.find(&text[at..]) else {
                break;
            };
            if at + start >= bound {
                break;
            }
            out.push(((at + start) as u64, pattern as u32));
            // The scanner goes on after a hit's line: later hits on it are never asked for.
            at = memchr::memchr(b'\n', &text[at + start..]).map_or(bound, |i| at + start + i + 1);
        }
        // (Past `bound` only when the last hit's line ends beyond it: the rest of that line.)
        self.decided = self.decided.max(bound).max(at.min(text.len()));
        self.decided
    }
}

/// Whether `text` contains any anchor.
pub(crate) fn any_anchor(text: &[u8]) -> bool {
    anchors().find(text).is_some()
}

#[derive(Debug)]
struct Block {
    start: usize,
    start_line: u64,
    end: usize,
}

/// A push-based scanner. See the module docs.
#[derive(Debug)]
pub struct Scanner {
    anchors: &'static Anchors,
    /// Where the next search starts, in the coordinates of the next buffer.
    resume: usize,
    /// A position in the current buffer whose 0-based line number is known.
    cursor_pos: usize,
    cursor_line: u64,
    block: Option<Block>,
    merger: Merger,
    /// 1-based line of the last warning read by the fast path: a block's lookbehind may cover
    /// it again, and its pieces up to this line are not counted twice.
    fast_last_line: u64,
    /// Where in the buffer the raw line of the last fast-path remat warning lies, with its
    /// line: copied into the merger only before the buffer is dropped.
    fast_raw: Option<(usize, usize, u64)>,
    /// Warning shapes read recently.
    shapes: fast::Shapes,
    bytes_seen: u64,
    last_floor: usize,
    /// Anchor hits found by a [`HitFinder`], and the absolute byte ranges they cover
    /// (ascending); elsewhere the scanner searches itself.
    hits: std::collections::VecDeque<Hit>,
    covered: std::collections::VecDeque<(u64, u64)>,
}

impl Default for Scanner {
    fn default() -> Self {
        Self::new()
    }
}

impl Scanner {
    /// A scanner at the start of a log.
    pub fn new() -> Scanner {
        Scanner {
            anchors: anchors(),
            resume: 0,
            cursor_pos: 0,
            cursor_line: 0,
            block: None,
            merger: Merger::new(),
            fast_last_line: 0,
            fast_raw: None,
            shapes: fast::Shapes::default(),
            bytes_seen: 0,
            last_floor: 0,
            hits: std::collections::VecDeque::new(),
            covered: std::collections::VecDeque::new(),
        }
    }

    /// Hands over the anchor hits a [`HitFinder`] found in the absolute byte range `covered`
    /// (after those passed before): every hit of that range, in order. The scanner takes its
    /// hits there from these, and searches other bytes itself.
    pub fn push_hits(&mut self, hits: &[Hit], covered: (u64, u64)) {
        self.hits.extend(hits.iter().copied());
        if covered.0 < covered.1 {
            self.covered.push_back(covered);
        }
    }

    /// The first anchor starting at or after `from` in `buf`: its offset from `from` and index.
    #[inline]
    fn next_hit(&mut self, buf: &[u8], from: usize) -> Option<(usize, usize)> {
        if self.covered.is_empty() {
            return self.anchors.find(&buf[from..]);
        }
        let mut pos = from;
        loop {
            let abs = self.bytes_seen + pos as u64;
            while self.covered.front().is_some_and(|&(_, e)| e <= abs) {
                self.covered.pop_front();
            }
            while self.hits.front().is_some_and(|&(h, _)| h < abs) {
                self.hits.pop_front();
            }
            match self.covered.front().copied() {
                Some((a, e)) if a <= abs => {
                    if let Some(&(h, pattern)) = self.hits.front() {
                        if h < e {
                            let at = (h - self.bytes_seen) as usize;
                            return (at < buf.len()).then_some((at - from, pattern as usize));
                        }
                    }
                    // No hit in the rest of this range.
                    let at = (e - self.bytes_seen) as usize;
                    if at >= buf.len() {
                        return None;
                    }
                    pos = at;
                }
                next => {
                    // Not covered up to the next range: search up to its start (an anchor
                    // that starts before it ends by `stop + reach`).
                    let stop = next.map(|(a, _)| (a - self.bytes_seen) as usize);
                    let end = stop.map_or(buf.len(), |s| (s + self.anchors.reach).min(buf.len()));
                    if let Some((start, pattern)) = self.anchors.find(&buf[pos..end]) {
                        if stop.is_none_or(|s| pos + start < s) {
                            return Some((pos + start - from, pattern));
                        }
                    }
                    match stop {
                        Some(s) if s < buf.len() => pos = s,
                        _ => return None,
                    }
                }
            }
        }
    }

    fn line_of(&mut self, buf: &[u8], pos: usize) -> u64 {
        if pos >= self.cursor_pos {
            self.cursor_line += bytecount::count(&buf[self.cursor_pos..pos], b'\n') as u64;
        } else {
            // A hit found past the end of the previous call's window whose line began before it.
            self.cursor_line -= bytecount::count(&buf[pos..self.cursor_pos], b'\n') as u64;
        }
        self.cursor_pos = pos;
        self.cursor_line
    }

    /// Scans `buf`, which starts where the previous call's consumed bytes ended. `eof` says no more
    /// data follows. Returns how many leading bytes of `buf` the caller may now drop.
    pub fn scan(&mut self, buf: &[u8], eof: bool) -> usize {
        let limit = if eof {
            buf.len()
        } else {
            buf.len().saturating_sub(LOOKAHEAD_BYTES)
        };
        let mut pos = self.resume.min(buf.len());
        while pos < limit {
            let Some((start, pattern)) = self.next_hit(buf, pos) else {
                break;
            };
            let hit = pos + start;
            if hit >= limit {
                break;
            }
            let line_start = memchr::memrchr(b'\n', &buf[..hit]).map_or(0, |i| i + 1);
            let shape = self.anchors.shapes[pattern];
            if let Some((warning, text_end)) =
                self.shapes.recognise(buf, line_start, hit, shape, eof)
            {
                let line_end = (text_end + 1).min(buf.len());
                pos = line_end;
                if let Some(block) = &mut self.block {
                    if line_start < block.end {
                        // Read with its block, which it does not extend.
                        block.end = block.end.max(line_end);
                        continue;
                    }
                }
                if line_start < self.last_floor {
                    // Already read, whole or in part, by the block that just closed.
                    continue;
                }
                self.close_block(buf);
                let line = self.line_of(buf, line_start) + 1;
                self.fast_last_line = line;
                match warning {
                    Fast::Remat(remat) => {
                        self.merger.push_remat_fast(line, remat);
                        self.fast_raw = Some((line_start, text_end, line));
                    }
                    Fast::Warning(kind, requested_bytes) => self.merger.push(Piece::Warning {
                        kind,
                        figures: WarningFigures {
                            line,
                            requested_bytes,
                            ..WarningFigures::default()
                        },
                    }),
                }
                continue;
            }
            let line_end = memchr::memchr(b'\n', &buf[hit..]).map_or(buf.len(), |i| hit + i + 1);
            pos = line_end;
            if let Some(block) = &mut self.block {
                if line_start < block.end && line_end - block.start < MAX_BLOCK_BYTES {
                    block.end = block.end.max(forward(buf, line_end));
                    continue;
                }
            }
            self.close_block(buf);
            let hit_line = self.line_of(buf, line_start);
            let floor = self.block_floor();
            let start = backward(buf, line_start, floor);
            let start_line = hit_line - bytecount::count(&buf[start..line_start], b'\n') as u64;
            self.block = Some(Block {
                start,
                start_line,
                end: forward(buf, line_end),
            });
        }
        if self.block.as_ref().is_some_and(|b| b.end <= limit || eof) {
            self.close_block(buf);
        }
        self.line_of(buf, limit.max(self.cursor_pos));
        let keep_from = match &self.block {
            Some(b) => b.start,
            None => limit.saturating_sub(LOOKBEHIND_BYTES),
        };
        let consumed = if eof { buf.len() } else { keep_from.min(limit) };
        if let Some((s, e, line)) = self.fast_raw.take() {
            self.merger.keep_pending_raw(line, &buf[s..e]);
        }
        self.resume = limit.max(pos.min(buf.len())) - consumed;
        self.cursor_pos -= consumed;
        if let Some(b) = &mut self.block {
            b.start -= consumed;
            b.end -= consumed;
        }
        self.last_floor = self.last_floor.saturating_sub(consumed);
        self.bytes_seen += consumed as u64;
        consumed
    }

    fn block_floor(&self) -> usize {
        self.last_floor
    }

    fn close_block(&mut self, buf: &[u8]) {
        let Some(block) = self.block.take() else {
            return;
        };
        self.last_floor = block.end;
        let lines = clean_block(&buf[block.start..block.end], block.start_line + 1);
        for piece in parse_block(&lines) {
            let seen = match &piece {
                Piece::Remat { line, .. } => *line <= self.fast_last_line,
                Piece::Warning { figures, .. } => figures.line <= self.fast_last_line,
                _ => false,
            };
            if !seen {
                self.merger.push(piece);
            }
        }
    }

    /// Whether non-fatal events were summarised without being kept one by one beyond
    /// [`crate::merge::MAX_NON_FATAL_EVENTS`] (fatal events are never dropped).
    pub fn truncated(&self) -> bool {
        self.merger.truncated()
    }

    /// Ends the scan and returns the events, duplicates merged, in input order.
    pub fn finish(self) -> Vec<Event> {
        self.finish_with_warnings().0
    }

    /// Ends the scan: the events, and the non-fatal warnings summarised per kind.
    pub fn finish_with_warnings(self) -> (Vec<Event>, Vec<WarningSummary>) {
        self.merger.finish()
    }
}

/// End of the window after a hit's line: up to [`LOOKAHEAD_LINES`] lines or bytes.
fn forward(buf: &[u8], from: usize) -> usize {
    let cap = (from + LOOKAHEAD_BYTES).min(buf.len());
    match memchr::memchr_iter(b'\n', &buf[from..cap]).nth(LOOKAHEAD_LINES - 1) {
        Some(i) => from + i + 1,
        None => cap,
    }
}

/// Start of the window before a hit's line, never before `floor` (the end of the previous block).
fn backward(buf: &[u8], line_start: usize, floor: usize) -> usize {
    let floor = floor.max(line_start.saturating_sub(LOOKBEHIND_BYTES));
    if line_start <= floor {
        return line_start.max(floor.min(line_start));
    }
    match memchr::memrchr_iter(b'\n', &buf[floor..line_start.saturating_sub(1)])
        .nth(LOOKBEHIND_LINES - 1)
    {
        Some(i) => floor + i + 1,
        None => floor,
    }
}

/// Scans a whole in-memory log.
pub fn scan_all(input: &[u8]) -> Vec<Event> {
    scan_all_with_warnings(input).0
}

/// Scans a whole in-memory log: the events, and the warnings summarised per kind.
pub fn scan_all_with_warnings(input: &[u8]) -> (Vec<Event>, Vec<WarningSummary>) {
    scan_unwrapped(input).unwrap_or_else(|| scan_as_is(input))
}

/// The scan and, in a small text with no printed failure, a failure told in words.
fn scan_as_is(input: &[u8]) -> (Vec<Event>, Vec<WarningSummary>) {
    let mut scanner = Scanner::new();
    scanner.scan(input, true);
    let (mut events, warnings) = scanner.finish_with_warnings();
    with_told_failure(&mut events, input);
    (events, warnings)
}

/// A small text (a post, [`crate::parse::TOLD_MAX_BYTES`] or less) that a terminal hard-wrapped
/// (Windows' console, an e-mail: every long line cut at the same width, inside words and
/// numbers): scanned joined again, its events' and warnings' lines those of the input. `None`
/// for any other text (a machine-written log is never wrapped).
pub fn scan_unwrapped(input: &[u8]) -> Option<(Vec<Event>, Vec<WarningSummary>)> {
    if input.len() > crate::parse::TOLD_MAX_BYTES {
        return None;
    }
    let (text, numbers) = crate::clean::unwrap_terminal(input)?;
    let (mut events, mut warnings) = scan_as_is(&text);
    let line = |n: u64| {
        usize::try_from(n)
            .ok()
            .and_then(|i| numbers.get(i.checked_sub(1)?))
            .copied()
            .unwrap_or(n)
    };
    for e in &mut events {
        e.line = line(e.line);
    }
    for w in &mut warnings {
        w.first_line = line(w.first_line);
        w.last_line = line(w.last_line);
        w.worst.line = line(w.worst.line);
    }
    Some((events, warnings))
}

/// A small text with no printed failure may tell one in words
/// ([`crate::parse::told_failure`]); it joins the events when nothing printed was found.
///
/// A pull request's description ([`crate::parse::pull_request`]) quotes messages as examples of
/// its change: it holds no failure.
pub fn with_told_failure(events: &mut Vec<Event>, input: &[u8]) {
    if crate::parse::pull_request(input) {
        events.clear();
        return;
    }
    if events.iter().any(|e| e.fatal) {
        return;
    }
    if let Some(e) = crate::parse::told_failure(input) {
        events.push(e);
        events.sort_by_key(|e| e.line);
    }
}
