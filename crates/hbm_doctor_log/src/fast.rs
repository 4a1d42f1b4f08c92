//! The fast path for non-fatal warnings that repeat with different numbers.
//!
//! A training log can print a rematerialization warning for every program it compiles, or an
//! allocator retry for every step: one line in five may hit an anchor without being an error.
//! Cutting a block of context around each of them and running the message regexes over it costs
//! ~100x a plain search, so the scanner first asks [`recognise`] whether the hit's line has the
//! exact shape of a known warning. If it has, only its numbers are read, with byte comparisons;
//! if anything about the line is unusual (a wrap, a prefix the cleaner would have to think about,
//! text after the message, a size spelled in a rare way), it answers `None` and the line takes
//! the ordinary path, which reads every variant. So the fast path gives the same pieces as the
//! slow one on the lines it takes (tested in `tests` below), and nothing on the others.

use crate::event::{Remat, WarningKind};
use memchr::memmem;
use std::sync::OnceLock;

/// What a warning line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fast {
    /// A rematerialization shortfall.
    Remat(Remat),
    /// An allocator warning and the bytes it asked for.
    Warning(WarningKind, Option<u64>),
}

const REMAT_HEAD: &[u8] = b"Can't reduce memory use below ";
const REMAT_MID: &[u8] = b" by rematerialization; only reduced to ";
const DOWN_FROM: &[u8] = b", down from ";
const BFC_HEAD: &[u8] = b"Allocator (";
const BFC_MID: &[u8] = b") ran out of memory trying to allocate ";
const CUDA_HEAD: &[u8] = b"failed to allocate ";
const CUDA_TAIL: &[u8] = b" bytes) from device: CUDA_ERROR_OUT_OF_MEMORY";
const DEVICE_HEAD: &[u8] = b"Failed to allocate device memory of ";
const DEVICE_TAIL: &[u8] = b" bytes): RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY";

fn finder(which: usize) -> &'static memmem::Finder<'static> {
    static F: OnceLock<[memmem::Finder<'static>; 3]> = OnceLock::new();
    &F.get_or_init(|| {
        [
            memmem::Finder::new(REMAT_HEAD),
            memmem::Finder::new(BFC_HEAD),
            memmem::Finder::new(b"not a failure"),
        ]
    })[which]
}

/// Which warning an anchor can start (the scanner classifies its anchors once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Not one of these warnings' anchors.
    None,
    /// `rematerialization`.
    Remat,
    /// `ut of memory` (BFC's "ran out of memory ... not a failure").
    Bfc,
    /// `ailed to alloc` (cuda_driver's retry).
    Cuda,
}

impl Shape {
    /// The shape an anchor string can start.
    pub(crate) fn of(anchor: &str) -> Shape {
        match anchor {
            "rematerialization" => Shape::Remat,
            "ut of memory" => Shape::Bfc,
            "ailed to alloc" => Shape::Cuda,
            _ => Shape::None,
        }
    }
}

/// Reads the warning on the line that starts at `start` in `buf`, whose leftmost anchor (of
/// `shape`) was found at `hit`. Returns what it says and where its text ends (the newline, or
/// the end of `buf` when `eof`). `None`: not a warning this path knows, or not a plain one.
#[cfg(test)]
pub(crate) fn recognise(
    buf: &[u8],
    start: usize,
    hit: usize,
    shape: Shape,
    eof: bool,
) -> Option<(Fast, usize)> {
    recognise_nums(buf, start, hit, shape, eof).map(|(f, end, _)| (f, end))
}

/// [`recognise`], and the line's [`Nums`] when its shape alone decides how it reads (a remat
/// warning after a glog prefix with every size's exact count).
fn recognise_nums(
    buf: &[u8],
    start: usize,
    hit: usize,
    shape: Shape,
    eof: bool,
) -> Option<(Fast, usize, Option<Nums>)> {
    if shape == Shape::None {
        return None;
    }
    let rest = &buf[start..];
    let hit = hit - start;
    // Where the message starts: after a glog prefix (which may hold the anchor:
    // `hlo_rematerialization.cc:3231]`), else wherever its first words are.
    let glog = glog_end(rest);
    if shape == Shape::Remat {
        if let Some(g) = glog.filter(|&g| expect(rest, g, REMAT_HEAD).is_some()) {
            // The usual line: the walk over the message finds its end too.
            let (fast, end, nums) = remat_nums(rest, g, hit, eof)?;
            return Some((fast, start + end, nums));
        }
    }
    let text_end = match memchr::memchr(b'\n', &rest[hit..]) {
        Some(i) => hit + i,
        None if eof => rest.len(),
        None => return None,
    };
    let line = &rest[..text_end];
    let at = |head: &[u8], finder: usize| match glog {
        Some(g) if line[g..].starts_with(head) => Some(g),
        _ => self::finder(finder).find(line),
    };
    let (head, fast) = match shape {
        Shape::Remat => {
            let head = at(REMAT_HEAD, 0)?;
            (head, remat(line, head, hit, true)?.0)
        }
        Shape::Bfc => bfc(line, at(BFC_HEAD, 1)?, hit)?,
        _ => cuda(line, hit)?,
    };
    if glog == Some(head) {
        // The cleaner strips a glog prefix whole.
        return Some((fast, start + text_end, None));
    }
    // Other text before the message: no anchor in it, nothing the cleaner must split, and no
    // chance that a terminal wrap joins this line to the one before.
    let prefix = &line[..head];
    let plain = prefix.trim_ascii().is_empty()
        || (hit > head && !prefix.contains(&b'\\') && previous_line_is_closed(&buf[..start]));
    plain.then_some((fast, start + text_end, None))
}

/// Lines read recently, by shape: the line with every digit replaced by `0`. A remat warning
/// whose shape is known (same text between its numbers, numbers of the same lengths) reads as
/// that one did, so only its counts are parsed: one pass of eight-byte comparisons instead of
/// the grammar. Shapes are kept by line length, a few at a time.
#[derive(Debug, Default)]
pub(crate) struct Shapes {
    slots: [Option<Box<Learned>>; SLOTS],
}

const SLOTS: usize = 8;
/// Longer lines are not kept.
const MAX_LEN: usize = 512;

#[derive(Debug)]
struct Learned {
    /// The line's length, without its newline.
    len: usize,
    /// Where its leftmost anchor lies.
    hit: usize,
    /// The shape: the line with every ASCII digit made `0`.
    shape: Vec<u8>,
    nums: Nums,
}

/// Whether `line` has `shape` (a branch-free loop the compiler turns into SIMD compares).
#[inline]
fn has_shape(line: &[u8], shape: &[u8]) -> bool {
    if line.len() != shape.len() {
        return false;
    }
    let mut diff = 0u8;
    for (&b, &want) in line.iter().zip(shape) {
        let b = if b.is_ascii_digit() { b'0' } else { b };
        diff |= b ^ want;
    }
    diff == 0
}

impl Shapes {
    /// [`recognise`], through the shapes seen before.
    #[inline]
    pub(crate) fn recognise(
        &mut self,
        buf: &[u8],
        start: usize,
        hit: usize,
        shape: Shape,
        eof: bool,
    ) -> Option<(Fast, usize)> {
        if shape == Shape::Remat {
            if let Some(found) = self.known(buf, start, hit, eof) {
                return Some(found);
            }
        }
        let (fast, end, nums) = recognise_nums(buf, start, hit, shape, eof)?;
        if let Some(nums) = nums {
            let line = &buf[start..end];
            if line.len() <= MAX_LEN {
                let shape = line
                    .iter()
                    .map(|&b| if b.is_ascii_digit() { b'0' } else { b })
                    .collect();
                self.slots[line.len() % SLOTS] = Some(Box::new(Learned {
                    len: line.len(),
                    hit: hit - start,
                    shape,
                    nums,
                }));
            }
        }
        Some((fast, end))
    }

    fn known(&self, buf: &[u8], start: usize, hit: usize, eof: bool) -> Option<(Fast, usize)> {
        let rest = &buf[start..];
        let len = match memchr::memchr(b'\n', &rest[hit - start..]) {
            Some(i) => hit - start + i,
            None if eof => rest.len(),
            None => return None,
        };
        let learned = self.slots[len % SLOTS].as_deref()?;
        if learned.len != len || learned.hit != hit - start {
            return None;
        }
        let line = &rest[..len];
        if !has_shape(line, &learned.shape) {
            return None;
        }
        let (nums, count) = learned.nums;
        let value =
            |(off, n): (usize, usize)| digits(line, off).filter(|d| d.1 == off + n).map(|d| d.0);
        let remat = Remat {
            target_bytes: value(nums[0])?,
            reduced_to_bytes: value(nums[1])?,
            original_bytes: if count == 3 {
                Some(value(nums[2])?)
            } else {
                None
            },
        };
        Some((Fast::Remat(remat), start + len))
    }
}

/// Where the message starts, and what it says.
type Found = (usize, Fast);

/// `Can't reduce memory use below 12.45GiB (13372150681 bytes) by rematerialization; only reduced
/// to 15.25GiB (16374564352 bytes), down from 25.81GiB (27715962368 bytes) originally`, from
/// `head` to the newline (or the end of `text` when `eof`): the figures and where the text ends.
#[inline]
fn remat(text: &[u8], head: usize, hit: usize, eof: bool) -> Option<(Fast, usize)> {
    remat_nums(text, head, hit, eof).map(|(f, end, _)| (f, end))
}

/// Offset and length of a run of digits.
type Span = (usize, usize);

/// Where a line's exact counts lie (offset and digits: target, reduced to, original) when all its
/// sizes carry one: reading such a line depends on its shape only.
type Nums = ([Span; 3], usize);

/// [`remat`], and the line's [`Nums`] when it has them.
#[inline]
fn remat_nums(
    text: &[u8],
    head: usize,
    hit: usize,
    eof: bool,
) -> Option<(Fast, usize, Option<Nums>)> {
    let line = text;
    let mut i = head + REMAT_HEAD.len();
    let mut nums = [(0, 0); 3];
    let mut exact = true;
    let (target, mid, e) = size_at_exact(line, i)?;
    exact &= e.is_some();
    nums[0] = e.unwrap_or_default();
    // The anchor found is this shape's own (` by r...`), or one in the prefix.
    if hit > head && mid + 4 != hit {
        return None;
    }
    i = expect(line, mid, REMAT_MID)?;
    let (reduced, next, e) = size_at_exact(line, i)?;
    exact &= e.is_some();
    nums[1] = e.unwrap_or_default();
    i = next;
    let mut original = None;
    let mut count = 2;
    if let Some(j) = expect(line, i, DOWN_FROM) {
        let (o, next, e) = size_at_exact(line, j)?;
        exact &= e.is_some();
        nums[2] = e.unwrap_or_default();
        count = 3;
        original = Some(o);
        i = next;
    }
    i = expect(line, i, b" originally").unwrap_or(i);
    i = expect(line, i, b".").unwrap_or(i);
    while matches!(line.get(i), Some(b' ' | b'\t' | b'\r')) {
        i += 1;
    }
    match line.get(i) {
        Some(b'\n') => {}
        None if eof => {}
        _ => return None,
    }
    Some((
        Fast::Remat(Remat {
            target_bytes: target,
            reduced_to_bytes: reduced,
            original_bytes: original,
        }),
        i,
        exact.then_some((nums, count)),
    ))
}

/// The TF BFC allocator's warning that it will carry on: `Allocator (GPU_0_bfc) ran out of memory
/// trying to allocate 2.21GiB with freed_by_count=0. The caller indicates that this is not a
/// failure, ...`.
#[inline]
fn bfc(line: &[u8], head: usize, hit: usize) -> Option<Found> {
    let name_start = head + BFC_HEAD.len();
    let name_len = line[name_start..]
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b':' | b'-')))?;
    let mid = name_start + name_len;
    // The anchor found is this shape's own (`) ran o|ut of memory`), or one in the prefix.
    if hit > head && mid + 7 != hit {
        return None;
    }
    let mut i = expect(line, mid, BFC_MID)?;
    let (size, next) = size_at(line, i)?;
    i = next;
    let mut requested = Some(size);
    if let Some(j) = expect(line, i, b" (rounded to ") {
        let (n, next) = digits(line, j)?;
        requested = Some(n);
        i = expect(line, next, b")")?;
    }
    let tail = &line[i..];
    if finder(2).find(tail).is_none() || crate::scan::any_anchor(tail) {
        return None;
    }
    Some((head, Fast::Warning(WarningKind::BfcNotAFailure, requested)))
}

/// `cuda_driver`'s `failed to allocate 3.77G (4046333952 bytes) from device:
/// CUDA_ERROR_OUT_OF_MEMORY: out of memory`: the allocator retries with less.
#[inline]
fn cuda(line: &[u8], hit: usize) -> Option<Found> {
    let head = hit.checked_sub(1)?;
    // Newer XLA's `Failed to allocate device memory of 59.38GiB (63763906560 bytes):
    // RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY: out of memory`.
    let (mut i, tail) = match expect(line, head, DEVICE_HEAD) {
        Some(i) => (i, DEVICE_TAIL),
        None => (expect(line, head, CUDA_HEAD)?, CUDA_TAIL),
    };
    let token = line[i..].iter().position(|&b| b == b' ' || b == b'\t')?;
    if token == 0 {
        return None;
    }
    i = expect(line, i + token, b" (")?;
    let (n, next) = digits(line, i)?;
    expect(line, next, tail)?;
    Some((head, Fast::Warning(WarningKind::AllocatorRetry, Some(n))))
}

/// `lit` at `i`: the position after it. Compared eight bytes at a time, inline (a call to
/// `memcmp` per literal was a visible share of a warning line's cost).
#[inline(always)]
fn expect(line: &[u8], i: usize, lit: &[u8]) -> Option<usize> {
    let end = i + lit.len();
    let got = line.get(i..end)?;
    let mut k = 0;
    while k + 8 <= lit.len() {
        let a = u64::from_le_bytes(got[k..k + 8].try_into().expect("eight bytes"));
        let b = u64::from_le_bytes(lit[k..k + 8].try_into().expect("eight bytes"));
        if a != b {
            return None;
        }
        k += 8;
    }
    while k < lit.len() {
        if got[k] != lit[k] {
            return None;
        }
        k += 1;
    }
    Some(end)
}

/// The value of eight ASCII digits loaded little-endian (the first digit in the lowest byte).
#[inline(always)]
fn eight_digits(w: u64) -> u64 {
    const MASK: u64 = 0x0000_00FF_0000_00FF;
    const MUL1: u64 = 100 + (1_000_000 << 32);
    const MUL2: u64 = 1 + (10_000 << 32);
    let v = w.wrapping_sub(0x3030_3030_3030_3030);
    let v = v.wrapping_mul(10).wrapping_add(v >> 8);
    (v & MASK)
        .wrapping_mul(MUL1)
        .wrapping_add(((v >> 16) & MASK).wrapping_mul(MUL2))
        >> 32
}

/// Eight bytes at `i`, little-endian, when the line has them.
#[inline(always)]
fn load8(line: &[u8], i: usize) -> Option<u64> {
    let bytes: [u8; 8] = line.get(i..i + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// 0x80 in every byte of `w` that is not an ASCII digit (no carries between bytes).
#[inline(always)]
fn non_digits(w: u64) -> u64 {
    let t = w ^ 0x3030_3030_3030_3030;
    ((t & 0x7F7F_7F7F_7F7F_7F7F).wrapping_add(0x7676_7676_7676_7676) | t) & 0x8080_8080_8080_8080
}

/// How many ASCII digits start at `i`: eight bytes at a time, without a branch per digit
/// (numbers of varying length made the byte loop mispredict on every one).
#[inline(always)]
fn digit_run(line: &[u8], i: usize) -> usize {
    let mut n = 0;
    while let Some(w) = load8(line, i + n) {
        let m = non_digits(w);
        if m != 0 {
            return n + (m.trailing_zeros() / 8) as usize;
        }
        n += 8;
        if n > 24 {
            return n;
        }
    }
    while line.get(i + n).is_some_and(u8::is_ascii_digit) {
        n += 1;
    }
    n
}

/// The value of the `n` (1 to 8) digits at the start of `w`.
#[inline(always)]
fn aligned_value(w: u64, n: usize) -> u64 {
    // Right-align the n digits and fill the bytes before them with '0'.
    let w = if n >= 8 {
        w
    } else {
        (w << (8 * (8 - n))) | (0x3030_3030_3030_3030 >> (8 * n))
    };
    eight_digits(w)
}

/// The value of the `n` (1 to 16) digits at `i`, when eight bytes can be read there.
#[inline(always)]
fn digits_value(line: &[u8], i: usize, n: usize) -> Option<u64> {
    let w = load8(line, i)?;
    if n <= 8 {
        return Some(aligned_value(w, n));
    }
    let low = eight_digits(load8(line, i + n - 8)?);
    Some(aligned_value(w, n - 8) * 100_000_000 + low)
}

/// A run of ASCII digits at `i` and its value.
#[inline(always)]
fn digits(line: &[u8], i: usize) -> Option<(u64, usize)> {
    let n = digit_run(line, i);
    if n == 0 || n > 19 {
        // 19 digits always fit in a u64; longer numbers are left to the slow path.
        return None;
    }
    if n <= 16 {
        if let Some(v) = digits_value(line, i, n) {
            return Some((v, i + n));
        }
    }
    let v = line[i..i + n]
        .iter()
        .fold(0u64, |v, &b| v * 10 + u64::from(b - b'0'));
    Some((v, i + n))
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// A size token at `i` as the message regexes read it (`12.45GiB (13372150681 bytes)`, `12.45G`,
/// `512B`, `13372150681 bytes`), valued as [`crate::parse_size`] values it. Rare spellings
/// (thousands separators, lower-case units) are `None`: the slow path reads them.
#[inline]
fn size_at(line: &[u8], i: usize) -> Option<(u64, usize)> {
    size_at_exact(line, i).map(|(v, end, _)| (v, end))
}

/// [`size_at`], and where the exact count in parentheses lies (offset, digits) when the value
/// came from one: then whether the token is read depends on its shape only, not its digits.
#[inline]
fn size_at_exact(line: &[u8], i: usize) -> Option<(u64, usize, Option<Span>)> {
    let skip = |j: usize| {
        let n = digit_run(line, j);
        (n > 0).then_some(j + n)
    };
    let mut j = skip(i)?;
    if line.get(j) == Some(&b'.') {
        j = skip(j + 1)?;
    }
    let number_end = j;
    if line.get(j) == Some(&b' ') {
        j += 1;
    }
    match line.get(j)? {
        b'K' | b'M' | b'G' | b'T' | b'P' | b'E' => {
            j += 1;
            if line.get(j..j + 2) == Some(b"iB") {
                j += 2;
            } else if line.get(j) == Some(&b'B') {
                j += 1;
            }
        }
        b'B' => j += 1,
        b'b' if line.get(j..j + 5) == Some(b"bytes") => j += 5,
        _ => return None,
    }
    if line.get(j).is_some_and(|&b| is_word(b)) {
        return None;
    }
    let unit_end = j;
    // `(13372150681 bytes)` / `(15360000000B)` right after: the exact count wins.
    let mut k = j;
    while line.get(k) == Some(&b' ') {
        k += 1;
    }
    if line.get(k) == Some(&b'(') {
        if let Some((exact, mut m)) = digits(line, k + 1) {
            if line.get(m) == Some(&b' ') {
                m += 1;
            }
            let unit = if line.get(m..m + 5) == Some(b"bytes") {
                5
            } else if line.get(m) == Some(&b'B') {
                1
            } else {
                0
            };
            if unit > 0 && line.get(m + unit) == Some(&b')') {
                let digits_end = if line[m - 1] == b' ' { m - 1 } else { m };
                return Some((exact, m + unit + 1, Some((k + 1, digits_end - k - 1))));
            }
        }
    }
    let token = std::str::from_utf8(&line[i..unit_end]).ok()?;
    if number_end == unit_end {
        return None;
    }
    Some((crate::size::parse_size(token)?, unit_end, None))
}

/// How many bytes of `[0-9:.]` (a glog time) start at `i`, eight at a time.
#[inline(always)]
fn time_run(line: &[u8], i: usize) -> usize {
    let mut n = 0;
    while let Some(w) = load8(line, i + n) {
        // Digits and ':' are 0x30..=0x3A; '.' is 0x2E.
        let dots = {
            let t = w ^ 0x2E2E_2E2E_2E2E_2E2E;
            // 0x80 exactly where the byte is '.' (t is zero there; no carries between bytes).
            !(((t & 0x7F7F_7F7F_7F7F_7F7F).wrapping_add(0x7F7F_7F7F_7F7F_7F7F)) | t)
                & 0x8080_8080_8080_8080
        };
        let t = w ^ 0x3030_3030_3030_3030;
        // 0x80 where the byte is not in 0x30..=0x3A.
        let outside = ((t & 0x7F7F_7F7F_7F7F_7F7F).wrapping_add(0x7575_7575_7575_7575) | t)
            & 0x8080_8080_8080_8080;
        let bad = outside & !dots;
        if bad != 0 {
            return n + (bad.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    while line
        .get(i + n)
        .is_some_and(|b| b.is_ascii_digit() || *b == b':' || *b == b'.')
    {
        n += 1;
    }
    n
}

/// Where the message starts when the line begins with a glog prefix (`W1121 12:00:00.123456
/// 4436 hlo_rematerialization.cc:3231] `), which the cleaner strips whole:
/// `^\s*[IWEF]\d{4} [\d:.]+\s+\d+\s+[^\]]+?:\d+\]\s*`.
#[inline(always)]
fn glog_end(line: &[u8]) -> Option<usize> {
    // Every variable-length run is measured eight bytes at a time: a byte loop per run
    // mispredicted at the end of each (padding before the pid, pid and line number lengths).
    let mut i = space_run(line, 0);
    let head = load8(line, i)?;
    // `[IWEF]\d{4} ` then the time.
    let first = head as u8;
    if !matches!(first, b'I' | b'W' | b'E' | b'F')
        || non_digits(head) & 0x0000_0080_8080_8000 != 0
        || (head >> 40) as u8 != b' '
    {
        return None;
    }
    i += 6;
    let n = time_run(line, i);
    let s = space_run(line, i + n);
    if n == 0 || s == 0 {
        return None;
    }
    i += n + s;
    let n = digit_run(line, i);
    let s = space_run(line, i + n);
    if n == 0 || s == 0 {
        return None;
    }
    i += n + s;
    // `file.cc:123]`: the first `]` ends the prefix, after `:` and digits and at least one byte.
    // (A backslash first: the cleaner may split the line at a literal `\n`; a newline first:
    // no prefix on this line.)
    let close = i + memchr::memchr3(b']', b'\\', b'\n', &line[i..])?;
    if line[close] != b']' || close < i + 3 {
        return None;
    }
    // The digits just before `]`, counted from the eight bytes that end there.
    let w = load8(line, close - 8).filter(|_| close >= i + 8);
    let d = match w {
        Some(w) => {
            let m = non_digits(w);
            if m == 0 {
                return None;
            }
            close - (m.leading_zeros() / 8) as usize
        }
        None => {
            let mut d = close;
            while d > i && line[d - 1].is_ascii_digit() {
                d -= 1;
            }
            d
        }
    };
    if d == close || d < i + 2 || line[d - 1] != b':' {
        return None;
    }
    let end = close + 1;
    Some(end + space_run(line, end))
}

/// How many spaces and tabs start at `i`, eight bytes at a time.
#[inline(always)]
fn space_run(line: &[u8], i: usize) -> usize {
    let mut n = 0;
    while let Some(w) = load8(line, i + n) {
        // 0x80 exactly where the byte is a space or a tab (zero after the xor).
        let zero = |t: u64| {
            !(((t & 0x7F7F_7F7F_7F7F_7F7F).wrapping_add(0x7F7F_7F7F_7F7F_7F7F)) | t)
                & 0x8080_8080_8080_8080
        };
        let blank = zero(w ^ 0x2020_2020_2020_2020) | zero(w ^ 0x0909_0909_0909_0909);
        let other = !blank & 0x8080_8080_8080_8080;
        if other != 0 {
            return n + (other.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    while matches!(line.get(i + n), Some(b' ' | b'\t')) {
        n += 1;
    }
    n
}

/// The line before cannot be joined with this one as a number a terminal wrapped (it does not
/// end in a digit or a dot, nor in something the cleaner strips).
fn previous_line_is_closed(before: &[u8]) -> bool {
    let Some(last) = before
        .iter()
        .rev()
        .find(|b| !matches!(b, b'\n' | b'\r' | b' ' | b'\t'))
    else {
        return true;
    };
    (last.is_ascii_alphabetic() && *last != b'm') || matches!(last, b')' | b',' | b';' | b':')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clean::clean_block;
    use crate::parse::{parse_block, Piece};

    fn fast(line: &str) -> Option<Fast> {
        let (start, pattern) = crate::scan::anchors().find(line.as_bytes())?;
        let shape = Shape::of(crate::scan::ANCHORS[pattern]);
        let got = recognise(line.as_bytes(), 0, start, shape, true);
        // The same line followed by others ends at its newline; cut short, it is not read.
        let more = format!("{line}\nnext line\n");
        assert_eq!(
            recognise(more.as_bytes(), 0, start, shape, false),
            got,
            "{line}"
        );
        assert_eq!(
            recognise(line.as_bytes(), 0, start, shape, false),
            None,
            "{line}"
        );
        let (fast, end) = got?;
        assert_eq!(end, line.len(), "{line}");
        Some(fast)
    }

    fn slow(line: &str) -> Vec<Piece> {
        parse_block(&clean_block(line.as_bytes(), 1))
    }

    const REMAT: &[&str] = &[
        "W1122 01:10:03.411821    4436 hlo_rematerialization.cc:3231] Can't reduce memory use below 12.45GiB (13372150681 bytes) by rematerialization; only reduced to 15.25GiB (16374564352 bytes), down from 25.81GiB (27715962368 bytes) originally",
        "W0000 00:00:1756998431.440298    5182 hlo_rematerialization.cc:3183] Can't reduce memory use below 10.64GiB (11424661504 bytes) by rematerialization; only reduced to 67.69GiB (72679444480 bytes), down from 80.12GiB (86030000000 bytes) originally\r",
        "Can't reduce memory use below 12.45G by rematerialization; only reduced to 15.25G",
        "Can't reduce memory use below 12.45G (13372150681B) by rematerialization; only reduced to 15.25 GiB, down from 20G.",
        "Can't reduce memory use below 13372150681 bytes by rematerialization; only reduced to 16374564352 bytes",
        "2024-01-01 12:00:00.000000: W external/xla/compiler.cc:3423] Can't reduce memory use below 1.00GiB (1073741824 bytes) by rematerialization; only reduced to 2.00GiB (2147483648 bytes)",
    ];

    #[test]
    fn remat_lines_read_as_the_slow_path_reads_them() {
        for line in REMAT {
            let Some(Fast::Remat(r)) = fast(line) else {
                panic!("not taken: {line}");
            };
            let pieces = slow(line);
            assert!(
                matches!(&pieces[..], [Piece::Remat { line: 1, remat, .. }] if *remat == r),
                "{line}: fast {r:?}, slow {pieces:?}"
            );
        }
    }

    #[test]
    fn known_shapes_read_as_the_grammar_reads_them() {
        // Lines of a few shapes, with digits changed (same lengths: the shape is known; other
        // lengths: a new shape), each read through the cache and without it.
        let mut shapes = Shapes::default();
        let mut rng = 12345u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut taken = 0;
        for round in 0..2000 {
            let base = REMAT[round % REMAT.len()];
            let mut line: Vec<u8> = base.bytes().collect();
            for b in line.iter_mut() {
                if b.is_ascii_digit() && next() % 3 == 0 {
                    *b = b'0' + (next() % 10) as u8;
                }
            }
            if round % 7 == 0 {
                // A digit more or less somewhere: another shape.
                let at = (next() as usize) % line.len();
                if line[at].is_ascii_digit() {
                    line.insert(at, b'7');
                }
            }
            line.extend_from_slice(b"\nnext\n");
            let text = &line[..];
            let Some((start, pattern)) = crate::scan::anchors().find(text) else {
                continue;
            };
            let shape = Shape::of(crate::scan::ANCHORS[pattern]);
            let want = recognise(text, 0, start, shape, false);
            assert_eq!(
                shapes.recognise(text, 0, start, shape, false),
                want,
                "{}",
                String::from_utf8_lossy(text)
            );
            taken += usize::from(want.is_some());
        }
        assert!(taken > 1000, "{taken}");
    }

    #[test]
    fn unusual_lines_take_the_slow_path() {
        for line in [
            // text after the message
            "Can't reduce memory use below 12.45G by rematerialization; only reduced to 15.25G RESOURCE_EXHAUSTED",
            "Can't reduce memory use below 12.45G by rematerialization; only reduced to 15.25G [9x]",
            // wrapped
            "Can't reduce memory use below 12.45G by rematerialization; only reduced",
            // thousands separators, lower-case unit
            "Can't reduce memory use below 1 234 567 bytes by rematerialization; only reduced to 15.25G",
            "Can't reduce memory use below 12.45g by rematerialization; only reduced to 15.25G",
            // a prefix the cleaner must read
            "foo\\nbar\\n Can't reduce memory use below 12.45G by rematerialization; only reduced to 15.25G",
            // an anchor in a prefix that is not glog's
            "2024-01-01 12:00:00.000000: W external/xla/hlo_rematerialization.cc:3423] Can't reduce memory use below 1.00GiB (1073741824 bytes) by rematerialization; only reduced to 2.00GiB (2147483648 bytes)",
            // other lines with the anchor
            "XLA::TPU post optimization rematerialization limit 12.45G = 95% hbm (14.96G) - (arguments (2.50G) - aliased_output(0B)) - overlays (7.02M)",
            "XLA::TPU rematerialization hbm reduction:  25.81G => 15.25G",
            "Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.21GiB with freed_by_count=0.",
            "Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.21GiB. not a failure. RESOURCE_EXHAUSTED",
            "failed to allocate 3.77G (4046333952 bytes) on host",
        ] {
            assert_eq!(fast(line), None, "{line}");
        }
    }

    #[test]
    fn allocator_warnings_read_as_the_slow_path_reads_them() {
        let cases = [
            ("I tensorflow/core/common_runtime/bfc_allocator.cc:275] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.21GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.", WarningKind::BfcNotAFailure, 2372969431),
            ("W1121 12:00:00.000000 1 bfc_allocator.cc:275] Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.00GiB (rounded to 1073741824) with freed_by_count=0. The caller indicates that this is not a failure", WarningKind::BfcNotAFailure, 1073741824),
            ("2023-01-01 12:00:00.000000: I external/xla/xla/stream_executor/cuda/cuda_driver.cc:739] failed to allocate 2.12G (2282521344 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory", WarningKind::AllocatorRetry, 2282521344),
            ("E1126 09:50:36.466878     443 cuda_executor.cc:1365] [0] Failed to allocate device memory of 59.38GiB (63763906560 bytes): RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY: out of memory", WarningKind::AllocatorRetry, 63763906560),
            ("E1126 09:50:36.466878     443 cuda_executor.cc:1365] Failed to allocate device memory of 59.38GiB (63763906560 bytes): RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY: out of memory", WarningKind::AllocatorRetry, 63763906560),
        ];
        for (line, kind, bytes) in cases {
            let Some(Fast::Warning(k, requested)) = fast(line) else {
                panic!("not taken: {line}");
            };
            assert_eq!((k, requested), (kind, Some(bytes)), "{line}");
            let pieces = slow(line);
            assert!(
                matches!(&pieces[..], [Piece::Warning { kind: sk, figures }] if *sk == k && figures.requested_bytes == requested && figures.line == 1),
                "{line}: slow {pieces:?}"
            );
        }
    }

    #[test]
    fn digits_eight_at_a_time() {
        for n in [
            "0",
            "7",
            "12345678",
            "123456789",
            "13372150681",
            "00000000",
            "99999999",
            "9999999999999999999",
            "1234567x",
            "12345678 bytes",
            "1",
            "12",
            "123",
            "1234567890123456",
            "12345678901234567",
            "12.45GiB",
            "1 bytes) down from",
        ] {
            let want = n
                .bytes()
                .take_while(u8::is_ascii_digit)
                .fold(0u64, |v, b| v * 10 + u64::from(b - b'0'));
            let len = n.bytes().take_while(u8::is_ascii_digit).count();
            assert_eq!(digits(n.as_bytes(), 0), Some((want, len)), "{n}");
        }
        assert_eq!(digits(b"12345678901234567890", 0), None);
        assert_eq!(digits(b"ab123456789012cd", 2), Some((123456789012, 14)));
        assert_eq!(digits(b"ab12", 2), Some((12, 4)));
        assert_eq!(digit_run(b"\xb0\xb1", 0), 0);
        assert_eq!(digits(b"x1", 0), None);
    }

    /// The byte-by-byte reading of `^\s*[IWEF]\d{4} [\d:.]+\s+\d+\s+[^\]]+?:\d+\]\s*`.
    fn glog_end_reference(line: &[u8]) -> Option<usize> {
        let mut i = line.iter().position(|b| !matches!(b, b' ' | b'\t'))?;
        let b = |i: usize| line.get(i).copied().unwrap_or(0);
        if !matches!(b(i), b'I' | b'W' | b'E' | b'F') {
            return None;
        }
        i += 1;
        for _ in 0..4 {
            if !b(i).is_ascii_digit() {
                return None;
            }
            i += 1;
        }
        if b(i) != b' ' {
            return None;
        }
        i += 1;
        let from = i;
        while b(i).is_ascii_digit() || b(i) == b':' || b(i) == b'.' {
            i += 1;
        }
        let spaces = |mut i: usize| {
            let from = i;
            while b(i) == b' ' || b(i) == b'\t' {
                i += 1;
            }
            (i > from).then_some(i)
        };
        if i == from {
            return None;
        }
        i = spaces(i)?;
        let from = i;
        while b(i).is_ascii_digit() {
            i += 1;
        }
        if i == from {
            return None;
        }
        i = spaces(i)?;
        // `file.cc:123]`: the first `]` ends the prefix, after `:` and digits and at least one byte.
        // (A backslash first: the cleaner may split the line at a literal `\n`.)
        // (A newline first: no prefix on this line.)
        let close = i + memchr::memchr3(b']', b'\\', b'\n', &line[i..])?;
        if line[close] != b']' {
            return None;
        }
        let mut d = close;
        while d > i && line[d - 1].is_ascii_digit() {
            d -= 1;
        }
        if d == close || d < i + 2 || line[d - 1] != b':' {
            return None;
        }
        let mut end = close + 1;
        while b(end) == b' ' || b(end) == b'\t' {
            end += 1;
        }
        Some(end)
    }

    #[test]
    fn glog_prefix_eight_at_a_time_reads_as_byte_by_byte() {
        let bases = [
            "W1122 01:10:03.411821    4436 hlo_rematerialization.cc:3231] Can't",
            "E0000 00:00:1756998431.440298  5182 a.cc:1]x",
            "  I1121 1 2 b:12]",
            "F1121 1:1 \t 22 \t c/d.py:7]  \t z",
        ];
        // Every prefix of each, and each with one byte changed to every interesting byte.
        let mut cases = Vec::new();
        for base in bases {
            let b = base.as_bytes();
            for cut in 0..=b.len() {
                cases.push(b[..cut].to_vec());
            }
            for at in 0..b.len() {
                for c in [
                    b' ', b'\t', b'0', b'9', b':', b'.', b']', b'\\', b'\n', b'a', b'/', 0xb0,
                ] {
                    let mut v = b.to_vec();
                    v[at] = c;
                    cases.push(v);
                }
            }
        }
        for c in cases {
            assert_eq!(
                glog_end(&c),
                glog_end_reference(&c),
                "{:?}",
                String::from_utf8_lossy(&c)
            );
        }
    }

    #[test]
    fn glog_prefixes() {
        let line = b"W1122 01:10:03.411821    4436 hlo_rematerialization.cc:3231] Can't";
        assert_eq!(glog_end(line), Some(line.len() - 5));
        assert_eq!(
            glog_end(b" E0000 00:00:1756998431.440298  5182 a.cc:1]x"),
            Some(44)
        );
        assert_eq!(glog_end(b"W1122 01:10:03.411821 4436 a.cc] x"), None);
        assert_eq!(glog_end(b"W1122 01:10:03.411821 4436 :1] x"), None);
        assert_eq!(glog_end(b"12 a.cc:1] x"), None);
        for t in [
            "01:10:03.411821 x",
            "00:00:1756998431.440298  5",
            "1.2:3/",
            "1./234567",
            "::..::..::..9;",
            "",
            "7",
        ] {
            let want = t
                .bytes()
                .take_while(|b| b.is_ascii_digit() || *b == b':' || *b == b'.')
                .count();
            assert_eq!(time_run(t.as_bytes(), 0), want, "{t}");
        }
    }
}

#[cfg(test)]
mod bench {
    /// `cargo test --release -p hbm_doctor_log --lib fast::bench -- --ignored --nocapture`
    /// (needs `bench/gen_warn_log.py /tmp/warn-64MiB.log 64`).
    #[test]
    #[ignore]
    fn per_line_cost() {
        let text = std::fs::read("/tmp/warn-64MiB.log").expect("bench/gen_warn_log.py output");
        let mut lines = Vec::new();
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', &text) {
            if let Some((hit, p)) = crate::scan::anchors().find(&text[start..end]) {
                lines.push((
                    start,
                    start + hit,
                    super::Shape::of(crate::scan::ANCHORS[p]),
                ));
            }
            start = end + 1;
        }
        let mut shapes = super::Shapes::default();
        let t = std::time::Instant::now();
        let mut n = 0;
        // Groups of lines that stay in cache, each line different from the one before (as in
        // a log: a predictor that learns one line would flatter byte loops).
        for group in lines.chunks(1000) {
            for _ in 0..50 {
                for &(s, h, shape) in group {
                    n += usize::from(
                        shapes
                            .recognise(std::hint::black_box(&text), s, h, shape, false)
                            .is_some(),
                    );
                }
            }
        }
        let t2 = std::time::Instant::now();
        let mut n2 = 0;
        for group in lines.chunks(1000) {
            for _ in 0..50 {
                for &(s, h, shape) in group {
                    n2 += usize::from(
                        super::recognise(std::hint::black_box(&text), s, h, shape, false).is_some(),
                    );
                }
            }
        }
        eprintln!(
            "grammar alone: {:.1} ns per line ({n2})",
            t2.elapsed().as_nanos() as f64 / (lines.len() * 50) as f64
        );
        eprintln!(
            "{} lines x50, {} taken: {:.1} ns per line",
            lines.len(),
            n / 50,
            t.elapsed().as_nanos() as f64 / (lines.len() * 50) as f64
        );
    }
}
