//! Helpers shared by the integration tests: paths to shared data and running the binary.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared/validation-data`, the measured public data the project calibrates against.
pub fn validation_data(file: &str) -> PathBuf {
    root().join("../shared/validation-data").join(file)
}

/// Runs the `syncopate` binary with arguments, from the repository root.
pub fn syncopate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_syncopate"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("the syncopate binary runs")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A scratch directory unique to one test.
pub fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("syncopate-test-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
