//! Syncopate's execution crate: CPU gradient-compression kernels with real wire formats, the host profiler, and the runtime that executes plans.

pub mod compress;
pub mod error;
pub mod profile_cluster;
pub mod profile_host;
pub mod runtime;

pub use error::{ExecError, Result};
