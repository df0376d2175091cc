//! The CUDA backend: NVRTC kernels, NCCL collectives, one stream per simulated resource, CUDA-event timing.

pub mod codec;
pub mod gemm;
mod kernels;
mod powersgd;
pub mod probe;
mod profile;
mod run;
mod select;

pub use profile::{profile, CudaProfile, CudaProfileOptions};

use super::{launch, rendezvous, ExecOptions, Measured};
use crate::error::{ExecError, Result};
use cudarc::nccl::Id;
use syncopate_sim::graph::TaskGraph;
use syncopate_sim::scenario::Scenario;

/// Runs the graph on the visible GPUs: every one of them from this process, or this process's
/// one GPU when a launcher (torchrun, Open MPI, Slurm) set rank and world size.
pub fn execute(scenario: &Scenario, graph: &TaskGraph, options: &ExecOptions) -> Result<Measured> {
    let gpus = probe::probe()?;
    let streams = scenario.plan.policy.comm_streams as usize;
    let nccl = |e: cudarc::nccl::result::NcclError| ExecError::Cuda {
        message: format!("cannot create an NCCL unique id: {e:?}"),
    };
    let placement = match launch::from_env(|v| std::env::var(v).ok())? {
        None => run::Placement {
            world: gpus as u32,
            local: (0..gpus).map(|d| (d as u32, d)).collect(),
            ids: (0..streams)
                .map(|_| Id::new())
                .collect::<Result<_, _>>()
                .map_err(nccl)?,
        },
        Some(info) => {
            if info.local_rank as usize >= gpus {
                return Err(ExecError::Launch {
                    variable: "LOCAL_RANK".into(),
                    message: format!(
                        "local rank {} but only {gpus} GPU(s) visible",
                        info.local_rank
                    ),
                });
            }
            let bytes = rendezvous::exchange(
                &info.master,
                info.rank,
                info.world,
                || {
                    let mut bytes = Vec::with_capacity(128 * streams);
                    for _ in 0..streams {
                        let id = Id::new().map_err(nccl)?;
                        bytes.extend(id.internal().iter().map(|&c| c as u8));
                    }
                    Ok(bytes)
                },
                options.timeout,
            )?;
            if bytes.len() != 128 * streams {
                return Err(ExecError::Rendezvous {
                    address: info.master.clone(),
                    message: format!(
                        "got {} bytes of NCCL ids, expected {}",
                        bytes.len(),
                        128 * streams
                    ),
                });
            }
            let ids = bytes
                .chunks(128)
                .map(|chunk| {
                    let mut internal = [0 as std::ffi::c_char; 128];
                    for (i, &b) in internal.iter_mut().zip(chunk) {
                        *i = b as std::ffi::c_char;
                    }
                    Id::uninit(internal)
                })
                .collect();
            run::Placement {
                world: info.world,
                local: vec![(info.rank, info.local_rank as usize)],
                ids,
            }
        }
    };
    run::execute(scenario, graph, options, placement)
}
