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
pub fn open(path: Option<&Path>) -> Result<(Box<dyn Read>, String)> {
    let stdin = path.is_none_or(|p| p.as_os_str() == "-");
    if stdin {
        if std::io::stdin().is_terminal() {
            bail!("no input: pass a log file (hbm-doctor explain train.log) or pipe one in (... 2>&1 | hbm-doctor explain -)");
        }
        return Ok((Box::new(std::io::stdin().lock()), "<stdin>".into()));
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

/// Streams `reader` through the OOM scanner.
pub fn scan(mut reader: Box<dyn Read>, name: String) -> Result<Scanned> {
    let mut scanner = Scanner::new();
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + hbm_doctor_log::scan::LOOKAHEAD_BYTES * 2);
    let mut bytes: u64 = 0;
    let mut looks_binary = None;
    loop {
        let start = buf.len();
        // Append up to one chunk without zero-filling it first; `take` + `read_to_end` loops over
        // short reads (pipes) until the chunk is full or the input ends.
        let read = reader
            .by_ref()
            .take(CHUNK as u64)
            .read_to_end(&mut buf)
            .with_context(|| {
                format!("cannot read `{name}` (for a compressed log, check it is complete)")
            })?;
        let eof = read < CHUNK;
        bytes += (buf.len() - start) as u64;
        if looks_binary.is_none() && !buf.is_empty() {
            looks_binary = Some(is_binary(&buf[..buf.len().min(64 * 1024)]));
        }
        let consumed = scanner.scan(&buf, eof);
        buf.drain(..consumed);
        if eof {
            break;
        }
    }
    let (events, warnings) = scanner.finish_with_warnings();
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
