//! The synchronization sequence, written once for every backend.
//!
//! A step's ops run in the schedule's order, on its piece, through the backend's primitives.

use super::backend::{Backend, Lane};
use super::Job;
use crate::error::Result;
use syncopate_sim::schedule::{Op, StepKind};

/// Runs task `task` (an encode, collective or decode step) on `lane`, timed by the backend.
pub(super) fn run_sync_task<B: Backend>(
    backend: &B,
    job: &Job,
    rank: &B::Rank,
    lane: &Lane<B::Link>,
    task: u32,
) -> Result<()> {
    let step = job.step(task);
    let index = step
        .piece
        .expect("a synchronization step names its piece (checked when the schedule is loaded)")
        as usize;
    let round = match step.kind {
        StepKind::Collective { round, .. } => round,
        _ => 0,
    };
    backend.timed(rank, lane, task, index, &mut |piece| {
        for op in &step.ops {
            match op {
                Op::Compensate => backend.compensate(rank, lane, piece, index)?,
                Op::Encode => backend.encode(rank, lane, piece, index)?,
                Op::NextRound => backend.next_round(rank, lane, piece, index)?,
                Op::Exchange => backend.exchange(rank, lane, piece, index, round)?,
                Op::Decode => backend.decode(rank, lane, piece, index)?,
                Op::UpdateMemory => backend.update_memory(rank, lane, piece, index)?,
                Op::ScaleOutput => backend.scale_output(rank, lane, piece, index)?,
            }
        }
        Ok(())
    })
}
