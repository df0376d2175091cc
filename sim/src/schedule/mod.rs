//! Schedules: a plan lowered once into cost-free steps, run by the simulator and every executor.
//!
//! A [`Schedule`] says what one rank does in one steady-state training iteration and in which
//! order; it holds no durations (the simulator's cost pass adds them, an executor measures
//! them). Every rank runs the same steps (SPMD); a collective step is one rank's part of a
//! collective that spans all ranks, and names its peers through its [`Exchange`].
//!
//! ```text
//! Plan ──lower──► Schedule ──unroll(K)──► Program (K iterations, a DAG of tasks)
//!                                           ├─► + cost pass ─► TaskGraph ─► engine (predicted)
//!                                           └─► executor: host | mpi | cuda ─► measured
//! ```
//!
//! The rules every engine follows:
//! - **Streams.** A step runs on one stream of its rank ([`Stream`]). The compute stream runs
//!   its steps in program order: each compute step also waits for the compute step before it
//!   (across iterations too); a piece's encode and decode may run there too, in line (a
//!   plan's `codec_stream`). The codec and CPU streams take ready steps first come, first
//!   served. A collective step starts once every rank has met its dependencies, then waits for
//!   the launch policy (the `launch` module) to give it a communication stream.
//! - **Dependencies.** `after` names steps of the same iteration, `after_previous` steps of
//!   the previous iteration. A step with `from_iteration` 1 does not exist in iteration 0 (the
//!   per-group updates of strategies that overlap synchronization with the next forward pass).
//! - **Iterations.** The end of step `iteration_end` closes an iteration: in steady state
//!   consecutive ends are one iteration apart, whatever the policy.
//! - **The synchronization sequence.** A step's `ops` run in order on its piece's buffers:
//!   `compensate` (read the piece from its group buffer, add error feedback), `encode`,
//!   `next-round` (PowerSGD's Q from the reduced P), `exchange` (the round's collective),
//!   `decode` (into the piece's result), `update-memory` (keep what was not transmitted),
//!   `scale-output` (EF-SignSGD divides by its learning rate again).
//! - **Buffers.** A backward step writes its tensor's gradient into its slot of the group's
//!   fusion buffer; pieces are contiguous slices of a buffer.

pub mod launch;
mod lower;
mod shard;
mod unroll;

pub use lower::{lower, lower_group};
pub use unroll::{LaunchKey, Program, TaskRef};

use crate::base::data;
use crate::base::error::{Result, SimError};
use crate::compress::{Aggregation, Compressor, Memory, Wire};
use crate::plan::{CodecCalls, CompressOn, Launch, Scheme};
use crate::sharding::ParamDtype;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// Where a step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// The rank's compute stream: forward, backward, optimizer and updates, in program order,
    /// and the codecs of a plan whose codecs run in line.
    Compute,
    /// The rank's compression stream on the device its compute runs on (a GPU's kernels, or
    /// a CPU rank's compression thread): it slows compute down while it runs.
    Codec,
    /// A GPU rank's host CPU: compression handed to the host (Espresso's CPU option).
    Cpu,
    /// A communication stream: collectives span every rank and start when all are ready.
    Comm,
}

impl Stream {
    /// As schedules and traces spell it.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Compute => "compute",
            Stream::Codec => "codec",
            Stream::Cpu => "cpu",
            Stream::Comm => "comm",
        }
    }
}

/// What a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepKind {
    /// Forward of one tensor.
    Forward {
        /// Index into the model's tensors.
        tensor: u32,
    },
    /// Backward of one tensor; its gradient lands in its slot of the group buffer.
    Backward {
        /// Index into the model's tensors.
        tensor: u32,
    },
    /// Encoding of one piece before its collectives.
    Encode {
        /// Index of the plan group.
        group: u32,
        /// Index of the piece within its group.
        part: u32,
    },
    /// One round of one piece's synchronization.
    Collective {
        /// Index of the plan group.
        group: u32,
        /// Index of the piece within its group.
        part: u32,
        /// Index of the round among the piece's rounds.
        round: u32,
    },
    /// Decoding of one piece after its collectives.
    Decode {
        /// Index of the plan group.
        group: u32,
        /// Index of the piece within its group.
        part: u32,
    },
    /// The optimizer step of the whole model after every group is synchronized.
    Optimizer,
    /// The optimizer step of one group's parameters, just before their next forward
    /// (strategies that overlap synchronization with the next forward pass).
    Update {
        /// Index of the plan group.
        group: u32,
    },
    /// A sharded plan's all-gather of one unit's parameters from every rank's shard
    /// ([`Schedule::param_shards`]).
    Gather {
        /// Index of the plan group (the unit).
        group: u32,
        /// Which of the unit's gathers it is.
        pass: Pass,
    },
}

/// When a sharded plan gathers a unit's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// Before the unit's forward (ZeRO-3, FSDP).
    Forward,
    /// Before its backward, after it was freed following its forward (FSDP's
    /// `reshard_after_forward`).
    Backward,
    /// After the optimizer updated every rank's shard (ZeRO-1 and 2).
    Step,
}

impl Pass {
    /// As labels spell it.
    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "fwd",
            Pass::Backward => "bwd",
            Pass::Step => "step",
        }
    }
}

impl StepKind {
    /// A short name for messages: `bwd t12`, `collective g3.0.1`.
    pub fn label(&self) -> String {
        match *self {
            StepKind::Forward { tensor } => format!("fwd t{tensor}"),
            StepKind::Backward { tensor } => format!("bwd t{tensor}"),
            StepKind::Encode { group, part } => format!("encode g{group}.{part}"),
            StepKind::Collective { group, part, round } => {
                format!("collective g{group}.{part}.{round}")
            }
            StepKind::Decode { group, part } => format!("decode g{group}.{part}"),
            StepKind::Optimizer => "optimizer".into(),
            StepKind::Update { group } => format!("update g{group}"),
            StepKind::Gather { group, pass } => format!("gather g{group} {}", pass.name()),
        }
    }

    /// Codec work (an encode or a decode), on whichever stream it runs: busy time counts it as
    /// compression.
    pub fn is_codec(&self) -> bool {
        matches!(self, StepKind::Encode { .. } | StepKind::Decode { .. })
    }
}

/// One operation of the synchronization sequence (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Reads the piece from its group buffer and adds error feedback.
    Compensate,
    /// Encodes the piece's payload.
    Encode,
    /// Computes the next round's input: PowerSGD's Q from the reduced P.
    NextRound,
    /// Runs the round's collective.
    Exchange,
    /// Decodes into the piece's result.
    Decode,
    /// Keeps what was not transmitted (error-feedback memory).
    UpdateMemory,
    /// Rescales the output: EF-SignSGD divides by its learning rate again.
    ScaleOutput,
}

/// How one round of a piece's synchronization moves its payload between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Exchange {
    /// Every rank's payload summed element-wise in the wire type, the sum on every rank.
    Allreduce,
    /// As `Allreduce`, reduced inside each node, across nodes, then shared inside each node.
    HierarchicalAllreduce,
    /// The reduce-scatter half of an allreduce: each rank ends with the sum of its shard.
    ReduceScatter,
    /// A reduce-scatter inside each node, then each shard allreduced across nodes among the
    /// ranks of the same place in their node: each rank ends with the world's sum of its shard
    /// of the node's split (hybrid sharding).
    HybridReduceScatter,
    /// Each rank's payload of chunk c (its codec's call c) to the rank that keeps chunk c, which
    /// decodes and adds every rank's: each rank ends with the sum of its shard, as after
    /// `ReduceScatter` (ZeRO++'s quantized gradients).
    AlltoallReduceScatter,
    /// The all-gather half of an allreduce: the summed shards go to every rank.
    AllgatherShards,
    /// Every rank's payload (sizes may differ) to every rank, each decoded there.
    Allgather,
    /// Push to the piece's server, which decodes, sums and re-encodes; pull its payload. The
    /// server is a rank or a dedicated machine ([`Schedule::servers`]). The simulator prices
    /// BytePS's round, summed inside each node and pushed from each node; the executors push
    /// every rank's payload to the server rank (the same sum, and the same traffic with one rank
    /// per node).
    PushPull {
        /// The piece's server: a rank, or a dedicated server's index ([`Schedule::servers`]).
        server: u32,
    },
    /// HiPress CaSync-Ring: a ring whose every hop decodes, adds and re-encodes the shard.
    CompressedRing,
}

impl Exchange {
    /// As schedules spell it.
    pub fn name(self) -> &'static str {
        match self {
            Exchange::Allreduce => "allreduce",
            Exchange::HierarchicalAllreduce => "hierarchical-allreduce",
            Exchange::ReduceScatter => "reduce-scatter",
            Exchange::HybridReduceScatter => "hybrid-reduce-scatter",
            Exchange::AlltoallReduceScatter => "alltoall-reduce-scatter",
            Exchange::AllgatherShards => "allgather-shards",
            Exchange::Allgather => "allgather",
            Exchange::PushPull { .. } => "push-pull",
            Exchange::CompressedRing => "compressed-ring",
        }
    }
}

/// One collective of a piece's synchronization.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Round {
    /// How the round moves its payload.
    pub exchange: Exchange,
    /// Bytes of this rank's payload in this round.
    pub bytes: u64,
}

/// One tensor's place in its group's fusion buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slot {
    /// Index into the model's tensors.
    pub tensor: u32,
    /// First element of the tensor in the buffer.
    pub offset: u64,
    /// Elements of the tensor.
    pub numel: u64,
    /// A sharded plan with float8 gathers: the tensor is a float8 linear's weight, gathered in
    /// float8 e4m3 with its own scale ([`crate::sharding::Sharding::float8_all_gather`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub float8: bool,
}

/// A group's fusion buffer: its tensors, in plan order, one after another.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Buffer {
    /// Elements of the whole buffer.
    pub numel: u64,
    /// Each tensor's place, in plan order.
    pub slots: Vec<Slot>,
}

impl Buffer {
    /// Elements of its float8 weights ([`Slot::float8`]).
    pub fn float8_numel(&self) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.float8)
            .map(|s| s.numel)
            .sum()
    }

    /// How many float8 weights it holds.
    pub fn float8_weights(&self) -> usize {
        self.slots.iter().filter(|s| s.float8).count()
    }
}

/// One rank's shard of a sharded plan's unit: what it contributes to each gather of the unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamShard {
    /// Bytes of the shard on the wire, in the plan's parameter precision.
    pub bytes: u64,
    /// That precision: the codec the shard is written with.
    #[serde(default, skip_serializing_if = "is_default")]
    pub dtype: ParamDtype,
    /// Whether the shard is one of the node's ranks' (hybrid sharding): the unit is gathered
    /// inside the node, not over every rank.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub within_node: bool,
    /// Bytes of the rank's second shard of the unit, split over its node's ranks, from which the
    /// gather before backward takes it inside the node (ZeRO++'s hpZ); none without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_bytes: Option<u64>,
    /// With float8 gathers: the float8 weights (of the whole model) whose scales this unit's
    /// forward gather agrees on first, the model's every one on the unit gathered first in an
    /// iteration and none elsewhere; every other forward gather of the iteration waits for it.
    /// Each rank all-gathers the largest magnitude of its shard of each and takes the largest,
    /// priced and run so (torchao all-reduces them once after each step: a few hundred floats
    /// either way).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub amaxes: u32,
}

impl ParamShard {
    /// The shard a gather of `pass` joins: the secondary one inside the node before backward
    /// when the unit has one (hpZ), else this one.
    pub fn for_pass(&self, pass: Pass) -> ParamShard {
        match (pass, self.secondary_bytes) {
            (Pass::Backward, Some(bytes)) => ParamShard {
                bytes,
                dtype: self.dtype,
                within_node: true,
                secondary_bytes: None,
                amaxes: 0,
            },
            (Pass::Forward, _) => *self,
            _ => ParamShard { amaxes: 0, ..*self },
        }
    }

    /// The ranks whose shards a gather of the unit joins: every rank, or the node's.
    pub fn ranks(&self, world: World) -> u32 {
        crate::sharding::split_ranks(self.within_node, world.ranks(), world.ranks_per_node)
    }

    /// Bytes of the gathered unit: every shard [`ParamShard::ranks`] holds; `None` when they
    /// overflow.
    pub fn gathered_bytes(&self, world: World) -> Option<u64> {
        self.bytes.checked_mul(u64::from(self.ranks(world)))
    }
}

/// One partition of one group: the unit every encode, collective and decode step works on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Piece {
    /// Index of the plan group.
    pub group: u32,
    /// Index of the piece within its group.
    pub part: u32,
    /// Elements `offset..offset + numel` of the group's buffer.
    pub offset: u64,
    /// Elements in the piece.
    pub numel: u64,
    /// The group's compressor.
    pub compressor: Compressor,
    /// The group's error-feedback memory.
    pub memory: Memory,
    /// The group's scheme as the plan states it.
    pub scheme: Scheme,
    /// Where the plan runs the piece's compression kernels.
    #[serde(default, skip_serializing_if = "is_default")]
    pub compress_on: CompressOn,
    /// How the payloads are combined, as the group's scheme implies.
    pub aggregation: Aggregation,
    /// How the plan's implementation lays sub-byte codes on the wire (the plan's `wire`): the
    /// rounds' bytes follow it; executors run only the packed formats and refuse `bytes`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub wire: Wire,
    /// The matrices PowerSGD compresses in this piece: the group's tensor shapes, a partition's
    /// rows of a single matrix, or a flat slice (sent raw); none for other compressors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shapes: Option<Vec<Vec<u64>>>,
    /// The piece's collectives, in order.
    pub rounds: RoundList,
    /// Element counts of the piece's codec calls, one per tensor (or the part of a tensor the
    /// piece holds), when the plan compresses each tensor on its own (`codec_calls: tensor`);
    /// the payload is their payloads one after another. Empty: one call on the whole piece.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<u64>,
}

impl Piece {
    /// The tensor shapes the codecs take (PowerSGD's matrices; empty for other compressors).
    pub fn shapes(&self) -> Vec<&[u64]> {
        self.shapes.iter().flatten().map(Vec::as_slice).collect()
    }

    /// Bytes one rank contributes to the piece's exchanges per iteration: each payload round
    /// once (an all-gather of shards moves the reduce-scatter's payload again).
    pub fn payload_bytes(&self) -> u64 {
        self.rounds
            .iter()
            .filter(|r| r.exchange != Exchange::AllgatherShards)
            .map(|r| r.bytes)
            .sum()
    }

    /// Element counts of the codec calls that compress the piece: its `calls`, or the whole
    /// piece in one.
    pub fn codec_calls(&self) -> &[u64] {
        match self.calls.is_empty() {
            true => std::slice::from_ref(&self.numel),
            false => &self.calls,
        }
    }

    /// Whether the piece goes round HiPress's CaSync-Ring, encoded and decoded shard by shard.
    pub fn compressed_ring(&self) -> bool {
        self.exchanged_by(Exchange::CompressedRing)
    }

    /// Whether a round of the piece is a hierarchical allreduce (inside the node, across nodes,
    /// inside again).
    pub fn hierarchical(&self) -> bool {
        self.exchanged_by(Exchange::HierarchicalAllreduce)
    }

    /// Whether the piece is reduce-scattered by an all-to-all of its chunks' payloads.
    pub fn alltoall_scattered(&self) -> bool {
        self.exchanged_by(Exchange::AlltoallReduceScatter)
    }

    fn exchanged_by(&self, exchange: Exchange) -> bool {
        self.rounds.iter().any(|r| r.exchange == exchange)
    }
}

/// What is wrong with a piece's codec calls, if anything: they must be two or more non-empty
/// parts that add up to the piece, of an element-wise codec (as `lower` makes them).
fn bad_calls(piece: &Piece) -> Option<String> {
    if piece.calls.is_empty() {
        return None;
    }
    let total = piece
        .calls
        .iter()
        .try_fold(0u64, |sum, &n| sum.checked_add(n).filter(|_| n > 0));
    if piece.calls.len() < 2 || total != Some(piece.numel) {
        return Some(format!(
            "{} calls must be two or more non-empty parts adding up to the piece's {} elements",
            piece.calls.len(),
            piece.numel
        ));
    }
    match piece.compressor {
        Compressor::None => Some("an uncompressed piece has no codec calls".into()),
        c => c.why_one_call(),
    }
}

/// How the implementation running a plan encodes each piece: its wire layout and how many
/// codec calls compress it (the plan's `wire` and `codec_calls`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Encoding {
    /// How sub-byte codes are laid on the wire.
    pub wire: Wire,
    /// Whether the codec is called once per piece or once per tensor.
    pub calls: CodecCalls,
}

/// Where a collective step stands in the launch order of its iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSlot {
    /// Lower goes first under the priority policy.
    pub priority: i64,
    /// 0: synchronization during backward; 1: DeAR's all-gathers before the next forward
    /// (launched in forward order, the reverse of `position`).
    pub phase: u8,
    /// 1-based position among the iteration's collectives, in lowering order.
    pub position: u32,
}

/// One step of one rank's iteration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// What the step does.
    pub kind: StepKind,
    /// The stream it runs on.
    pub stream: Stream,
    /// Steps of the same iteration that must end first.
    #[serde(default, skip_serializing_if = "SmallVec::is_empty")]
    pub after: StepList,
    /// Steps of the previous iteration that must end first.
    #[serde(default, skip_serializing_if = "SmallVec::is_empty")]
    pub after_previous: StepList,
    /// The first iteration in which this step exists (0 or 1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub from_iteration: u32,
    /// Compute steps: the time the model profile measured for this work on its own device.
    /// The simulator scales it to the cluster's device; an executor reproduces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiled_us: Option<f64>,
    /// Synchronization steps: the index of their piece in `pieces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub piece: Option<u32>,
    /// Synchronization steps: the operations they run, in order.
    #[serde(default, skip_serializing_if = "SmallVec::is_empty")]
    pub ops: OpList,
    /// Collectives: their place in the launch order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<LaunchSlot>,
}

/// Step indices: most steps wait for one or two others, held inline (a schedule has thousands
/// of steps, and lowering runs once per plan a search scores).
pub type StepList = SmallVec<[u32; 2]>;

/// A step's ops, held inline: a synchronization step runs at most six.
pub type OpList = SmallVec<[Op; 6]>;

/// A piece's rounds, held inline: PowerSGD has two, DeAR's scheme two exchanges.
pub type RoundList = SmallVec<[Round; 2]>;

fn is_zero(value: &u32) -> bool {
    *value == 0
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The ranks a schedule is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct World {
    /// Nodes in the world.
    pub nodes: u32,
    /// Ranks on each node.
    pub ranks_per_node: u32,
}

impl World {
    /// Ranks in all: nodes × ranks per node.
    pub fn ranks(&self) -> u32 {
        self.nodes * self.ranks_per_node
    }

    /// Whether an all-to-all reduce-scatter takes two hops here, inside the nodes then across
    /// them (ZeRO++'s qgZ): only with several nodes of several ranks.
    pub fn two_hop_alltoall(&self) -> bool {
        self.nodes > 1 && self.ranks_per_node > 1
    }

    /// The payloads of its chunk a rank decodes after an all-to-all reduce-scatter: every
    /// node's after two hops, every rank's after one.
    pub fn alltoall_payloads(&self) -> u32 {
        match self.two_hop_alltoall() {
            true => self.nodes,
            false => self.ranks(),
        }
    }
}

/// The ring position that holds chunk `chunk` of `ranks` summed after a ring reduce-scatter,
/// and keeps it after an all-to-all one: the position before it (the executors'
/// `ring::summed_chunk` is the inverse).
pub fn chunk_keeper(chunk: usize, ranks: usize) -> usize {
    (chunk + ranks - 1) % ranks
}

/// How collectives take the communication streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchPolicy {
    /// The order in which ready collectives take a stream.
    pub launch: Launch,
    /// Communication streams collectives can run on at once.
    pub comm_streams: u32,
    /// Horovod's cycle: a ready collective launches at the next multiple of this (0: at once).
    pub cycle_ns: u64,
}

impl LaunchPolicy {
    /// Whether every rank can decide the launch order by itself: plan order fixes it whatever
    /// the timing, as DDP and NCCL rely on (with several streams the collectives take them in
    /// turn: `launch::Launcher`). Under priority which collective takes a free stream depends
    /// on what was released when it freed, and one rank must decide for all.
    pub fn order_is_fixed(&self) -> bool {
        self.launch == Launch::PlanOrder
    }
}

/// Where a schedule's parameter servers run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Servers {
    /// On the workers: a push-pull's `server` is a rank, the first of its node (BytePS's
    /// colocated servers).
    #[default]
    Colocated,
    /// On this many machines of their own beside the workers: a push-pull's `server` indexes
    /// them. Only the simulator runs them; the executors refuse such a schedule.
    Dedicated(u32),
}

impl Servers {
    /// The plan's `policy.ps_servers` (0: colocated).
    pub fn from_count(count: u32) -> Servers {
        match count {
            0 => Servers::Colocated,
            n => Servers::Dedicated(n),
        }
    }
}

/// A plan lowered for one model on one world: see the module documentation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Version of the data format the schedule is written in.
    pub format_version: u32,
    /// The strategy that produced the plan.
    pub strategy: String,
    /// The model's name.
    pub model: String,
    /// The plan's fingerprint of the model's tensor names and sizes.
    pub model_fingerprint: String,
    /// The ranks the schedule is for.
    pub world: World,
    /// How collectives take the communication streams.
    pub policy: LaunchPolicy,
    /// Where the parameter servers run.
    #[serde(default, skip_serializing_if = "is_default")]
    pub servers: Servers,
    /// One fusion buffer per plan group.
    pub buffers: Vec<Buffer>,
    /// Every group's partitions, group by group (none on a single rank: nothing to synchronize).
    pub pieces: Vec<Piece>,
    /// A sharded plan's shard of each group's parameters, group by group, which its gather
    /// steps all-gather (none for a replicated plan, or on a single rank).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub param_shards: Vec<ParamShard>,
    /// One rank's steps of one iteration.
    pub steps: Vec<Step>,
    /// The step whose end closes an iteration.
    pub iteration_end: u32,
}

impl Schedule {
    /// The step at `index`.
    pub fn step(&self, index: u32) -> &Step {
        &self.steps[index as usize]
    }

    /// Whether step `index` runs in iteration `iteration` (a step with `from_iteration` 1 does
    /// not run in the first).
    pub fn runs_in(&self, index: u32, iteration: u32) -> bool {
        iteration >= self.step(index).from_iteration
    }

    /// The steps of the same iteration that step `index` waits for in `iteration`: its `after`
    /// steps that run then. The unrolled program and `syncopate.torch` both take them here.
    pub fn waits_for(&self, index: u32, iteration: u32) -> impl Iterator<Item = u32> + '_ {
        self.step(index)
            .after
            .iter()
            .copied()
            .filter(move |&dep| self.runs_in(dep, iteration))
    }

    /// The steps of iteration `iteration - 1` that step `index` waits for in `iteration`: its
    /// `after_previous` steps that ran then (none in the first iteration).
    pub fn waits_for_previous(&self, index: u32, iteration: u32) -> impl Iterator<Item = u32> + '_ {
        self.step(index)
            .after_previous
            .iter()
            .copied()
            .filter(move |&dep| iteration > 0 && self.runs_in(dep, iteration - 1))
    }

    /// The piece a synchronization step works on.
    pub fn piece_of(&self, step: &Step) -> Option<&Piece> {
        step.piece.map(|p| &self.pieces[p as usize])
    }

    /// Each tensor's group and slot, indexed by tensor.
    pub fn tensor_slots(&self) -> Vec<(u32, Slot)> {
        let tensors = self.buffers.iter().map(|b| b.slots.len()).sum();
        let mut slots = vec![
            (
                0,
                Slot {
                    tensor: 0,
                    offset: 0,
                    numel: 0,
                    float8: false,
                }
            );
            tensors
        ];
        for (g, buffer) in self.buffers.iter().enumerate() {
            for slot in &buffer.slots {
                slots[slot.tensor as usize] = (g as u32, *slot);
            }
        }
        slots
    }

    /// Bytes one rank contributes to the parameter gathers of an iteration (its shard, once
    /// per gather).
    pub fn gather_bytes(&self) -> u64 {
        self.steps
            .iter()
            .filter_map(|s| match s.kind {
                StepKind::Gather { group, pass } => Some(self.gather_shard(group, pass).bytes),
                _ => None,
            })
            .sum()
    }

    /// The shard rank contributes to a gather of `group` before `pass` (hpZ's secondary one
    /// before backward).
    pub fn gather_shard(&self, group: u32, pass: Pass) -> ParamShard {
        self.param_shards[group as usize].for_pass(pass)
    }

    /// Collective steps per iteration.
    pub fn collectives_per_iteration(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| s.stream == Stream::Comm)
            .count()
    }

    /// Reads a schedule written by `syncopate lower`, checking its references.
    pub fn load(path: &str) -> Result<Schedule> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
            path: path.into(),
            source,
        })?;
        let schedule: Schedule = data::parse_json(path, &text)?;
        schedule.validate(path)?;
        Ok(schedule)
    }

    /// Checks what a hand-edited file could break: versions, indices, the dependency order,
    /// that every synchronization step names a piece and round that exist, and that compute
    /// steps carry a usable time.
    pub fn validate(&self, label: &str) -> Result<()> {
        data::check_format_version(label, self.format_version)?;
        let steps = self.steps.len() as u64;
        let bad = |field: String, message: String| Err(SimError::invalid(label, field, message));
        if self.world.nodes == 0 || self.world.ranks_per_node == 0 {
            return bad(
                "world".into(),
                "needs at least one node and one rank per node".into(),
            );
        }
        if self
            .world
            .nodes
            .checked_mul(self.world.ranks_per_node)
            .is_none()
        {
            return bad("world".into(), "more than 2^32 ranks".into());
        }
        if self.policy.comm_streams == 0 {
            return bad(
                "policy.comm_streams".into(),
                "needs at least one stream".into(),
            );
        }
        if u64::from(self.iteration_end) >= steps {
            return bad(
                "iteration_end".into(),
                format!("step {} does not exist", self.iteration_end),
            );
        }
        for (p, piece) in self.pieces.iter().enumerate() {
            let fits = self.buffers.get(piece.group as usize).is_some_and(|b| {
                piece
                    .offset
                    .checked_add(piece.numel)
                    .is_some_and(|end| end <= b.numel)
            });
            if !fits {
                return bad(
                    format!("pieces[{p}]"),
                    "lies outside its group's buffer".into(),
                );
            }
            if piece.rounds.is_empty() {
                return bad(
                    format!("pieces[{p}].rounds"),
                    "needs at least one round".into(),
                );
            }
            if let Some(message) = bad_calls(piece) {
                return bad(format!("pieces[{p}].calls"), message);
            }
            for round in &piece.rounds {
                if let Exchange::PushPull { server } = round.exchange {
                    let (count, what) = match self.servers {
                        Servers::Colocated => (self.world.ranks(), "ranks"),
                        Servers::Dedicated(n) => (n, "dedicated servers"),
                    };
                    if server >= count {
                        return bad(
                            format!("pieces[{p}].rounds"),
                            format!("server {server} is not one of the {count} {what}"),
                        );
                    }
                }
            }
        }
        for (i, step) in self.steps.iter().enumerate() {
            let at = |field: &str| format!("steps[{i}].{field}");
            if let Some(&dep) = step.after.iter().find(|&&d| d as usize >= i) {
                return bad(at("after"), format!("step {dep} is not an earlier step"));
            }
            if let Some(&dep) = step.after_previous.iter().find(|&&d| u64::from(d) >= steps) {
                return bad(at("after_previous"), format!("step {dep} does not exist"));
            }
            if step.from_iteration > 1 {
                return bad(at("from_iteration"), "is 0 or 1".into());
            }
            let piece = match step.piece {
                Some(p) => match self.pieces.get(p as usize) {
                    Some(piece) => Some(piece),
                    None => return bad(at("piece"), format!("piece {p} does not exist")),
                },
                None => None,
            };
            match (step.stream, piece, step.kind) {
                // Encode and decode in line with the compute stream (`CodecStream::Compute`).
                (Stream::Compute, Some(_), StepKind::Encode { .. } | StepKind::Decode { .. }) => {}
                (Stream::Compute, Some(_), _) => {
                    return bad(
                        at("kind"),
                        "only encode and decode of a piece run on the compute stream".into(),
                    )
                }
                (Stream::Compute, None, _) => {
                    if !step
                        .profiled_us
                        .is_some_and(|us| us.is_finite() && us >= 0.0)
                    {
                        return bad(
                            at("profiled_us"),
                            "a compute step needs a finite, non-negative time".into(),
                        );
                    }
                }
                (Stream::Comm, None, StepKind::Gather { group, .. }) => {
                    if group as usize >= self.param_shards.len() {
                        return bad(
                            at("kind"),
                            format!("group {group} has no parameter shard to gather"),
                        );
                    }
                    if step.launch.is_none() {
                        return bad(at("launch"), "a gather needs its launch slot".into());
                    }
                }
                (_, None, _) => {
                    return bad(at("piece"), "a synchronization step needs its piece".into())
                }
                (Stream::Comm, Some(piece), StepKind::Collective { round, .. }) => {
                    if round as usize >= piece.rounds.len() {
                        return bad(at("kind"), format!("round {round} does not exist"));
                    }
                    if step.launch.is_none() {
                        return bad(at("launch"), "a collective needs its launch slot".into());
                    }
                }
                (Stream::Comm, _, _) => {
                    return bad(
                        at("kind"),
                        "only collectives run on a communication stream".into(),
                    )
                }
                (_, _, StepKind::Encode { .. } | StepKind::Decode { .. }) => {}
                _ => {
                    return bad(
                        at("kind"),
                        "only encode and decode run on a codec stream".into(),
                    )
                }
            }
        }
        Ok(())
    }
}
