//! Dispatch from parsed arguments to the command implementations, and exit codes.

mod collective;
mod exec;
mod experiment;
mod export;
mod lab;
mod list;
mod lower;
mod profile;
mod shared;
mod simulate;
mod sweep;
mod tune;
mod validate;

use crate::cli::{Cli, Command, ExperimentCommand};
use anyhow::Context;

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
        Command::Export(args) => export::run(&args),
        Command::Sweep(args) => sweep::run(&args),
        Command::Experiment(ExperimentCommand::Run(args)) => experiment::run(&args),
        Command::Profile(args) => profile::run(&args),
        Command::List(what) => list::run(what),
        Command::Exec(args) => exec::run(&args),
        Command::Validate(args) => validate::run(&args),
        Command::Lower(args) => lower::run(&args),
        Command::Lab(command) => lab::run(command),
    }
}

/// A time in ms as reports print it (rounded to the nanosecond).
pub fn ms(time: syncopate_sim::base::time::SimTime) -> f64 {
    syncopate_sim::base::stats::round6(time.as_ms())
}

pub use syncopate_sim::base::data::write_atomically;

/// Runs `work` as one rank of an MPI job. A failure is printed and ends the whole job
/// (MPI_Abort) instead of returning: returning would finalize MPI, which waits for ranks that
/// may be waiting for this one.
#[cfg(feature = "mpi")]
pub fn as_mpi_rank<T, E: std::fmt::Display>(
    work: impl FnOnce(&syncopate_exec::mpi::World) -> Result<T, E>,
) -> anyhow::Result<T> {
    let world = syncopate_exec::mpi::World::init()?;
    match work(&world) {
        Ok(value) => Ok(value),
        Err(err) => {
            // One write, so that mpirun's --tag-output keeps the line whole.
            let line = format!("error: rank {}: {err}\n", world.rank);
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            world.abort(1)
        }
    }
}

/// The error of a command that needs the `mpi` feature in a build without it.
#[cfg(not(feature = "mpi"))]
pub fn without_mpi() -> anyhow::Error {
    without_mpi_error()
}

/// The message of [`without_mpi`], for code that checks the feature at run time.
pub fn without_mpi_error() -> anyhow::Error {
    anyhow::anyhow!(
        "this syncopate was built without the `mpi` feature; rebuild with `cargo build --release --features mpi` (needs Debian's openmpi-bin, libopenmpi-dev and libclang-dev)"
    )
}

/// Writes `text` to `path` atomically (see [`write_atomically`]), naming the file in the error.
pub fn write_file(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    write_atomically(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes a value as pretty JSON and a final line break.
pub fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> anyhow::Result<()> {
    write_file(path, &(serde_json::to_string_pretty(value)? + "\n"))
}

/// Serializes a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
