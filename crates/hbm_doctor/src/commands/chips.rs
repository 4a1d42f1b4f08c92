//! `hbm-doctor chips` (hidden): the TPU chip table of `hbm_doctor_analysis::chips`, so the
//! Python package's `fit` reads the same figures as the diagnosis.

use crate::cli::{ChipsArgs, OutputFormat};
use crate::exit;
use anyhow::Result;
use hbm_doctor_analysis::chips::TPUS;
use hbm_doctor_log::format_size;
use std::io::Write;

/// Runs `chips`.
pub fn run(args: &ChipsArgs) -> Result<u8> {
    let mut out = std::io::stdout().lock();
    match args.format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&tpus_json())?)?,
        _ => {
            for t in TPUS {
                writeln!(
                    out,
                    "{:8} {:>9} usable per device ({} B), {} physical  {}",
                    t.name,
                    format_size(t.usable_bytes),
                    t.usable_bytes,
                    format_size(t.physical_bytes),
                    t.long_name
                )?;
            }
        }
    }
    Ok(exit::OK)
}

/// The chip table as JSON: `{"schema_version": 1, "tpus": [{name, long_name, physical_bytes,
/// usable_bytes}]}`, smallest memory first.
pub fn tpus_json() -> serde_json::Value {
    serde_json::json!({
        "schema_version": 1,
        "tpus": TPUS
            .iter()
            .map(|t| serde_json::json!({
                "name": t.name,
                "long_name": t.long_name,
                "physical_bytes": t.physical_bytes,
                "usable_bytes": t.usable_bytes,
            }))
            .collect::<Vec<_>>(),
    })
}
