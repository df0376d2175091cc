//! The host backend: ranks as CPU threads (one per stream), the real CPU compression kernels, collectives over in-process channels, wall-clock timing. It runs the whole exec path on a laptop or in CI; it is not a cluster backend.

pub mod busy;
pub mod comm;
pub mod profile;

use super::backend::{Backend, Lane};
use super::board::Board;
use super::check::Checker;
use super::driver::{drive, Local};
use super::pieces::{self, wire_element_bytes, Gradients};
use super::sched::Failure;
use super::{Job, Measured};
use crate::compress::{Codec, MemoryState};
use crate::error::{ExecError, Result};
use busy::BusyWork;
use comm::Mesh;
use std::sync::Mutex;
use std::time::Instant;
use syncopate_sim::compress::{Aggregation, Memory};
use syncopate_sim::engine::TaskRecord;
use syncopate_sim::schedule::{Exchange, StepKind};
use syncopate_sim::time::SimTime;

/// One rank's buffers and codec state for one piece.
pub struct PieceState {
    codec: Box<dyn Codec>,
    server_codec: Box<dyn Codec>,
    memory: MemoryState,
    compensated: Vec<f32>,
    payload: Vec<u8>,
    /// This rank's own payload, kept for error feedback when the collective overwrites it.
    own: Vec<u8>,
    gathered: Vec<Vec<u8>>,
    result: Vec<f32>,
    transmitted: Vec<f32>,
}

pub struct RankState {
    rank: u32,
    groups: Vec<Mutex<Vec<f32>>>,
    pieces: Vec<Mutex<PieceState>>,
}

/// Everything the threads of a run share.
struct Run<'a> {
    job: &'a Job<'a>,
    gradients: &'a Gradients,
    checker: Option<&'a Checker>,
    busy: BusyWork,
    world: u32,
    epoch: Instant,
    failure: Failure,
    records: Mutex<Vec<TaskRecord>>,
}

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
    let gradients = Gradients::new(schedule, ranks, seed);
    let checker = job.options.check.then(|| Checker::new(schedule, seed));
    let streams = schedule.policy.comm_streams;
    let epoch = Instant::now();
    let run = Run {
        job,
        gradients: &gradients,
        checker: checker.as_ref(),
        busy,
        world: ranks,
        epoch,
        failure: Failure::default(),
        records: Mutex::new(Vec::new()),
    };
    let board = Board::new(
        &schedule.policy,
        &job.program,
        ranks,
        epoch,
        job.options.timeout,
    );
    let states: Vec<RankState> = (0..ranks).map(|r| rank_state(&run, r)).collect();
    // The meshes come stream by stream; each rank takes its end of every stream.
    let mut local: Vec<Local<Run>> = states
        .iter()
        .map(|state| Local {
            rank: state.rank,
            state,
            openers: Vec::new(),
        })
        .collect();
    for ends in comm::meshes(streams, ranks, job.options.timeout) {
        for (rank, mesh) in local.iter_mut().zip(ends) {
            rank.openers.push(mesh);
        }
    }
    drive(&run, job, &board, &run.failure, local)?;
    let records = run.records.into_inner().expect("the record lock");
    Ok(Measured::from_records(
        &job.program,
        records,
        ranks,
        checker.map(|c| c.report()).unwrap_or_default(),
    ))
}

fn rank_state(run: &Run, rank: u32) -> RankState {
    let schedule = run.job.schedule;
    let seed = run.job.options.seed;
    RankState {
        rank,
        groups: schedule
            .buffers
            .iter()
            .map(|b| Mutex::new(vec![0.0; b.numel as usize]))
            .collect(),
        pieces: schedule
            .pieces
            .iter()
            .enumerate()
            .map(|(i, piece)| {
                let n = piece.numel as usize;
                Mutex::new(PieceState {
                    codec: pieces::codec(schedule, seed, i, Some(rank)),
                    server_codec: pieces::codec(schedule, seed, i, None),
                    memory: pieces::memory(piece),
                    compensated: Vec::with_capacity(n),
                    payload: Vec::new(),
                    own: Vec::new(),
                    gathered: Vec::new(),
                    result: vec![0.0; n],
                    transmitted: vec![0.0; n],
                })
            })
            .collect(),
    }
}

impl Run<'_> {
    fn now(&self) -> SimTime {
        SimTime(self.epoch.elapsed().as_nanos() as u64)
    }

    fn record(&self, rank: u32, task: u32, stream: u32, start: SimTime) {
        let end = self.now();
        self.records
            .lock()
            .expect("the record lock")
            .push(TaskRecord {
                rank,
                task,
                stream,
                start,
                end,
            });
    }

    fn piece(&self, index: usize) -> &syncopate_sim::schedule::Piece {
        &self.job.schedule.pieces[index]
    }
}

impl Backend for Run<'_> {
    type Rank = RankState;
    type Piece = PieceState;
    type Opener = Mesh;
    type Link = Mesh;
    /// Host compute is done when `compute` returns.
    type Running = std::convert::Infallible;

    /// Busy work of the task's duration; a backward task also writes its synthetic gradient.
    fn compute(&self, state: &RankState, task: u32) -> Result<Option<Self::Running>> {
        let start = self.now();
        self.busy.run_for(self.job.compute_ns(task));
        if let StepKind::Backward { tensor } = self.job.step(task).kind {
            let iteration = self.job.program.task(task).iteration;
            let (group, slot) = self.job.slots[tensor as usize];
            let (offset, numel) = (slot.offset as usize, slot.numel as usize);
            let mut buffer = state.groups[group as usize]
                .lock()
                .expect("a group buffer lock");
            self.gradients.fill(
                state.rank,
                iteration,
                tensor as usize,
                &mut buffer[offset..offset + numel],
            );
        }
        self.record(state.rank, task, 0, start);
        Ok(None)
    }

    fn is_done(&self, running: &Self::Running) -> Result<bool> {
        match *running {}
    }

    fn finish(&self, _: &RankState, _: u32, running: Self::Running) -> Result<()> {
        match running {}
    }

    /// The meshes are built before the threads start: the rank's end is handed over as is.
    fn open(&self, _: &RankState, _: u32, mesh: Mesh) -> Result<Mesh> {
        Ok(mesh)
    }

    /// Times the step on the wall clock; collectives are recorded once, by rank 0. The
    /// `--check` reports follow the step (inside the timing: on the host, `--check`
    /// slows every rank alike).
    fn timed(
        &self,
        state: &RankState,
        lane: &Lane<Mesh>,
        task: u32,
        index: usize,
        body: &mut dyn FnMut(&mut PieceState) -> Result<()>,
    ) -> Result<()> {
        let start = self.now();
        let mut piece = state.pieces[index].lock().expect("a piece lock");
        body(&mut piece)?;
        if let Some(checker) = self.checker {
            let step = self.job.step(task);
            let iteration = self.job.program.task(task).iteration;
            if step.ops.contains(&syncopate_sim::schedule::Op::Compensate) {
                checker.input(index, state.rank, iteration, &piece.compensated);
            }
            if step.ops.contains(&syncopate_sim::schedule::Op::Decode) {
                checker.result(index, state.rank, iteration, &piece.result)?;
            }
        }
        drop(piece);
        if matches!(lane, Lane::Codec) || state.rank == 0 {
            self.record(state.rank, task, lane.trace_stream(), start);
        }
        Ok(())
    }

    fn compensate(
        &self,
        state: &RankState,
        _: &Lane<Mesh>,
        piece: &mut PieceState,
        index: usize,
    ) -> Result<()> {
        let spec = self.piece(index);
        let buffer = state.groups[spec.group as usize]
            .lock()
            .expect("a group buffer lock");
        piece
            .memory
            .compensate(&buffer[pieces::range(spec)], &mut piece.compensated)
    }

    fn encode(
        &self,
        _: &RankState,
        _: &Lane<Mesh>,
        piece: &mut PieceState,
        index: usize,
    ) -> Result<()> {
        piece.codec.encode(&piece.compensated, &mut piece.payload)?;
        if self.piece(index).memory != Memory::None {
            piece.own.clone_from(&piece.payload);
        }
        Ok(())
    }

    fn next_round(
        &self,
        _: &RankState,
        _: &Lane<Mesh>,
        piece: &mut PieceState,
        _: usize,
    ) -> Result<()> {
        let reduced = std::mem::take(&mut piece.payload);
        piece.codec.next_round(&reduced, &mut piece.payload)
    }

    fn exchange(
        &self,
        _: &RankState,
        lane: &Lane<Mesh>,
        piece: &mut PieceState,
        index: usize,
        round: u32,
    ) -> Result<()> {
        let Lane::Comm { link: mesh, .. } = lane else {
            unreachable!("the schedule puts exchanges on communication streams")
        };
        let spec = self.piece(index);
        let element = wire_element_bytes(&spec.compressor);
        let abort = self.failure.flag();
        match spec.rounds[round as usize].exchange {
            Exchange::Allreduce | Exchange::HierarchicalAllreduce => {
                mesh.allreduce(&mut piece.payload, element, &*piece.codec, abort)
            }
            // DeAR: the reduce-scatter half in backward, the all-gather half later.
            Exchange::ReduceScatter => {
                mesh.reduce_scatter(&mut piece.payload, element, &*piece.codec, abort)
            }
            Exchange::AllgatherShards => mesh.allgather_chunks(&mut piece.payload, element, abort),
            Exchange::Allgather => {
                piece.gathered = mesh.allgather(piece.payload.clone(), abort)?;
                Ok(())
            }
            Exchange::PushPull { .. } | Exchange::CompressedRing => {
                piece.payload = mesh.push_pull(
                    std::mem::take(&mut piece.payload),
                    pieces::server_rank(spec, self.world) as usize,
                    &mut *piece.codec,
                    &mut *piece.server_codec,
                    spec.numel as usize,
                    abort,
                )?;
                Ok(())
            }
        }
    }

    fn decode(
        &self,
        _: &RankState,
        _: &Lane<Mesh>,
        piece: &mut PieceState,
        index: usize,
    ) -> Result<()> {
        piece.result.fill(0.0);
        match self.piece(index).aggregation {
            Aggregation::Allreduce | Aggregation::ParameterServer => {
                piece.codec.decode_add(&piece.payload, &mut piece.result)
            }
            Aggregation::Allgather => {
                for payload in &piece.gathered {
                    piece.codec.decode_add(payload, &mut piece.result)?;
                }
                Ok(())
            }
        }
    }

    fn update_memory(
        &self,
        _: &RankState,
        _: &Lane<Mesh>,
        piece: &mut PieceState,
        index: usize,
    ) -> Result<()> {
        // Error feedback keeps what this rank's own payload did not carry. A multi-round codec
        // (PowerSGD) has no payload of its own to decode: its transmitted part is the averaged
        // low-rank result, as in PyTorch's hook.
        if self.piece(index).compressor.allreduce_rounds() > 1 {
            let world = self.world as f32;
            for (t, &r) in piece.transmitted.iter_mut().zip(&piece.result) {
                *t = r / world;
            }
        } else {
            piece.transmitted.fill(0.0);
            piece.codec.decode_add(&piece.own, &mut piece.transmitted)?;
        }
        piece.memory.update(&piece.compensated, &piece.transmitted)
    }

    fn scale_output(
        &self,
        _: &RankState,
        _: &Lane<Mesh>,
        piece: &mut PieceState,
        _: usize,
    ) -> Result<()> {
        let scale = piece.memory.output_scale();
        piece.result.iter_mut().for_each(|x| *x *= scale);
        Ok(())
    }
}
