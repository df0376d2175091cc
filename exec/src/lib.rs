//! Syncopate's execution crate: CPU gradient-compression kernels with real wire formats, and the host profiler.

pub mod compress;
pub mod error;
pub mod profile_host;

pub use error::{ExecError, Result};
