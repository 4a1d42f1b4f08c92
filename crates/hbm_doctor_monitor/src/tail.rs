//! Following files that another process appends to: complete lines only, across truncation and
//! rotation, starting near the end of a large file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// How much of an existing file is read on the first poll (the rest is history).
const INITIAL_WINDOW: u64 = 1 << 20;

/// Reads the lines appended to a file since the last call. A last line without its newline
/// (a torn write, or a write in progress) is left for the next call.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    offset: u64,
    started: bool,
    pending: Vec<u8>,
    from_start: bool,
    inode: u64,
}

impl Tail {
    /// Follows `path`; the first poll reads at most the last MiB of an existing file.
    pub fn new(path: impl Into<PathBuf>) -> Tail {
        Tail {
            path: path.into(),
            offset: 0,
            started: false,
            pending: Vec::new(),
            from_start: false,
            inode: 0,
        }
    }

    /// Follows `path` from its first byte.
    pub fn from_start(path: impl Into<PathBuf>) -> Tail {
        Tail {
            from_start: true,
            ..Tail::new(path)
        }
    }

    /// The file followed.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// New complete lines (without their newline). `Ok(None)` when the file does not exist.
    pub fn poll(&mut self) -> std::io::Result<Option<Vec<String>>> {
        let mut f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = f.metadata()?;
        let len = meta.len();
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        let mut skip_partial = false;
        if self.started && inode != self.inode {
            // A new file under the same name (rotation): read it from its start.
            self.offset = 0;
            self.pending.clear();
        }
        self.inode = inode;
        if !self.started {
            self.started = true;
            if !self.from_start && len > INITIAL_WINDOW {
                self.offset = len - INITIAL_WINDOW;
                skip_partial = true;
            }
        } else if len < self.offset {
            // Truncated or replaced (rotation): start over.
            self.offset = 0;
            self.pending.clear();
        }
        if len == self.offset {
            return Ok(Some(Vec::new()));
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::with_capacity((len - self.offset).min(64 << 20) as usize);
        (&mut f).take(64 << 20).read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        let mut data = std::mem::take(&mut self.pending);
        data.extend_from_slice(&buf);
        let mut lines = Vec::new();
        let mut start = 0;
        if skip_partial {
            // The window began mid-line: drop up to the first newline.
            start = data
                .iter()
                .position(|&b| b == b'\n')
                .map_or(data.len(), |i| i + 1);
        }
        while let Some(i) = data[start..].iter().position(|&b| b == b'\n') {
            let line = &data[start..start + i];
            if !line.is_empty() {
                lines.push(
                    String::from_utf8_lossy(line)
                        .trim_end_matches('\r')
                        .to_string(),
                );
            }
            start += i + 1;
        }
        self.pending = data[start..].to_vec();
        Ok(Some(lines))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn keeps_torn_line_for_later() {
        let dir = std::env::temp_dir().join(format!("hbm-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.jsonl");
        let mut f = File::create(&p).unwrap();
        let mut t = Tail::new(&p);
        f.write_all(b"one\ntw").unwrap();
        assert_eq!(t.poll().unwrap().unwrap(), vec!["one"]);
        f.write_all(b"o\nthree\n").unwrap();
        assert_eq!(t.poll().unwrap().unwrap(), vec!["two", "three"]);
        drop(f);
        std::fs::write(&p, b"new\n").unwrap();
        assert_eq!(t.poll().unwrap().unwrap(), vec!["new"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
