//! Dispatch from parsed arguments to the command implementations, and exit codes.

mod collective;
mod list;
mod profile;
mod simulate;
mod tune;

use crate::cli::{Cli, Command};

/// Exit code for a failed command: 1 for errors (bad input, failed runs).
pub fn exit_code(_err: &anyhow::Error) -> u8 {
    1
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Collective(args) => collective::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Tune(args) => tune::run(&args),
        Command::Profile(args) => profile::run(&args),
        Command::List { what } => list::run(what),
    }
}

/// Serializes a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
