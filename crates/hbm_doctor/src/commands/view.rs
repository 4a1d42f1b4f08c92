//! `hbm-doctor view PATH [-o FILE.html] [--force]` (and `view BEFORE AFTER`): writes one
//! self-contained offline HTML memory viewer of an XLA dump, built from the same report as
//! `analyze --format json`, which the page embeds.

use crate::cli::{BudgetArgs, GlobalArgs, OutputFormat};
use crate::dump::{analyze_files, discover};
use anyhow::{bail, Context, Result};
use clap::Args;
use hbm_doctor_analysis::analyze::{AnalyzeOptions, AnalyzeReport};
use hbm_doctor_render::view::{render_view, ViewOptions, ViewSide};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `hbm-doctor view`.
#[derive(Debug, Args)]
pub struct ViewArgs {
    /// An XLA dump directory (--xla_dump_to) or one file of it; give two, BEFORE AFTER, to see
    /// what a change did.
    #[arg(required = true, num_args = 1..=2, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// The page to write (default: named after the input, in the current directory); `-` writes
    /// it to standard output.
    #[arg(long, short = 'o', value_name = "FILE.html")]
    pub output: Option<PathBuf>,
    /// Overwrite the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Open the page on the module whose name contains this (all modules stay selectable).
    #[arg(long, value_name = "NAME")]
    pub module: Option<String>,
    /// The limit drawn and checked against.
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// `human` prints what was written to stderr; `json` prints it to stdout as an object.
    #[arg(long, short = 'f', value_enum, default_value_t = OutputFormat::Human)]
    pub format: OutputFormat,
}

/// Directory names too generic to name a page after: their parent's name is put in front.
const GENERIC: [&str; 9] = [
    "dump",
    "dumps",
    "xla_dump",
    "xla_dumps",
    "xla-dump",
    "hlo",
    "out",
    "tmp",
    "output",
];

fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    out.trim_matches('.').to_string()
}

/// A short name for an input: the directory's name (with its parent's for a generic one like
/// `dump`), or for a dump file its module (`module_0000.jit_f.cl_1.after_optimizations.txt` ->
/// `jit_f`).
fn input_stem(p: &Path) -> String {
    let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let name = abs
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "dump".into());
    let stem = if abs.is_dir() {
        if GENERIC.contains(&name.to_ascii_lowercase().as_str()) {
            match abs.parent().and_then(Path::file_name) {
                Some(parent) => format!("{}-{name}", parent.to_string_lossy()),
                None => name,
            }
        } else {
            name
        }
    } else {
        let parts: Vec<&str> = name.split('.').collect();
        match parts.iter().position(|p| p.starts_with("module_")) {
            Some(k) if k + 1 < parts.len() => parts[k + 1].to_string(),
            _ => parts.first().copied().unwrap_or("dump").to_string(),
        }
    };
    let s = sanitize(&stem);
    if s.is_empty() {
        "dump".into()
    } else {
        s
    }
}

/// The default page name for the inputs: `<input>.memory.html`, `<before>-vs-<after>.memory.html`.
pub fn default_output(paths: &[PathBuf]) -> PathBuf {
    let stems: Vec<String> = paths.iter().map(|p| input_stem(p)).collect();
    let name = match stems.as_slice() {
        [a, b] if a == b => format!("{a}-diff"),
        [a, b] => format!("{a}-vs-{b}"),
        [a, ..] => a.clone(),
        [] => "dump".into(),
    };
    PathBuf::from(format!("{name}.memory.html"))
}

fn analyze_path(path: &Path, opts: &AnalyzeOptions) -> Result<AnalyzeReport> {
    let files = discover(path)?;
    if files.is_empty() {
        bail!("no XLA dump files in `{}`: run the program with XLA_FLAGS=\"--xla_dump_to={} --xla_dump_hlo_as_text\" and pass that directory", path.display(), path.display());
    }
    analyze_files(&files, opts)
}

/// Runs `view`.
pub fn run(args: &ViewArgs, global: &GlobalArgs) -> Result<u8> {
    let _ = global;
    let opts = args.budget.options()?;
    let to_stdout = args.output.as_deref() == Some(Path::new("-"));
    let out_path = match &args.output {
        Some(p) => p.clone(),
        None => default_output(&args.paths),
    };
    if !to_stdout && !args.force && out_path.exists() {
        bail!(
            "`{}` already exists: pass --force to overwrite it, or -o FILE.html to write elsewhere",
            out_path.display()
        );
    }
    let mut reports = Vec::new();
    for p in &args.paths {
        reports.push(analyze_path(p, &opts)?);
    }
    let labels: Vec<String> = args.paths.iter().map(|p| p.display().to_string()).collect();
    let sides: Vec<ViewSide<'_>> = labels
        .iter()
        .zip(&reports)
        .map(|(label, report)| ViewSide { label, report })
        .collect();
    let html = render_view(
        &sides,
        &ViewOptions {
            module: args.module.clone(),
            target: opts.target.clone(),
            limit_bytes: opts.budget_bytes,
            generator: format!("hbm-doctor {}", env!("CARGO_PKG_VERSION")),
        },
    )?;
    if to_stdout {
        let mut out = std::io::stdout().lock();
        out.write_all(html.as_bytes())?;
        out.flush()?;
        return Ok(crate::exit::OK);
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .create_new(!args.force)
        .open(&out_path)
        .with_context(|| {
            format!(
                "cannot write `{}`: check the directory exists and is writable, or pass -o FILE.html",
                out_path.display()
            )
        })?;
    file.write_all(html.as_bytes())
        .and_then(|()| file.flush())
        .with_context(|| format!("cannot write `{}`", out_path.display()))?;
    let abs = std::fs::canonicalize(&out_path).unwrap_or_else(|_| out_path.clone());
    let modules = reports.iter().map(|r| r.modules.len()).max().unwrap_or(0);
    match args.format {
        OutputFormat::Json => {
            let v = serde_json::json!({
                "schema_version": hbm_doctor_analysis::SCHEMA_VERSION,
                "output": out_path.display().to_string(),
                "bytes": html.len(),
                "modules": modules,
                "mode": if reports.len() > 1 { "diff" } else { "single" },
            });
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            out.flush()?;
        }
        _ => {
            eprintln!(
                "Wrote {} ({}, {modules} module{})",
                out_path.display(),
                hbm_doctor_log::format_size(html.len() as u64),
                if modules == 1 { "" } else { "s" }
            );
            eprintln!(
                "Open it in any browser: file://{} (it works offline; from a remote or TPU VM, copy the file first, e.g. with scp)",
                abs.display()
            );
        }
    }
    Ok(crate::exit::OK)
}
