//! The `syncopate` command: parses arguments, runs one command, prints the error chain once.

mod args;
mod cli;
mod commands;
mod plot;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = cli::Cli::parse();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            let mut source = err.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::from(commands::exit_code(&err))
        }
    }
}

/// Rust ignores SIGPIPE, so `syncopate ... | head` would panic on a closed stdout; a command-line
/// tool should instead end quietly, as the default signal action does.
fn restore_default_sigpipe() {
    // SAFETY: called once at start-up, before any thread exists; resetting a signal's
    // disposition to its default has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
