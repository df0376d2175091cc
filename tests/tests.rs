//! Syncopate's integration tests: shipped data, closed-form cases, properties and the CLI.
//!
//! The CLI is tested end to end.

mod cli;
mod collective;
mod common;
mod compression;
mod data_files;
mod experiments;
mod golden;
mod lab;
mod robustness;
mod runtime;
mod simulator;
mod tuning;
