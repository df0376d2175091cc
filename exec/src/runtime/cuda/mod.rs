//! The CUDA backend: NVRTC kernels, NCCL collectives, CUDA-event timing.
//!
//! It uses one stream per simulated resource.

pub mod codec;
mod compressed_ring;
mod device_piece;
pub mod foreign;
pub mod gemm;
pub(crate) mod kernels;
mod links;
mod memory;
mod nccl;
pub mod probe;
mod run;
mod server;

use super::check::{Checker, GroupCheck};
use super::check_report;
use super::control::{Control, Liveness};
use super::sched::Failure;
use super::{launch, rendezvous, Job, Measured};
use crate::error::{ExecError, Result};
use cudarc::nccl::Id;
use std::sync::Arc;

/// This backend as the refusal of a sharded plan names it.
const RUNTIME: &str = "the cuda backend";

/// Runs the job on the visible GPUs: every one of them from this process, or this process's
/// one GPU when a launcher (torchrun, Open MPI, Slurm) set rank and world size. Then the
/// rendezvous connections stay open as the control plane for the whole run, so a rank that
/// dies or fails stops every other rank with an error naming it, and under `--check` every rank
/// sends rank 0 its inputs and results over it at the end, for rank 0 to check them all.
pub fn execute(job: &Job) -> Result<Measured> {
    super::refuse_sharded(job.schedule, RUNTIME)?;
    let options = job.options;
    let gpus = probe::probe()?;
    let streams = job.schedule.policy.comm_streams as usize;
    let failure = Arc::new(Failure::default());
    let Some(info) = launch::from_env(|v| std::env::var(v).ok())? else {
        let placement = run::Placement {
            world: gpus as u32,
            local: (0..gpus).map(|d| (d as u32, d)).collect(),
            ids: (0..streams)
                .map(|_| Id::new())
                .collect::<Result<_, _>>()
                .map_err(nccl_err)?,
        };
        return run::execute(job, placement, &failure).map(|(measured, _)| measured);
    };
    if info.local_rank as usize >= gpus {
        return Err(ExecError::Launch {
            variable: "LOCAL_RANK".into(),
            message: format!(
                "local rank {} but only {gpus} GPU(s) visible",
                info.local_rank
            ),
        });
    }
    let (bytes, link) = rendezvous::exchange(
        &info.master,
        info.rank,
        info.world,
        || {
            let mut bytes = Vec::with_capacity(128 * streams);
            for _ in 0..streams {
                let id = Id::new().map_err(nccl_err)?;
                bytes.extend(id.internal().iter().map(|&c| c as u8));
            }
            Ok(bytes)
        },
        options.timeout,
    )?;
    let control = Control::start(
        info.rank,
        link,
        Liveness::for_run(options.timeout),
        failure.clone(),
    )?;
    // From here on every failure, this rank's too, goes out over the control plane.
    let ran = unique_ids(&bytes, streams, &info.master).and_then(|ids| {
        let placement = run::Placement {
            world: info.world,
            local: vec![(info.rank, info.local_rank as usize)],
            ids,
        };
        run::execute(job, placement, &failure)
    });
    let (mut measured, mut report) = match ran {
        Ok((measured, report)) => (Ok(measured), report),
        Err(err) => (Err(err), None),
    };
    // Every rank but 0 sends its --check data to rank 0 with its final frame.
    let sent = if info.rank == 0 { None } else { report.take() };
    let reports = control.finish(measured.as_ref().err(), sent);
    if let (Ok(measured), Some(own)) = (&mut measured, report) {
        measured.checks = check_all(job, info.world, &own, &reports)?;
    }
    measured
}

/// Rank 0 under `--check`: every rank's check data (its own, then each other rank's report)
/// replayed into one checker, which checks as in one process.
fn check_all(
    job: &Job,
    world: u32,
    own: &[u8],
    reports: &[(u32, Vec<u8>)],
) -> Result<Vec<GroupCheck>> {
    let checker = Checker::new(job.schedule, job.options.seed);
    check_report::replay(&checker, 0, own)?;
    for rank in 1..world {
        let Some((_, bytes)) = reports.iter().find(|(r, _)| *r == rank) else {
            return Err(ExecError::Rank {
                rank,
                message: "sent rank 0 no --check data".into(),
            });
        };
        check_report::replay(&checker, rank, bytes)?;
    }
    Ok(checker.report())
}

fn nccl_err(e: cudarc::nccl::result::NcclError) -> ExecError {
    ExecError::Cuda {
        message: format!("cannot create an NCCL unique id: {e:?}"),
    }
}

/// The `streams` NCCL ids rank 0 sent (128 bytes each); a different count means the ranks
/// run plans with different numbers of comm streams.
fn unique_ids(bytes: &[u8], streams: usize, master: &str) -> Result<Vec<Id>> {
    if bytes.len() != 128 * streams {
        return Err(ExecError::Rendezvous {
            address: master.into(),
            message: format!(
                "got {} bytes of NCCL ids, expected {} (do all ranks run the same plan?)",
                bytes.len(),
                128 * streams
            ),
        });
    }
    Ok(bytes
        .chunks(128)
        .map(|chunk| {
            let mut internal = [0 as std::ffi::c_char; 128];
            for (i, &b) in internal.iter_mut().zip(chunk) {
                *i = b as std::ffi::c_char;
            }
            Id::uninit(internal)
        })
        .collect())
}
