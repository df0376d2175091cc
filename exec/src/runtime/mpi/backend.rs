//! The MPI backend: one rank per process, the CPU backend core over MPI streams.
//!
//! Ranks are started by mpirun, srun or `syncopate lab run --mpi`. It runs the job-wide launch
//! policy, and rank 0 gathers every rank's records and `--check` data.

use super::coordinate::MpiBoard;
use super::transport::Stream;
use super::world::World;
use crate::compress::Codec;
use crate::error::{ExecError, Result};
use crate::runtime::check::{CheckSink, Checker};
use crate::runtime::check_report::{replay, Collector};
use crate::runtime::cpu::{Collectives, CpuRun};
use crate::runtime::driver::{drive, Local};
use crate::runtime::host::busy::BusyWork;
use crate::runtime::pieces::Gradients;
use crate::runtime::sched::Failure;
use crate::runtime::{Job, Measured};
use std::sync::atomic::AtomicBool;
use std::time::Instant;
use syncopate_sim::base::time::SimTime;
use syncopate_sim::predict::engine::TaskRecord;

impl Collectives for Stream<'_> {
    fn allreduce(
        &self,
        payload: &mut Vec<u8>,
        element: usize,
        codec: &dyn Codec,
        abort: &AtomicBool,
    ) -> Result<()> {
        Stream::allreduce(self, payload, element, codec, abort)
    }
    fn allgather(&self, mine: Vec<u8>, abort: &AtomicBool) -> Result<Vec<Vec<u8>>> {
        Stream::allgather(self, mine, abort)
    }
}

/// Records as bytes: task, stream (u32), start, end (u64 ns).
fn encode_records(records: &[TaskRecord]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(records.len() * 24);
    for r in records {
        bytes.extend(r.task.to_le_bytes());
        bytes.extend(r.stream.to_le_bytes());
        bytes.extend(r.start.as_ns().to_le_bytes());
        bytes.extend(r.end.as_ns().to_le_bytes());
    }
    bytes
}

fn decode_records(rank: u32, bytes: &[u8]) -> Result<Vec<TaskRecord>> {
    if !bytes.len().is_multiple_of(24) {
        return Err(ExecError::Mpi {
            rank,
            operation: "gathering records".into(),
            message: format!("{} bytes are not whole records", bytes.len()),
        });
    }
    Ok(bytes
        .chunks_exact(24)
        .map(|c| TaskRecord {
            rank,
            task: u32::from_le_bytes(c[0..4].try_into().expect("4 bytes")),
            stream: u32::from_le_bytes(c[4..8].try_into().expect("4 bytes")),
            start: SimTime(u64::from_le_bytes(c[8..16].try_into().expect("8 bytes"))),
            end: SimTime(u64::from_le_bytes(c[16..24].try_into().expect("8 bytes"))),
        })
        .collect())
}

/// Runs this process's rank of the job. Rank 0 returns the whole run (every rank's records,
/// the `--check` verdicts); the other ranks return `None`.
pub fn execute(world: &World, job: &Job) -> Result<Option<Measured>> {
    let schedule = job.schedule;
    let options = job.options;
    if schedule.world.ranks() != world.size {
        return Err(ExecError::Sim(syncopate_sim::SimError::bad_value(
            "--plan",
            format!(
                "lowered for {} ranks ({} nodes × {})",
                schedule.world.ranks(),
                schedule.world.nodes,
                schedule.world.ranks_per_node
            ),
            format!(
                "the MPI job has {} processes: launch as many as the plan's world, or pass --nodes and --gpus-per-node to match the job",
                world.size
            ),
        )));
    }
    let streams = schedule.policy.comm_streams;
    let mut links = world.streams(streams, options.timeout)?;
    let control = world.streams(streams, options.timeout)?;
    let gather = world
        .streams(1, options.timeout)?
        .pop()
        .expect("one stream");
    let failure = Failure::default();
    // Calibrate compute with every rank of this machine's job busy at once.
    gather.barrier(failure.flag())?;
    let busy = BusyWork::for_rank_process();
    let gradients = Gradients::new(schedule, world.rank..world.rank + 1, options.seed);
    let collector = options.check.then(Collector::default);
    // Time zero is when every rank leaves this barrier, so that records compare across ranks.
    gather.barrier(failure.flag())?;
    let epoch = Instant::now();
    let run: CpuRun<Stream> = CpuRun::new(
        job,
        &gradients,
        collector.as_ref().map(|c| c as &dyn CheckSink),
        busy,
        epoch,
        &failure,
    );
    let board = MpiBoard::new(
        world.rank,
        &schedule.policy,
        &job.program,
        control,
        epoch,
        options.timeout,
    );
    let state = run.rank_state(world.rank);
    let local = vec![Local {
        rank: world.rank,
        state: &state,
        openers: std::mem::take(&mut links),
    }];
    drive(&run, job, &board, &failure, local)?;
    let records = run.into_records();
    let check = collector.map(Collector::encode);
    let abort = failure.flag();
    if world.rank != 0 {
        gather.send_data(0, encode_records(&records), "this rank's records", abort)?;
        if let Some(check) = check {
            gather.send_data(0, check, "this rank's --check data", abort)?;
        }
        return Ok(None);
    }
    let checker = check
        .map(|bytes| -> Result<Checker> {
            let checker = Checker::new(schedule, options.seed);
            replay(&checker, 0, &bytes)?;
            Ok(checker)
        })
        .transpose()?;
    let mut all = records;
    for rank in 1..world.size {
        let bytes = gather.receive_data(rank as usize, "a rank's records", abort)?;
        all.extend(decode_records(rank, &bytes)?);
        if let Some(checker) = &checker {
            let bytes = gather.receive_data(rank as usize, "a rank's --check data", abort)?;
            replay(checker, rank, &bytes)?;
        }
    }
    Ok(Some(Measured::from_records(
        &job.program,
        all,
        world.size,
        checker.map(|c| c.report()).unwrap_or_default(),
    )))
}
