//! Helpers shared by the binary's integration tests (`mod support;`): the binary, the corpus,
//! scratch directories, and a run captured for a snapshot.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `hbm-doctor` binary, with the colour-forcing variables of the caller's environment
/// removed (`--color auto` then means no colour: stdout is a pipe).
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hbm-doctor"));
    c.env_remove("NO_COLOR")
        .env_remove("FORCE_COLOR")
        .env_remove("CLICOLOR_FORCE");
    c
}

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `tests/corpus/<rel>`.
pub fn corpus(rel: &str) -> PathBuf {
    root().join("tests/corpus").join(rel)
}

/// The XLA dump of a compiled TPU case: `tests/corpus/tpu/<case>/dump`.
pub fn tpu_dump(case: &str) -> PathBuf {
    corpus("tpu").join(case).join("dump")
}

/// A CPU-backend case: `tests/corpus/cpu/<case>`.
pub fn cpu(case: &str) -> PathBuf {
    corpus("cpu").join(case)
}

/// An empty scratch directory for this process (removed first if a previous run left it).
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hbm-doctor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Runs `hbm-doctor ARGS` from the repository root (so corpus paths print relative).
pub fn run(args: &[&str]) -> Output {
    bin()
        .current_dir(root())
        .args(args)
        .output()
        .expect("run hbm-doctor")
}

/// A run as one text for a snapshot: the command, exit code, stdout and stderr.
pub fn transcript(args: &[&str], out: &Output) -> String {
    format!(
        "$ hbm-doctor {}\nexit: {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        out.status
            .code()
            .map_or_else(|| "signal".to_string(), |c| c.to_string()),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
