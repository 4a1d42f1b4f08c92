//! Reading logs: files or standard input, plain or gzip, streamed in fixed-size chunks so memory
//! stays flat on multi-GB logs. Bad input becomes a one-line error that says what to do.

use anyhow::{bail, Context, Result};
use hbm_doctor_log::{Event, Scanner, WarningSummary};
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
    let (mut events, warnings) = scanner.finish_with_warnings();
    if bytes as usize <= hbm_doctor_log::parse::TOLD_MAX_BYTES {
        hbm_doctor_log::scan::with_told_failure(&mut events, &small);
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
