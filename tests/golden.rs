//! Golden files of whole runs, compared byte for byte; `SYNCOPATE_BLESS=1` rewrites them.
//!
//! The runs are `simulate` summaries (symmetric and explicit), a trace, a `tune` and a `sweep`;
//! blessing is for a change that is meant.

use crate::common::{scratch, stderr, syncopate};
use std::path::{Path, PathBuf};

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// Compares `got` with golden file `name`, or writes it when blessing.
fn compare(name: &str, got: &[u8]) {
    let path = golden(name);
    if std::env::var_os("SYNCOPATE_BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read(&path).unwrap_or_else(|err| {
        panic!(
            "{}: {err} (run with SYNCOPATE_BLESS=1 to write it)",
            path.display()
        )
    });
    if got != want.as_slice() {
        let fresh = path.with_extension("new");
        std::fs::write(&fresh, got).unwrap();
        panic!(
            "{name} differs from its golden file; what this build writes is in {} (diff them; SYNCOPATE_BLESS=1 accepts a change that is meant, to be explained in its commit)",
            fresh.display()
        );
    }
}

/// Runs `syncopate ARGS` and compares its standard output with golden file `name`.
fn run(name: &str, args: &[&str]) {
    let out = syncopate(args);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    compare(name, &out.stdout);
}

#[test]
fn simulate_summaries_are_byte_for_byte_the_golden_ones() {
    run(
        "simulate-horovod-resnet50.json",
        &[
            "simulate",
            "--model",
            "resnet50",
            "--cluster",
            "v100-10gbe",
            "--nodes",
            "4",
            "--strategy",
            "horovod",
            "--format",
            "json",
        ],
    );
    run(
        "simulate-ddp-fp16-bert-large.json",
        &[
            "simulate",
            "--model",
            "bert-large",
            "--cluster",
            "dgx-h100",
            "--nodes",
            "2",
            "--strategy",
            "ddp",
            "--compressor",
            "fp16",
            "--format",
            "json",
        ],
    );
    // The explicit path (every rank, seeded jitter) with HiPress's compressed ring.
    run(
        "simulate-hipress-jitter.json",
        &[
            "simulate",
            "--model",
            "resnet50",
            "--cluster",
            "v100-10gbe",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--strategy",
            "hipress",
            "--compressor",
            "onebit",
            "--jitter",
            "0.05",
            "--iterations",
            "3",
            "--format",
            "json",
        ],
    );
}

#[test]
fn a_trace_is_byte_for_byte_the_golden_one() {
    let dir = scratch("golden-trace");
    let trace = dir.join("trace.json");
    let out = syncopate(&[
        "simulate",
        "--model",
        "ncf",
        "--cluster",
        "dgx-a100",
        "--nodes",
        "2",
        "--strategy",
        "mergecomp",
        "--compressor",
        "topk:0.01",
        "--iterations",
        "2",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    compare("trace-mergecomp-ncf.json", &std::fs::read(&trace).unwrap());
}

#[test]
fn tune_and_sweep_are_byte_for_byte_the_golden_ones() {
    run(
        "tune-ddp-resnet50.json",
        &[
            "tune",
            "--model",
            "resnet50",
            "--cluster",
            "v100-10gbe",
            "--nodes",
            "2",
            "--framework",
            "ddp",
            "--format",
            "json",
        ],
    );
    let dir = scratch("golden-sweep");
    let out = syncopate(&[
        "sweep",
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "1,2,4",
        "--strategy",
        "horovod,ddp",
        "--compressor",
        "none,fp16",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    compare(
        "sweep-resnet50.csv",
        &std::fs::read(dir.join("sweep.csv")).unwrap(),
    );
}
