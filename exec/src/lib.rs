//! Syncopate's execution crate: CPU gradient-compression kernels with real wire formats, the host profiler, and the runtime that executes plans.

pub mod compress;
pub mod error;
pub mod lab;
pub mod profile_cluster;
pub mod profile_host;
pub mod runtime;

#[cfg(feature = "mpi")]
pub use runtime::mpi;

pub use error::{ExecError, Result};
