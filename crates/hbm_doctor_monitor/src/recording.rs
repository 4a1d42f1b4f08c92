//! The recording format: JSON lines, one complete line per write, rotated by size.
//!
//! Every line is a [`Record`] with a `type` field (`header`, `sample`, `process`, `counters`,
//! `event`). The writer assembles all lines of one sampling round in memory and hands them to the
//! kernel with one `write` on a file opened with `O_APPEND`, so a `kill -9` of the recorder (or
//! of the trainer) can at worst leave the last line torn. The reader skips a torn last line (a
//! line without its newline) and any line that is not valid JSON, and never fails because of
//! one. The format is documented in docs/recording.md.

use crate::host::{now, rfc3339};
use crate::sample::{DeviceSample, Event};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// The line types are modelled once, in `hbm_doctor_trend::recording` (trend reads recordings
// through them too); re-exported so that `hbm_doctor_monitor::recording::*` keeps working.
pub use hbm_doctor_trend::recording::{Record, FORMAT, SCHEMA_VERSION};

/// Rotation and durability settings.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Start a new file when the current one would grow past this many bytes (0: never).
    pub max_bytes: u64,
    /// How many rotated files (`FILE.1` newest … `FILE.N`) to keep.
    pub keep: usize,
    /// `fdatasync` at most this often (samples survive a killed process without it; this is
    /// for power loss).
    pub sync_every: Duration,
    /// What the header lines say.
    pub host: String,
    /// Sampling interval for the header.
    pub interval_seconds: Option<f64>,
    /// Watched pid for the header.
    pub pid: Option<u32>,
    /// Sources for the header.
    pub sources: Vec<String>,
    /// While writes fail (a full disk), rounds are held in memory up to this many bytes and
    /// written when space returns; older rounds beyond it are lost, and counted.
    pub hold_bytes: usize,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            max_bytes: 256 << 20,
            keep: 20,
            sync_every: Duration::from_secs(1),
            host: crate::host::hostname(),
            interval_seconds: None,
            pid: None,
            sources: Vec::new(),
            hold_bytes: 16 << 20,
        }
    }
}

/// Appends records to a recording, rotating by size.
#[derive(Debug)]
pub struct RecordingWriter {
    path: PathBuf,
    file: File,
    size: u64,
    opts: WriterOptions,
    last_sync: Instant,
    buf: Vec<u8>,
    /// Lines written since the writer was created.
    pub lines_written: u64,
    /// Rounds not yet written (writes are failing), oldest first, with their line counts.
    held: std::collections::VecDeque<(Vec<u8>, u64)>,
    held_bytes: usize,
    /// Lines dropped because the hold was full, not yet reported in the file.
    lost: u64,
    /// Lines dropped since the writer was created.
    pub lost_total: u64,
    /// The write error while writes fail; `None` when writing.
    pub failing: Option<String>,
    /// The file ends in part of a line (a write cut short by the error).
    torn: bool,
}

fn open_append(path: &Path) -> io::Result<(File, u64)> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(path)?;
    let mut size = file.metadata()?.len();
    if size > 0 {
        // A torn last line from a killed writer: end it, so the next line starts clean.
        let mut last = [0u8; 1];
        file.seek(SeekFrom::End(-1))?;
        file.read_exact(&mut last)?;
        if last[0] != b'\n' {
            file.write_all(b"\n")?;
            size += 1;
        }
    }
    Ok((file, size))
}

impl RecordingWriter {
    /// Opens (appending to) `path` and writes a header line.
    pub fn create(path: impl Into<PathBuf>, opts: WriterOptions) -> io::Result<Self> {
        let path = path.into();
        let (file, size) = open_append(&path)?;
        let mut w = RecordingWriter {
            path,
            file,
            size,
            opts,
            last_sync: Instant::now(),
            buf: Vec::new(),
            lines_written: 0,
            held: Default::default(),
            held_bytes: 0,
            lost: 0,
            lost_total: 0,
            failing: None,
            torn: false,
        };
        let header = w.header();
        w.write(&[header])?;
        if let Some(e) = w.failing.take() {
            return Err(io::Error::other(e));
        }
        Ok(w)
    }

    /// The file written now.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn header(&self) -> Record {
        let ts = now();
        Record::Header {
            format: FORMAT.to_string(),
            schema_version: SCHEMA_VERSION,
            host: self.opts.host.clone(),
            ts,
            time: rfc3339(ts),
            version: env!("CARGO_PKG_VERSION").to_string(),
            interval_seconds: self.opts.interval_seconds,
            pid: self.opts.pid,
            sources: self.opts.sources.clone(),
        }
    }

    fn rotate(&mut self) -> io::Result<()> {
        let _ = self.file.sync_data();
        let numbered = |n: usize| PathBuf::from(format!("{}.{n}", self.path.display()));
        if self.opts.keep == 0 {
            fs::remove_file(&self.path)?;
        } else {
            let _ = fs::remove_file(numbered(self.opts.keep));
            for n in (1..self.opts.keep).rev() {
                let from = numbered(n);
                if from.exists() {
                    fs::rename(&from, numbered(n + 1))?;
                }
            }
            fs::rename(&self.path, numbered(1))?;
        }
        let (file, size) = open_append(&self.path)?;
        self.file = file;
        self.size = size;
        let header = self.header();
        self.write_lines(&[header])
    }

    fn write_lines(&mut self, records: &[Record]) -> io::Result<()> {
        self.buf.clear();
        for r in records {
            serde_json::to_writer(&mut self.buf, r)?;
            self.buf.push(b'\n');
        }
        // One write of complete lines: the kernel appends it whole or (on a crash mid-call)
        // leaves a prefix that the reader skips.
        self.file.write_all(&self.buf)?;
        self.size += self.buf.len() as u64;
        self.lines_written += records.len() as u64;
        Ok(())
    }

    /// Appends the records of one sampling round. A failing write (a full disk) does not stop
    /// the recorder: the round is held in memory (bounded by `hold_bytes`, oldest dropped and
    /// counted) and written, with everything held, as soon as a write succeeds again; then a
    /// `records_lost` event says how many lines were dropped. `failing` tells the caller.
    pub fn write(&mut self, records: &[Record]) -> io::Result<()> {
        if !records.is_empty() {
            if self.failing.is_none()
                && self.opts.max_bytes > 0
                && self.size > 0
                && self.lines_written > 0
                && self.size >= self.opts.max_bytes
            {
                self.rotate()?;
            }
            let mut chunk = Vec::new();
            for r in records {
                serde_json::to_writer(&mut chunk, r)?;
                chunk.push(b'\n');
            }
            self.held_bytes += chunk.len();
            self.held.push_back((chunk, records.len() as u64));
            while self.held_bytes > self.opts.hold_bytes.max(1) && self.held.len() > 1 {
                if let Some((c, n)) = self.held.pop_front() {
                    self.held_bytes -= c.len();
                    self.lost += n;
                    self.lost_total += n;
                }
            }
        }
        self.flush_held();
        if self.failing.is_none() && self.last_sync.elapsed() >= self.opts.sync_every {
            self.file.sync_data()?;
            self.last_sync = Instant::now();
        }
        Ok(())
    }

    /// Writes what is held, oldest first; stops at the first error.
    fn flush_held(&mut self) {
        if self.torn {
            // End the partial line a failed write left, so the next one starts clean.
            if let Err(e) = self.file.write_all(b"\n") {
                self.failing = Some(e.to_string());
                return;
            }
            self.size += 1;
            self.torn = false;
        }
        while let Some((chunk, n)) = self.held.front() {
            // One write of complete lines: the kernel appends it whole or (on a crash mid-call)
            // leaves a prefix that the reader skips.
            match self.file.write_all(chunk) {
                Ok(()) => {
                    self.size += chunk.len() as u64;
                    self.lines_written += n;
                    self.held_bytes -= chunk.len();
                    self.held.pop_front();
                }
                Err(e) => {
                    let actual = self.file.metadata().map_or(self.size, |m| m.len());
                    if actual > self.size {
                        self.torn = true;
                        self.size = actual;
                    }
                    self.failing = Some(e.to_string());
                    return;
                }
            }
        }
        if let Some(reason) = self.failing.take() {
            if self.lost > 0 {
                let ts = now();
                let line = Record::Event {
                    ts,
                    host: Some(self.opts.host.clone()),
                    event: Event::RecordsLost {
                        count: self.lost,
                        reason,
                    },
                };
                if self.write_lines(&[line]).is_ok() {
                    self.lost = 0;
                }
            }
        }
    }

    /// Lines held in memory, not yet written.
    pub fn held_lines(&self) -> u64 {
        self.held.iter().map(|(_, n)| n).sum()
    }

    /// Flushes to stable storage.
    pub fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// What reading a recording found.
#[derive(Debug, Default)]
pub struct ReadBack {
    /// Every complete, valid line, in file order.
    pub records: Vec<Record>,
    /// True when a file ended with a line without its newline (a write cut short by a kill).
    pub torn_tail: bool,
    /// Complete lines that were not valid records (skipped).
    pub bad_lines: usize,
}

impl ReadBack {
    /// The device samples only.
    pub fn samples(&self) -> impl Iterator<Item = &DeviceSample> {
        self.records.iter().filter_map(|r| match r {
            Record::Sample { device, .. } => Some(device),
            _ => None,
        })
    }
}

/// Reads one file of a recording, skipping a torn last line and invalid lines.
pub fn read_file(path: &Path, into: &mut ReadBack) -> io::Result<()> {
    let mut r = BufReader::new(File::open(path)?);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = r.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            into.torn_tail = true;
            break;
        }
        let text = &line[..line.len() - 1];
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Record>(text) {
            Ok(rec) => into.records.push(rec),
            Err(_) => into.bad_lines += 1,
        }
    }
    Ok(())
}

/// The files of a recording, oldest first: `FILE.N` … `FILE.1`, then `FILE`.
pub fn files(path: &Path) -> Vec<PathBuf> {
    let mut rotated: Vec<(usize, PathBuf)> = Vec::new();
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                let f = e.file_name();
                let Some(f) = f.to_str() else { continue };
                if let Some(n) = f
                    .strip_prefix(name)
                    .and_then(|r| r.strip_prefix('.'))
                    .and_then(|n| n.parse::<usize>().ok())
                {
                    rotated.push((n, e.path()));
                }
            }
        }
    }
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut out: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    if path.exists() {
        out.push(path.to_path_buf());
    }
    out
}

/// Reads a whole recording (rotated files included), oldest first.
pub fn read(path: &Path) -> io::Result<ReadBack> {
    let mut back = ReadBack::default();
    let files = files(path);
    if files.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: no such recording", path.display()),
        ));
    }
    for f in files {
        read_file(&f, &mut back)?;
    }
    Ok(back)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::SourceKind;

    fn sample(i: u64) -> Record {
        let mut d = DeviceSample::new("0", "tpu", SourceKind::Libtpu);
        d.used_bytes = Some(i);
        d.ts = Some(i as f64);
        Record::Sample {
            host: Some("h".into()),
            device: d,
        }
    }

    #[test]
    fn round_trips_and_skips_torn_tail() {
        let dir = std::env::temp_dir().join(format!("hbm-rec-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.jsonl");
        let mut w = RecordingWriter::create(
            &p,
            WriterOptions {
                host: "h".into(),
                ..WriterOptions::default()
            },
        )
        .unwrap();
        for i in 0..5 {
            w.write(&[sample(i)]).unwrap();
        }
        w.write(&[Record::Event {
            ts: 1.0,
            host: None,
            event: Event::SourceUp { source: "x".into() },
        }])
        .unwrap();
        drop(w);
        // A kill mid-write leaves a prefix of a line.
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(br#"{"type":"sample","host":"h","id":"0","acc"#)
            .unwrap();
        drop(f);
        let back = read(&p).unwrap();
        assert!(back.torn_tail);
        assert_eq!(back.samples().count(), 5);
        assert_eq!(back.records.len(), 7);
        // Appending again ends the torn line first: it becomes one bad line, nothing else is lost.
        let mut w = RecordingWriter::create(&p, WriterOptions::default()).unwrap();
        w.write(&[sample(9)]).unwrap();
        drop(w);
        let back = read(&p).unwrap();
        assert!(!back.torn_tail);
        assert_eq!(back.bad_lines, 1);
        assert_eq!(back.samples().count(), 6);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rotates_by_size_and_reads_in_order() {
        let dir = std::env::temp_dir().join(format!("hbm-rot-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.jsonl");
        let opts = WriterOptions {
            max_bytes: 2000,
            keep: 3,
            host: "h".into(),
            ..WriterOptions::default()
        };
        let mut w = RecordingWriter::create(&p, opts).unwrap();
        for i in 0..100 {
            w.write(&[sample(i)]).unwrap();
        }
        drop(w);
        let files = files(&p);
        assert_eq!(files.len(), 4, "{files:?}");
        let back = read(&p).unwrap();
        let used: Vec<u64> = back.samples().filter_map(|d| d.used_bytes).collect();
        assert!(used.windows(2).all(|w| w[1] == w[0] + 1), "{used:?}");
        assert_eq!(used.last(), Some(&99));
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod full_disk {
    use super::*;

    fn round(i: u64) -> Vec<Record> {
        let mut d = DeviceSample::new("0", "tpu", crate::sample::SourceKind::Jax);
        d.used_bytes = Some(i);
        d.ts = Some(i as f64);
        vec![Record::Sample {
            host: None,
            device: d,
        }]
    }

    /// Writes to /dev/full fail with ENOSPC: rounds are held, then written when space returns;
    /// beyond the hold, the oldest are lost and the file says how many.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_full_disk_holds_rounds_and_counts_what_it_drops() {
        let Ok(full) = OpenOptions::new().append(true).open("/dev/full") else {
            eprintln!("skipped: no /dev/full");
            return;
        };
        let dir = std::env::temp_dir().join(format!("hbm-doctor-full-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rec.jsonl");
        let mut w = RecordingWriter::create(&path, WriterOptions::default()).unwrap();
        let real = std::mem::replace(&mut w.file, full.try_clone().unwrap());
        for i in 0..10 {
            w.write(&round(i)).unwrap();
        }
        assert!(w.failing.is_some());
        assert_eq!(w.held_lines(), 10);
        w.file = real;
        w.write(&round(10)).unwrap();
        assert!(w.failing.is_none());
        let back = read(&path).unwrap();
        assert_eq!(back.samples().count(), 11, "nothing lost within the hold");

        // A hold of one round: the others are dropped and counted.
        let real = std::mem::replace(&mut w.file, full);
        w.opts.hold_bytes = 1;
        for i in 11..20 {
            w.write(&round(i)).unwrap();
        }
        assert_eq!(w.held_lines(), 1);
        w.file = real;
        w.write(&[]).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back.samples().count(), 12);
        let lost: Vec<u64> = back
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Event {
                    event: Event::RecordsLost { count, .. },
                    ..
                } => Some(*count),
                _ => None,
            })
            .collect();
        assert_eq!(lost, vec![8]);
        assert_eq!(back.bad_lines, 0);
        fs::remove_dir_all(&dir).unwrap();
    }
}
