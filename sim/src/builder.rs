//! Builds the task graph of a scenario: durations from the profiles, collective costs from the
//! cluster model, dependencies from the plan.

use crate::collective::{self, Estimate, Group as RankGroup, Op, ServerPlacement};
use crate::compress::{Aggregation, Compressor, Memory};
use crate::device::DeviceKind;
use crate::error::Result;
use crate::graph::{Resource, Task, TaskGraph, TaskKind};
use crate::plan::{Group, Scheme};
use crate::scenario::Scenario;
use crate::time::SimTime;
use petgraph::graph::{DiGraph, NodeIndex};

/// GPU-to-host bandwidth of a PCIe 3.0 x16 link as NCCL's topology model counts it (PCI_BW,
/// src/graph/topo.h): compression on the host pays it for the gradient and for the result.
const HOST_LINK_GBYTES_PER_S: f64 = 12.0;

/// The synchronization of one piece (partition) of one group, shared by every iteration.
struct PieceCost {
    encode: Option<SimTime>,
    /// Bytes and cost of each collective round.
    rounds: Vec<(u64, Estimate)>,
    decode: Option<SimTime>,
}

/// Builds `iterations` iterations of the scenario's training loop for one rank.
pub fn build_graph(scenario: &Scenario, iterations: u32) -> Result<TaskGraph> {
    let model = &scenario.model;
    let plan = &scenario.plan;
    let synchronize = scenario.cluster.world_size() > 1;
    let costs: Vec<Vec<PieceCost>> = if synchronize {
        plan.groups
            .iter()
            .map(|group| piece_costs(scenario, group))
            .collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    let codec_resource = match scenario.codec_device().kind {
        DeviceKind::Gpu => Resource::Codec,
        DeviceKind::Cpu => Resource::Cpu,
    };
    let scaled = |us: f64| SimTime::from_us(us * scenario.compute_scale);
    let forward_order = model.forward_order();
    let mut graph: DiGraph<Task, ()> = DiGraph::new();
    let mut iteration_end = Vec::new();
    let mut previous_optimizer: Option<NodeIndex> = None;
    let mut collective_position = 0u32;
    for k in 0..iterations {
        let compute = |kind, duration| Task {
            kind,
            iteration: k,
            resource: Resource::Compute,
            duration,
            bytes: 0,
            estimate: None,
            launch_key: (0, k, 0),
        };
        // Forward in registration order, then backward in gradient-ready order, one chain.
        let mut chain_tail = previous_optimizer;
        for &t in &forward_order {
            let node = graph.add_node(compute(
                TaskKind::Forward { tensor: t as u32 },
                scaled(model.tensors[t].forward_us),
            ));
            if let Some(tail) = chain_tail {
                graph.add_edge(tail, node, ());
            }
            chain_tail = Some(node);
        }
        let mut backward = Vec::with_capacity(model.num_tensors());
        for (t, tensor) in model.tensors.iter().enumerate() {
            let node = graph.add_node(compute(
                TaskKind::Backward { tensor: t as u32 },
                scaled(tensor.backward_us),
            ));
            if let Some(tail) = chain_tail {
                graph.add_edge(tail, node, ());
            }
            chain_tail = Some(node);
            backward.push(node);
        }
        let optimizer = graph.add_node(compute(TaskKind::Optimizer, scaled(model.optimizer_us)));
        graph.add_edge(chain_tail.expect("a model has tensors"), optimizer, ());
        for (g, (group, pieces)) in plan.groups.iter().zip(&costs).enumerate() {
            let ready = group
                .tensors
                .iter()
                .map(|&t| backward[t])
                .max_by_key(|n| n.index())
                .expect("validated groups are non-empty");
            for (part, piece) in pieces.iter().enumerate() {
                let (g32, part32) = (g as u32, part as u32);
                let mut tail = ready;
                let side = |graph: &mut DiGraph<Task, ()>, tail: NodeIndex, kind, duration| {
                    let node = graph.add_node(Task {
                        kind,
                        iteration: k,
                        resource: codec_resource,
                        duration,
                        bytes: 0,
                        estimate: None,
                        launch_key: (0, k, 0),
                    });
                    graph.add_edge(tail, node, ());
                    node
                };
                if let Some(duration) = piece.encode {
                    tail = side(
                        &mut graph,
                        tail,
                        TaskKind::Encode {
                            group: g32,
                            part: part32,
                        },
                        duration,
                    );
                }
                for (round, &(bytes, estimate)) in piece.rounds.iter().enumerate() {
                    let node = graph.add_node(Task {
                        kind: TaskKind::Collective {
                            group: g32,
                            part: part32,
                            round: round as u32,
                        },
                        iteration: k,
                        resource: Resource::Comm,
                        duration: estimate.time,
                        bytes,
                        estimate: Some(estimate),
                        launch_key: (group.priority, k, collective_position),
                    });
                    collective_position += 1;
                    graph.add_edge(tail, node, ());
                    tail = node;
                }
                if let Some(duration) = piece.decode {
                    tail = side(
                        &mut graph,
                        tail,
                        TaskKind::Decode {
                            group: g32,
                            part: part32,
                        },
                        duration,
                    );
                }
                graph.add_edge(tail, optimizer, ());
            }
        }
        iteration_end.push(optimizer);
        previous_optimizer = Some(optimizer);
    }
    Ok(TaskGraph::freeze(graph, iterations, iteration_end))
}

/// Costs of each partition of a group on the scenario's cluster.
fn piece_costs(scenario: &Scenario, group: &Group) -> Result<Vec<PieceCost>> {
    let model = &scenario.model;
    let cluster = &scenario.cluster;
    let device = scenario.codec_device();
    // Compressing on the host moves the fp32 gradient to the host and the decoded result back.
    let host_copy = |numel: u64| match device.kind {
        DeviceKind::Cpu => SimTime::from_secs(4.0 * numel as f64 / (HOST_LINK_GBYTES_PER_S * 1e9)),
        DeviceKind::Gpu => SimTime::ZERO,
    };
    let world = cluster.world_size();
    let numel = group.numel(model);
    let parts = u64::from(group.partitions);
    let round_shares = round_shares(scenario, group);
    (0..parts)
        .map(|p| {
            // Equal pieces; the remainder spreads over the first ones.
            let share = |total: u64| total * (p + 1) / parts - total * p / parts;
            let piece_numel = share(numel).max(1);
            let compressing = group.compressor != Compressor::None;
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
                    let decoded = match group.aggregation() {
                        Aggregation::Allreduce => one,
                        // Every rank decodes every rank's payload.
                        Aggregation::Allgather => SimTime(one.as_ns() * u64::from(world)),
                        // The server decodes the pushed payloads of its shard and re-encodes the
                        // sum; the worker decodes the pulled result.
                        Aggregation::ParameterServer => {
                            one + one
                                + group
                                    .compressor
                                    .encode_time(device, piece_numel / u64::from(cluster.nodes))?
                        }
                    };
                    Ok(decoded + host_copy(piece_numel))
                })
                .transpose()?;
            let rounds = round_shares
                .iter()
                .map(|&round_bytes| {
                    let bytes = share(round_bytes).max(1);
                    Ok((bytes, collective_cost(scenario, group, bytes)?))
                })
                .collect::<Result<_>>()?;
            Ok(PieceCost {
                encode,
                rounds,
                decode,
            })
        })
        .collect()
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

/// One rank's payload of `bytes` synchronized by the group's scheme over the whole cluster.
fn collective_cost(scenario: &Scenario, group: &Group, bytes: u64) -> Result<Estimate> {
    let cluster = &scenario.cluster;
    let world = RankGroup::world(cluster);
    match (group.scheme, group.aggregation()) {
        (Scheme::Hierarchical, _) => collective::estimate_hierarchical_allreduce(cluster, bytes),
        (_, Aggregation::Allreduce) => collective::estimate(cluster, Op::Allreduce, bytes, world),
        (_, Aggregation::Allgather) => collective::estimate(
            cluster,
            Op::Allgather,
            bytes * u64::from(world.ranks),
            world,
        ),
        (_, Aggregation::ParameterServer) => {
            // BytePS-style: reduce inside each node, push/pull between nodes, broadcast inside.
            let mut estimate = collective::ps_push_pull(
                cluster,
                bytes,
                cluster.nodes,
                ServerPlacement::Colocated,
            )?;
            if cluster.gpus_per_node > 1 {
                let local = RankGroup::one_node(cluster);
                estimate.time += collective::estimate(cluster, Op::Reduce, bytes, local)?.time
                    + collective::estimate(cluster, Op::Broadcast, bytes, local)?.time;
            }
            Ok(estimate)
        }
    }
}
