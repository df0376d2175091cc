//! Builds the task graph of a scenario: durations from the profiles, collective costs from the
//! cluster model, dependencies from the plan.

use crate::collective::{self, Estimate, Group as RankGroup, Op, ServerPlacement};
use crate::compress::{Aggregation, Compressor, Memory};
use crate::device::{DeviceKind, DeviceProfile};
use crate::error::{Result, SimError};
use crate::graph::{LaunchKey, Resource, Task, TaskGraph, TaskKind};
use crate::plan::{CompressOn, Group, Scheme};
use crate::scenario::Scenario;
use crate::time::SimTime;
use petgraph::graph::{DiGraph, NodeIndex};

/// GPU-to-host bandwidth of a PCIe 3.0 x16 link as NCCL's topology model counts it (PCI_BW,
/// src/graph/topo.h): compression on the host pays it for the gradient and for the result.
const HOST_LINK_GBYTES_PER_S: f64 = 12.0;

/// One collective of a group's synchronization.
struct Round {
    bytes: u64,
    estimate: Estimate,
    /// DeAR's all-gather waits for the next forward pass in the launch order.
    before_next_forward: bool,
}

/// The synchronization of one piece (partition) of one group, the same in every iteration.
struct PieceCost {
    encode: Option<SimTime>,
    rounds: Vec<Round>,
    decode: Option<SimTime>,
}

/// Everything about a group that does not change between iterations.
struct GroupSync {
    pieces: Vec<PieceCost>,
    codec: Resource,
    /// The group's tensor that runs first in the forward pass.
    first_forward: usize,
    /// Its optimizer step when it runs per group.
    update: SimTime,
}

/// Builds `iterations` iterations of the scenario's training loop for one rank.
pub fn build_graph(scenario: &Scenario, iterations: u32) -> Result<TaskGraph> {
    let model = &scenario.model;
    let plan = &scenario.plan;
    let overlap = plan.policy.overlap_forward;
    let syncs: Vec<GroupSync> = if scenario.cluster.world_size() > 1 {
        plan.groups
            .iter()
            .enumerate()
            .map(|(g, group)| group_sync(scenario, g, group))
            .collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    let scaled = |us: f64| SimTime::from_us(us * scenario.compute_scale);
    let forward_order = model.forward_order();
    // Groups whose optimizer step runs just before each tensor's forward.
    let mut updates_before: Vec<Vec<usize>> = vec![Vec::new(); model.num_tensors()];
    for (g, sync) in syncs.iter().enumerate() {
        updates_before[sync.first_forward].push(g);
    }
    let mut graph: DiGraph<Task, ()> = DiGraph::new();
    let mut iteration_end = Vec::new();
    let mut chain_tail: Option<NodeIndex> = None;
    // Per group, the last node of each of its pieces in the previous iteration.
    let mut previous_sync_tails: Vec<Vec<NodeIndex>> = Vec::new();
    let mut position = 0u32;
    for k in 0..iterations {
        let compute = |kind, duration| Task {
            kind,
            iteration: k,
            resource: Resource::Compute,
            duration,
            bytes: 0,
            estimate: None,
            launch_key: LaunchKey::default(),
        };
        let mut chain = |graph: &mut DiGraph<Task, ()>, task: Task| {
            let node = graph.add_node(task);
            if let Some(tail) = chain_tail {
                graph.add_edge(tail, node, ());
            }
            chain_tail = Some(node);
            node
        };
        // Forward in registration order, then backward in gradient-ready order: one chain.
        for &t in &forward_order {
            if overlap && k > 0 {
                for &g in &updates_before[t] {
                    let update = chain(
                        &mut graph,
                        compute(TaskKind::Update { group: g as u32 }, syncs[g].update),
                    );
                    for &tail in &previous_sync_tails[g] {
                        graph.add_edge(tail, update, ());
                    }
                }
            }
            chain(
                &mut graph,
                compute(
                    TaskKind::Forward { tensor: t as u32 },
                    scaled(model.tensors[t].forward_us),
                ),
            );
        }
        let backward: Vec<NodeIndex> = model
            .tensors
            .iter()
            .enumerate()
            .map(|(t, tensor)| {
                chain(
                    &mut graph,
                    compute(
                        TaskKind::Backward { tensor: t as u32 },
                        scaled(tensor.backward_us),
                    ),
                )
            })
            .collect();
        let last_backward = *backward.last().expect("a model has tensors");
        let mut sync_tails = Vec::with_capacity(syncs.len());
        for (g, (group, sync)) in plan.groups.iter().zip(&syncs).enumerate() {
            let ready = group
                .tensors
                .iter()
                .map(|&t| backward[t])
                .max_by_key(|n| n.index())
                .expect("validated groups are non-empty");
            let tails: Vec<NodeIndex> = sync
                .pieces
                .iter()
                .enumerate()
                .map(|(part, piece)| {
                    add_piece(
                        &mut graph,
                        ready,
                        piece,
                        sync.codec,
                        group.priority,
                        k,
                        (g, part),
                        &mut position,
                    )
                })
                .collect();
            sync_tails.push(tails);
        }
        // Without synchronization (one GPU) there are no per-group updates: one optimizer step.
        if !overlap || syncs.is_empty() {
            let optimizer = chain(
                &mut graph,
                compute(TaskKind::Optimizer, scaled(model.optimizer_us)),
            );
            for &tail in sync_tails.iter().flatten() {
                graph.add_edge(tail, optimizer, ());
            }
        }
        // In steady state every iteration repeats with the same period, so the end of the last
        // backward marks iterations for overlapping and non-overlapping policies alike.
        iteration_end.push(last_backward);
        previous_sync_tails = sync_tails;
    }
    Ok(TaskGraph::freeze(graph, iterations, iteration_end))
}

/// Encode, communication (all rounds) and decode time of each piece of one group, as the graph
/// will run them: the stages a pipelining strategy (HiPress's SeCoPa) reasons about.
pub fn piece_stages(scenario: &Scenario, group: &Group) -> Result<Vec<[SimTime; 3]>> {
    let sync = group_sync(scenario, 0, group)?;
    Ok(sync
        .pieces
        .iter()
        .map(|p| {
            [
                p.encode.unwrap_or(SimTime::ZERO),
                p.rounds.iter().map(|r| r.estimate.time).sum(),
                p.decode.unwrap_or(SimTime::ZERO),
            ]
        })
        .collect())
}

/// Adds one piece's encode, collectives and decode after `ready`; returns the last node.
#[allow(clippy::too_many_arguments)]
fn add_piece(
    graph: &mut DiGraph<Task, ()>,
    ready: NodeIndex,
    piece: &PieceCost,
    codec: Resource,
    priority: i64,
    iteration: u32,
    (group, part): (usize, usize),
    position: &mut u32,
) -> NodeIndex {
    let (group, part) = (group as u32, part as u32);
    let side_task = |kind, duration| Task {
        kind,
        iteration,
        resource: codec,
        duration,
        bytes: 0,
        estimate: None,
        launch_key: LaunchKey::default(),
    };
    let mut tail = ready;
    let mut then = |graph: &mut DiGraph<Task, ()>, task: Task| {
        let node = graph.add_node(task);
        graph.add_edge(tail, node, ());
        tail = node;
    };
    if let Some(duration) = piece.encode {
        then(graph, side_task(TaskKind::Encode { group, part }, duration));
    }
    for (round, r) in piece.rounds.iter().enumerate() {
        *position += 1;
        then(
            graph,
            Task {
                kind: TaskKind::Collective {
                    group,
                    part,
                    round: round as u32,
                },
                iteration,
                resource: Resource::Comm,
                duration: r.estimate.time,
                bytes: r.bytes,
                estimate: Some(r.estimate),
                launch_key: LaunchKey {
                    priority,
                    iteration,
                    phase: u8::from(r.before_next_forward),
                    // All-gathers go in forward order, which is backward order reversed.
                    position: if r.before_next_forward {
                        u32::MAX - *position
                    } else {
                        *position
                    },
                },
            },
        );
    }
    if let Some(duration) = piece.decode {
        then(graph, side_task(TaskKind::Decode { group, part }, duration));
    }
    tail
}

/// Costs of each partition of a group on the scenario's cluster.
fn group_sync(scenario: &Scenario, g: usize, group: &Group) -> Result<GroupSync> {
    let model = &scenario.model;
    let cluster = &scenario.cluster;
    let device: &DeviceProfile = match (group.compress_on, &scenario.host_codec) {
        (CompressOn::Gpu, _) => &scenario.device,
        (CompressOn::Cpu, Some(host)) => host,
        (CompressOn::Cpu, None) => {
            return Err(SimError::bad_value(
                format!("groups[{g}].compress_on"),
                "cpu",
                "compressing on the CPU needs a host profile (--cpu-compression PROFILE)",
            ))
        }
    };
    let world = u64::from(cluster.world_size());
    // Compressing on the host moves the fp32 gradient to the host and the decoded result back.
    let host_copy = |numel: u64| match device.kind {
        DeviceKind::Cpu => SimTime::from_secs(4.0 * numel as f64 / (HOST_LINK_GBYTES_PER_S * 1e9)),
        DeviceKind::Gpu => SimTime::ZERO,
    };
    let numel = group.numel(model);
    let parts = u64::from(group.partitions);
    let round_shares = round_shares(scenario, group);
    let compressing = group.compressor != Compressor::None;
    let pieces = (0..parts)
        .map(|p| {
            // Equal pieces; the remainder spreads over the first ones.
            let share = |total: u64| total * (p + 1) / parts - total * p / parts;
            let piece_numel = share(numel).max(1);
            let encode = (compressing || group.memory != Memory::None)
                .then(|| -> Result<SimTime> {
                    Ok(group.compressor.encode_time(device, piece_numel)?
                        + group.memory.update_time(device, piece_numel)
                        + host_copy(piece_numel))
                })
                .transpose()?;
            let decode = compressing
                .then(|| -> Result<SimTime> {
                    let one = group.compressor.decode_time(device, piece_numel)?;
                    let decoded = match (group.scheme, group.aggregation()) {
                        // Every rank decodes every rank's payload.
                        (_, Aggregation::Allgather) => SimTime(one.as_ns() * world),
                        // The server decodes the pushed payloads of its shard and re-encodes
                        // the sum; the worker decodes the pulled result.
                        (Scheme::Ps, _) => {
                            one + one
                                + group
                                    .compressor
                                    .encode_time(device, piece_numel / u64::from(cluster.nodes))?
                        }
                        // The ring's per-hop work is in its collective; the result is decoded once.
                        _ => one,
                    };
                    Ok(decoded + host_copy(piece_numel))
                })
                .transpose()?;
            let rounds = round_shares
                .iter()
                .map(|&round_bytes| {
                    rounds(
                        scenario,
                        group,
                        device,
                        share(round_bytes).max(1),
                        piece_numel,
                    )
                })
                .collect::<Result<Vec<_>>>()?
                .into_iter()
                .flatten()
                .collect();
            Ok(PieceCost {
                encode,
                rounds,
                decode,
            })
        })
        .collect::<Result<_>>()?;
    let first_forward = group
        .tensors
        .iter()
        .copied()
        .min_by_key(|&t| model.tensors[t].registration_index)
        .expect("validated groups are non-empty");
    // The optimizer's share of this group; DeAR updates only its 1/world shard.
    let share = numel as f64 / model.total_numel() as f64;
    let shard = if group.scheme == Scheme::ReduceScatterAllgather {
        world as f64
    } else {
        1.0
    };
    Ok(GroupSync {
        pieces,
        codec: match device.kind {
            DeviceKind::Gpu => Resource::Codec,
            DeviceKind::Cpu => Resource::Cpu,
        },
        first_forward,
        update: SimTime::from_us(model.optimizer_us * scenario.compute_scale * share / shard),
    })
}

/// Bytes of each allreduce round of a group: PowerSGD sends P then Q, everything else one round.
fn round_shares(scenario: &Scenario, group: &Group) -> Vec<u64> {
    match group.compressor {
        Compressor::PowerSgd { rank } => {
            let shapes: Vec<&[u64]> = group
                .tensors
                .iter()
                .map(|&t| scenario.model.tensors[t].shape.as_slice())
                .collect();
            let layout = crate::compress::powersgd_layout(&shapes, rank);
            let p: u64 = layout.iter().map(|m| m.p_bytes()).sum();
            let q: u64 = layout.iter().map(|m| m.q_bytes()).sum();
            if q == 0 {
                vec![p]
            } else {
                vec![p, q]
            }
        }
        _ => vec![group.wire_bytes(&scenario.model)],
    }
}

/// The collectives that move one rank's payload of `bytes` by the group's scheme.
fn rounds(
    scenario: &Scenario,
    group: &Group,
    device: &DeviceProfile,
    bytes: u64,
    numel: u64,
) -> Result<Vec<Round>> {
    let cluster = &scenario.cluster;
    let world = RankGroup::world(cluster);
    let one = |estimate: Estimate| {
        vec![Round {
            bytes,
            estimate,
            before_next_forward: false,
        }]
    };
    Ok(match (group.scheme, group.aggregation()) {
        (Scheme::Hierarchical, _) => {
            one(collective::estimate_hierarchical_allreduce(cluster, bytes)?)
        }
        (Scheme::ReduceScatterAllgather, _) => vec![
            Round {
                bytes,
                estimate: collective::estimate(cluster, Op::ReduceScatter, bytes, world)?,
                before_next_forward: false,
            },
            Round {
                bytes,
                estimate: collective::estimate(cluster, Op::Allgather, bytes, world)?,
                before_next_forward: scenario.plan.policy.overlap_forward,
            },
        ],
        (Scheme::CompressedRing, _) => {
            // A ring allreduce moves the compressed shards; in its reduce-scatter half each of
            // the n-1 hops decodes the incoming shard, adds and re-encodes it.
            let mut estimate = collective::estimate(cluster, Op::Allreduce, bytes, world)?;
            let shard = numel.div_ceil(u64::from(world.ranks)).max(1);
            let hop = group.compressor.decode_time(device, shard)?
                + group.compressor.encode_time(device, shard)?;
            estimate.time += SimTime(hop.as_ns() * u64::from(world.ranks - 1));
            one(estimate)
        }
        (_, Aggregation::Allreduce) => {
            one(collective::estimate(cluster, Op::Allreduce, bytes, world)?)
        }
        (_, Aggregation::Allgather) => one(collective::estimate(
            cluster,
            Op::Allgather,
            bytes * u64::from(world.ranks),
            world,
        )?),
        (_, Aggregation::ParameterServer) => {
            let placement = match scenario.plan.policy.ps_servers {
                0 => ServerPlacement::Colocated,
                servers => ServerPlacement::Dedicated { servers },
            };
            // BytePS: reduce inside each node, push/pull between nodes, broadcast inside.
            let mut estimate = collective::ps_push_pull(cluster, bytes, cluster.nodes, placement)?;
            if cluster.gpus_per_node > 1 {
                let local = RankGroup::one_node(cluster);
                estimate.time += collective::estimate(cluster, Op::Reduce, bytes, local)?.time
                    + collective::estimate(cluster, Op::Broadcast, bytes, local)?.time;
            }
            one(estimate)
        }
    })
}
