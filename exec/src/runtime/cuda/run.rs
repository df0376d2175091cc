//! Runs a schedule on GPUs: CUDA streams, NCCL collectives, CUDA-event timing of every task.
//!
//! Each rank has one CUDA stream per schedule stream (compute, codec, each comm stream).
//!
//! The threads are the host backend's (`driver.rs`): per rank one thread per stream, the same
//! launch board deciding the collective order, the same FIFO codec queue. A thread enqueues
//! its task between two timing events on its stream and waits (bounded, abortable) for the end
//! event before releasing the successors, so the board and the codec queue see real GPU
//! completion times and every cross-stream dependency is met before the dependent work is
//! enqueued (compute tasks whose inputs are earlier compute tasks are enqueued behind them
//! without waiting, and completed as their end events come in). Event times are converted to the run's host clock through an epoch event
//! recorded when the host clock was read.
//!
//! Aggregation: NCCL allreduce (DeAR: its reduce-scatter and all-gather halves), the
//! hierarchical allreduce over node communicators split from the world's (`links.rs`),
//! allgather, a parameter server's push/pull (`server.rs`), or HiPress's CaSync-Ring, hop by hop
//! over NCCL sends and receives (`compressed_ring.rs`). Error feedback (residual, EF-SignSGD,
//! DGC) is `memory.rs`.
//!
//! Launch modes: one process driving every visible GPU (one rank per GPU, NCCL communicators
//! created on each rank's own thread with one shared unique id), or one process per GPU (rank
//! and world from `launch.rs`, the ids exchanged over `rendezvous.rs`, other processes'
//! failures raised by `control.rs` into the run's `Failure`). Every wait is bounded and watches
//! that failure; a communicator is finalized and destroyed after its last collective, aborted
//! after a failure (`nccl.rs`).

use super::compressed_ring::{self, GpuShards};
use super::device_piece::DevicePiece;
use super::gemm::Gemm;
use super::kernels::{cuda_err, Kernels};
use super::links::Links;
use super::nccl::Communicator;
use super::server::{push_pull, Server};
use crate::error::{ExecError, Result};
use crate::runtime::backend::{Backend, Lane};
use crate::runtime::board::LocalBoard;
use crate::runtime::check::{CheckSink, Checker};
use crate::runtime::check_report::Collector;
use crate::runtime::driver::{drive, Local};
use crate::runtime::pieces::{self, Gradients};
use crate::runtime::sched::{check_abort, Failure};
use crate::runtime::{Job, Measured};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DeviceRepr};
use cudarc::nccl::{Id, NcclType};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use syncopate_sim::base::time::SimTime;
use syncopate_sim::compress::{Aggregation, Element, Memory};
use syncopate_sim::predict::engine::TaskRecord;
use syncopate_sim::schedule::{Exchange, Op, Schedule, StepKind, Stream};

/// fp16 and bf16 elements as NCCL sees them (the payload buffers are bytes).
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
struct Half(u16);
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
struct Brain(u16);
// SAFETY: plain 16-bit values, valid for any bit pattern, laid out as u16.
unsafe impl DeviceRepr for Half {}
// SAFETY: as for Half.
unsafe impl DeviceRepr for Brain {}
impl NcclType for Half {
    fn as_nccl_type() -> cudarc::nccl::sys::ncclDataType_t {
        cudarc::nccl::sys::ncclDataType_t::ncclFloat16
    }
}
impl NcclType for Brain {
    fn as_nccl_type() -> cudarc::nccl::sys::ncclDataType_t {
        cudarc::nccl::sys::ncclDataType_t::ncclBfloat16
    }
}

/// Which ranks this process drives.
pub(super) struct Placement {
    pub world: u32,
    /// (global rank, device ordinal) of each rank driven here.
    pub local: Vec<(u32, usize)>,
    /// One NCCL unique id per comm stream, the same on every rank.
    pub ids: Vec<Id>,
}

pub(super) struct GpuPiece {
    device: DevicePiece,
    /// Padded to a multiple of the world size in elements, so NCCL's reduce-scatter splits it
    /// (one byte for a CaSync-Ring piece, which goes round in its shards' buffers).
    payload: CudaSlice<u8>,
    /// This rank's shard of the padded payload in DeAR's halves (one byte for other pieces).
    chunk: CudaSlice<u8>,
    /// This rank's share of its node's sum in a hierarchical allreduce: 1/per_node of the
    /// padded payload (one byte for a piece without one).
    node_share: CudaSlice<u8>,
    gathered: CudaSlice<u8>,
    /// Parameter-server aggregation, on the piece's server rank only.
    server: Option<Server>,
    /// A CaSync-Ring piece's shards: it is encoded, exchanged and decoded shard by shard.
    ring: Option<GpuShards>,
}

pub(super) struct GpuRank {
    rank: u32,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    codec: Arc<CudaStream>,
    comm: Vec<Arc<CudaStream>>,
    kernels: Kernels,
    gemm: Mutex<Gemm>,
    grads: CudaSlice<f32>,
    groups: Vec<Mutex<CudaSlice<f32>>>,
    pieces: Vec<Mutex<GpuPiece>>,
    /// Recorded on the compute stream when the host clock read `epoch_ns`.
    epoch_event: CudaEvent,
    epoch_ns: u64,
}

struct Run<'a> {
    job: &'a Job<'a>,
    gradients: &'a Gradients,
    checker: Option<&'a dyn CheckSink>,
    world: u32,
    epoch: Instant,
    timeout: Duration,
    failure: &'a Failure,
    records: Mutex<Vec<TaskRecord>>,
}

/// Refuses, before any GPU work, what this build cannot run.
fn check_plan(schedule: &Schedule, placement: &Placement) -> Result<()> {
    let multi_process = placement.local.len() < placement.world as usize;
    // The same rule as the MPI backend's: unless the order is fixed, one rank must decide it
    // for all, and this backend has no coordinator across processes.
    if multi_process && !schedule.policy.order_is_fixed() {
        return Err(ExecError::Cuda {
            message: "priority launch across processes needs a coordinator that this build lacks; run one process for all GPUs or a plan-order policy".into(),
        });
    }
    for (index, piece) in schedule.pieces.iter().enumerate() {
        DevicePiece::runs(index, piece)?;
        if let Some(why) = piece
            .compressed_ring()
            .then(|| compressed_ring::why_not(&piece.compressor))
            .flatten()
        {
            return Err(ExecError::Cuda {
                message: format!(
                    "pieces[{index}] (group {}) goes round a compressed ring, which the CUDA backend cannot run here: {why}; run it with --backend host or mpi",
                    piece.group
                ),
            });
        }
    }
    Ok(())
}

/// Runs the job on the ranks of `placement` and times every task. `failure` may be raised from
/// outside (another process's failure): the run then stops and reports it. Under `--check`, a
/// process that drives every rank checks them itself; one of several returns its ranks' check
/// data for rank 0 (`check_report`) instead.
pub(super) fn execute(
    job: &Job,
    placement: Placement,
    failure: &Failure,
) -> Result<(Measured, Option<Vec<u8>>)> {
    let schedule = job.schedule;
    let options = job.options;
    if schedule.world.ranks() != placement.world {
        return Err(ExecError::Sim(syncopate_sim::SimError::bad_value(
            "--plan",
            format!(
                "lowered for {} nodes × {} GPUs",
                schedule.world.nodes, schedule.world.ranks_per_node
            ),
            format!(
                "this run has {} ranks (the visible GPUs, or the launcher's world size); pass --nodes and --gpus-per-node to match",
                placement.world
            ),
        )));
    }
    let policy = &schedule.policy;
    check_plan(schedule, &placement)?;
    let single = placement.local.len() == placement.world as usize;
    let world = placement.world;
    let first = placement.local.iter().map(|&(r, _)| r).min().unwrap_or(0);
    let end = placement
        .local
        .iter()
        .map(|&(r, _)| r + 1)
        .max()
        .unwrap_or(0);
    let gradients = Gradients::new(schedule, first..end, options.seed);
    let checker = (options.check && single).then(|| Checker::new(schedule, options.seed));
    let collector = (options.check && !single).then(Collector::default);
    let sink: Option<&dyn CheckSink> = match (&checker, &collector) {
        (Some(checker), _) => Some(checker),
        (_, Some(collector)) => Some(collector),
        _ => None,
    };
    let epoch = Instant::now();
    let run = Run {
        job,
        gradients: &gradients,
        checker: sink,
        world,
        epoch,
        timeout: options.timeout,
        failure,
        records: Mutex::new(Vec::new()),
    };
    let ranks: Vec<GpuRank> = placement
        .local
        .iter()
        .map(|&(rank, device)| run.rank(rank, device, policy.comm_streams))
        .collect::<Result<_>>()?;
    let board = LocalBoard::new(
        policy,
        &job.program,
        placement.local.len() as u32,
        epoch,
        options.timeout,
    );
    let local = ranks
        .iter()
        .map(|state| Local {
            rank: state.rank,
            state,
            openers: placement.ids.clone(),
        })
        .collect();
    drive(&run, job, &board, failure, local)?;
    let records = run.records.into_inner().expect("the record lock");
    let measured = Measured::from_records(
        &job.program,
        records,
        world,
        checker.map(|c| c.report()).unwrap_or_default(),
    );
    Ok((measured, collector.map(Collector::encode)))
}

impl Run<'_> {
    fn rank(&self, rank: u32, device: usize, streams: u32) -> Result<GpuRank> {
        let ctx = CudaContext::new(device).map_err(cuda_err("cannot open the GPU"))?;
        // SAFETY: every cross-stream dependency is met on the host (a task's successors are
        // enqueued only after its end event completed; set-up ends with a synchronize), so
        // cudarc's per-buffer events would only add false ones, e.g. an encode waiting for a
        // later backward task that writes another tensor of the same fusion buffer.
        unsafe { ctx.disable_event_tracking() };
        let stream = cuda_err("cannot create a stream");
        let compute = ctx.new_stream().map_err(&stream)?;
        let codec = ctx.new_stream().map_err(&stream)?;
        let comm = (0..streams)
            .map(|_| ctx.new_stream())
            .collect::<Result<Vec<_>, _>>()
            .map_err(&stream)?;
        let kernels = Kernels::load(&ctx)?;
        let gemm = Gemm::calibrate(&kernels, &compute)?;
        let alloc = cuda_err("cannot allocate run buffers");
        let grads = compute
            .clone_htod(self.gradients.rank_values(rank))
            .map_err(&alloc)?;
        let schedule = self.job.schedule;
        let seed = self.job.options.seed;
        let groups = schedule
            .buffers
            .iter()
            .map(|b| {
                compute
                    .alloc_zeros((b.numel as usize).max(1))
                    .map(Mutex::new)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(&alloc)?;
        let world = self.world as usize;
        let mut pieces = Vec::with_capacity(schedule.pieces.len());
        for (i, spec) in schedule.pieces.iter().enumerate() {
            let n = spec.numel as usize;
            let device = DevicePiece::new(schedule, seed, i, rank, &codec)?;
            let bytes = device.codec.wire_bytes();
            let elem = pieces::wire_element_bytes(&spec.compressor);
            let padded = (bytes / elem).div_ceil(world) * world * elem;
            let node_share = match spec.hierarchical() {
                true => padded / schedule.world.ranks_per_node.max(1) as usize,
                false => 1,
            };
            let gathered = if spec.aggregation == Aggregation::Allgather {
                bytes * world
            } else {
                1
            };
            // A CaSync-Ring piece goes round in its shards' buffers; only DeAR's halves use a
            // chunk.
            let payload = if spec.compressed_ring() {
                1
            } else {
                padded.max(bytes)
            };
            let halves = spec.rounds.iter().any(|r| {
                matches!(
                    r.exchange,
                    Exchange::ReduceScatter | Exchange::AllgatherShards
                )
            });
            let chunk = if halves { padded / world } else { 1 };
            pieces.push(Mutex::new(GpuPiece {
                device,
                payload: codec.alloc_zeros(payload.max(1)).map_err(&alloc)?,
                chunk: codec.alloc_zeros(chunk.max(1)).map_err(&alloc)?,
                node_share: codec.alloc_zeros(node_share.max(1)).map_err(&alloc)?,
                gathered: codec.alloc_zeros(gathered.max(1)).map_err(&alloc)?,
                server: self.server(i, rank, &codec)?,
                ring: match spec.compressed_ring() {
                    true => Some(GpuShards::new(
                        &spec.compressor,
                        rank as usize,
                        world,
                        n,
                        |shard| pieces::shard_seed(schedule, seed, i, rank, shard),
                        &codec,
                    )?),
                    false => None,
                },
            }));
        }
        ctx.synchronize().map_err(cuda_err("set-up failed"))?;
        let epoch_ns = self.epoch.elapsed().as_nanos() as u64;
        let epoch_event = compute
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("cannot record the epoch event"))?;
        Ok(GpuRank {
            rank,
            ctx,
            compute,
            codec,
            comm,
            kernels,
            gemm: Mutex::new(gemm),
            grads,
            groups,
            pieces,
            epoch_event,
            epoch_ns,
        })
    }

    /// The server state of piece `index` when `rank` serves its group.
    fn server(&self, index: usize, rank: u32, stream: &Arc<CudaStream>) -> Result<Option<Server>> {
        let schedule = self.job.schedule;
        let spec = &schedule.pieces[index];
        if spec.aggregation != Aggregation::ParameterServer
            || spec.compressed_ring()
            || pieces::server_rank(spec, self.world) != rank
        {
            return Ok(None);
        }
        let seed = pieces::codec_seed(schedule, self.job.options.seed, index, None);
        Server::new(
            &spec.compressor,
            spec.numel as usize,
            &spec.shapes(),
            seed,
            self.world as usize,
            stream,
        )
        .map(Some)
    }

    fn aborted(&self, rank: u32) -> Result<()> {
        check_abort(self.failure.flag(), rank)
    }

    /// Records a timing event on `stream`.
    fn event(&self, stream: &Arc<CudaStream>) -> Result<CudaEvent> {
        stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("cannot record a timing event"))
    }

    /// Waits for `end` within the timeout, giving up when another thread failed.
    fn wait_event(&self, state: &GpuRank, end: &CudaEvent, what: &str) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if end.try_is_complete().map_err(cuda_err(what))? {
                return Ok(());
            }
            self.aborted(state.rank)?;
            if Instant::now() >= deadline {
                return Err(ExecError::Rank {
                    rank: state.rank,
                    message: format!(
                        "{what} did not complete within {:.1} s (a peer rank may be dead or stuck; its communicator is aborted)",
                        self.timeout.as_secs_f64()
                    ),
                });
            }
            // Successors are released only when this returns, so every µs of polling latency
            // is a gap in the measured timeline: yield instead of sleeping (a sleep lasts at
            // least the kernel's timer slack, 50 µs by default).
            std::thread::yield_now();
        }
    }

    /// Waits, bounded and abortable, until the work enqueued so far on `stream` is done; needed
    /// before a host read-back on a stream whose NCCL calls wait for peers.
    fn drain(&self, state: &GpuRank, stream: &Arc<CudaStream>, what: &str) -> Result<()> {
        let done = self.event(stream)?;
        self.wait_event(state, &done, what)
    }

    /// Enqueues `enqueue`'s work on `stream` between two timing events.
    fn enqueue_timed(
        &self,
        state: &GpuRank,
        stream: &Arc<CudaStream>,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<(CudaEvent, CudaEvent)> {
        state
            .ctx
            .bind_to_thread()
            .map_err(cuda_err("cannot bind the context"))?;
        let start = self.event(stream)?;
        enqueue()?;
        Ok((start, self.event(stream)?))
    }

    /// Waits for the work between `events` and records it as `task`.
    fn finish_timed(
        &self,
        state: &GpuRank,
        task: u32,
        lane: u32,
        (start, end): (CudaEvent, CudaEvent),
    ) -> Result<()> {
        self.wait_event(state, &end, "a task")?;
        // Event times are f32 ms: the start from the epoch (a few µs off after minutes), the
        // duration from the start (exact to the event resolution), so durations stay precise.
        let ms = |from: &CudaEvent, to: &CudaEvent| -> Result<u64> {
            let ms = from
                .elapsed_ms(to)
                .map_err(cuda_err("cannot read a timing event"))?;
            Ok((f64::from(ms) * 1e6).max(0.0) as u64)
        };
        let begin = SimTime(state.epoch_ns + ms(&state.epoch_event, &start)?);
        let record = TaskRecord {
            rank: state.rank,
            task,
            stream: lane,
            start: begin,
            end: SimTime(begin.as_ns() + ms(&start, &end)?),
        };
        let keep = self.job.step(task).stream != Stream::Comm || state.rank == 0;
        if keep {
            self.records.lock().expect("the record lock").push(record);
        }
        Ok(())
    }

    fn spec(&self, index: usize) -> &syncopate_sim::schedule::Piece {
        &self.job.schedule.pieces[index]
    }

    /// The CUDA stream of a lane.
    fn stream<'r>(&self, state: &'r GpuRank, lane: &Lane<Links>) -> &'r Arc<CudaStream> {
        match lane {
            Lane::Codec => &state.codec,
            Lane::Comm { stream, .. } => &state.comm[*stream as usize],
        }
    }

    /// After a step completed, outside its timing: the finite check of a fresh compression
    /// input and the `--check` copies of the input and of the (scaled) result.
    fn after(
        &self,
        state: &GpuRank,
        stream: &Arc<CudaStream>,
        index: usize,
        piece: &mut GpuPiece,
        ops: &[Op],
        iteration: u32,
    ) -> Result<()> {
        let n = self.spec(index).numel as usize;
        let read = cuda_err("cannot copy a result back for --check");
        if ops.contains(&Op::Compensate) {
            match &piece.ring {
                Some(ring) => ring.check_own(stream, &piece.device.compensated)?,
                None => piece.device.check_finite(stream)?,
            }
            if let Some(checker) = self.checker {
                let input = stream
                    .clone_dtoh(&piece.device.compensated.slice(..n))
                    .map_err(&read)?;
                checker.input(index, state.rank, iteration, &input);
            }
        }
        if let (true, Some(checker)) = (ops.contains(&Op::Decode), self.checker) {
            let result = stream
                .clone_dtoh(&piece.device.result.slice(..n))
                .map_err(&read)?;
            checker.result(index, state.rank, iteration, &result)?;
        }
        Ok(())
    }
}

impl<'a> Backend for Run<'a> {
    type Rank = GpuRank;
    type Piece = GpuPiece;
    type Opener = Id;
    type Link = Links<'a>;
    /// A compute task's start and end events.
    type Running = (CudaEvent, CudaEvent);

    /// Calibrated GEMMs of the task's duration; a backward task also writes its tensor's
    /// synthetic gradient.
    fn compute(&self, state: &GpuRank, task: u32) -> Result<Option<Self::Running>> {
        let stream = &state.compute;
        let kind = self.job.step(task).kind;
        let iteration = self.job.program.task(task).iteration;
        self.enqueue_timed(state, stream, || {
            state.gemm.lock().expect("the GEMM lock").run_for(
                &state.kernels,
                stream,
                self.job.compute_ns(task),
            )?;
            if let StepKind::Backward { tensor } = kind {
                let (group, slot) = self.job.slots[tensor as usize];
                let (offset, numel) = (slot.offset as usize, slot.numel as usize);
                let start = self.gradients.offset(tensor as usize);
                let src = state.grads.slice(start..start + numel);
                let mut buffer = state.groups[group as usize]
                    .lock()
                    .expect("a group buffer lock");
                let mut dst = buffer.slice_mut(offset..offset + numel);
                let (n, scale) = (numel as u32, Gradients::scale(iteration));
                state.kernels.scale_copy(stream, &src, &mut dst, n, scale)?;
            }
            Ok(())
        })
        .map(Some)
    }

    fn is_done(&self, (_, end): &Self::Running) -> Result<bool> {
        end.try_is_complete()
            .map_err(cuda_err("cannot query a compute task's end"))
    }

    fn finish(&self, state: &GpuRank, task: u32, events: Self::Running) -> Result<()> {
        self.finish_timed(state, task, 0, events)
    }

    /// This rank's NCCL communicators of stream `lane`, created on (and so aborted by) the
    /// comm thread, with the context bound: the world's, and the node ones if a piece is
    /// exchanged by a hierarchical allreduce.
    fn open(&self, state: &GpuRank, lane: u32, id: Id) -> Result<Links<'a>> {
        state
            .ctx
            .bind_to_thread()
            .map_err(cuda_err("cannot bind the context"))?;
        let world = Communicator::init(
            state.comm[lane as usize].clone(),
            state.rank,
            self.world,
            lane,
            id,
            self.timeout,
            self.failure.flag(),
        )?;
        let schedule = self.job.schedule;
        let hierarchical = schedule.pieces.iter().any(|p| p.hierarchical());
        Links::open(world, hierarchical.then_some(schedule.world.ranks_per_node))
    }

    fn close(&self, links: Links<'a>) -> Result<()> {
        links.finish()
    }

    /// The step's ops between timing events on the lane's stream, then what follows untimed.
    fn timed(
        &self,
        state: &GpuRank,
        lane: &Lane<Links<'a>>,
        task: u32,
        index: usize,
        body: &mut dyn FnMut(&mut GpuPiece) -> Result<()>,
    ) -> Result<()> {
        let stream = self.stream(state, lane);
        let mut piece = state.pieces[index].lock().expect("a piece lock");
        let events = self.enqueue_timed(state, stream, || body(&mut piece))?;
        self.finish_timed(state, task, lane.trace_stream(), events)?;
        let iteration = self.job.program.task(task).iteration;
        self.after(
            state,
            stream,
            index,
            &mut piece,
            &self.job.step(task).ops,
            iteration,
        )
    }

    /// `cuda::execute` refuses a sharded plan before it runs, so no gather reaches here; a
    /// gather is refused the same way.
    fn gather(&self, _: &GpuRank, _: &Lane<Links<'a>>, _: u32) -> Result<()> {
        crate::runtime::refuse_sharded(self.job.schedule, super::RUNTIME)
    }

    fn compensate(
        &self,
        state: &GpuRank,
        lane: &Lane<Links<'a>>,
        piece: &mut GpuPiece,
        index: usize,
    ) -> Result<()> {
        let spec = self.spec(index);
        let buffer = state.groups[spec.group as usize]
            .lock()
            .expect("a group buffer lock");
        let grad = buffer.slice(pieces::range(spec));
        piece
            .device
            .compensate(&state.kernels, self.stream(state, lane), &grad)
    }

    fn encode(
        &self,
        state: &GpuRank,
        lane: &Lane<Links<'a>>,
        piece: &mut GpuPiece,
        index: usize,
    ) -> Result<()> {
        let stream = self.stream(state, lane);
        if let Some(ring) = &mut piece.ring {
            return ring.encode_own(&state.kernels, stream, &piece.device.compensated);
        }
        piece
            .device
            .encode(&state.kernels, stream, self.spec(index), &mut piece.payload)
    }

    /// A later round of a multi-round codec (PowerSGD's Q), from the reduced payload of the
    /// last one.
    fn next_round(
        &self,
        state: &GpuRank,
        lane: &Lane<Links<'a>>,
        piece: &mut GpuPiece,
        _: usize,
    ) -> Result<()> {
        piece
            .device
            .next_round(&state.kernels, self.stream(state, lane), &mut piece.payload)
    }

    fn exchange(
        &self,
        state: &GpuRank,
        lane: &Lane<Links<'a>>,
        piece: &mut GpuPiece,
        index: usize,
        round: u32,
    ) -> Result<()> {
        let Lane::Comm { link, .. } = lane else {
            unreachable!("the schedule puts exchanges on communication streams")
        };
        let comm = &link.world;
        let stream = self.stream(state, lane);
        let spec = self.spec(index);
        let exchange = spec.rounds[round as usize].exchange;
        match exchange {
            Exchange::Allreduce
            | Exchange::ReduceScatter
            | Exchange::AllgatherShards
            | Exchange::HierarchicalAllreduce => {
                let elem = pieces::wire_element_bytes(&spec.compressor);
                // Reduce-scatter splits the padded buffer, and so does the hierarchical
                // allreduce inside each node; an allreduce sends only this round's payload
                // (PowerSGD's P and Q differ in size).
                let count = match exchange {
                    Exchange::ReduceScatter
                    | Exchange::AllgatherShards
                    | Exchange::HierarchicalAllreduce => piece.payload.len() / elem,
                    _ => piece.device.codec.round_bytes(round) / elem,
                };
                let chunk = piece.chunk.len() / elem;
                let share = piece.node_share.len() / elem;
                // The transmutes below are sound: the byte buffers are device allocations
                // (256-byte aligned) holding count·elem, chunk·elem and share·elem bytes, read
                // as elements of elem bytes that are valid for any bit pattern.
                macro_rules! reduce {
                    ($t:ty) => {{
                        // SAFETY: the payload's count·elem bytes as elements (above).
                        let mut payload = unsafe { piece.payload.transmute_mut::<$t>(count) }
                            .expect("payload size");
                        match exchange {
                            Exchange::ReduceScatter => {
                                // SAFETY: the chunk's chunk·elem bytes as elements (above).
                                let mut out = unsafe { piece.chunk.transmute_mut::<$t>(chunk) }
                                    .expect("chunk size");
                                comm.reduce_scatter_sum(&payload, &mut out)?;
                            }
                            Exchange::AllgatherShards => {
                                // SAFETY: the chunk's chunk·elem bytes as elements (above).
                                let part = unsafe { piece.chunk.transmute::<$t>(chunk) }
                                    .expect("chunk size");
                                comm.all_gather(&part, &mut payload)?;
                            }
                            Exchange::HierarchicalAllreduce => {
                                let mine =
                                    // SAFETY: the share's share·elem bytes as elements (above).
                                    unsafe { piece.node_share.transmute_mut::<$t>(share) };
                                let mut mine = mine.expect("share size");
                                link.hierarchical_allreduce(&mut payload, &mut mine)?;
                            }
                            _ => comm.all_reduce_sum(&mut payload)?,
                        }
                    }};
                }
                match spec.compressor.summed_as() {
                    Some(Element::F16) => reduce!(Half),
                    Some(Element::Bf16) => reduce!(Brain),
                    _ => reduce!(f32),
                }
            }
            Exchange::Allgather => {
                let bytes = piece.device.codec.wire_bytes();
                let send = piece.payload.slice(..bytes);
                comm.all_gather(&send, &mut piece.gathered)?;
            }
            Exchange::CompressedRing => {
                let Some(ring) = &mut piece.ring else {
                    unreachable!("a compressed ring's piece has its shards")
                };
                ring.exchange(comm, &state.kernels, &piece.device.compensated, || {
                    self.drain(state, stream, "a CaSync-Ring")
                })?
            }
            Exchange::PushPull { server } => push_pull(
                comm,
                &state.kernels,
                server,
                &mut piece.device.codec,
                piece.server.as_mut(),
                &mut piece.payload,
                || self.drain(state, stream, "the parameter-server push"),
            )?,
            // Only sharded plans reduce so, and this backend refuses them before a run
            // (`refuse_sharded`): a schedule that reaches here was not checked.
            Exchange::HybridReduceScatter | Exchange::AlltoallReduceScatter => {
                return Err(ExecError::Cuda {
                    message: format!(
                        "pieces[{index}] is a sharded unit's {}, which the cuda backend does not run (a sharded plan: run it with `--backend host` or `mpi`)",
                        exchange.name()
                    ),
                })
            }
        }
        Ok(())
    }

    fn decode(
        &self,
        state: &GpuRank,
        lane: &Lane<Links<'a>>,
        piece: &mut GpuPiece,
        index: usize,
    ) -> Result<()> {
        let stream = self.stream(state, lane);
        let k = &state.kernels;
        if let Some(ring) = &mut piece.ring {
            stream
                .memset_zeros(&mut piece.device.result)
                .map_err(cuda_err("cannot clear the result"))?;
            return ring.decode(k, stream, &mut piece.device.result);
        }
        let bytes = piece.device.codec.wire_bytes();
        let blocks: Vec<_> = match self.spec(index).aggregation {
            Aggregation::Allgather => (0..self.world as usize)
                .map(|r| piece.gathered.slice(r * bytes..(r + 1) * bytes))
                .collect(),
            _ => vec![piece.payload.slice(..bytes)],
        };
        piece.device.decode(k, stream, &blocks)
    }

    fn update_memory(
        &self,
        state: &GpuRank,
        lane: &Lane<Links<'a>>,
        piece: &mut GpuPiece,
        index: usize,
    ) -> Result<()> {
        let stream = self.stream(state, lane);
        let spec = self.spec(index);
        let k = &state.kernels;
        match &mut piece.ring {
            Some(ring) if spec.memory != Memory::None => {
                ring.transmitted(k, stream, &mut piece.device.transmitted)?;
                piece.device.remember(k, stream)
            }
            Some(_) => Ok(()),
            None => piece.device.update_memory(k, stream, spec, self.world),
        }
    }

    fn scale_output(
        &self,
        state: &GpuRank,
        lane: &Lane<Links<'a>>,
        piece: &mut GpuPiece,
        index: usize,
    ) -> Result<()> {
        piece
            .device
            .scale_output(&state.kernels, self.stream(state, lane), self.spec(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::test_plans::{group, lowered, resnet50};
    use syncopate_sim::plan::{Launch, Scheme};

    /// ResNet-50 in one group on 4 GPUs, compressed by `spec` with `memory`, aggregated by
    /// `scheme`.
    fn schedule(spec: &str, memory: Memory, scheme: Scheme) -> Schedule {
        let tensors = (0..resnet50().num_tensors()).collect();
        lowered(vec![group(tensors, spec, memory, scheme, 2)], 4)
    }

    #[test]
    fn dgc_memory_and_parameter_servers_pass_the_plan_check() {
        let placement = Placement {
            world: 4,
            local: (0..4).map(|r| (r, r as usize)).collect(),
            ids: Vec::new(),
        };
        let dgc = Memory::Dgc {
            momentum: 0.9,
            warmup_epochs: 0,
        };
        for (spec, memory, scheme) in [
            ("dgc:0.01", dgc, Scheme::Auto),
            ("topk:0.1", Memory::Residual, Scheme::Ps),
            ("fp16", dgc, Scheme::Ps),
        ] {
            let schedule = schedule(spec, memory, scheme);
            assert!(
                check_plan(&schedule, &placement).is_ok(),
                "{spec} {memory} {scheme:?}"
            );
        }
    }

    /// CaSync-Ring runs hop by hop over NCCL sends and receives, stochastic codecs too (each
    /// shard has its codec); a payload whose length depends on the data is refused by name. The
    /// hierarchical allreduce runs over node communicators (`links.rs`) and passes.
    #[test]
    fn the_compressed_ring_runs_fixed_length_payloads_and_the_hierarchical_allreduce_passes() {
        let placement = Placement {
            world: 4,
            local: (0..4).map(|r| (r, r as usize)).collect(),
            ids: Vec::new(),
        };
        for spec in ["onebit", "tbq:0.01", "terngrad", "dgc:0.01"] {
            let ring = schedule(spec, Memory::Residual, Scheme::CompressedRing);
            assert!(ring.pieces.iter().all(|p| p.compressed_ring()), "{spec}");
            assert!(check_plan(&ring, &placement).is_ok(), "{spec}");
        }
        let threshold = schedule("threshold:2.5", Memory::Residual, Scheme::CompressedRing);
        let err = check_plan(&threshold, &placement).unwrap_err().to_string();
        assert!(
            err.contains("compressed ring")
                && err.contains("depends on the data")
                && err.contains("--backend host or mpi"),
            "{err}"
        );
        let hierarchical = schedule("fp16", Memory::Residual, Scheme::Hierarchical);
        assert!(hierarchical.pieces.iter().all(|p| p.hierarchical()));
        assert!(check_plan(&hierarchical, &placement).is_ok());
    }

    /// One process per GPU runs a plan-order schedule, whose order every rank knows; priority
    /// launch, which one rank must decide for all, is refused before any GPU work.
    #[test]
    fn priority_launch_across_processes_is_refused() {
        let one_of_four = Placement {
            world: 4,
            local: vec![(1, 0)],
            ids: Vec::new(),
        };
        let mut schedule = schedule("fp16", Memory::None, Scheme::Allreduce);
        assert!(check_plan(&schedule, &one_of_four).is_ok());
        schedule.policy.launch = Launch::Priority;
        let err = check_plan(&schedule, &one_of_four).unwrap_err().to_string();
        assert!(err.contains("priority launch across processes"), "{err}");
        let all_four = Placement {
            world: 4,
            local: (0..4).map(|r| (r, r as usize)).collect(),
            ids: Vec::new(),
        };
        assert!(check_plan(&schedule, &all_four).is_ok());
    }
}
