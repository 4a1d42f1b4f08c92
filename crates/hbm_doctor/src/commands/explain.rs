//! `hbm-doctor explain`: every OOM event in a log, classified, with a ranked plan.

use crate::cli::{ExplainArgs, GlobalArgs};
use crate::{exit, input};
use anyhow::{bail, Result};
use hbm_doctor_render::render_explain;
use std::io::Write;

/// Runs `explain`.
pub fn run(args: &ExplainArgs, global: &GlobalArgs) -> Result<u8> {
    if let Some(dump) = &args.dump {
        if !dump.is_dir() {
            bail!(
                "--dump `{}` is not a directory: pass the directory given to --xla_dump_to",
                dump.display()
            );
        }
    }
    let evidence = match &args.evidence {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("cannot read --evidence `{}`: {e}", p.display()))?;
            Some(
                hbm_doctor_analysis::evidence::Evidence::parse(&text).map_err(|e| {
                    anyhow::anyhow!(
                        "--evidence `{}`: {e}: pass the JSON file hbm_doctor.watch() wrote",
                        p.display()
                    )
                })?,
            )
        }
        None => None,
    };
    // `explain --evidence FILE` alone: the evidence's exception is the message, so a terminal
    // on stdin is not waited on and an empty stdin is no error.
    let stdin_is_terminal = {
        use std::io::IsTerminal;
        std::io::stdin().is_terminal()
    };
    let scanned = if evidence.is_some() && args.file.is_none() && stdin_is_terminal {
        input::scan(Box::new(std::io::empty()), "<evidence>".into())?
    } else {
        input::scan_path(args.file.as_deref())?
    };
    if scanned.bytes == 0 && evidence.is_none() {
        bail!(
            "`{}` is empty: pass the log or traceback that contains the error",
            scanned.name
        );
    }
    if scanned.events.is_empty() && scanned.looks_binary {
        bail!("`{}` looks binary, not like a log: pass the text log (stderr of the training run) or the error message", scanned.name);
    }
    let mut events = scanned.events;
    // The log may not hold the error the process raised: the evidence's exception does.
    if !events.iter().any(|e| e.fatal) {
        if let Some(t) = evidence.as_ref().and_then(|e| e.exception_text()) {
            let more = hbm_doctor_log::scan_all(t.as_bytes());
            if more.iter().any(|e| e.fatal) {
                events = more;
            }
        }
    }
    // Warnings (rematerialization that fell short) are reported but are not out-of-memory errors.
    let found = events.iter().any(|e| e.fatal);
    let mut report = hbm_doctor_analysis::explain_with_warnings(events, scanned.warnings);
    if let Some(ev) = &evidence {
        hbm_doctor_analysis::evidence::apply(&mut report, ev);
    }
    if let Some(dir) = &args.dump {
        let files = crate::dump::discover(dir)?;
        let dump = crate::dump::analyze_files(&files, &Default::default())?;
        if report.diagnosis.is_some()
            && hbm_doctor_analysis::join::join_dump(&mut report, &dump).is_none()
        {
            eprintln!(
                "hbm-doctor: note: no module with HBM figures in `{}`; explaining the log alone",
                dir.display()
            );
        }
    }
    let text = render_explain(
        &report,
        args.format.render(),
        global.style(args.format),
        &scanned.name,
    );
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(if found { exit::FOUND } else { exit::OK })
}
