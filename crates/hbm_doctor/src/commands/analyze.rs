//! `hbm-doctor analyze PATH`: peak memory per module and memory space of an XLA dump, the
//! buffers live at the peak with their source lines, and the waste detectors.

use crate::cli::{AnalyzeArgs, GlobalArgs, OutputFormat};
use crate::exit;
use anyhow::{bail, Context, Result};
use hbm_doctor_analysis::analyze::{
    analyze, AnalyzeOptions, AnalyzeReport, ModuleInput, ModuleReport, SpaceReport,
};
use hbm_doctor_hlo::buffer_assignment::parse_buffer_assignment;
use hbm_doctor_hlo::hlo::{parse_module, strip_attribute, FusionBodyFilter};
use hbm_doctor_hlo::live_range::parse_live_range;
use hbm_doctor_hlo::usage_report::parse_usage_report;
use hbm_doctor_log::format_size;
use std::fmt::Write as _;
use std::io::Write;
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

/// Module name from the file key: `module_0042.jit_f.cl_1.after_optimizations` -> `jit_f`.
fn name_from_key(key: &str) -> String {
    let parts: Vec<&str> = key.split('.').collect();
    let start = parts
        .iter()
        .position(|p| p.starts_with("module_"))
        .map_or(0, |k| k + 1);
    let end = parts
        .iter()
        .rposition(|p| p.contains("after_optimizations") || p.starts_with("cl_"))
        .unwrap_or(parts.len());
    let mut end = end;
    while end > start && parts[end - 1].starts_with("cl_") {
        end -= 1;
    }
    if end > start {
        parts[start..end].join(".")
    } else {
        key.to_string()
    }
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

/// Positions in a live-range file are bounded by what the file can hold (one byte per position
/// at the very least): a header or an interval beyond that is a corrupt or foreign file, and
/// trusting it would allocate without bound.
fn check_live_range(
    lr: &hbm_doctor_hlo::live_range::LiveRange<'_>,
    bytes: usize,
    path: Option<&Path>,
) -> Result<()> {
    let name = path.map_or_else(String::new, |p| p.display().to_string());
    let bound = bytes as u64 + 1;
    if lr.max > bound {
        bail!("`{name}`: `HloLiveRange (max {})` is more positions than a file of {bytes} bytes can hold: the live-range file is corrupt; dump it again (--xla_dump_to) or remove it", lr.max);
    }
    let end = if lr.max > 0 { lr.max } else { bound };
    if let Some(r) = lr.ranges.iter().find(|r| r.end > end || r.start > r.end) {
        bail!("`{name}`: the live range `{}: {}-{}` lies outside the schedule (max {}): the live-range file is corrupt; dump it again (--xla_dump_to) or remove it", r.name, r.start, r.end, lr.max);
    }
    Ok(())
}

/// HBM (color 0) totals of the buffer assignment and of the memory-usage report, when both
/// state one.
fn hbm_totals(
    ba: &hbm_doctor_hlo::buffer_assignment::BufferAssignment<'_>,
    rep: &hbm_doctor_hlo::usage_report::UsageReport<'_>,
) -> Option<(u64, u64)> {
    let ba0 = ba.totals_by_color().into_iter().find(|(c, _)| *c == 0)?.1;
    let rep0 = rep
        .spaces
        .iter()
        .find(|s| s.color.unwrap_or(0) == 0)?
        .total_bytes;
    Some((ba0, rep0))
}

/// The files of one module must come from one compile: the buffer assignment names instructions
/// of the HLO text, and the memory-usage report cannot hold less than the buffer assignment
/// assigns. A mismatch is an error naming the files; nothing that is not a dump is read as one.
fn check_consistent(
    f: &ModuleFiles,
    hlo: Option<&hbm_doctor_hlo::hlo::HloModule<'_>>,
    ba: Option<&hbm_doctor_hlo::buffer_assignment::BufferAssignment<'_>>,
    rep: Option<&hbm_doctor_hlo::usage_report::UsageReport>,
) -> Result<()> {
    let show = |p: &Option<PathBuf>| {
        p.as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    };
    let empty_hlo = hlo.is_none_or(|m| m.computations.iter().all(|c| c.instructions.is_empty()));
    let empty_ba = ba.is_none_or(|b| b.allocations.is_empty());
    if empty_hlo && empty_ba && rep.is_none_or(|r| r.spaces.is_empty()) {
        bail!(
            "`{}` is not an XLA dump (no HLO instruction, no buffer allocation): pass the directory given to --xla_dump_to, with its *after_optimizations* files",
            show(&f.hlo).max(show(&f.buffer_assignment))
        );
    }
    if let (Some(m), Some(b)) = (hlo, ba) {
        let names: std::collections::HashSet<&str> = m
            .computations
            .iter()
            .flat_map(|c| c.instructions.iter().map(|i| i.name))
            .collect();
        let values: Vec<&str> = b
            .allocations
            .iter()
            .flat_map(|a| a.values.iter().map(|v| v.name))
            .take(2000)
            .collect();
        let missing = values.iter().filter(|v| !names.contains(*v)).count();
        // Fusion bodies are not read, so a few names may be missing; most must be there.
        if values.len() >= 10 && missing * 2 > values.len() {
            bail!(
                "`{}` and `{}` are not from the same compile: {missing} of the first {} values the buffer assignment names are not instructions of the HLO text; keep the files of one --xla_dump_to run together",
                show(&f.buffer_assignment),
                show(&f.hlo),
                values.len()
            );
        }
    }
    if let (Some(b), Some(r)) = (ba, rep) {
        if let Some((x, y)) = hbm_totals(b, r) {
            if x > y.saturating_add(y / 100) {
                bail!(
                    "`{}` assigns {} of HBM but `{}` reports {}: the files are not from the same compile; keep the files of one --xla_dump_to run together",
                    show(&f.buffer_assignment),
                    hbm_doctor_log::format_size(x),
                    show(&f.usage_report),
                    hbm_doctor_log::format_size(y)
                );
            }
        }
    }
    Ok(())
}

/// Reads, parses and analyzes the modules; the budget check is left to the caller.
pub fn analyze_files(files: &[ModuleFiles], opts: &AnalyzeOptions) -> Result<AnalyzeReport> {
    let mut texts = Vec::new();
    for f in files {
        let (hlo, fusion_bodies) = read_hlo(&f.hlo)?;
        texts.push((
            hlo,
            read(&f.buffer_assignment)?,
            read(&f.live_range)?,
            read(&f.usage_report)?,
            fusion_bodies,
        ));
    }
    let mut parsed = Vec::new();
    for (f, (hlo, ba, lr, rep, fusion_bodies)) in files.iter().zip(&texts) {
        let mut notes = Vec::new();
        let ba_len = ba.as_deref().map(str::len);
        let hlo = hlo.as_deref().map(|t| {
            let (m, d) = parse_module(t);
            if !d.is_empty() {
                notes.push(format!(
                    "HLO text: {} part(s) skipped (first: line {}{}: {})",
                    d.len(),
                    d[0].line,
                    if *fusion_bodies > 0 {
                        format!(" of the text without its {fusion_bodies} fusion bodies, which are not read")
                    } else {
                        String::new()
                    },
                    d[0].message
                ));
            }
            m
        });
        let ba = ba.as_deref().map(|t| {
            let (b, d) = parse_buffer_assignment(t);
            if !d.is_empty() {
                notes.push(format!(
                    "buffer assignment: {} line(s) skipped (first: line {}: {})",
                    d.len(),
                    d[0].line,
                    d[0].message
                ));
            }
            b
        });
        let lr = match lr.as_deref() {
            Some(t) => {
                let lr = parse_live_range(t).0;
                check_live_range(&lr, t.len(), f.live_range.as_deref())?;
                Some(lr)
            }
            None => None,
        };
        // XLA also prints the live ranges at the end of the buffer assignment.
        if let (Some(b), Some(t)) = (ba.as_ref(), ba_len) {
            if let Some(embedded) = b.live_range.as_ref() {
                check_live_range(embedded, t, f.buffer_assignment.as_deref())?;
            }
        }
        if let Err((which, e)) =
            hbm_doctor_analysis::analyze::check_sizes(hlo.as_ref(), ba.as_ref())
        {
            let path = if which == "hlo" {
                &f.hlo
            } else {
                &f.buffer_assignment
            };
            let path = path
                .as_deref()
                .map_or_else(|| f.key.clone(), |p| p.display().to_string());
            bail!(
                "`{path}` is not an XLA dump file: {e}; pass the files of --xla_dump_to unchanged"
            );
        }
        let rep = rep.as_deref().map(|t| parse_usage_report(t).0);
        parsed.push((hlo, ba, lr, rep, notes));
    }
    for (f, (hlo, ba, _, rep, _)) in files.iter().zip(&parsed) {
        check_consistent(f, hlo.as_ref(), ba.as_ref(), rep.as_ref())?;
    }
    let mut inputs = Vec::new();
    for (f, (hlo, ba, lr, rep, notes)) in files.iter().zip(&parsed) {
        let mut notes = notes.clone();
        if let (Some(b), Some(r)) = (ba.as_ref(), rep.as_ref()) {
            if let Some((x, y)) = hbm_totals(b, r) {
                if x < y {
                    notes.push(format!(
                        "`{}` holds {} of HBM allocations but the memory-usage report says {}: the buffer assignment looks cut short (truncated); its totals are not trusted over the report's",
                        f.buffer_assignment.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                        hbm_doctor_log::format_size(x),
                        hbm_doctor_log::format_size(y)
                    ));
                }
            }
        }
        if ba.is_none() {
            notes.push("no *-buffer-assignment.txt: run with XLA_FLAGS=\"--xla_dump_to=DIR --xla_dump_hlo_as_text\" for exact figures".into());
        }
        if hlo.is_none() {
            notes.push("no *after_optimizations.txt: source lines and most detectors need the HLO text (--xla_dump_hlo_as_text, without --xla_dump_disable_metadata)".into());
        }
        let name = hlo
            .as_ref()
            .map(|m| m.name.to_string())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| name_from_key(&f.key));
        inputs.push(ModuleInput {
            name,
            hlo: hlo.as_ref(),
            buffer_assignment: ba.as_ref(),
            live_range: lr.as_ref(),
            usage_report: rep.as_ref(),
            notes,
        });
    }
    Ok(analyze(&inputs, opts))
}

/// The budget of `--budget BYTES` or `--target GEN` (shared by `analyze` and `view`).
pub fn budget_options(budget: Option<&str>, target: Option<&str>) -> Result<AnalyzeOptions> {
    let mut opts = AnalyzeOptions::default();
    if let Some(b) = budget {
        let Some(bytes) = hbm_doctor_log::parse_size(b).filter(|&x| x > 0) else {
            bail!("cannot read --budget `{b}`: give bytes or a size such as 16G, 15.75GiB or 17179869184");
        };
        opts.budget_bytes = Some(bytes);
    }
    if let Some(t) = target {
        let Some(chip) = hbm_doctor_analysis::chips::tpu_by_name(t) else {
            bail!("unknown --target `{t}`: use v4, v5e, v5p, v6e or v7, or give --budget BYTES");
        };
        opts.budget_bytes = Some(chip.usable_bytes);
        opts.target = Some(chip.name.to_string());
    }
    Ok(opts)
}

/// Runs `analyze`.
pub fn run(args: &AnalyzeArgs, global: &GlobalArgs) -> Result<u8> {
    let _ = global;
    let opts = budget_options(args.budget.as_deref(), args.target.as_deref())?;
    let mut files = discover(&args.path)?;
    if let Some(m) = &args.module {
        files.retain(|f| f.key.contains(m.as_str()));
        if files.is_empty() {
            bail!(
                "no module matching `{m}` in `{}`: run without --module to list them",
                args.path.display()
            );
        }
    }
    if files.is_empty() {
        bail!("no XLA dump files in `{}`: run the program with XLA_FLAGS=\"--xla_dump_to={} --xla_dump_hlo_as_text\" and pass that directory", args.path.display(), args.path.display());
    }
    let mut report = analyze_files(&files, &opts)?;
    for name in &args.what_if {
        let w = hbm_doctor_analysis::whatif::named(&report, name)
            .map_err(|e| anyhow::anyhow!("--what-if: {e}"))?;
        report.diagnosis.what_if.push(w);
    }
    let text = match args.format {
        OutputFormat::Json => serde_json::to_string_pretty(&report)? + "\n",
        OutputFormat::Markdown => render_markdown(&report, args.top),
        _ => render_human(&report, args.top, false),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(if report.diagnosis.fits == Some(false) {
        exit::FOUND
    } else {
        exit::OK
    })
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A one-line chart of bytes over program order (max per column).
pub fn sparkline(values: &[u64], width: usize) -> String {
    if values.is_empty() {
        return String::new();
    }
    let width = width.min(values.len()).max(1);
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    let min = values.iter().copied().min().unwrap_or(0);
    let span = (max - min).max(1);
    (0..width)
        .map(|c| {
            let a = c * values.len() / width;
            let b = ((c + 1) * values.len() / width).max(a + 1);
            let v = values[a..b].iter().copied().max().unwrap_or(0);
            BARS[(((v - min) as f64 / span as f64) * 7.0).round() as usize]
        })
        .collect()
}

/// A compact area chart of bytes over program order, `rows` lines high, from zero to the largest
/// of the values and `limit` (max per column): y labels on the left, the limit marked on its row,
/// and a last line with `^` under the peak position.
pub fn area_chart(
    values: &[u64],
    width: usize,
    rows: usize,
    limit: Option<u64>,
    peak: Option<u64>,
) -> Vec<String> {
    if values.is_empty() || rows == 0 {
        return Vec::new();
    }
    let width = width.min(values.len()).max(1);
    let vmax = values.iter().copied().max().unwrap_or(0);
    let ymax = vmax.max(limit.unwrap_or(0)).max(1);
    let cols: Vec<u64> = (0..width)
        .map(|c| {
            let a = c * values.len() / width;
            let b = ((c + 1) * values.len() / width).max(a + 1);
            values[a..b].iter().copied().max().unwrap_or(0)
        })
        .collect();
    let eighths: Vec<usize> = cols
        .iter()
        .map(|&v| ((v as f64 / ymax as f64) * (rows * 8) as f64).round() as usize)
        .collect();
    let limit_row = limit.map(|l| {
        let h = (l as f64 / ymax as f64) * rows as f64;
        rows - (h.ceil() as usize).clamp(1, rows)
    });
    let label_w = format_size(ymax).len().max(2);
    let mut out = Vec::with_capacity(rows + 1);
    for r in 0..rows {
        let base = (rows - 1 - r) * 8;
        let line: String = eighths
            .iter()
            .map(|&h| match h.saturating_sub(base) {
                0 => ' ',
                k if k >= 8 => '█',
                k => BARS[k - 1],
            })
            .collect();
        let label = match r {
            0 => format_size(ymax),
            _ if r == rows - 1 => "0B".to_string(),
            _ => String::new(),
        };
        let mark = match (limit_row, limit) {
            (Some(lr), Some(l)) if lr == r => format!(" ◂ limit {}", format_size(l)),
            _ => String::new(),
        };
        let line = if mark.is_empty() {
            line.trim_end()
        } else {
            &line
        };
        out.push(format!("{label:>label_w$} ┤{line}{mark}"));
    }
    let mut axis = format!("{:>label_w$} └", "");
    if let Some(t) = peak.filter(|&t| (t as usize) < values.len()) {
        let col = (t as usize * width / values.len()).min(width - 1);
        axis.push_str(&" ".repeat(col));
        axis.push_str(&format!(
            "^ peak {} at #{t}",
            format_size(values[t as usize])
        ));
    }
    out.push(axis);
    out
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let head: String = s.chars().take(n.saturating_sub(1)).collect();
        format!("{head}…")
    }
}

fn render_space(out: &mut String, s: &SpaceReport, top: usize, limit: Option<u64>) {
    let _ = writeln!(
        out,
        "  {}: total {} (what the compiler reserves), peak {} live{}",
        s.space,
        format_size(s.total_bytes),
        format_size(s.peak_bytes),
        s.peak_instruction
            .as_deref()
            .map(|i| format!(" at #{} {i}", s.peak_time.unwrap_or(0)))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "    arguments {}  outputs {}  aliased {}  temporaries {}  padding {}{}",
        format_size(s.arguments_bytes),
        format_size(s.outputs_bytes),
        format_size(s.aliased_bytes),
        format_size(s.temp_bytes),
        format_size(s.padding_bytes),
        if s.fragmentation_bytes > 0 {
            format!("  fragmentation {}", format_size(s.fragmentation_bytes))
        } else {
            String::new()
        }
    );
    if s.timeline.len() > 1 {
        let _ = writeln!(
            out,
            "    memory over program order ({} schedule positions; `hbm-doctor view` draws it):",
            s.timeline.len()
        );
        let limit = limit.filter(|_| s.color == 0);
        for line in area_chart(&s.timeline, 64, 4, limit, s.peak_time) {
            let _ = writeln!(out, "      {line}");
        }
    }
    if s.buffers_at_peak.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "    {:>9} {:>9}  {:<9} {:<26} {:<28} op_name / source",
        "size", "unpadded", "kind", "shape", "buffer"
    );
    for b in s.buffers_at_peak.iter().take(top) {
        let origin = match (&b.op_name, &b.source) {
            (Some(o), Some(src)) => format!("{} ({src})", trunc(o, 48)),
            (Some(o), None) => trunc(o, 60),
            (None, Some(src)) => src.clone(),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "    {:>9} {:>9}  {:<9} {:<26} {:<28} {}",
            format_size(b.size_bytes),
            format_size(b.unpadded_bytes),
            b.kind,
            trunc(&b.shape, 26),
            trunc(&b.name, 28),
            origin
        );
    }
    if s.buffers_at_peak.len() > top {
        let rest: u64 = s.buffers_at_peak[top..].iter().map(|b| b.size_bytes).sum();
        let _ = writeln!(
            out,
            "    ... {} more buffers, {}",
            s.buffers_at_peak.len() - top,
            format_size(rest)
        );
    }
    let with_source: Vec<_> = s
        .by_source
        .iter()
        .filter(|g| !g.key.starts_with('('))
        .take(5)
        .collect();
    if !with_source.is_empty() {
        let _ = writeln!(
            out,
            "    by source line: {}",
            with_source
                .iter()
                .map(|g| format!("{} {}", g.key, format_size(g.bytes)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let tree: Vec<_> = s
        .by_op_name
        .iter()
        .filter(|g| g.depth < 3 && g.bytes * 50 >= s.peak_bytes.max(1))
        .take(12)
        .collect();
    if !tree.is_empty() {
        let _ = writeln!(out, "    by op_name:");
        for g in tree {
            let leaf = g.key.rsplit('/').next().unwrap_or(&g.key);
            let _ = writeln!(
                out,
                "      {}{} {} ({})",
                "  ".repeat(g.depth),
                trunc(leaf, 60),
                format_size(g.bytes),
                g.buffers
            );
        }
    }
}

/// ` (N partitions, per-device figures)` for SPMD modules, else nothing.
fn partitions_note(m: &ModuleReport) -> String {
    if m.num_partitions > 1 {
        format!(" ({} partitions, per-device figures)", m.num_partitions)
    } else {
        String::new()
    }
}

/// The memory spaces that hold anything.
fn spaces_in_use(m: &ModuleReport) -> impl Iterator<Item = &SpaceReport> {
    m.memory_spaces
        .iter()
        .filter(|s| s.total_bytes > 0 || s.peak_bytes > 0)
}

fn render_module(out: &mut String, m: &ModuleReport, top: usize, limit: Option<u64>) {
    let _ = writeln!(
        out,
        "module {}{}{}",
        m.name,
        partitions_note(m),
        if m.estimate {
            " - ESTIMATE from the schedule (no buffer assignment)"
        } else {
            ""
        }
    );
    for s in spaces_in_use(m) {
        render_space(out, s, top, limit);
    }
    if let (Some(x), Some(o)) = (m.xla.live_range_peak_bytes, m.xla.recomputed_peak_bytes) {
        let _ = writeln!(
            out,
            "  XLA live-range peak (logical sizes, all spaces): {} at #{}{}",
            format_size(x),
            m.xla.live_range_peak_time.unwrap_or(0),
            if x == o {
                ", reproduced exactly".to_string()
            } else {
                format!(", recomputed {}", format_size(o))
            }
        );
    }
    for n in &m.notes {
        let _ = writeln!(out, "  note: {n}");
    }
}

/// The human report.
pub fn render_human(r: &AnalyzeReport, top: usize, _markdown: bool) -> String {
    let mut out = String::new();
    for m in &r.modules {
        render_module(&mut out, m, top, r.diagnosis.budget_bytes);
        out.push('\n');
    }
    let d = &r.diagnosis;
    let _ = writeln!(out, "{}", d.summary);
    if !d.ledger.is_empty() {
        let _ = writeln!(out, "ledger (HBM of the main module):");
        let w = d.ledger.iter().map(|l| l.part.len()).max().unwrap_or(0);
        for l in &d.ledger {
            let _ = writeln!(
                out,
                "  {:<w$}  {:>9}  {}",
                l.part,
                format_size(l.bytes),
                l.note
            );
        }
    }
    for w in &d.what_if {
        let _ = writeln!(
            out,
            "what if {}: peak {} -> {} ({} buffers changed); total {}{}",
            w.change,
            format_size(w.peak_before_bytes),
            format_size(w.peak_bytes),
            w.buffers,
            format_size(w.total_bytes),
            match w.fits {
                Some(true) => " - fits the budget",
                Some(false) => " - still does not fit the budget",
                None => "",
            }
        );
    }
    if d.causes.is_empty() {
        let _ = writeln!(out, "no known waste found");
    }
    for (k, c) in d.causes.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. {}{}: {}",
            k + 1,
            c.cause.as_str(),
            c.savings_bytes
                .map(|s| format!(" (saves ~{})", format_size(s)))
                .unwrap_or_default(),
            c.evidence
        );
        for a in &c.actions {
            let _ = writeln!(out, "   - {a}");
        }
    }
    out
}

/// A table cell: pipes escaped, newlines folded, empty shown as `—`.
fn cell(s: &str) -> String {
    let s = s.replace('|', "\\|").replace(['\n', '\r'], " ");
    if s.trim().is_empty() {
        "—".into()
    } else {
        s
    }
}

/// Inline code for a cell (backticks in the text fall back to plain text).
fn code(s: &str) -> String {
    if s.is_empty() {
        "—".into()
    } else if s.contains('`') {
        cell(s)
    } else {
        format!("`{}`", cell(s))
    }
}

fn markdown_space(out: &mut String, s: &SpaceReport, top: usize) {
    let _ = writeln!(out, "#### {} buffers live at the peak\n", s.space);
    if s.buffers_at_peak.is_empty() {
        let _ = writeln!(out, "_none known (no live ranges)_\n");
        return;
    }
    let _ = writeln!(
        out,
        "| # | size | unpadded | kind | shape | buffer | op | op_name | source |\n|---:|---:|---:|---|---|---|---|---|---|"
    );
    for (k, b) in s.buffers_at_peak.iter().take(top).enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            k + 1,
            format_size(b.size_bytes),
            format_size(b.unpadded_bytes),
            b.kind,
            code(&b.shape),
            code(&b.name),
            b.opcode.as_deref().map_or_else(|| "—".into(), code),
            b.op_name
                .as_deref()
                .map_or_else(|| "—".into(), |o| code(&trunc(o, 80))),
            b.source.as_deref().map_or_else(|| "—".into(), code),
        );
    }
    if s.buffers_at_peak.len() > top {
        let rest = &s.buffers_at_peak[top..];
        let bytes: u64 = rest.iter().map(|b| b.size_bytes).sum();
        let unpadded: u64 = rest.iter().map(|b| b.unpadded_bytes).sum();
        let _ = writeln!(
            out,
            "| | {} | {} | {} more buffers | | | | | |",
            format_size(bytes),
            format_size(unpadded),
            rest.len()
        );
    }
    out.push('\n');
    let sources: Vec<_> = s.by_source.iter().take(top).collect();
    if sources.iter().any(|g| !g.key.starts_with('(')) {
        let _ = writeln!(
            out,
            "#### {} peak by source line\n\n| source | bytes | share | buffers |\n|---|---:|---:|---:|",
            s.space
        );
        for g in sources {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                if g.key.starts_with('(') {
                    cell(&g.key)
                } else {
                    code(&g.key)
                },
                format_size(g.bytes),
                share(g.bytes, s.peak_bytes),
                g.buffers
            );
        }
        out.push('\n');
    }
    let tree: Vec<_> = s
        .by_op_name
        .iter()
        .filter(|g| g.depth < 4 && g.bytes * 50 >= s.peak_bytes.max(1))
        .take(3 * top)
        .collect();
    if !tree.is_empty() {
        let _ = writeln!(
            out,
            "#### {} peak by op_name path\n\n| op_name path | bytes | share | buffers |\n|---|---:|---:|---:|",
            s.space
        );
        for g in tree {
            let leaf = g.key.rsplit('/').next().unwrap_or(&g.key);
            let _ = writeln!(
                out,
                "| {}{} | {} | {} | {} |",
                "&nbsp;&nbsp;".repeat(g.depth),
                code(&trunc(leaf, 60)),
                format_size(g.bytes),
                share(g.bytes, s.peak_bytes),
                g.buffers
            );
        }
        out.push('\n');
    }
}

fn share(part: u64, whole: u64) -> String {
    format!("{:.1}%", part as f64 * 100.0 / whole.max(1) as f64)
}

/// The markdown report: one table of figures per module and memory space, the buffers at the
/// peak, the peak by source line and by op_name path, and the ranked causes; to paste in an
/// issue or a pull request.
pub fn render_markdown(r: &AnalyzeReport, top: usize) -> String {
    let mut out = String::new();
    let d = &r.diagnosis;
    let _ = writeln!(out, "### hbm-doctor analyze: {}\n", cell(&d.summary));
    let _ = writeln!(
        out,
        "**Category:** `{}`{}\n",
        d.category.as_str(),
        d.budget_bytes
            .map(|b| format!(
                " · **budget:** {} · **fits:** {}",
                format_size(b),
                if d.fits == Some(true) { "yes" } else { "no" }
            ))
            .unwrap_or_default()
    );
    if !d.ledger.is_empty() {
        let _ = writeln!(out, "| part | bytes | what |\n|---|---:|---|");
        for l in &d.ledger {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                l.part,
                format_size(l.bytes),
                cell(&l.note)
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "| module | space | total | peak | arguments | outputs | aliased | temporaries | padding | fragmentation | method |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for m in &r.modules {
        for s in &m.memory_spaces {
            if s.total_bytes == 0 && s.peak_bytes == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                code(&m.name),
                s.space,
                format_size(s.total_bytes),
                format_size(s.peak_bytes),
                format_size(s.arguments_bytes),
                format_size(s.outputs_bytes),
                format_size(s.aliased_bytes),
                format_size(s.temp_bytes),
                format_size(s.padding_bytes),
                format_size(s.fragmentation_bytes),
                if m.estimate {
                    format!("{} (estimate)", m.method)
                } else {
                    m.method.clone()
                }
            );
        }
    }
    out.push('\n');
    if !d.causes.is_empty() {
        let _ = writeln!(
            out,
            "#### Causes\n\n| # | cause | saves | evidence |\n|---:|---|---:|---|"
        );
        for (k, c) in d.causes.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | `{}` | {} | {} |",
                k + 1,
                c.cause.as_str(),
                c.savings_bytes
                    .map_or_else(|| "—".into(), |b| format!("~{}", format_size(b))),
                cell(&c.evidence)
            );
        }
        out.push('\n');
        for (k, c) in d.causes.iter().enumerate() {
            if c.actions.is_empty() {
                continue;
            }
            let _ = writeln!(out, "{}. **`{}`**", k + 1, c.cause.as_str());
            for a in &c.actions {
                let _ = writeln!(out, "   - {}", a.replace('\n', " "));
            }
        }
        out.push('\n');
    } else {
        let _ = writeln!(out, "No known waste found.\n");
    }
    for m in &r.modules {
        let _ = writeln!(
            out,
            "### Module `{}`{}{}\n",
            m.name,
            partitions_note(m),
            if m.estimate {
                " — estimate from the schedule (no buffer assignment)"
            } else {
                ""
            }
        );
        for s in spaces_in_use(m) {
            if let Some(i) = &s.peak_instruction {
                let _ = writeln!(
                    out,
                    "**{}** peak {} at schedule position {} (`{}`) of {}.\n",
                    s.space,
                    format_size(s.peak_bytes),
                    s.peak_time.unwrap_or(0),
                    cell(i),
                    s.timeline.len()
                );
            }
            markdown_space(&mut out, s, top);
        }
        if let (Some(x), Some(o)) = (m.xla.live_range_peak_bytes, m.xla.recomputed_peak_bytes) {
            let _ = writeln!(
                out,
                "XLA's live-range peak (logical sizes, all spaces): {} at #{}{}.\n",
                format_size(x),
                m.xla.live_range_peak_time.unwrap_or(0),
                if x == o {
                    ", reproduced exactly".to_string()
                } else {
                    format!(", recomputed {}", format_size(o))
                }
            );
        }
        for n in &m.notes {
            let _ = writeln!(out, "> **note:** {}\n", cell(n));
        }
    }
    out
}
