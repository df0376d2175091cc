//! The CPU backends' shared core, over any transport with the collectives of [`Collectives`].
//!
//! It holds a rank's buffers and codecs, compute as a calibrated busy loop, and the synchronization
//! primitives on the real CPU kernels; the transport is in-process channels or MPI.

use super::alltoall;
use super::backend::{Backend, Lane};
use super::check::CheckSink;
use super::gather_check::{digest, GatherDigests};
use super::params::{self, Held};
use super::piece_state::PieceState;
use super::pieces::{self, wire_element_bytes, Gradients};
use super::push_pull::{self, Messages};
use super::ring::{self, Ring, RingLink};
use super::sched::Failure;
use super::Job;
use crate::compress::Codec;
use crate::error::Result;
use crate::runtime::host::busy::BusyWork;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Instant;
use syncopate_sim::base::time::SimTime;
use syncopate_sim::predict::engine::TaskRecord;
use syncopate_sim::schedule::{Exchange, Op, StepKind};

/// One rank's end of a communication stream: the collectives a schedule's exchanges need,
/// the rings of `runtime::ring` and the push/pull of `runtime::push_pull` among them.
pub(super) trait Collectives: RingLink + Messages + Send {
    /// Allreduce in the wire type (elements of `element` bytes, summed by the codec).
    fn allreduce(
        &self,
        payload: &mut Vec<u8>,
        element: usize,
        codec: &dyn Codec,
        abort: &AtomicBool,
    ) -> Result<()>;
    /// Every rank's payload, of any length, in rank order.
    fn allgather(&self, mine: Vec<u8>, abort: &AtomicBool) -> Result<Vec<Vec<u8>>>;
}

pub(super) struct RankState {
    rank: u32,
    groups: Vec<Mutex<Vec<f32>>>,
    pieces: Vec<Mutex<PieceState>>,
    /// A sharded plan's units: the rank's shard and gather buffer of each.
    units: Vec<Held>,
}

/// Everything the threads of a CPU run share; `L` is the transport's link type.
pub(super) struct CpuRun<'a, L> {
    pub job: &'a Job<'a>,
    pub gradients: &'a Gradients,
    pub checker: Option<&'a dyn CheckSink>,
    pub busy: BusyWork,
    pub world: u32,
    /// Time zero of the run's records (aligned across processes by a barrier).
    pub epoch: Instant,
    pub failure: &'a Failure,
    pub records: Mutex<Vec<TaskRecord>>,
    _link: std::marker::PhantomData<fn(&L)>,
}

impl<'a, L> CpuRun<'a, L> {
    pub(super) fn new(
        job: &'a Job<'a>,
        gradients: &'a Gradients,
        checker: Option<&'a dyn CheckSink>,
        busy: BusyWork,
        epoch: Instant,
        failure: &'a Failure,
    ) -> Self {
        CpuRun {
            job,
            gradients,
            checker,
            busy,
            world: job.schedule.world.ranks(),
            epoch,
            failure,
            records: Mutex::new(Vec::new()),
            _link: std::marker::PhantomData,
        }
    }

    /// Rank `rank`'s buffers, codecs and memories.
    pub(super) fn rank_state(&self, rank: u32) -> RankState {
        rank_state(self.job, rank)
    }

    /// The records of every task this process ran.
    pub(super) fn into_records(self) -> Vec<TaskRecord> {
        self.records.into_inner().expect("the record lock")
    }
}

fn rank_state(job: &Job, rank: u32) -> RankState {
    let schedule = job.schedule;
    let seed = job.options.seed;
    RankState {
        rank,
        groups: schedule
            .buffers
            .iter()
            .map(|b| Mutex::new(vec![0.0; b.numel as usize]))
            .collect(),
        pieces: (0..schedule.pieces.len())
            .map(|i| Mutex::new(PieceState::new(schedule, seed, i, rank)))
            .collect(),
        units: job.units.iter().map(|u| u.held(seed, rank)).collect(),
    }
}

impl<L> CpuRun<'_, L> {
    fn now(&self) -> SimTime {
        SimTime(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Records a synchronization step that ran on `lane` from `start`: every rank's
    /// compression steps, a collective once (rank 0's).
    fn record_on<K>(&self, state: &RankState, lane: &Lane<K>, task: u32, start: SimTime) {
        if matches!(lane, Lane::Codec) || state.rank == 0 {
            self.record(state.rank, task, lane.trace_stream(), start);
        }
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

impl<L: Collectives> Backend for CpuRun<'_, L> {
    type Rank = RankState;
    type Piece = PieceState;
    type Opener = L;
    type Link = L;
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

    /// The links are made before the threads start: the rank's end is handed over as is.
    fn open(&self, _: &RankState, _: u32, link: L) -> Result<L> {
        Ok(link)
    }

    /// Times the step on the wall clock; collectives are recorded once, by rank 0. The
    /// `--check` reports follow the step (inside the timing: `--check` slows every rank
    /// alike, and the run says its timings are not representative).
    fn timed(
        &self,
        state: &RankState,
        lane: &Lane<L>,
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
            if step.ops.contains(&Op::Compensate) {
                checker.input(index, state.rank, iteration, piece.compensated());
            }
            if step.ops.contains(&Op::Decode) {
                checker.result(index, state.rank, iteration, piece.result())?;
            }
        }
        drop(piece);
        self.record_on(state, lane, task, start);
        Ok(())
    }

    /// The all-gather of the unit's shards over the stream's ring (`params`), the iteration's
    /// first agreeing on the float8 scales before it; under `--check` the rank reports digests
    /// of the shard it sent, of the scales it cast it with and of every shard it then holds.
    fn gather(&self, state: &RankState, lane: &Lane<L>, task: u32) -> Result<()> {
        let Lane::Comm { link, .. } = *lane else {
            unreachable!("the schedule puts gathers on communication streams")
        };
        let StepKind::Gather { group, pass } = self.job.step(task).kind else {
            unreachable!("the driver runs only gather steps here")
        };
        let start = self.now();
        let at = self.job.program.task(task);
        let (unit, held) = (
            &self.job.units[group as usize],
            &state.units[group as usize],
        );
        let mut buffer = held
            .buffer(unit, pass)
            .lock()
            .expect("a gather buffer lock");
        let version = params::version(pass, at.iteration);
        if unit.agrees_before(pass) {
            let abort = self.failure.flag();
            params::agree_scales(&self.job.units, &state.units, link, version, abort)?;
        }
        let sent = unit.put_own(held, (pass, version), &mut buffer)?;
        let sent = self
            .checker
            .map(|_| (digest(sent), unit.scales_digest(held)));
        unit.gather(link, pass, &mut buffer, self.failure.flag())?;
        unit.decode(held, pass, &buffer)?;
        if let (Some(checker), Some(sent)) = (self.checker, sent) {
            let held = unit.shards(pass, &buffer).map(digest).collect();
            let (sent, scales) = sent;
            let digests = GatherDigests { sent, scales, held };
            checker.gathered(at.step, state.rank, at.iteration, &digests)?;
        }
        drop(buffer);
        self.record_on(state, lane, task, start);
        Ok(())
    }

    fn compensate(
        &self,
        state: &RankState,
        _: &Lane<L>,
        piece: &mut PieceState,
        index: usize,
    ) -> Result<()> {
        let spec = self.piece(index);
        let buffer = state.groups[spec.group as usize]
            .lock()
            .expect("a group buffer lock");
        piece.compensate(spec, &buffer)
    }

    fn encode(
        &self,
        _: &RankState,
        _: &Lane<L>,
        piece: &mut PieceState,
        index: usize,
    ) -> Result<()> {
        piece.encode(self.piece(index))
    }

    fn next_round(
        &self,
        _: &RankState,
        _: &Lane<L>,
        piece: &mut PieceState,
        _: usize,
    ) -> Result<()> {
        piece.next_round()
    }

    fn exchange(
        &self,
        _: &RankState,
        lane: &Lane<L>,
        piece: &mut PieceState,
        index: usize,
        round: u32,
    ) -> Result<()> {
        let Lane::Comm { link, .. } = *lane else {
            unreachable!("the schedule puts exchanges on communication streams")
        };
        let spec = self.piece(index);
        let element = wire_element_bytes(&spec.compressor);
        let abort = self.failure.flag();
        let world = self.world as usize;
        let ring = Ring::world(link.rank(), world);
        match spec.rounds[round as usize].exchange {
            Exchange::Allreduce => {
                link.allreduce(&mut piece.payload, element, &*piece.codec, abort)
            }
            Exchange::HierarchicalAllreduce => ring::hierarchical_allreduce(
                link,
                world,
                self.job.schedule.world.ranks_per_node as usize,
                &mut piece.payload,
                element,
                &*piece.codec,
                abort,
            ),
            // DeAR: the reduce-scatter half in backward, the all-gather half later; a sharded
            // plan's unit: the reduce-scatter alone (hybrid sharding's: the node's, then the
            // shard across nodes), after which the rank keeps its shard of the sum.
            exchange @ (Exchange::ReduceScatter | Exchange::HybridReduceScatter) => {
                let payload = &mut piece.payload;
                let codec = &*piece.codec;
                let schedule_world = &self.job.schedule.world;
                if exchange == Exchange::HybridReduceScatter {
                    let per_node = schedule_world.ranks_per_node as usize;
                    ring::hybrid_reduce_scatter(
                        link, world, per_node, payload, element, codec, abort,
                    )?;
                } else {
                    ring::reduce_scatter(link, &ring, payload, element, codec, abort)?;
                }
                if pieces::ends_scattered(spec) {
                    let split = pieces::scatter_ranks(spec, schedule_world);
                    ring::keep_summed_chunk(&Ring::node(link.rank(), split), payload, element);
                }
                Ok(())
            }
            // ZeRO++'s quantized gradients: each chunk's payload to the rank that keeps it.
            Exchange::AlltoallReduceScatter => {
                let Some((_, chunks)) = &piece.alltoall else {
                    unreachable!("a piece exchanged by an all-to-all has its chunks")
                };
                let world = self.job.schedule.world;
                let codec = &mut *piece.codec;
                piece.gathered =
                    alltoall::reduce_scatter(link, world, codec, &piece.payload, chunks, abort)?;
                Ok(())
            }
            Exchange::AllgatherShards => {
                ring::allgather_chunks(link, &ring, &mut piece.payload, element, abort)
            }
            Exchange::Allgather => {
                piece.gathered = link.allgather(piece.payload.clone(), abort)?;
                Ok(())
            }
            Exchange::CompressedRing => piece.compressed_ring(spec, link, &ring, abort),
            Exchange::PushPull { server } => {
                piece.payload = push_pull::push_pull(
                    link,
                    std::mem::take(&mut piece.payload),
                    server as usize,
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
        _: &Lane<L>,
        piece: &mut PieceState,
        index: usize,
    ) -> Result<()> {
        piece.decode(self.piece(index), None)
    }

    fn update_memory(
        &self,
        _: &RankState,
        _: &Lane<L>,
        piece: &mut PieceState,
        index: usize,
    ) -> Result<()> {
        piece.update_memory(self.piece(index), self.world)
    }

    fn scale_output(
        &self,
        _: &RankState,
        _: &Lane<L>,
        piece: &mut PieceState,
        _: usize,
    ) -> Result<()> {
        piece.scale_output();
        Ok(())
    }
}
