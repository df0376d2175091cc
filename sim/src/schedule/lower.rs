//! Lowering: turns (model, world, plan) into a Schedule, the one place that says what a plan means.

use super::shard;
use super::{
    Buffer, Encoding, Exchange, LaunchPolicy, LaunchSlot, Op, OpList, Piece, Round, Schedule,
    Servers, Slot, Step, StepKind, StepList, Stream, World,
};
use crate::base::data::FORMAT_VERSION;
use crate::base::error::{Result, SimError};
use crate::base::time::SimTime;
use crate::compress::{powersgd_layout, powersgd_rounds, Aggregation, Compressor, Memory};
use crate::inputs::model::ModelProfile;
use crate::plan::{CodecCalls, CodecStream, CompressOn, Group, Plan, Scheme};
use smallvec::{smallvec, SmallVec};

/// Lowers `plan` for `model` on `world`. `cpu_ranks` says that the ranks are CPU processes
/// (their compression runs on the CPU stream). `label` names the plan in errors.
pub fn lower(
    model: &ModelProfile,
    world: World,
    cpu_ranks: bool,
    plan: &Plan,
    label: &str,
) -> Result<Schedule> {
    plan.validate(label, model)?;
    if world.nodes == 0 || world.ranks_per_node == 0 {
        return Err(SimError::bad_value(
            "world",
            format!("{} nodes × {} ranks", world.nodes, world.ranks_per_node),
            "needs at least one node and one rank per node",
        ));
    }
    world
        .nodes
        .checked_mul(world.ranks_per_node)
        .ok_or_else(|| {
            SimError::bad_value(
                "world",
                format!("{} nodes × {} ranks", world.nodes, world.ranks_per_node),
                "more than 2^32 ranks",
            )
        })?;
    let cycle = SimTime::from_us(plan.policy.cycle_time_us);
    let syncing = world.ranks() > 1;
    let overlap = plan.policy.overlap_forward && syncing;
    let servers = Servers::from_count(plan.policy.ps_servers);
    // Float8 weights are gathered, so marked, only where there are ranks to gather from.
    let float8 = syncing && plan.sharding.as_ref().is_some_and(|s| s.float8_all_gather);
    let buffers: Vec<Buffer> = plan
        .groups
        .iter()
        .map(|g| buffer(model, g, float8))
        .collect();
    let mut pieces = Vec::new();
    let mut group_pieces = Vec::with_capacity(plan.groups.len());
    if syncing {
        for (g, group) in plan.groups.iter().enumerate() {
            let first = pieces.len();
            let encoding = Encoding {
                wire: plan.wire,
                calls: plan.codec_calls,
            };
            pieces.extend(lower_group(
                model, world, servers, first, g, group, encoding,
            ));
            group_pieces.push(first..pieces.len());
        }
    }
    let schedule = |steps, iteration_end, param_shards, buffers, pieces| Schedule {
        format_version: FORMAT_VERSION,
        strategy: plan.strategy.clone(),
        model: plan.model.clone(),
        model_fingerprint: plan.model_fingerprint.clone(),
        world,
        policy: LaunchPolicy {
            launch: plan.policy.launch,
            comm_streams: plan.policy.comm_streams,
            cycle_ns: cycle.as_ns(),
        },
        servers,
        buffers,
        pieces,
        param_shards,
        steps,
        iteration_end,
    };
    if let (Some(sharding), true) = (&plan.sharding, syncing) {
        let codec = |g: usize| codec_stream(plan.groups[g].compress_on, cpu_ranks, false);
        let sharded = shard::sharded_steps(
            model,
            (
                sharding.shard_ranks(world.ranks(), world.ranks_per_node),
                world.ranks_per_node,
            ),
            plan,
            (sharding, &buffers),
            (&pieces, &group_pieces),
            codec,
        )?;
        return Ok(schedule(
            sharded.steps,
            sharded.iteration_end,
            sharded.param_shards,
            buffers,
            pieces,
        ));
    }
    // Forward and backward per tensor, per piece an encode, its rounds and a decode, per
    // group an update, and the optimizer: reserved at once, since a search lowers every plan.
    let rounds: usize = pieces.iter().map(|p: &Piece| p.rounds.len()).sum();
    let mut steps: Vec<Step> = Vec::with_capacity(
        2 * model.num_tensors() + 2 * pieces.len() + rounds + plan.groups.len() + 1,
    );
    let mut push = |step: Step| {
        steps.push(step);
        (steps.len() - 1) as u32
    };
    // Groups whose update runs just before each tensor's forward.
    let mut updates_before: Vec<Vec<usize>> = vec![Vec::new(); model.num_tensors()];
    if overlap {
        for (g, group) in plan.groups.iter().enumerate() {
            updates_before[first_forward(model, group)].push(g);
        }
    }
    let mut update_step = vec![None; plan.groups.len()];
    for t in model.forward_order() {
        for &g in &updates_before[t] {
            let numel = buffers[g].numel as f64;
            // The optimizer's share of this group; DeAR updates only its 1/world shard.
            let shard = match plan.groups[g].scheme {
                Scheme::ReduceScatterAllgather => f64::from(world.ranks()),
                _ => 1.0,
            };
            let mut step = compute(
                StepKind::Update { group: g as u32 },
                model.optimizer_us * (numel / model.total_numel() as f64) / shard,
            );
            step.from_iteration = 1;
            update_step[g] = Some(push(step));
        }
        push(compute(
            StepKind::Forward { tensor: t as u32 },
            model.tensors[t].forward_us,
        ));
    }
    // Codecs in line on a GPU rank's compute stream encode right behind the backward step
    // that completes their group, ahead of the backward steps after it.
    let in_line = !cpu_ranks && plan.codec_stream == CodecStream::Compute;
    let inline = |g: usize| in_line && plan.groups[g].compress_on == CompressOn::Gpu;
    // Sized only when codecs run in line: a search lowers thousands of plans without.
    let sized = |n: usize| if in_line { n } else { 0 };
    if overlap {
        let coded = |g: usize| inline(g) && plan.groups[g].compressor != Compressor::None;
        if (0..plan.groups.len()).any(coded) {
            // Decodes in line belong before each group's update in the next forward pass,
            // which the lowering does not place yet; behind backward they would hold it all.
            return Err(SimError::bad_value(
                "codec_stream",
                "compute",
                "codecs in line with the compute stream are not modeled for a plan that overlaps synchronization with the next forward pass (policy.overlap_forward: DeAR, ByteScheduler)",
            ));
        }
    }
    let mut encodes_after: Vec<Vec<usize>> = vec![Vec::new(); sized(model.num_tensors())];
    for (g, range) in group_pieces.iter().enumerate() {
        if inline(g) {
            let last = *plan.groups[g]
                .tensors
                .iter()
                .max()
                .expect("validated groups are non-empty");
            encodes_after[last].extend(range.clone().filter(|&p| has_encode(&pieces[p])));
        }
    }
    let mut inline_encode: Vec<Option<u32>> = vec![None; sized(pieces.len())];
    let mut backward = Vec::with_capacity(model.num_tensors());
    for (t, tensor) in model.tensors.iter().enumerate() {
        let step = push(compute(
            StepKind::Backward { tensor: t as u32 },
            tensor.backward_us,
        ));
        backward.push(step);
        for &p in encodes_after.get(t).map_or(&[][..], Vec::as_slice) {
            let piece = &pieces[p];
            let kind = StepKind::Encode {
                group: piece.group,
                part: piece.part,
            };
            let ops = smallvec![Op::Compensate, Op::Encode];
            inline_encode[p] = Some(push(sync_step(kind, Stream::Compute, step, p, ops)));
        }
    }
    let last_backward = *backward.last().expect("a validated model has tensors");
    let mut position = 0u32;
    let mut group_tails: Vec<Vec<u32>> = Vec::with_capacity(group_pieces.len());
    for (g, range) in group_pieces.iter().enumerate() {
        let group = &plan.groups[g];
        let ready = group
            .tensors
            .iter()
            .map(|&t| backward[t])
            .max()
            .expect("validated groups are non-empty");
        let codec = codec_stream(group.compress_on, cpu_ranks, inline(g));
        let mut tails = Vec::with_capacity(range.len());
        for p in range.clone() {
            let encoded = inline_encode.get(p).copied().flatten();
            let chain = Chain {
                ready,
                encoded,
                codec,
                priority: group.priority,
                overlap,
            };
            tails.push(push_sync(&mut steps, &pieces, p, chain, &mut position)?);
        }
        group_tails.push(tails);
    }
    if !overlap {
        let mut optimizer = compute(StepKind::Optimizer, model.optimizer_us);
        optimizer.after = group_tails.iter().flatten().copied().collect();
        steps.push(optimizer);
    }
    for (g, update) in update_step.iter().enumerate() {
        if let Some(update) = update {
            steps[*update as usize].after_previous = StepList::from_slice(&group_tails[g]);
        }
    }
    Ok(schedule(steps, last_backward, Vec::new(), buffers, pieces))
}

pub(super) fn too_many_collectives() -> SimError {
    SimError::bad_value(
        "plan",
        "collectives per iteration",
        "more than 2^32 collectives in one iteration",
    )
}

/// Where a group's codec steps run: in line on the compute stream, on the host CPU (a GPU
/// rank handing compression to it, as Espresso may), or on the rank's codec stream (a CPU
/// rank's compression thread runs on the cores its compute runs on).
pub(super) fn codec_stream(on: CompressOn, cpu_ranks: bool, in_line: bool) -> Stream {
    match (on, cpu_ranks) {
        _ if in_line => Stream::Compute,
        (CompressOn::Cpu, false) => Stream::Cpu,
        (_, true) | (CompressOn::Gpu, false) => Stream::Codec,
    }
}

/// How one piece's synchronization is placed: after which step, where its codecs run and
/// where its collectives stand in the launch order.
#[derive(Clone, Copy)]
pub(super) struct Chain {
    /// The step whose end makes the piece ready (its group's last gradient).
    pub ready: u32,
    /// Its encode when already placed in line with the backward pass.
    pub encoded: Option<u32>,
    /// The stream of its encode and decode.
    pub codec: Stream,
    /// The group's priority.
    pub priority: i64,
    /// Whether all-gathers of shards wait for the next forward pass (DeAR).
    pub overlap: bool,
}

/// Pushes piece `p`'s synchronization: its encode, a collective per round (numbered on from
/// `position`) and its decode, each after the one before. Returns its last step.
pub(super) fn push_sync(
    steps: &mut Vec<Step>,
    pieces: &[Piece],
    p: usize,
    chain: Chain,
    position: &mut u32,
) -> Result<u32> {
    let mut push = |step: Step| {
        steps.push(step);
        (steps.len() - 1) as u32
    };
    let piece = &pieces[p];
    let sync = |kind, stream, after: u32, ops: OpList| sync_step(kind, stream, after, p, ops);
    let (group, part) = (piece.group, piece.part);
    let compressing = piece.compressor != Compressor::None;
    let has_encode = has_encode(piece);
    let mut tail = chain.ready;
    if let Some(encode) = chain.encoded {
        tail = encode;
    } else if has_encode {
        tail = push(sync(
            StepKind::Encode { group, part },
            chain.codec,
            tail,
            smallvec![Op::Compensate, Op::Encode],
        ));
    }
    let rounds = piece.rounds.len();
    for (r, round) in piece.rounds.iter().enumerate() {
        let mut ops = OpList::new();
        if r == 0 && !has_encode {
            ops.extend([Op::Compensate, Op::Encode]);
        }
        if r > 0 && round.exchange != Exchange::AllgatherShards {
            ops.push(Op::NextRound);
        }
        ops.push(Op::Exchange);
        if r + 1 == rounds && !compressing {
            ops.extend(decode_ops(piece.memory));
        }
        *position = position.checked_add(1).ok_or_else(too_many_collectives)?;
        let mut step = sync(
            StepKind::Collective {
                group,
                part,
                round: r as u32,
            },
            Stream::Comm,
            tail,
            ops,
        );
        step.launch = Some(LaunchSlot {
            priority: chain.priority,
            phase: u8::from(round.exchange == Exchange::AllgatherShards && chain.overlap),
            position: *position,
        });
        tail = push(step);
    }
    if compressing {
        tail = push(sync(
            StepKind::Decode { group, part },
            chain.codec,
            tail,
            decode_ops(piece.memory),
        ));
    }
    Ok(tail)
}

/// Whether a piece is encoded before its first round: compressed, or with a memory to add.
fn has_encode(piece: &Piece) -> bool {
    piece.compressor != Compressor::None || piece.memory != Memory::None
}

/// A step of piece `p`'s synchronization on `stream`, after step `after`.
fn sync_step(kind: StepKind, stream: Stream, after: u32, p: usize, ops: OpList) -> Step {
    Step {
        kind,
        stream,
        after: smallvec![after],
        after_previous: StepList::new(),
        from_iteration: 0,
        profiled_us: None,
        piece: Some(p as u32),
        ops,
        launch: None,
    }
}

pub(super) fn compute(kind: StepKind, profiled_us: f64) -> Step {
    Step {
        kind,
        stream: Stream::Compute,
        after: StepList::new(),
        after_previous: StepList::new(),
        from_iteration: 0,
        profiled_us: Some(profiled_us),
        piece: None,
        ops: OpList::new(),
        launch: None,
    }
}

/// What follows a piece's last collective: decode, then the memory's bookkeeping.
fn decode_ops(memory: Memory) -> OpList {
    let mut ops = smallvec![Op::Decode];
    if memory != Memory::None {
        ops.push(Op::UpdateMemory);
    }
    if matches!(memory, Memory::EfSignSgd { .. }) {
        ops.push(Op::ScaleOutput);
    }
    ops
}

/// The group's tensor that runs first in the forward pass.
pub(super) fn first_forward(model: &ModelProfile, group: &Group) -> usize {
    group
        .tensors
        .iter()
        .copied()
        .min_by_key(|&t| model.tensors[t].registration_index)
        .expect("validated groups are non-empty")
}

/// Group `group`'s buffer; with `float8` gathers (torchao's), its float8 weights are marked.
pub(super) fn buffer(model: &ModelProfile, group: &Group, float8: bool) -> Buffer {
    let mut offset = 0u64;
    let slots = group
        .tensors
        .iter()
        .map(|&t| {
            let tensor = &model.tensors[t];
            let numel = tensor.numel;
            let slot = Slot {
                tensor: t as u32,
                offset,
                numel,
                float8: float8 && tensor.is_float8_linear_weight(),
            };
            offset += numel;
            slot
        })
        .collect();
    Buffer {
        numel: offset,
        slots,
    }
}

/// The pieces of group `g`: equal partitions (the remainder spread over the first ones), each
/// with the collectives that move its payload, encoded as `encoding` says, by the group's
/// scheme. `turn` is the schedule's index of the first of them (parameter servers take turns).
pub fn lower_group(
    model: &ModelProfile,
    world: World,
    servers: Servers,
    turn: usize,
    g: usize,
    group: &Group,
    encoding: Encoding,
) -> Vec<Piece> {
    let aggregation = group.aggregation();
    let per_tensor = encoding.calls == CodecCalls::Tensor && group.compressor != Compressor::None;
    slices(model, group)
        .into_iter()
        .enumerate()
        .map(|(p, (range, shapes))| {
            let numel = range.end - range.start;
            // A single call on the whole piece is the piece's own codec. An all-to-all
            // reduce-scatter encodes each rank's chunk (the ring's chunks) in a call of its own.
            let calls = match (per_tensor, group.scheme) {
                (_, Scheme::AlltoallReduceScatter) => {
                    let ranks = u64::from(world.ranks());
                    (0..ranks)
                        .map(|c| share(numel, c, ranks))
                        .map(|r| r.end - r.start)
                        .collect()
                }
                (true, _) => tensor_calls(model, group, range.clone()),
                (false, _) => Vec::new(),
            };
            let calls = if calls.len() > 1 { calls } else { Vec::new() };
            let round_bytes = match (&shapes, group.compressor) {
                (Some(shapes), Compressor::PowerSgd { rank }) => powersgd_round_bytes(shapes, rank),
                // The executors encode each piece, and each of its calls, on its own: every
                // call's payload carries the codec's headers and rounding of its own.
                _ => {
                    let sizes = if calls.is_empty() {
                        &[numel][..]
                    } else {
                        &calls
                    };
                    smallvec![sizes
                        .iter()
                        .map(|&n| group.compressor.wire_bytes_as(n, encoding.wire))
                        .sum()]
                }
            };
            let rounds = round_bytes
                .iter()
                .flat_map(|&bytes| {
                    exchanges(group.scheme, aggregation, server(world, servers, turn + p))
                        .into_iter()
                        .map(move |exchange| Round {
                            exchange,
                            bytes: bytes.max(1),
                        })
                })
                .collect();
            Piece {
                group: g as u32,
                part: p as u32,
                offset: range.start,
                numel,
                compressor: group.compressor,
                memory: group.memory,
                scheme: group.scheme,
                compress_on: group.compress_on,
                aggregation,
                wire: encoding.wire,
                shapes,
                rounds,
                calls,
            }
        })
        .collect()
}

/// The element counts of the tensors (or their parts) that lie in `range` of the group's
/// buffer, in buffer order: one codec call each.
fn tensor_calls(model: &ModelProfile, group: &Group, range: std::ops::Range<u64>) -> Vec<u64> {
    let mut start = 0u64;
    group
        .tensors
        .iter()
        .filter_map(|&t| {
            let end = start + model.tensors[t].numel;
            let overlap = end.min(range.end).saturating_sub(start.max(range.start));
            start = end;
            (overlap > 0).then_some(overlap)
        })
        .collect()
}

/// A partition's elements of its group buffer and, for PowerSGD, the matrices it compresses.
type Slice = (std::ops::Range<u64>, Option<Vec<Vec<u64>>>);

/// Each partition's elements of the group buffer and, for PowerSGD, the matrices its codec
/// compresses. A whole group keeps its tensors' shapes. A partitioned single matrix is split
/// by rows, so that each partition is a smaller matrix with its own P and Q (what a
/// partitioning scheduler does with a 2-D gradient). Any other partition is a flat slice with
/// no low-rank form: PowerSGD sends it raw, in one round.
fn slices(model: &ModelProfile, group: &Group) -> Vec<Slice> {
    let numel = group.numel(model);
    let parts = u64::from(group.partitions);
    let flat = |p: u64| share(numel, p, parts);
    if !matches!(group.compressor, Compressor::PowerSgd { .. }) {
        return (0..parts).map(|p| (flat(p), None)).collect();
    }
    if parts == 1 {
        let shapes = group
            .tensors
            .iter()
            .map(|&t| model.tensors[t].shape.clone())
            .collect();
        return vec![(0..numel, Some(shapes))];
    }
    let matrix = match group.tensors.as_slice() {
        [t] => Some(&model.tensors[*t].shape).filter(|s| s.len() >= 2 && s[0] >= parts),
        _ => None,
    };
    match matrix {
        Some(shape) => {
            let (rows, cols) = (shape[0], numel / shape[0]);
            (0..parts)
                .map(|p| {
                    let own = share(rows, p, parts);
                    let range = own.start * cols..own.end * cols;
                    (range, Some(vec![vec![own.end - own.start, cols]]))
                })
                .collect()
        }
        None => (0..parts)
            .map(|p| {
                let range = flat(p);
                let numel = range.end - range.start;
                (range, Some(vec![vec![numel]]))
            })
            .collect(),
    }
}

/// Part `p` of `parts` equal shares of `total`, the remainder spread over the first ones.
fn share(total: u64, p: u64, parts: u64) -> std::ops::Range<u64> {
    let at = |i: u64| (u128::from(total) * u128::from(i) / u128::from(parts)) as u64;
    at(p)..at(p + 1)
}

/// Bytes of each allreduce round of PowerSGD over these matrices: P (with the raw tensors),
/// then Q when some tensor is low-rank.
fn powersgd_round_bytes(shapes: &[Vec<u64>], rank: u32) -> SmallVec<[u64; 2]> {
    let shapes: Vec<&[u64]> = shapes.iter().map(Vec::as_slice).collect();
    let layout = powersgd_layout(&shapes, rank);
    let p: u64 = layout.iter().map(|m| m.p_bytes()).sum();
    let q: u64 = layout.iter().map(|m| m.q_bytes()).sum();
    SmallVec::from_slice(&[p, q][..powersgd_rounds(&layout) as usize])
}

/// The server of the schedule's `turn`-th piece: pieces take turns over the nodes' first ranks
/// (or the dedicated servers), so that a model's pieces spread over every server's link, as
/// BytePS and ByteScheduler spread their partitions' keys.
fn server(world: World, servers: Servers, turn: usize) -> u32 {
    match servers {
        Servers::Colocated => (turn as u64 % u64::from(world.nodes)) as u32 * world.ranks_per_node,
        Servers::Dedicated(n) => (turn as u64 % u64::from(n.max(1))) as u32,
    }
}

/// The collectives that move one round's payload by the group's scheme; `server` serves a
/// parameter server's push-pull.
fn exchanges(scheme: Scheme, aggregation: Aggregation, server: u32) -> SmallVec<[Exchange; 2]> {
    match (scheme, aggregation) {
        (Scheme::Hierarchical, _) => smallvec![Exchange::HierarchicalAllreduce],
        (Scheme::ReduceScatterAllgather, _) => {
            smallvec![Exchange::ReduceScatter, Exchange::AllgatherShards]
        }
        (Scheme::CompressedRing, _) => smallvec![Exchange::CompressedRing],
        (Scheme::ReduceScatter, _) => smallvec![Exchange::ReduceScatter],
        (Scheme::HybridReduceScatter, _) => smallvec![Exchange::HybridReduceScatter],
        (Scheme::AlltoallReduceScatter, _) => smallvec![Exchange::AlltoallReduceScatter],
        (_, Aggregation::Allreduce) => smallvec![Exchange::Allreduce],
        (_, Aggregation::Allgather) => smallvec![Exchange::Allgather],
        (_, Aggregation::ParameterServer) => smallvec![Exchange::PushPull { server }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::Wire;
    use crate::plan::{Launch, Policy};
    use crate::schedule::Program;
    use crate::strategy::{per_tensor_plan, plan_order};

    fn world(nodes: u32, ranks_per_node: u32) -> World {
        World {
            nodes,
            ranks_per_node,
        }
    }

    /// A model of `n` tensors of 1000 elements, 1 ms of backward each, registered in reverse.
    fn model(n: usize) -> ModelProfile {
        let mut model = ModelProfile::load("resnet50").unwrap();
        model.tensors.truncate(n);
        for (i, t) in model.tensors.iter_mut().enumerate() {
            t.name = format!("t{i}");
            t.shape = vec![1000];
            t.numel = 1000;
            t.registration_index = n - 1 - i;
            t.backward_us = 1000.0;
            t.forward_us = 500.0;
        }
        model
    }

    fn plan(model: &ModelProfile, groups: Vec<Vec<usize>>, spec: &str, scheme: Scheme) -> Plan {
        let mut plan = per_tensor_plan(model);
        plan.groups = groups
            .into_iter()
            .enumerate()
            .map(|(i, tensors)| Group {
                tensors,
                compressor: spec.parse().unwrap(),
                memory: Memory::None,
                compress_on: CompressOn::Gpu,
                scheme,
                partitions: 1,
                priority: i as i64,
            })
            .collect();
        plan
    }

    fn kinds(schedule: &Schedule) -> Vec<StepKind> {
        schedule.steps.iter().map(|s| s.kind).collect()
    }

    #[test]
    fn wait_free_backprop_is_forward_backward_one_collective_per_tensor_and_the_optimizer() {
        let model = model(3);
        let schedule = lower(&model, world(2, 1), false, &per_tensor_plan(&model), "t").unwrap();
        let c = |g| StepKind::Collective {
            group: g,
            part: 0,
            round: 0,
        };
        // Forward in registration order (t2 first), backward in gradient-ready order.
        assert_eq!(
            kinds(&schedule),
            vec![
                StepKind::Forward { tensor: 2 },
                StepKind::Forward { tensor: 1 },
                StepKind::Forward { tensor: 0 },
                StepKind::Backward { tensor: 0 },
                StepKind::Backward { tensor: 1 },
                StepKind::Backward { tensor: 2 },
                c(0),
                c(1),
                c(2),
                StepKind::Optimizer,
            ]
        );
        // Each collective waits for its tensor's gradient; the optimizer for all of them.
        assert_eq!(schedule.steps[6].after[..], [3]);
        assert_eq!(schedule.steps[8].after[..], [5]);
        assert_eq!(schedule.steps[9].after[..], [6, 7, 8]);
        assert_eq!(schedule.iteration_end, 5);
        // An uncompressed collective encodes (casts) and decodes itself.
        assert_eq!(
            schedule.steps[6].ops[..],
            [Op::Compensate, Op::Encode, Op::Exchange, Op::Decode]
        );
        assert_eq!(schedule.steps[6].launch.unwrap().position, 1);
        assert_eq!(schedule.pieces[1].rounds[0].bytes, 4000);
    }

    #[test]
    fn a_single_rank_has_nothing_to_synchronize() {
        let model = model(3);
        let mut plan = per_tensor_plan(&model);
        plan.policy.overlap_forward = true;
        let schedule = lower(&model, world(1, 1), false, &plan, "t").unwrap();
        assert!(schedule.pieces.is_empty());
        assert_eq!(schedule.buffers.len(), 3);
        assert_eq!(schedule.steps.last().unwrap().kind, StepKind::Optimizer);
        assert_eq!(schedule.steps.len(), 7);
    }

    /// Two groups of two tensors, each top-k compressed.
    fn two_topk_groups(model: &ModelProfile) -> Plan {
        plan(
            model,
            vec![vec![0, 1], vec![2, 3]],
            "topk:0.1",
            Scheme::Auto,
        )
    }

    #[test]
    fn codecs_in_line_encode_behind_their_gradient_and_decode_after_backward() {
        let model = model(4);
        let mut plan = two_topk_groups(&model);
        plan.codec_stream = CodecStream::Compute;
        let schedule = lower(&model, world(1, 4), false, &plan, "t").unwrap();
        schedule.validate("t").unwrap();
        let kinds: Vec<StepKind> = schedule
            .steps
            .iter()
            .filter(|s| s.stream == Stream::Compute)
            .map(|s| s.kind)
            .collect();
        let backward = |t| StepKind::Backward { tensor: t };
        let encode = |g| StepKind::Encode { group: g, part: 0 };
        let decode = |g| StepKind::Decode { group: g, part: 0 };
        // After the forward pass: each group's encode right behind its last gradient, ahead of
        // the backward steps after it; the decodes behind the whole backward pass, in plan
        // order, and the optimizer last.
        assert_eq!(
            kinds[4..],
            [
                backward(0),
                backward(1),
                encode(0),
                backward(2),
                backward(3),
                encode(1),
                decode(0),
                decode(1),
                StepKind::Optimizer
            ]
        );
        assert!(schedule.steps.iter().all(|s| s.stream != Stream::Codec));
        // CPU ranks run their codecs on their compression thread whatever the plan says.
        let cpu = lower(&model, world(1, 4), true, &plan, "t").unwrap();
        let on_codec = cpu.steps.iter().filter(|s| s.stream == Stream::Codec);
        assert_eq!(on_codec.count(), 4);
        // Overlapping the next forward pass with codecs in line is refused, by field.
        plan.policy.overlap_forward = true;
        let err = lower(&model, world(1, 4), false, &plan, "t").unwrap_err();
        assert!(err.to_string().contains("codec_stream"), "{err}");
    }

    #[test]
    fn compressed_groups_encode_and_decode_on_the_codec_stream() {
        let model = model(4);
        let mut plan = two_topk_groups(&model);
        plan.groups[1].memory = Memory::EfSignSgd { lr: 0.5 };
        plan.groups[1].partitions = 2;
        let schedule = lower(&model, world(1, 4), false, &plan, "t").unwrap();
        let encode = |g, p| StepKind::Encode { group: g, part: p };
        let steps: Vec<&Step> = schedule
            .steps
            .iter()
            .filter(|s| s.stream == Stream::Codec)
            .collect();
        assert_eq!(steps.len(), 6, "3 pieces, each encoded and decoded");
        assert_eq!(steps[0].kind, encode(0, 0));
        assert_eq!(steps[0].ops[..], [Op::Compensate, Op::Encode]);
        let last = steps.last().unwrap();
        assert_eq!(
            last.ops[..],
            [Op::Decode, Op::UpdateMemory, Op::ScaleOutput]
        );
        // The two partitions split 2000 elements in two; top-k sends k (index, value) pairs.
        assert_eq!(
            (schedule.pieces[1].offset, schedule.pieces[1].numel),
            (0, 1000)
        );
        assert_eq!(
            (schedule.pieces[2].offset, schedule.pieces[2].numel),
            (1000, 1000)
        );
        assert_eq!(schedule.pieces[2].rounds[0].bytes, 800);
        assert_eq!(schedule.pieces[2].rounds[0].exchange, Exchange::Allgather);
        // A CPU rank compresses on its own compression stream, beside its compute; a GPU
        // rank told to compress on the CPU uses its host's CPU stream.
        let cpu = lower(&model, world(1, 4), true, &plan, "t").unwrap();
        assert!(cpu.steps.iter().all(|s| s.stream != Stream::Cpu));
        let mut offloaded = plan.clone();
        offloaded.groups[0].compress_on = CompressOn::Cpu;
        let gpu = lower(&model, world(1, 4), false, &offloaded, "t").unwrap();
        assert!(gpu.steps.iter().any(|s| s.stream == Stream::Cpu));
    }

    #[test]
    fn a_plan_sending_byte_codes_is_lowered_to_byte_rounds_and_says_so_in_its_pieces() {
        let model = model(2);
        let mut plan = plan(&model, vec![vec![0, 1]], "signsgd", Scheme::Allgather);
        let packed = lower(&model, world(1, 4), false, &plan, "t").unwrap();
        assert_eq!(packed.pieces[0].rounds[0].bytes, 2000 / 8);
        assert_eq!(packed.pieces[0].wire, Wire::Packed);
        plan.wire = Wire::Bytes;
        let bytes = lower(&model, world(1, 4), false, &plan, "t").unwrap();
        assert_eq!(bytes.pieces[0].rounds[0].bytes, 2000);
        assert_eq!(bytes.pieces[0].wire, Wire::Bytes);
        // The plan file names it only when it is not the default.
        assert!(!serde_json::to_string(&packed).unwrap().contains("\"wire\""));
        let text = serde_json::to_string(&plan).unwrap();
        assert!(text.contains("\"wire\":\"bytes\""), "{text}");
        assert_eq!(serde_json::from_str::<Plan>(&text).unwrap(), plan);
    }

    #[test]
    fn a_plan_compressing_each_tensor_makes_a_call_per_tensor_part_and_sums_their_payloads() {
        let mut model = model(3);
        model.tensors[1].numel = 500;
        model.tensors[1].shape = vec![500];
        let mut plan = plan(&model, vec![vec![0, 1, 2]], "onebit", Scheme::Allgather);
        plan.groups[0].partitions = 2;
        plan.codec_calls = CodecCalls::Tensor;
        let schedule = lower(&model, world(1, 4), false, &plan, "t").unwrap();
        // 2500 elements in two pieces of 1250: the middle tensor is cut between them.
        let calls: Vec<&[u64]> = schedule.pieces.iter().map(|p| &p.calls[..]).collect();
        assert_eq!(calls, [&[1000, 250][..], &[250, 1000][..]]);
        // Each call carries onebit's two means and its bits: 8 + ceil(n / 8) bytes.
        let call = |n: u64| 8 + n.div_ceil(8);
        assert_eq!(
            schedule.pieces[0].rounds[0].bytes,
            call(1000) + call(250),
            "one call's headers per tensor part"
        );
        // One call per piece otherwise, and an uncompressed group has no codec calls at all.
        plan.codec_calls = CodecCalls::Group;
        let fused = lower(&model, world(1, 4), false, &plan, "t").unwrap();
        assert!(fused.pieces.iter().all(|p| p.calls.is_empty()));
        assert_eq!(fused.pieces[0].codec_calls(), [1250]);
        plan.codec_calls = CodecCalls::Tensor;
        plan.groups[0].compressor = Compressor::None;
        plan.groups[0].scheme = Scheme::Auto;
        let dense = lower(&model, world(1, 4), false, &plan, "t").unwrap();
        assert!(dense.pieces.iter().all(|p| p.calls.is_empty()));
        let text = serde_json::to_string(&plan).unwrap();
        assert!(text.contains("\"codec_calls\":\"tensor\""), "{text}");
        assert_eq!(serde_json::from_str::<Plan>(&text).unwrap(), plan);
    }

    #[test]
    fn dear_splits_the_allreduce_and_updates_before_the_next_forward() {
        let model = model(2);
        let mut plan = plan(
            &model,
            vec![vec![0, 1]],
            "none",
            Scheme::ReduceScatterAllgather,
        );
        plan.policy.overlap_forward = true;
        let schedule = lower(&model, world(2, 2), false, &plan, "t").unwrap();
        let rounds: Vec<Exchange> = schedule.pieces[0]
            .rounds
            .iter()
            .map(|r| r.exchange)
            .collect();
        assert_eq!(
            rounds,
            vec![Exchange::ReduceScatter, Exchange::AllgatherShards]
        );
        let update = &schedule.steps[0];
        assert_eq!(update.kind, StepKind::Update { group: 0 });
        assert_eq!(update.from_iteration, 1);
        assert_eq!(
            update.after_previous.len(),
            1,
            "the all-gather of the last iteration"
        );
        // Each rank updates its quarter of the model.
        assert_eq!(update.profiled_us, Some(model.optimizer_us / 4.0));
        let gather = schedule
            .steps
            .iter()
            .find(|s| {
                s.kind
                    == StepKind::Collective {
                        group: 0,
                        part: 0,
                        round: 1,
                    }
            })
            .unwrap();
        assert_eq!(gather.launch.unwrap().phase, 1);
        assert_eq!(gather.ops[..], [Op::Exchange, Op::Decode]);
        assert!(schedule.steps.iter().all(|s| s.kind != StepKind::Optimizer));
        // Iteration 0 has no update; later ones do.
        let program = Program::unroll(&schedule, 2).unwrap();
        let updates = program
            .tasks
            .iter()
            .filter(|t| t.step == 0)
            .map(|t| t.iteration)
            .collect::<Vec<_>>();
        assert_eq!(updates, vec![1]);
    }

    /// The server of each piece's push-pull round.
    fn servers_of(schedule: &Schedule) -> Vec<u32> {
        schedule
            .pieces
            .iter()
            .map(|p| match p.rounds[0].exchange {
                Exchange::PushPull { server } => server,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn pieces_take_turns_over_the_nodes_first_ranks_or_the_dedicated_servers() {
        let model = model(3);
        let mut plan = plan(
            &model,
            vec![vec![0], vec![1], vec![2]],
            "onebit",
            Scheme::Ps,
        );
        plan.groups[1].partitions = 2;
        // Pieces g0, g1.0, g1.1, g2 take turns over 2 nodes of 2 ranks.
        let colocated = lower(&model, world(2, 2), false, &plan, "t").unwrap();
        assert_eq!(colocated.servers, Servers::Colocated);
        assert_eq!(servers_of(&colocated), vec![0, 2, 0, 2]);
        plan.policy.ps_servers = 3;
        let dedicated = lower(&model, world(2, 2), false, &plan, "t").unwrap();
        assert_eq!(dedicated.servers, Servers::Dedicated(3));
        assert_eq!(servers_of(&dedicated), vec![0, 1, 2, 0]);
        dedicated.validate("t").unwrap();
    }

    #[test]
    fn powersgd_sends_p_then_q_and_computes_q_in_its_second_round() {
        let mut model = model(1);
        model.tensors[0].shape = vec![10, 100];
        let plan = plan(&model, vec![vec![0]], "powersgd:2", Scheme::Auto);
        let schedule = lower(&model, world(1, 2), false, &plan, "t").unwrap();
        let bytes: Vec<u64> = schedule.pieces[0].rounds.iter().map(|r| r.bytes).collect();
        assert_eq!(bytes, vec![10 * 2 * 4, 100 * 2 * 4]);
        let second = schedule
            .steps
            .iter()
            .find(|s| {
                s.kind
                    == StepKind::Collective {
                        group: 0,
                        part: 0,
                        round: 1,
                    }
            })
            .unwrap();
        assert_eq!(second.ops[..], [Op::NextRound, Op::Exchange]);
    }

    #[test]
    fn a_partitioned_powersgd_matrix_is_split_by_rows_and_a_fused_one_is_sent_raw() {
        let mut model = model(2);
        model.tensors[0].shape = vec![40, 100];
        model.tensors[0].numel = 4000;
        let mut plan = plan(&model, vec![vec![0], vec![1]], "powersgd:2", Scheme::Auto);
        plan.groups[0].partitions = 3;
        plan.groups[1].partitions = 2;
        let schedule = lower(&model, world(1, 2), false, &plan, "t").unwrap();
        let pieces: Vec<&Piece> = schedule.pieces.iter().filter(|p| p.group == 0).collect();
        // Rows 13 + 13 + 14 of 100 columns: each partition its own P (rows × 2) and Q (100 × 2).
        let rows: Vec<u64> = pieces.iter().map(|p| p.numel / 100).collect();
        assert_eq!(rows, vec![13, 13, 14]);
        for piece in &pieces {
            let r = piece.numel / 100;
            assert_eq!(piece.shapes, Some(vec![vec![r, 100]]));
            let bytes: Vec<u64> = piece.rounds.iter().map(|r| r.bytes).collect();
            assert_eq!(bytes, vec![r * 2 * 4, 100 * 2 * 4]);
        }
        // A 1-D tensor has no matrix: each partition is a flat slice, raw in one round.
        for piece in schedule.pieces.iter().filter(|p| p.group == 1) {
            assert_eq!(piece.shapes, Some(vec![vec![piece.numel]]));
            let bytes: Vec<u64> = piece.rounds.iter().map(|r| r.bytes).collect();
            assert_eq!(bytes, vec![piece.numel * 4]);
        }
    }

    #[test]
    fn a_schedule_round_trips_through_json_and_rejects_broken_edits() {
        let model = model(3);
        let mut plan = per_tensor_plan(&model);
        plan.policy = Policy {
            launch: Launch::Priority,
            comm_streams: 2,
            ..plan_order(5000.0)
        };
        let schedule = lower(&model, world(2, 2), false, &plan, "t").unwrap();
        assert_eq!(schedule.policy.cycle_ns, 5_000_000);
        let text = serde_json::to_string(&schedule).unwrap();
        let back: Schedule = serde_json::from_str(&text).unwrap();
        assert_eq!(back, schedule);
        back.validate("t").unwrap();
        let broken = |edit: &dyn Fn(&mut Schedule), field: &str| {
            let mut s = schedule.clone();
            edit(&mut s);
            let err = s.validate("s.json").unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        };
        broken(&|s| s.steps[6].after = smallvec![7], "steps[6].after");
        broken(&|s| s.steps[6].piece = Some(99), "steps[6].piece");
        broken(
            &|s| s.steps[0].profiled_us = Some(f64::NAN),
            "steps[0].profiled_us",
        );
        broken(&|s| s.iteration_end = 1000, "iteration_end");
        broken(&|s| s.pieces[0].numel = 10_000, "pieces[0]");
        broken(&|s| s.policy.comm_streams = 0, "comm_streams");
        broken(
            &|s| s.pieces[0].calls = vec![u64::MAX, 2],
            "pieces[0].calls",
        );
        broken(&|s| s.pieces[0].calls = vec![500, 400], "pieces[0].calls");
        broken(&|s| s.pieces[0].calls = vec![500, 500], "uncompressed");
    }

    #[test]
    fn a_plan_for_another_model_is_refused() {
        let three = model(3);
        let four = model(4);
        let err = lower(
            &four,
            world(1, 2),
            false,
            &per_tensor_plan(&three),
            "p.json",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("p.json") && err.contains("made for"), "{err}");
    }
}
