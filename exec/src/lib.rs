//! Syncopate's execution crate: CPU gradient-compression kernels with real wire formats, the host profiler, and the runtime that executes plans.

pub mod compress;
pub mod error;
pub mod lab;
pub mod profile_host;
pub mod runtime;

/// The MPI transport. It lives under `runtime/mpi/` beside the other backends; declared here
/// while `runtime/mod.rs` is being reworked.
#[cfg(feature = "mpi")]
#[path = "runtime/mpi/mod.rs"]
pub mod mpi;

pub use error::{ExecError, Result};
