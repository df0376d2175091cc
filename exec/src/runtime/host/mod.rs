//! The host backend: ranks as CPU threads (one per simulated stream), the real CPU compression kernels, collectives over in-process channels, wall-clock timing. It runs the whole exec path on a laptop or in CI; it is not a cluster backend.

pub(super) mod board;
pub mod busy;
pub mod comm;
pub mod profile;

use super::check::{ps_server, Checker};
use super::driver::{drive, Local, Tasks};
use super::layout::{wire_element_bytes, Gradients, Layout};
use super::sched::Failure;
use super::{ExecOptions, Measured};
use crate::compress::{Codec, MemoryState};
use crate::error::Result;
use board::Board;
use busy::BusyWork;
use comm::Mesh;
use std::sync::Mutex;
use std::time::Instant;
use syncopate_sim::compress::{Aggregation, Memory};
use syncopate_sim::engine::TaskRecord;
use syncopate_sim::graph::{TaskGraph, TaskKind};
use syncopate_sim::plan::Scheme;
use syncopate_sim::scenario::Scenario;
use syncopate_sim::time::SimTime;

/// One rank's buffers and codec state for one piece.
struct PieceState {
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

struct RankState {
    rank: u32,
    groups: Vec<Mutex<Vec<f32>>>,
    pieces: Vec<Mutex<PieceState>>,
}

/// Everything the threads of a run share.
struct Run<'a> {
    graph: &'a TaskGraph,
    layout: &'a Layout,
    gradients: &'a Gradients,
    checker: Option<&'a Checker>,
    busy: BusyWork,
    world: u32,
    epoch: Instant,
    failure: Failure,
    records: Mutex<Vec<TaskRecord>>,
}

/// Runs the scenario's task graph on `ranks` thread-ranks and times every task.
pub fn execute(
    scenario: &Scenario,
    graph: &TaskGraph,
    options: &ExecOptions,
    ranks: u32,
    busy: BusyWork,
) -> Result<Measured> {
    let layout = Layout::new(scenario, options.seed);
    let gradients = Gradients::new(scenario, ranks, options.seed);
    let checker = options.check.then(|| Checker::new(&layout, ranks));
    let policy = &scenario.plan.policy;
    let streams = policy.comm_streams;
    let epoch = Instant::now();
    let run = Run {
        graph,
        layout: &layout,
        gradients: &gradients,
        checker: checker.as_ref(),
        busy,
        world: ranks,
        epoch,
        failure: Failure::default(),
        records: Mutex::new(Vec::new()),
    };
    let board = Board::new(
        graph,
        ranks,
        policy.launch,
        SimTime::from_us(policy.cycle_time_us).as_ns(),
        streams,
        epoch,
        options.timeout,
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
    for ends in comm::meshes(streams, ranks, options.timeout) {
        for (rank, mesh) in local.iter_mut().zip(ends) {
            rank.openers.push(mesh);
        }
    }
    drive(&run, graph, &board, options.timeout, &run.failure, local)?;
    let records = run.records.into_inner().expect("the record lock");
    Ok(Measured::from_records(
        graph,
        records,
        ranks,
        checker.map(|c| c.report()).unwrap_or_default(),
    ))
}

fn rank_state(run: &Run, rank: u32) -> RankState {
    let layout = run.layout;
    RankState {
        rank,
        groups: layout
            .group_numel
            .iter()
            .map(|&n| Mutex::new(vec![0.0; n]))
            .collect(),
        pieces: (0..layout.pieces.len())
            .map(|i| {
                let n = layout.pieces[i].range.len();
                Mutex::new(PieceState {
                    codec: layout.codec(i, Some(rank)),
                    server_codec: layout.codec(i, None),
                    memory: layout.memory(i),
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

    fn encode(
        &self,
        state: &RankState,
        index: usize,
        piece: &mut PieceState,
        iteration: u32,
    ) -> Result<()> {
        let spec = &self.layout.pieces[index];
        {
            let buffer = state.groups[spec.group]
                .lock()
                .expect("a group buffer lock");
            piece
                .memory
                .compensate(&buffer[spec.range.clone()], &mut piece.compensated)?;
        }
        if let Some(checker) = self.checker {
            checker.input(index, state.rank, iteration, &piece.compensated);
        }
        piece.codec.encode(&piece.compensated, &mut piece.payload)?;
        if spec.memory != Memory::None {
            piece.own.clone_from(&piece.payload);
        }
        Ok(())
    }

    fn decode(
        &self,
        rank: u32,
        index: usize,
        piece: &mut PieceState,
        iteration: u32,
    ) -> Result<()> {
        let spec = &self.layout.pieces[index];
        let PieceState {
            codec,
            memory,
            compensated,
            payload,
            own,
            gathered,
            result,
            transmitted,
            ..
        } = piece;
        result.fill(0.0);
        match spec.aggregation {
            Aggregation::Allreduce | Aggregation::ParameterServer => {
                codec.decode_add(payload, result)?
            }
            Aggregation::Allgather => {
                for payload in gathered.iter() {
                    codec.decode_add(payload, result)?;
                }
            }
        }
        if spec.memory != Memory::None {
            // Error feedback keeps what this rank's own payload did not carry. A multi-round
            // codec (PowerSGD) has no payload of its own to decode: its transmitted part is the
            // averaged low-rank result, as in PyTorch's hook.
            if spec.compressor.allreduce_rounds() > 1 {
                let world = self.world as f32;
                for (t, &r) in transmitted.iter_mut().zip(result.iter()) {
                    *t = r / world;
                }
            } else {
                transmitted.fill(0.0);
                codec.decode_add(own, transmitted)?;
            }
            memory.update(compensated, transmitted)?;
        }
        if let Some(checker) = self.checker {
            checker.result(index, spec.group, spec.aggregation, rank, iteration, result)?;
        }
        let scale = memory.output_scale();
        if scale != 1.0 {
            result.iter_mut().for_each(|x| *x *= scale);
        }
        Ok(())
    }
}

impl Tasks for Run<'_> {
    type Rank = RankState;
    type Opener = Mesh;
    type Link = Mesh;
    /// Host compute is done when `compute` returns.
    type Running = std::convert::Infallible;

    /// Busy work of the task's duration; a backward task also writes its synthetic gradient.
    fn compute(&self, state: &RankState, task: u32) -> Result<Option<Self::Running>> {
        let start = self.now();
        let t = self.graph.task(task);
        self.busy.run_for(t.duration.as_ns());
        if let TaskKind::Backward { tensor } = t.kind {
            let (group, offset, numel) = self.layout.tensor_slot[tensor as usize];
            let mut buffer = state.groups[group].lock().expect("a group buffer lock");
            self.gradients.fill(
                state.rank,
                t.iteration,
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

    fn codec(&self, state: &RankState, task: u32) -> Result<()> {
        let start = self.now();
        let t = self.graph.task(task);
        let index = self.layout.piece_of(&t.kind);
        let mut piece = state.pieces[index].lock().expect("a piece lock");
        if matches!(t.kind, TaskKind::Encode { .. }) {
            self.encode(state, index, &mut piece, t.iteration)?;
        } else {
            self.decode(state.rank, index, &mut piece, t.iteration)?;
        }
        drop(piece);
        self.record(state.rank, task, 0, start);
        Ok(())
    }

    /// The meshes are built before the threads start: the rank's end is handed over as is.
    fn open(&self, _: &RankState, _: u32, mesh: Mesh) -> Result<Mesh> {
        Ok(mesh)
    }

    /// The collective on this rank's end of the stream's mesh.
    fn collective(&self, state: &RankState, mesh: &Mesh, stream: u32, task: u32) -> Result<()> {
        let start = self.now();
        let t = self.graph.task(task);
        let TaskKind::Collective { round, .. } = t.kind else {
            unreachable!("only collectives reach the board")
        };
        let piece_index = self.layout.piece_of(&t.kind);
        let spec = &self.layout.pieces[piece_index];
        let mut guard = state.pieces[piece_index].lock().expect("a piece lock");
        let piece = &mut *guard;
        if round == 0 && !spec.has_encode {
            self.encode(state, piece_index, piece, t.iteration)?;
        }
        let split = spec.scheme == Scheme::ReduceScatterAllgather;
        if round > 0 && !split {
            let reduced = std::mem::take(&mut piece.payload);
            piece.codec.next_round(&reduced, &mut piece.payload)?;
        }
        let element = wire_element_bytes(&spec.compressor);
        let abort = self.failure.flag();
        match spec.aggregation {
            // DeAR: the reduce-scatter half in backward, the all-gather half later.
            Aggregation::Allreduce if split && round == 0 => {
                mesh.reduce_scatter(&mut piece.payload, element, &*piece.codec, abort)?
            }
            Aggregation::Allreduce if split => {
                mesh.allgather_chunks(&mut piece.payload, element, abort)?
            }
            Aggregation::Allreduce => {
                mesh.allreduce(&mut piece.payload, element, &*piece.codec, abort)?
            }
            Aggregation::Allgather => {
                piece.gathered = mesh.allgather(piece.payload.clone(), abort)?
            }
            Aggregation::ParameterServer => {
                piece.payload = mesh.push_pull(
                    std::mem::take(&mut piece.payload),
                    ps_server(spec.group, self.world as usize),
                    &mut *piece.codec,
                    &mut *piece.server_codec,
                    spec.range.len(),
                    abort,
                )?
            }
        }
        if round + 1 == spec.rounds() && !spec.has_decode {
            self.decode(state.rank, piece_index, piece, t.iteration)?;
        }
        drop(guard);
        if state.rank == 0 {
            self.record(0, task, stream, start);
        }
        Ok(())
    }
}
