//! The host backend: ranks as CPU threads of this process, over in-process channels.
//!
//! One thread per stream; the CPU backend core (`cpu.rs`) runs over the in-process channels, with
//! wall-clock timing. It runs the whole exec path on a laptop or in CI; it is not a cluster
//! backend.

pub mod busy;
pub mod comm;

use super::board::LocalBoard;
use super::check::{CheckSink, Checker};
use super::cpu::{Collectives, CpuRun};
use super::driver::{drive, Local};
use super::pieces::Gradients;
use super::ring::{self, Ring};
use super::sched::Failure;
use super::{Job, Measured};
use crate::compress::Codec;
use crate::error::{ExecError, Result};
use busy::BusyWork;
use comm::Mesh;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Runs the job on `ranks` thread-ranks, which must be the schedule's world, and times every
/// task.
pub fn execute(job: &Job, ranks: u32, busy: BusyWork) -> Result<Measured> {
    let schedule = job.schedule;
    if ranks != schedule.world.ranks() {
        return Err(ExecError::Sim(syncopate_sim::SimError::bad_value(
            "--ranks",
            ranks,
            format!(
                "the plan was lowered for {} ranks ({} nodes × {}); run that many",
                schedule.world.ranks(),
                schedule.world.nodes,
                schedule.world.ranks_per_node
            ),
        )));
    }
    let seed = job.options.seed;
    let gradients = Gradients::new(schedule, 0..ranks, seed);
    let checker = job.options.check.then(|| Checker::new(schedule, seed));
    let streams = schedule.policy.comm_streams;
    let epoch = Instant::now();
    let failure = Failure::default();
    let run: CpuRun<Mesh> = CpuRun::new(
        job,
        &gradients,
        checker.as_ref().map(|c| c as &dyn CheckSink),
        busy,
        epoch,
        &failure,
    );
    let board = LocalBoard::new(
        &schedule.policy,
        &job.program,
        ranks,
        epoch,
        job.options.timeout,
    );
    let states: Vec<_> = (0..ranks).map(|r| run.rank_state(r)).collect();
    // The meshes come stream by stream; each rank takes its end of every stream.
    let mut local: Vec<Local<CpuRun<Mesh>>> = states
        .iter()
        .zip(0..)
        .map(|(state, rank)| Local {
            rank,
            state,
            openers: Vec::new(),
        })
        .collect();
    for ends in comm::meshes(streams, ranks, job.options.timeout) {
        for (rank, mesh) in local.iter_mut().zip(ends) {
            rank.openers.push(mesh);
        }
    }
    drive(&run, job, &board, &failure, local)?;
    Ok(Measured::from_records(
        &job.program,
        run.into_records(),
        ranks,
        checker.map(|c| c.report()).unwrap_or_default(),
    ))
}

impl Collectives for Mesh {
    fn allreduce(
        &self,
        payload: &mut Vec<u8>,
        element: usize,
        codec: &dyn Codec,
        abort: &AtomicBool,
    ) -> Result<()> {
        let ring = Ring::world(self.rank as usize, self.world as usize);
        ring::allreduce(self, &ring, payload, element, codec, abort)
    }
    fn allgather(&self, mine: Vec<u8>, abort: &AtomicBool) -> Result<Vec<Vec<u8>>> {
        Mesh::allgather(self, mine, abort)
    }
}
