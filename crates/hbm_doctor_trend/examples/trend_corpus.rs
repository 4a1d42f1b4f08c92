//! Writes the generated trend test set (`tests/corpus/trend/gen`): files of every scenario of
//! `hbm_doctor_trend::simulate::table()` and `truth.json` with what each device truly does.
//! `crates/hbm_doctor/tests/trend_corpus.rs` reads them back and asserts the study's goals.
//!
//! Usage: `cargo run --release -p hbm_doctor_trend --example trend_corpus -- DIR [FILES_PER_SCENARIO]
//! [MAX_ROWS_PER_DEVICE] [FIRST_SEED] [SCENARIO_PREFIX]`
//! (the committed set: `tests/corpus/trend/gen 2 1500 1`).

use hbm_doctor_trend::simulate::{case, table};
use std::io::Write;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir =
        std::path::PathBuf::from(args.get(1).map_or("tests/corpus/trend/gen", String::as_str));
    let per: u64 = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(2);
    let max_rows: u64 = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(1500);
    let first: u64 = args.get(4).and_then(|v| v.parse().ok()).unwrap_or(1);
    let only = args.get(5).cloned();
    std::fs::create_dir_all(&dir)?;
    let mut cases = Vec::new();
    for (name, sc) in table() {
        if only.as_ref().is_some_and(|o| !name.starts_with(o.as_str())) {
            continue;
        }
        for seed in first..first + per {
            let c = case(name, sc, seed, max_rows);
            std::fs::write(dir.join(&c.file), &c.text)?;
            cases.push(c);
        }
    }
    let mut f = std::fs::File::create(dir.join("truth.json"))?;
    writeln!(
        f,
        "{}",
        serde_json::to_string_pretty(&cases).map_err(std::io::Error::other)?
    )?;
    eprintln!("{} files in {}", cases.len(), dir.display());
    Ok(())
}
