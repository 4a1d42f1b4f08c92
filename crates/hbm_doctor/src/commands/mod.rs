//! One module per subcommand; each returns its exit code.

pub mod analyze;
pub mod explain;
pub mod pad;

use crate::cli::{Cli, Command};

/// Runs the chosen subcommand.
pub fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Explain(args) => explain::run(&args, &cli.global),
        Command::Pad(args) => pad::run(&args, &cli.global),
        Command::Analyze(args) => analyze::run(&args, &cli.global),
    }
}
