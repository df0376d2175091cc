//! Helpers shared by the integration tests: paths to shared data and running the binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `profiles/validation`, the measured public data the project calibrates against.
pub fn validation_data(file: &str) -> PathBuf {
    root().join("profiles/validation").join(file)
}

/// Runs the `syncopate` binary with arguments, from the repository root.
pub fn syncopate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_syncopate"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("the syncopate binary runs")
}

/// `syncopate simulate ARGS --format json`'s summary; the run must succeed.
pub fn simulate_json(args: &[&str]) -> serde_json::Value {
    syncopate_json(&[&["simulate"], args].concat())
}

/// `syncopate ARGS --format json`'s report; the run must succeed.
pub fn syncopate_json(args: &[&str]) -> serde_json::Value {
    let out = syncopate(&[args, &["--format", "json"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// A JSON file the binary wrote.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fresh scratch directory for one call: tests run in parallel threads of one process, so
/// two tests (or two calls) asking for the same name must not share it.
pub fn scratch(test: &str) -> PathBuf {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "syncopate-test-{}-{call}-{test}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
