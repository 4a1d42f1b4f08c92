//! Reading an XLA dump: the after-optimizations modules of a `--xla_dump_to` directory (or the
//! module of one of its files), their text files read (HLO text streamed without fusion bodies),
//! then parsed, checked and analyzed by [`hbm_doctor_analysis::dump`]. Shared by `analyze`,
//! `view` and `explain --dump`.

use anyhow::{bail, Context, Result};
use hbm_doctor_analysis::analyze::{AnalyzeOptions, AnalyzeReport};
use hbm_doctor_analysis::dump::{analyze_texts, DumpText, ModuleTexts};
use hbm_doctor_hlo::hlo::{strip_attribute, FusionBodyFilter};
use std::path::{Path, PathBuf};

/// The text files of one module in a dump.
#[derive(Debug, Default, Clone)]
pub struct ModuleFiles {
    /// File-name key (`module_0000.jit_f.after_optimizations`).
    pub key: String,
    /// `<stage>.txt`.
    pub hlo: Option<PathBuf>,
    /// `-buffer-assignment.txt`.
    pub buffer_assignment: Option<PathBuf>,
    /// `-live-range.txt`.
    pub live_range: Option<PathBuf>,
    /// `-memory-usage-report.txt`.
    pub usage_report: Option<PathBuf>,
}

const SUFFIXES: [&str; 5] = [
    "-buffer-assignment.txt",
    "-buffer-assignment-values.txt",
    "-live-range.txt",
    "-memory-usage-report.txt",
    ".txt",
];

fn split_name(file: &str) -> Option<(&str, &'static str)> {
    SUFFIXES
        .iter()
        .find_map(|s| file.strip_suffix(s).map(|k| (k, *s)))
}

/// Finds the after-optimizations modules of a dump directory (or the module of one file).
pub fn discover(path: &Path) -> Result<Vec<ModuleFiles>> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read `{}`: check the path", path.display()))?;
    let (dir, only): (PathBuf, Option<String>) = if meta.is_dir() {
        (path.to_path_buf(), None)
    } else {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some((key, _)) = split_name(&name) else {
            bail!("`{}` is not an XLA dump text file: pass the --xla_dump_to directory or one of its *.txt files", path.display());
        };
        (
            path.parent().map(Path::to_path_buf).unwrap_or_default(),
            Some(key.to_string()),
        )
    };
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    let mut modules: Vec<ModuleFiles> = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list `{}`", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some((key, suffix)) = split_name(&name) else {
            continue;
        };
        // A FIFO or a device named like a dump file would block the read: only regular files.
        if !std::fs::metadata(&p).is_ok_and(|m| m.is_file()) {
            continue;
        }
        if only.as_deref().is_some_and(|o| o != key) {
            continue;
        }
        // Only the final module has a buffer assignment; earlier stages are not memory plans.
        if suffix == ".txt" && !key.ends_with("after_optimizations") && only.is_none() {
            continue;
        }
        let idx = match modules.iter().position(|m| m.key == key) {
            Some(i) => i,
            None => {
                modules.push(ModuleFiles {
                    key: key.to_string(),
                    ..Default::default()
                });
                modules.len() - 1
            }
        };
        let m = &mut modules[idx];
        match suffix {
            "-buffer-assignment.txt" => m.buffer_assignment = Some(p),
            "-live-range.txt" => m.live_range = Some(p),
            "-memory-usage-report.txt" => m.usage_report = Some(p),
            ".txt" => m.hlo = Some(p),
            _ => {}
        }
    }
    modules.retain(|m| m.hlo.is_some() || m.buffer_assignment.is_some());
    Ok(modules)
}

fn read(p: &Option<PathBuf>) -> Result<Option<String>> {
    match p {
        Some(p) => {
            let bytes =
                std::fs::read(p).with_context(|| format!("cannot read `{}`", p.display()))?;
            // Valid UTF-8 (always, from XLA) is taken as is: no second copy of a large file.
            Ok(Some(String::from_utf8(bytes).unwrap_or_else(|e| {
                String::from_utf8_lossy(e.as_bytes()).into_owned()
            })))
        }
        None => Ok(None),
    }
}

/// Reads HLO module text without the bodies of fusion computations (two streaming passes with
/// [`FusionBodyFilter`]) and without `backend_config` attributes: the analysis never looks at
/// them, and on large modules they are most of the text, so peak memory stays near the size of
/// the files. Text that is not UTF-8 is read whole (lossily) instead. Also returns how many
/// fusion bodies were left out.
fn read_hlo(p: &Option<PathBuf>) -> Result<(Option<String>, usize)> {
    use std::io::{BufRead, BufReader, Seek};
    let Some(path) = p else { return Ok((None, 0)) };
    let open =
        || std::fs::File::open(path).with_context(|| format!("cannot read `{}`", path.display()));
    let mut filter = FusionBodyFilter::default();
    let mut line = String::new();
    let mut reader = BufReader::with_capacity(1 << 20, open()?);
    let streamed = (|| -> std::io::Result<String> {
        while reader.read_line(&mut line)? > 0 {
            filter.scan(&line);
            line.clear();
        }
        reader.rewind()?;
        let mut kept = String::with_capacity(filter.kept_bytes() as usize);
        while reader.read_line(&mut line)? > 0 {
            if filter.keep(&line) {
                kept.push_str(&strip_attribute(&line, "backend_config"));
            }
            line.clear();
        }
        kept.shrink_to_fit();
        Ok(kept)
    })();
    match streamed {
        Ok(kept) => Ok((Some(kept), filter.dropped_computations())),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Ok((read(p)?, 0)),
        Err(e) => Err(e).with_context(|| format!("cannot read `{}`", path.display())),
    }
}

fn text(p: &Option<PathBuf>, read: Option<String>) -> Option<DumpText> {
    Some(DumpText::new(p.as_deref()?.display().to_string(), read?))
}

/// Reads, parses and analyzes the modules; the budget check is left to the caller.
pub fn analyze_files(files: &[ModuleFiles], opts: &AnalyzeOptions) -> Result<AnalyzeReport> {
    let mut texts = Vec::new();
    for f in files {
        let (hlo, fusion_bodies) = read_hlo(&f.hlo)?;
        texts.push(ModuleTexts {
            key: f.key.clone(),
            hlo: text(&f.hlo, hlo),
            fusion_bodies,
            buffer_assignment: text(&f.buffer_assignment, read(&f.buffer_assignment)?),
            live_range: text(&f.live_range, read(&f.live_range)?),
            usage_report: text(&f.usage_report, read(&f.usage_report)?),
        });
    }
    Ok(analyze_texts(&texts, opts)?)
}
