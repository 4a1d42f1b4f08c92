//! One module per subcommand; each returns its exit code.

pub mod analyze;
pub mod chips;
pub mod explain;
pub mod exporter;
pub mod fit;
pub mod pad;
pub mod record;
pub mod top;
pub mod trend;
pub mod view;

use crate::cli::{Cli, Command};

/// Runs the chosen subcommand.
pub fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Explain(args) => explain::run(&args, &cli.global),
        Command::Pad(args) => pad::run(&args, &cli.global),
        Command::Analyze(args) => analyze::run(&args, &cli.global),
        Command::Top(args) => top::run(&args, &cli.global),
        Command::Record(args) => record::run(&args, &cli.global),
        Command::Exporter(args) => exporter::run(&args, &cli.global),
        Command::Fit(args) => fit::run(&args, &cli.global),
        Command::Trend(args) => trend::run(&args, &cli.global),
        Command::View(args) => view::run(&args, &cli.global),
        Command::Chips(args) => chips::run(&args),
    }
}
