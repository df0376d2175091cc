//! The CUDA backend: NVRTC kernels, NCCL collectives, one stream per simulated resource, CUDA-event timing.

pub mod codec;
pub mod gemm;
mod kernels;
pub mod probe;

use super::{ExecOptions, Measured};
use crate::error::{ExecError, Result};
use syncopate_sim::graph::TaskGraph;
use syncopate_sim::scenario::Scenario;

/// Runs the graph on the visible GPUs.
pub fn execute(
    _scenario: &Scenario,
    _graph: &TaskGraph,
    _options: &ExecOptions,
) -> Result<Measured> {
    let gpus = probe::probe()?;
    Err(ExecError::Cuda {
        message: format!(
            "found {gpus} GPU(s), but plan execution on CUDA is not in this build yet"
        ),
    })
}

/// Measures the GPU into a device profile.
pub fn profile(_name: &str) -> Result<syncopate_sim::device::DeviceProfile> {
    let gpus = probe::probe()?;
    Err(ExecError::Cuda {
        message: format!("found {gpus} GPU(s), but GPU profiling is not in this build yet"),
    })
}
