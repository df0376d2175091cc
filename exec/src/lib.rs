//! Syncopate's execution crate: CPU compression kernels, the host profiler and the plan runtime.
//!
//! The CPU gradient-compression kernels write real wire formats, and the runtime executes plans.
//!
//! # Running a plan for real
//!
//! The simulator's [`syncopate_sim::schedule::Schedule`] is what a backend runs: every rank
//! computes for its steps' profiled time (scaled), encodes its groups with the real codecs
//! ([`compress`]), exchanges the payloads (host threads, MPI processes or NCCL on GPUs) and
//! decodes them, in the order and on the streams the simulator priced. With `check` on, every
//! aggregated gradient is compared with a reference computed beside the run.
//!
//! ```
//! use std::time::Duration;
//! use syncopate_exec::runtime::{self, Backend, ExecOptions, Job};
//! use syncopate_sim::inputs::model::ModelProfile;
//! use syncopate_sim::predict::scenario::Scenario;
//! use syncopate_sim::predict::simulate::schedule;
//! use syncopate_sim::strategy::{Strategy, StrategyOptions};
//! use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
//!
//! // A small CNN (226,570 parameters) on one machine's 2 ranks, Horovod's plan cast to fp16.
//! let model = ModelProfile::load("../experiments/dgc-accuracy/digits.json")?;
//! let two = ClusterOverrides { nodes: Some(1), gpus_per_node: Some(2), ..Default::default() };
//! let scenario = Scenario::new(model, Cluster::load("v100-10gbe", two)?)?;
//! let options = StrategyOptions { compressor: "fp16".parse()?, ..StrategyOptions::default() };
//! let plan = Strategy::Horovod.plan(&scenario, &options)?;
//! let schedule = schedule(&scenario, &plan)?;
//! let run = ExecOptions {
//!     warmup: 1,
//!     iterations: 2,
//!     check: true,
//!     seed: 7,
//!     timeout: Duration::from_secs(60),
//! };
//! // Two threads of this process, each busy for the profiled compute, sending real payloads.
//! let job = Job::new(&schedule, 1.0, &run, 2)?;
//! let measured = runtime::execute(Backend::Host { ranks: 2 }, &job)?;
//! // The warm-up, one between it and the measured ones (syncopate_sim::inputs::real_run), and
//! // those two.
//! assert_eq!(measured.iteration_end.len(), 4);
//! assert!(!measured.checks.is_empty() && measured.checks.iter().all(|group| group.ok));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Where things are
//!
//! - [`compress`]: the codecs, one per compressor of the catalog, with their wire formats.
//! - [`runtime`]: the driver every backend shares (readiness, launch order, checking) and the
//!   host, MPI and CUDA backends.
//! - [`lab`]: emulated clusters of network namespaces on this machine, and their fits.
//! - [`measure`]: the measurements of this machine that become device and cluster files (codec
//!   costs, the host backend's collectives, the cluster files fitted to them).
//! - [`tool`]: external programs run with bounded waits (the lab's tools, the CUDA probe's Python).

#![deny(missing_docs, unreachable_pub)]

// The CUDA API of the bindings is one feature or the other (see Cargo.toml).
#[cfg(all(feature = "cuda-12", feature = "cuda-13"))]
compile_error!(
    "the features cuda-12 and cuda-13 exclude each other: build cuda-13 with --no-default-features"
);

pub mod compress;
pub mod error;
pub mod lab;
pub mod measure;
pub mod runtime;
pub mod tool;

#[cfg(feature = "mpi")]
pub use runtime::mpi;

pub use error::{ExecError, Result};
