//! hbm-doctor's command line: argument parsing, file and stream I/O, exit codes.
//!
//! This crate is the only one that touches files. It reads input (streaming, gzip-aware), calls
//! the pure crates (`hbm_doctor_log`, `hbm_doctor_analysis`), and prints through
//! `hbm_doctor_render`. [`run`] is the library entry point (the Python package calls the binary).

pub mod cli;
pub mod commands;
pub mod dump;
pub mod exit;
pub mod input;

use clap::Parser;
use std::io::Write;
use std::process::ExitCode;

/// Parses the process arguments, runs, and turns errors into the contract's exit codes.
pub fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(err) => {
            let code = if err.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    ExitCode::from(run(args))
}

/// Runs a parsed command line and returns the exit code.
pub fn run(args: cli::Cli) -> u8 {
    let color = args.global.color.resolve_stderr();
    // A bug must not look like a crash to the user: report it in one line, exit 2.
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("hbm-doctor: internal error{location}: please report it with the command line and input (https://github.com/hbm-doctor/hbm-doctor/issues)");
    }));
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| commands::dispatch(args)));
    let Ok(result) = outcome else {
        return exit::USAGE;
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return exit::OK;
            }
            let mut stderr = std::io::stderr().lock();
            let head = if color {
                "\x1b[1;31merror\x1b[0m"
            } else {
                "error"
            };
            // One line: the message says what to do; the causes follow in parentheses.
            let causes: Vec<String> = err.chain().skip(1).map(|c| c.to_string()).collect();
            let tail = if causes.is_empty() {
                String::new()
            } else {
                format!(" ({})", causes.join(": "))
            };
            let _ = writeln!(stderr, "hbm-doctor: {head}: {err}{tail}");
            exit::USAGE
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
