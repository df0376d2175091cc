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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_plans::{small_sharded, small_sharded_with};
    use crate::runtime::{self, ExecOptions};
    use std::time::Duration;
    use syncopate_sim::compress::Compressor;
    use syncopate_sim::schedule::{Pass, StepKind};
    use syncopate_sim::sharding::ParamDtype;
    use syncopate_sim::strategy::ShardOptions;

    /// ZeRO-1, ZeRO-2 and FSDP plans run on three thread-ranks, gathering in fp32, bf16 and
    /// ZeRO++'s int8, and
    /// reducing uncompressed, in bf16, fp16 and random-k, and HSDP on two nodes of two: every
    /// rank's reduced gradient (FSDP's reduce-scattered shard) matches the reference, and every
    /// gather of every unit in every iteration gave every rank every shard of its split.
    #[test]
    fn sharded_plans_run_and_check_every_shard_and_gather() {
        let options = ExecOptions {
            warmup: 1,
            iterations: 2,
            check: true,
            seed: 3,
            timeout: Duration::from_secs(30),
        };
        for (strategy, spec, dtype, (nodes, per_node)) in [
            ("fsdp", "none", ParamDtype::Fp32, (1, 3)),
            ("fsdp", "randomk:0.5", ParamDtype::Bf16, (1, 3)),
            ("zero1", "bf16", ParamDtype::Fp32, (1, 3)),
            ("zero2", "fp16", ParamDtype::Bf16, (1, 3)),
            // Hybrid sharding: each node splits and gathers among its own ranks.
            ("hsdp", "bf16", ParamDtype::Bf16, (2, 2)),
            ("fsdp", "bf16", ParamDtype::Int8, (1, 3)),
            ("hsdp", "none", ParamDtype::Int8, (2, 2)),
            // Payloads that do not sum as they are: an all-to-all of each rank's chunks
            // (ZeRO++'s quantized gradients).
            // (in two hops on several nodes of several ranks, re-encoding the node's sums).
            ("fsdp", "int8:8", ParamDtype::Int8, (1, 3)),
            ("fsdp", "topk:0.5", ParamDtype::Fp32, (2, 2)),
            ("fsdp", "int4:4", ParamDtype::Int8, (2, 3)),
            ("fsdp", "qsgd:16", ParamDtype::Bf16, (3, 2)),
        ] {
            let what = format!("{strategy} {spec} {dtype:?}");
            let schedule = small_sharded(strategy, spec, dtype, (nodes, per_node));
            let summable = spec.parse::<Compressor>().unwrap().summed_as().is_some();
            let alltoall = schedule.pieces.iter().all(|p| p.alltoall_scattered());
            assert_eq!(
                alltoall,
                strategy == "fsdp" && !summable,
                "{strategy} {spec}"
            );
            let ranks = nodes * per_node;
            let job = Job::new(&schedule, 0.0, &options, ranks).unwrap();
            let measured = runtime::execute(runtime::Backend::Host { ranks }, &job);
            let measured = measured.unwrap_or_else(|err| panic!("{what}: {err}"));
            // Warm-up, the iteration between, two measured.
            assert_eq!(measured.iteration_end.len(), 4, "{what}");
            assert_eq!(measured.checks.len(), schedule.param_shards.len(), "{what}");
            for check in &measured.checks {
                assert!(check.ok && check.checked == 4, "{what}: {check:?}");
                let gathers = schedule
                    .steps
                    .iter()
                    .filter(|s| {
                        matches!(s.kind, StepKind::Gather { group, .. } if group as usize == check.group)
                    })
                    .count() as u32;
                assert!(gathers > 0, "{what}");
                assert_eq!(check.gathers_checked, 4 * gathers, "{what}: {check:?}");
            }
        }
    }

    /// ZeRO++'s hpZ on two nodes of three: each unit is gathered over all six ranks before
    /// forward and, from the second shards each rank cut from that gather, over its node's
    /// three before backward; every shard of both checked, in fp32 and in int8.
    #[test]
    fn hpz_gathers_before_backward_inside_the_node_from_second_shards() {
        let options = ExecOptions {
            warmup: 1,
            iterations: 2,
            check: true,
            seed: 5,
            timeout: Duration::from_secs(30),
        };
        for (dtype, spec) in [(ParamDtype::Fp32, "none"), (ParamDtype::Int8, "int4:4")] {
            let sharding = ShardOptions {
                param_dtype: dtype,
                secondary_within_node: true,
                ..ShardOptions::default()
            };
            let schedule = small_sharded_with("fsdp", spec, sharding, (2, 3));
            let shard = schedule.param_shards[0];
            assert!(shard.secondary_bytes.is_some() && !shard.within_node);
            assert!(shard.for_pass(Pass::Backward).within_node);
            let job = Job::new(&schedule, 0.0, &options, 6).unwrap();
            let measured = runtime::execute(runtime::Backend::Host { ranks: 6 }, &job);
            let measured = measured.unwrap_or_else(|err| panic!("{dtype:?}: {err}"));
            for check in &measured.checks {
                assert!(
                    check.ok && check.gathers_checked > 0,
                    "{dtype:?}: {check:?}"
                );
            }
        }
    }
}
