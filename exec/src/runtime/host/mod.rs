//! The host backend: ranks as CPU threads (one per simulated stream), the real CPU compression kernels, collectives over in-process channels, wall-clock timing. It runs the whole exec path on a laptop or in CI; it is not a cluster backend.

pub(super) mod board;
pub mod busy;
pub mod comm;
pub mod profile;

use super::check::{ps_server, Checker};
use super::layout::{wire_element_bytes, Gradients, Layout};
use super::sched::{Readiness, Sched};
use super::{ExecOptions, Measured};
use crate::compress::{Codec, MemoryState};
use crate::error::{ExecError, Result};
use board::Board;
use busy::BusyWork;
use comm::Mesh;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use syncopate_sim::compress::{Aggregation, Memory};
use syncopate_sim::engine::TaskRecord;
use syncopate_sim::graph::{Resource, TaskGraph, TaskKind};
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
    readiness: Readiness,
    groups: Vec<Mutex<Vec<f32>>>,
    pieces: Vec<Mutex<PieceState>>,
}

/// Everything the threads of a run share.
struct Run<'a> {
    graph: &'a TaskGraph,
    layout: &'a Layout,
    gradients: &'a Gradients,
    checker: Option<&'a Checker>,
    board: Board,
    busy: BusyWork,
    world: u32,
    epoch: Instant,
    timeout: Duration,
    abort: AtomicBool,
    first_error: Mutex<Option<ExecError>>,
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
        board: Board::new(
            graph,
            ranks,
            policy.launch,
            SimTime::from_us(policy.cycle_time_us).as_ns(),
            streams,
            epoch,
            options.timeout,
        ),
        busy,
        world: ranks,
        epoch,
        timeout: options.timeout,
        abort: AtomicBool::new(false),
        first_error: Mutex::new(None),
        records: Mutex::new(Vec::new()),
    };
    let states: Vec<RankState> = (0..ranks).map(|r| rank_state(&run, r)).collect();
    let mut meshes = comm::meshes(streams, ranks, options.timeout);
    std::thread::scope(|scope| {
        for state in &states {
            let run = &run;
            scope.spawn(move || run.guard(|| run.compute_thread(state)));
            scope.spawn(move || run.guard(|| run.codec_thread(state)));
        }
        for (stream, ends) in meshes.drain(..).enumerate() {
            for (state, mesh) in states.iter().zip(ends) {
                let run = &run;
                scope.spawn(move || run.guard(|| run.comm_thread(state, stream as u32, &mesh)));
            }
        }
    });
    if let Some(err) = run.first_error.lock().expect("the error lock").take() {
        return Err(err);
    }
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
        readiness: Readiness::new(rank, run.graph),
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
    /// Runs a thread's body; the first failure aborts every other thread.
    fn guard(&self, body: impl FnOnce() -> Result<()>) {
        if let Err(err) = body() {
            let mut first = self.first_error.lock().expect("the error lock");
            if first.is_none() {
                *first = Some(err);
            }
            self.abort.store(true, Ordering::Relaxed);
            self.board.wake_all();
        }
    }

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

    /// Marks `task` done on `state`'s rank and releases its successors.
    fn complete(&self, state: &RankState, task: u32) {
        state.readiness.complete(self.graph, &self.board, task);
    }

    /// Waits until `pick` finds something in the rank's scheduler state, within the timeout.
    fn wait_for<T>(
        &self,
        state: &RankState,
        what: &str,
        pick: impl FnMut(&mut Sched) -> Option<T>,
    ) -> Result<T> {
        state
            .readiness
            .wait_for(what, self.timeout, &self.abort, pick)
    }

    /// Forward, backward and optimizer tasks in program order, as busy work of their duration.
    fn compute_thread(&self, state: &RankState) -> Result<()> {
        let tasks = (0..self.graph.len() as u32)
            .filter(|&t| self.graph.task(t).resource == Resource::Compute);
        for task in tasks {
            self.wait_for(state, "a compute task's input", |s| {
                (s.pending[task as usize] == 0).then_some(())
            })?;
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
            self.complete(state, task);
        }
        Ok(())
    }

    /// Encode and decode tasks, first ready first served.
    fn codec_thread(&self, state: &RankState) -> Result<()> {
        let count = self
            .graph
            .graph
            .node_weights()
            .filter(|t| matches!(t.resource, Resource::Codec | Resource::Cpu))
            .count();
        for _ in 0..count {
            let task = self.wait_for(state, "a compression task", |s| s.codec_queue.pop_front())?;
            let start = self.now();
            let t = self.graph.task(task);
            match t.kind {
                TaskKind::Encode { group, part } => {
                    let index = self.layout.piece_index(group, part);
                    let mut piece = state.pieces[index].lock().expect("a piece lock");
                    self.encode(state, index, &mut piece, t.iteration)?;
                }
                TaskKind::Decode { group, part } => {
                    let index = self.layout.piece_index(group, part);
                    let mut piece = state.pieces[index].lock().expect("a piece lock");
                    self.decode(state.rank, index, &mut piece, t.iteration)?;
                }
                _ => unreachable!("only compression tasks run on the codec stream"),
            }
            self.record(state.rank, task, 0, start);
            self.complete(state, task);
        }
        Ok(())
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

    /// Collectives in the order the board decides, on this rank's end of the stream's mesh.
    fn comm_thread(&self, state: &RankState, stream: u32, mesh: &Mesh) -> Result<()> {
        let mut index = 0;
        while let Some(task) = self.board.next(stream, index, state.rank, &self.abort)? {
            index += 1;
            let start = self.now();
            let t = self.graph.task(task);
            let TaskKind::Collective { group, part, round } = t.kind else {
                unreachable!("only collectives reach the board")
            };
            let piece_index = self.layout.piece_index(group, part);
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
            match spec.aggregation {
                // DeAR: the reduce-scatter half in backward, the all-gather half later.
                Aggregation::Allreduce if split && round == 0 => {
                    mesh.reduce_scatter(&mut piece.payload, element, &*piece.codec, &self.abort)?
                }
                Aggregation::Allreduce if split => {
                    mesh.allgather_chunks(&mut piece.payload, element, &self.abort)?
                }
                Aggregation::Allreduce => mesh.allreduce(
                    &mut piece.payload,
                    wire_element_bytes(&spec.compressor),
                    &*piece.codec,
                    &self.abort,
                )?,
                Aggregation::Allgather => {
                    piece.gathered = mesh.allgather(piece.payload.clone(), &self.abort)?
                }
                Aggregation::ParameterServer => {
                    piece.payload = mesh.push_pull(
                        std::mem::take(&mut piece.payload),
                        ps_server(spec.group, self.world as usize),
                        &mut *piece.codec,
                        &mut *piece.server_codec,
                        spec.range.len(),
                        &self.abort,
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
            self.complete(state, task);
        }
        Ok(())
    }
}
