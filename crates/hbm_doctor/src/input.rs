//! Reading logs: files or standard input, plain or gzip, streamed in fixed-size chunks so memory
//! stays flat on multi-GB logs. Bad input becomes a one-line error that says what to do.

use anyhow::{bail, Context, Result};
use hbm_doctor_log::{Event, Hit, HitFinder, Scanner, WarningSummary};
use std::fs::File;
use std::io::{IsTerminal, Read};
use std::path::Path;

/// Bytes read per chunk.
pub const CHUNK: usize = 8 * 1024 * 1024;

/// What a scan of one input found.
#[derive(Debug)]
pub struct Scanned {
    /// The events, merged.
    pub events: Vec<Event>,
    /// Non-fatal warnings, counted per kind.
    pub warnings: Vec<WarningSummary>,
    /// Bytes read (after decompression).
    pub bytes: u64,
    /// Whether the start of the input looked like binary data.
    pub looks_binary: bool,
    /// The name to show for the input.
    pub name: String,
}

/// Opens `path` (`None` or `-` = stdin) as a reader, refusing what cannot be a log.
pub fn open(path: Option<&Path>) -> Result<(Box<dyn Read + Send>, String)> {
    let stdin = path.is_none_or(|p| p.as_os_str() == "-");
    if stdin {
        if std::io::stdin().is_terminal() {
            bail!("no input: pass a log file (hbm-doctor explain train.log) or pipe one in (... 2>&1 | hbm-doctor explain -)");
        }
        return Ok((Box::new(std::io::stdin()), "<stdin>".into()));
    }
    let path = path.expect("checked above");
    let name = path.display().to_string();
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read `{name}`: check the path"))?;
    if meta.is_dir() {
        bail!("`{name}` is a directory: pass a log file (for an XLA dump directory use `hbm-doctor analyze {name}` or `explain LOG --dump {name}`)");
    }
    let mut file =
        File::open(path).with_context(|| format!("cannot open `{name}`: check its permissions"))?;
    let mut magic = [0u8; 2];
    let n = file
        .read(&mut magic)
        .with_context(|| format!("cannot read `{name}`"))?;
    drop(file);
    let file = File::open(path).with_context(|| format!("cannot open `{name}`"))?;
    if n == 2 && magic == [0x1f, 0x8b] {
        return Ok((
            Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(
                file,
            ))),
            name,
        ));
    }
    Ok((Box::new(file), name))
}

/// Files at least this large are scanned through a read-only memory map, not copied in
/// chunks: the kernel's copy of the file was a third of the CPU time on a 1 GiB log.
const MAP_MIN_BYTES: u64 = 64 * 1024 * 1024;

/// Pages of the map already scanned are given back to the kernel every this many bytes, so the
/// resident memory stays flat whatever the size of the file.
const MAP_RELEASE_BYTES: usize = 8 * 1024 * 1024;

/// Scans the log at `path` (`None` or `-` = stdin): a large plain file through a memory map
/// (`scan_mapped`), anything else (stdin, gzip, small files) streamed in chunks ([`scan`]).
/// `HBM_DOCTOR_NO_MMAP=1` always streams (for a log that may be truncated while it is read).
pub fn scan_path(path: Option<&Path>) -> Result<Scanned> {
    if let Some(p) = path.filter(|p| p.as_os_str() != "-") {
        let mappable = std::env::var_os("HBM_DOCTOR_NO_MMAP")
            .is_none_or(|v| v.is_empty() || v == "0")
            && std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() >= MAP_MIN_BYTES);
        if mappable {
            if let Some(scanned) = scan_mapped(p)? {
                return Ok(scanned);
            }
        }
    }
    let (reader, name) = open(path)?;
    scan(reader, name)
}

/// Scans a large plain file through a read-only memory map: no copy, the scanner reads the
/// page cache in place, in windows of `CHUNK` bytes, and the pages it has passed are released
/// as it goes. The anchor search, the hot loop, is shared by the two cores: a second thread
/// finds the anchors of every other window ahead of the scanner ([`HitFinder`]), the scanner
/// those of the others. `None` when the file is compressed or cannot be mapped (the caller
/// streams it).
fn scan_mapped(path: &Path) -> Result<Option<Scanned>> {
    let name = path.display().to_string();
    let file =
        File::open(path).with_context(|| format!("cannot open `{name}`: check its permissions"))?;
    let map = match map_file(&file) {
        Some(m) => m,
        None => return Ok(None),
    };
    if map.starts_with(&[0x1f, 0x8b]) {
        return Ok(None);
    }
    let _ = map.advise(memmap2::Advice::Sequential);
    let len = map.len();
    let text: &[u8] = &map;
    let looks_binary = is_binary(&text[..len.min(64 * 1024)]);
    let mut scanner = Scanner::new();
    // The anchor search (the hot loop) is shared: the second thread searches every other window
    // ahead of the scanner and hands over its hits; the scanner searches the others itself.
    // Each message: the hits, the range they cover, and whether it was searched.
    type Found = (Vec<Hit>, u64, u64, bool);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Found>(1);
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut finder = HitFinder::new();
            let (mut from, mut end) = (0usize, 0usize);
            for window in 0u64.. {
                if end >= len {
                    return;
                }
                end = (end + CHUNK).min(len);
                let mut hits = Vec::new();
                let searched = window % 2 == 0 || end == len;
                let to = if searched {
                    finder.feed(&text[..end], end == len, &mut hits)
                } else {
                    finder.skip_to(end);
                    end
                };
                if tx.send((hits, from as u64, to as u64, searched)).is_err() {
                    return;
                }
                from = to;
            }
        });
        let (mut at, mut end, mut released, mut known) = (0usize, 0usize, 0usize, 0u64);
        loop {
            end = (end + CHUNK).min(len);
            let eof = end == len;
            // The hits the scanner will ask for in this window: up to its look-ahead, or all.
            let need = if eof {
                len
            } else {
                end.saturating_sub(hbm_doctor_log::scan::LOOKAHEAD_BYTES)
            };
            while known < need as u64 {
                let Ok((hits, a, b, searched)) = rx.recv() else {
                    break;
                };
                if searched {
                    scanner.push_hits(&hits, (a, b));
                }
                known = b;
            }
            at += scanner.scan(&text[at..end], eof);
            if eof {
                break;
            }
            let page_floor = at & !(64 * 1024 - 1);
            if page_floor >= released + MAP_RELEASE_BYTES {
                release(&map, released, page_floor - released);
                released = page_floor;
            }
        }
    });
    let (events, warnings) = scanner.finish_with_warnings();
    Ok(Some(Scanned {
        events,
        warnings,
        bytes: len as u64,
        looks_binary,
        name,
    }))
}

/// Maps `file` read-only.
#[allow(unsafe_code)]
fn map_file(file: &File) -> Option<memmap2::Mmap> {
    // SAFETY: the map is read-only and private to this process, and the scanner treats its bytes
    // as untrusted data (any content is valid input). What a map cannot guard against is another
    // process truncating the file while it is scanned (SIGBUS); `HBM_DOCTOR_NO_MMAP=1` streams
    // such a log instead, as ripgrep's `--no-mmap` does.
    unsafe { memmap2::Mmap::map(file) }.ok()
}

/// Gives the pages of `map[offset..offset + len]` back to the kernel (they are read again from
/// the page cache if touched).
#[allow(unsafe_code)]
fn release(map: &memmap2::Mmap, offset: usize, len: usize) {
    // SAFETY: the map is a read-only, file-backed shared mapping: MADV_DONTNEED drops this
    // process's page-table entries and a later access faults the file's pages in again, with
    // the same contents (the scanner has consumed the range; the anchor search is ahead of it).
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
}

/// Room kept free at the front of every chunk for the bytes the scanner has not consumed yet
/// (at least its look-ahead), so that they are put before the next chunk without copying it.
const FRONT: usize = 2 * hbm_doctor_log::scan::LOOKAHEAD_BYTES + 64 * 1024;

/// One chunk from the reader thread: `FRONT` spare bytes, then up to `CHUNK` bytes of input;
/// `true` when the input ended.
type Chunk = std::io::Result<(Vec<u8>, bool)>;

/// Streams `reader` through the OOM scanner. A second thread reads (and decompresses) the next
/// chunk while this one scans the current one: the kernel's copy of the file, or gunzip, runs on
/// the other core. Memory stays flat: at most three chunks exist at a time.
pub fn scan(reader: Box<dyn Read + Send>, name: String) -> Result<Scanned> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Chunk>(1);
    let (back_tx, back_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
    std::thread::scope(|s| {
        s.spawn(move || read_chunks(reader, &tx, &back_rx));
        scan_chunks(&rx, &back_tx, name)
    })
}

/// The reader thread: fills chunks (recycled ones first) until the input ends or fails, or the
/// scanner stops listening.
fn read_chunks(
    mut reader: Box<dyn Read + Send>,
    tx: &std::sync::mpsc::SyncSender<Chunk>,
    back: &std::sync::mpsc::Receiver<Vec<u8>>,
) {
    loop {
        let mut chunk = back
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(FRONT + CHUNK));
        chunk.clear();
        chunk.resize(FRONT, 0);
        // `take` + `read_to_end` loops over short reads (pipes) until the chunk is full or the
        // input ends, without zero-filling the chunk first.
        let read = reader.by_ref().take(CHUNK as u64).read_to_end(&mut chunk);
        let msg = read.map(|n| {
            let eof = n < CHUNK;
            (chunk, eof)
        });
        let end = !matches!(msg, Ok((_, false)));
        if tx.send(msg).is_err() || end {
            return;
        }
    }
}

fn scan_chunks(
    rx: &std::sync::mpsc::Receiver<Chunk>,
    back: &std::sync::mpsc::SyncSender<Vec<u8>>,
    name: String,
) -> Result<Scanned> {
    let mut scanner = Scanner::new();
    // What the scanner has not consumed yet, put before the next chunk.
    let mut carry: Vec<u8> = Vec::new();
    let mut bytes: u64 = 0;
    let mut looks_binary = None;
    let mut small: Vec<u8> = Vec::new();
    loop {
        // The reader always sends the input's end or its error before it stops: a closed channel
        // before that means it died, and what it had not read must not pass for the end.
        let (mut chunk, eof) = rx
            .recv()
            .map_err(|_| anyhow::anyhow!("cannot read `{name}`: the reading thread stopped"))?
            .with_context(|| {
                format!("cannot read `{name}` (for a compressed log, check it is complete)")
            })?;
        bytes += (chunk.len() - FRONT) as u64;
        // A small text (a post) is kept whole: it may tell its failure in words.
        if bytes as usize <= hbm_doctor_log::parse::TOLD_MAX_BYTES {
            small.extend_from_slice(&chunk[FRONT..]);
        }
        if looks_binary.is_none() && chunk.len() > FRONT {
            let head = &chunk[FRONT..chunk.len().min(FRONT + 64 * 1024)];
            looks_binary = Some(is_binary(head));
        }
        if carry.len() <= FRONT {
            let start = FRONT - carry.len();
            chunk[start..FRONT].copy_from_slice(&carry);
            let view = &chunk[start..];
            let consumed = scanner.scan(view, eof);
            carry.clear();
            carry.extend_from_slice(&view[consumed.min(view.len())..]);
        } else {
            // A block longer than the spare room (rare): join the two the plain way.
            carry.extend_from_slice(&chunk[FRONT..]);
            let consumed = scanner.scan(&carry, eof);
            carry.drain(..consumed.min(carry.len()));
        }
        // Give the chunk back for reuse; if the reader has finished it is simply dropped.
        let _ = back.try_send(chunk);
        if eof {
            break;
        }
    }
    let (mut events, mut warnings) = scanner.finish_with_warnings();
    if bytes as usize <= hbm_doctor_log::parse::TOLD_MAX_BYTES {
        // A post a terminal hard-wrapped is read joined again.
        if let Some((e, w)) = hbm_doctor_log::scan::scan_unwrapped(&small) {
            (events, warnings) = (e, w);
        } else {
            hbm_doctor_log::scan::with_told_failure(&mut events, &small);
        }
    }
    Ok(Scanned {
        events,
        warnings,
        bytes,
        looks_binary: looks_binary.unwrap_or(false),
        name,
    })
}

/// Text logs have few control bytes; binaries (protobufs, core dumps, images) have many.
fn is_binary(head: &[u8]) -> bool {
    if head.is_empty() {
        return false;
    }
    let nul = memchr_count(head, 0);
    let control = head
        .iter()
        .filter(|&&b| b < 0x09 || (0x0e..0x1b).contains(&b) || (0x1c..0x20).contains(&b))
        .count();
    nul * 100 > head.len() || control * 10 > head.len()
}

fn memchr_count(h: &[u8], b: u8) -> usize {
    h.iter().filter(|&&x| x == b).count()
}
