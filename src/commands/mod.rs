//! Dispatch from parsed arguments to the command implementations, and exit codes.

mod collective;
mod exec;
mod experiment;
mod lab;
mod list;
mod profile;
mod simulate;
mod sweep;
mod tune;
mod validate;

use crate::cli::{Cli, Command, ExperimentCommand};

/// Exit code for a failed command: 3 when a GPU was needed and none is usable, 1 for other
/// errors (bad input, failed runs).
pub fn exit_code(err: &anyhow::Error) -> u8 {
    match err.downcast_ref::<syncopate_exec::ExecError>() {
        Some(syncopate_exec::ExecError::NoGpu { .. }) => 3,
        _ => 1,
    }
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Collective(args) => collective::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Tune(args) => tune::run(&args),
        Command::Sweep(args) => sweep::run(&args),
        Command::Experiment(ExperimentCommand::Run(args)) => experiment::run(&args),
        Command::Profile(args) => profile::run(&args),
        Command::List { what } => list::run(what),
        Command::Exec(args) => exec::run(&args),
        Command::Validate(args) => validate::run(&args),
        Command::Lab(command) => lab::run(command),
    }
}

/// Serializes a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
