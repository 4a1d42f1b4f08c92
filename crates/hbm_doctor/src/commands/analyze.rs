//! `hbm-doctor analyze PATH`: peak memory per module and memory space of an XLA dump, the
//! buffers live at the peak with their source lines, and the waste detectors. Reading the dump is
//! [`crate::dump`]; the views are `hbm_doctor_render::analyze`.

use crate::cli::{AnalyzeArgs, GlobalArgs};
use crate::exit;
use anyhow::{bail, Result};
use hbm_doctor_render::render_analyze;
use std::io::Write;

pub use crate::cli::budget_options;
pub use crate::dump::{analyze_files, discover, ModuleFiles};

/// Runs `analyze`.
pub fn run(args: &AnalyzeArgs, global: &GlobalArgs) -> Result<u8> {
    let opts = args.budget.options()?;
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
    let text = render_analyze(
        &report,
        args.format.render(),
        global.style(args.format),
        args.top,
    );
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(if report.diagnosis.fits == Some(false) {
        exit::FOUND
    } else {
        exit::OK
    })
}
