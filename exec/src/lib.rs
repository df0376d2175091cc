//! Syncopate's execution crate: CPU compression kernels, the host profiler and the plan runtime.
//!
//! The CPU gradient-compression kernels write real wire formats, and the runtime executes plans.

#![deny(missing_docs)]

pub mod compress;
pub mod error;
pub mod lab;
pub mod profile_cluster;
pub mod profile_host;
pub mod runtime;

#[cfg(feature = "mpi")]
pub use runtime::mpi;

pub use error::{ExecError, Result};
