//! The cost pass: how long each step of a schedule takes on a scenario's hardware.
//!
//! It derives this from the compute profile, the codec curves and the collective models.

use crate::base::error::{Result, SimError};
use crate::base::time::SimTime;
use crate::codec::CodecCurves;
use crate::collective::{self, Estimate, Group as RankGroup, Links, Naming, ServerLink};
use crate::collective_op::Op;
use crate::compress::{Aggregation, Compressor, Memory};
use crate::inputs::device::DeviceProfile;
use crate::inputs::topology::Cluster;
use crate::plan::{CompressOn, Group};
use crate::predict::framework_cost;
use crate::predict::scenario::Scenario;
use crate::schedule::{
    lower_group, Encoding, Exchange, Op as Step, ParamShard, Pass, Piece, Schedule, Servers,
    StepKind,
};
use smallvec::SmallVec;

/// GPU-to-host bandwidth of a PCIe 3.0 x16 link as NCCL's topology model counts it (PCI_BW,
/// src/graph/topo.h): compression on the host pays it for the gradient and for the result.
const HOST_LINK_GBYTES_PER_S: f64 = 12.0;

/// The predicted duration of one step, and for collectives the algorithm and protocol and the
/// links they keep busy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepCost {
    /// How long the step takes.
    pub duration: SimTime,
    /// For a collective step, its estimate (algorithm, protocol, time); None otherwise.
    pub estimate: Option<Estimate>,
    /// The links the step keeps busy (`Links::Every` for non-collective steps).
    pub links: Links,
}

/// What each op of a piece's synchronization costs (see the ops of `crate::schedule`), and
/// every round's collective.
struct PieceCost {
    compensate: SimTime,
    encode: SimTime,
    /// PowerSGD's Q from the reduced P: part of its encode curve, which prices both rounds.
    next_round: SimTime,
    rounds: SmallVec<[(Estimate, Links); 2]>,
    decode: SimTime,
    update_memory: SimTime,
    scale_output: SimTime,
}

impl PieceCost {
    /// A step's time: the sum of its ops.
    fn step(&self, ops: &[Step], round: usize) -> SimTime {
        ops.iter()
            .map(|op| match op {
                Step::Compensate => self.compensate,
                Step::Encode => self.encode,
                Step::NextRound => self.next_round,
                Step::Exchange => self.rounds[round].0.time,
                Step::Decode => self.decode,
                Step::UpdateMemory => self.update_memory,
                Step::ScaleOutput => self.scale_output,
            })
            .sum()
    }
}

/// The cost of every step of `schedule` (one entry per step) on the scenario's hardware.
pub fn step_costs(
    scenario: &Scenario,
    schedule: &Schedule,
    naming: Naming,
) -> Result<Vec<StepCost>> {
    let pieces: Vec<PieceCost> = schedule
        .pieces
        .iter()
        .map(|piece| piece_cost(scenario, schedule.servers, piece, naming))
        .collect::<Result<_>>()?;
    // Each unit's gather, and its gather from hpZ's secondary shards before backward.
    let gathers: Vec<[(Estimate, Links); 2]> = schedule
        .param_shards
        .iter()
        .zip(&schedule.buffers)
        .map(|(&shard, unit)| {
            let cost = |shard| gather_cost(scenario, shard, unit.numel, naming);
            let own = cost(shard)?;
            let before_backward = match shard.secondary_bytes {
                Some(_) => cost(shard.for_pass(Pass::Backward))?,
                None => own,
            };
            Ok([own, before_backward])
        })
        .collect::<Result<_>>()?;
    let framework_times = framework_cost::step_times(scenario, schedule);
    Ok(schedule
        .steps
        .iter()
        .zip(framework_times)
        .map(|(step, framework)| {
            match (step.kind, step.piece.map(|p| &pieces[p as usize])) {
                (StepKind::Collective { round, .. }, Some(p)) => {
                    let (mut estimate, links) = p.rounds[round as usize];
                    // The collective's own ops (an uncompressed group casts and decodes itself).
                    // Only the exchange's fixed part is kept from the sharing of links: the
                    // ops are priced as before, inside the shared time.
                    estimate.time = p.step(&step.ops, round as usize) + framework;
                    StepCost {
                        duration: estimate.time,
                        estimate: Some(estimate),
                        links,
                    }
                }
                (StepKind::Gather { group, pass }, None) => {
                    let before_backward = usize::from(pass == Pass::Backward);
                    let (mut estimate, links) = gathers[group as usize][before_backward];
                    estimate.time += framework;
                    StepCost {
                        duration: estimate.time,
                        estimate: Some(estimate),
                        links,
                    }
                }
                // An encode or decode in line on the compute stream carries the copies the
                // framework stages there (nothing otherwise).
                (_, Some(p)) => StepCost {
                    duration: p.step(&step.ops, 0) + framework,
                    estimate: None,
                    links: Links::Every,
                },
                (_, None) => StepCost {
                    duration: scenario.compute_time(step.profiled_us.unwrap_or(0.0)) + framework,
                    estimate: None,
                    links: Links::Every,
                },
            }
        })
        .collect())
}

/// Encode, communication (all rounds) and decode time of each piece of one group, as the
/// engine will run them with the plan's `encoding`: the stages a pipelining strategy (HiPress's
/// SeCoPa) and the tuner's surrogate reason about.
pub fn piece_stages(
    scenario: &Scenario,
    group: &Group,
    encoding: Encoding,
) -> Result<Vec<[SimTime; 3]>> {
    let servers = Servers::Colocated;
    lower_group(
        &scenario.model,
        scenario.world(),
        servers,
        0,
        0,
        group,
        encoding,
    )
    .iter()
    .map(|piece| {
        let cost = piece_cost(scenario, servers, piece, Naming::Priced)?;
        // A host library's copies that the framework makes on the compute stream come before
        // and after the piece's exchanges there (`framework_cost::step_times`).
        let (off, back) = scenario
            .staged_on_compute
            .as_ref()
            .map_or((0.0, 0.0), |params| {
                framework_cost::piece_staging_us(params, piece, RankGroup::world(&scenario.cluster))
            });
        Ok([
            cost.compensate + cost.encode + SimTime::from_us(off),
            cost.rounds.iter().map(|(r, _)| r.time).sum(),
            cost.decode + cost.update_memory + cost.scale_output + SimTime::from_us(back),
        ])
    })
    .collect()
}

/// The device whose cost curves a piece's compression follows.
fn codec_device<'s>(scenario: &'s Scenario, piece: &Piece) -> Result<&'s DeviceProfile> {
    match (piece.compress_on, &scenario.host_codec) {
        (CompressOn::Gpu, _) => Ok(&scenario.device),
        (CompressOn::Cpu, Some(host)) => Ok(host),
        (CompressOn::Cpu, None) => Err(SimError::bad_value(
            format!("groups[{}].compress_on", piece.group),
            "cpu",
            "compressing on the CPU needs a host profile (--cpu-compression PROFILE)",
        )),
    }
}

/// Bytes per element of the memory passes around a codec, as the executors make them.
mod pass {
    /// Zero the result before decoding adds into it.
    pub(super) const ZERO: f64 = 4.0;
    /// Scale the result in place (EF-SignSGD's 1/lr).
    pub(super) const SCALE: f64 = 8.0;
}

fn piece_cost(
    scenario: &Scenario,
    servers: Servers,
    piece: &Piece,
    naming: Naming,
) -> Result<PieceCost> {
    let cluster = &scenario.cluster;
    let device = codec_device(scenario, piece)?;
    let world = u64::from(cluster.world_size());
    let numel = piece.numel.max(1);
    // An elementwise pass over the piece at the device's memory bandwidth.
    let pass = |bytes_per_element: f64| {
        SimTime::from_ns(bytes_per_element * numel as f64 / device.memory_bandwidth_gbytes_per_s)
    };
    // A GPU rank compressing on its host moves the fp32 gradient to the host and the decoded
    // result back; a CPU rank's gradient is already there.
    let offloaded = piece.compress_on == CompressOn::Cpu && !scenario.cpu_ranks();
    let host_copy = match offloaded {
        true => SimTime::from_secs(4.0 * numel as f64 / (HOST_LINK_GBYTES_PER_S * 1e9)),
        false => SimTime::ZERO,
    };
    let compressor = piece.compressor;
    let memory = piece.memory;
    let curves = CodecCurves::on(&compressor, device);
    // The executors' passes around the codec, unless the curves already count the source's.
    let around = |time: SimTime| match curves.includes_passes {
        true => SimTime::ZERO,
        false => time,
    };
    let compensate = around(pass(memory.compensate_bytes())) + host_copy;
    // Every codec call pays the curves' floor: one per piece, or one per tensor. A CaSync-Ring
    // rank encodes its own shard here (the others at its hops, in the exchange) and decodes
    // the summed shards, and its own encodings for the memory, one shard at a time.
    let ring_shards = piece
        .compressed_ring()
        .then(|| vec![numel.div_ceil(world); world as usize]);
    let calls = ring_shards.as_deref().unwrap_or(piece.codec_calls());
    let encode = per_call(ring_shards.as_ref().map_or(calls, |s| &s[..1]), |n| {
        curves.encode_time(n)
    });
    let one = per_call(calls, |n| curves.decode_time(n));
    // A decode call pays its own cost once and each payload's decode (device.rs, CodecCost).
    let payloads = match piece.aggregation {
        // After an all-to-all reduce-scatter a rank decodes every rank's payload of its chunk.
        Aggregation::Allgather if piece.alltoall_scattered() => {
            let chunk = calls.iter().copied().max().unwrap_or(numel);
            let payloads = u64::from(scenario.world().alltoall_payloads());
            curves.call_time(chunk.max(1), payloads)
        }
        // Every rank decodes every rank's payload in one call.
        Aggregation::Allgather => per_call(calls, |n| curves.call_time(n, world)),
        // The ring's per-hop work and the server's are in their collectives; the result is
        // decoded once.
        _ => per_call(calls, |n| curves.call_time(n, 1)),
    };
    let decode = around(pass(pass::ZERO)) + payloads + host_copy;
    let update_memory = match memory {
        Memory::None => SimTime::ZERO,
        // What this rank's own payload carried (PowerSGD's is the averaged result), then
        // the memory's bookkeeping.
        memory => around(one + pass(memory.update_bytes())),
    };
    let rounds = piece
        .rounds
        .iter()
        .map(|round| {
            let (mut estimate, links) = exchange_cost(
                scenario,
                servers,
                piece,
                device,
                round.exchange,
                round.bytes,
                naming,
            )?;
            estimate.delay_with_compute = delay_with_compute(scenario, round.exchange);
            Ok((estimate, links))
        })
        .collect::<Result<_>>()?;
    Ok(PieceCost {
        compensate,
        encode,
        next_round: SimTime::ZERO,
        rounds,
        decode,
        update_memory,
        scale_output: around(pass(pass::SCALE)),
    })
}

/// The time of the codec calls of `calls` elements each (at least one), `time` giving one
/// call's.
fn per_call(calls: &[u64], time: impl Fn(u64) -> SimTime) -> SimTime {
    calls.iter().map(|&n| time(n.max(1))).sum()
}

/// What `exchange` takes beyond its time when it starts while its CPU ranks compute (the
/// cluster's measured `contention`): an allgather's rounds, and a reduce-scatter's (as many),
/// are fewer than an allreduce's; every other exchange pays the allreduce's delay.
fn delay_with_compute(scenario: &Scenario, exchange: Exchange) -> SimTime {
    let Some(contention) = &scenario.cluster.contention else {
        return SimTime::ZERO;
    };
    let delay_us = match (exchange, contention.allgather_delay_with_compute_us) {
        (
            Exchange::Allgather | Exchange::AllgatherShards | Exchange::ReduceScatter,
            Some(allgather),
        ) => allgather,
        _ => contention.collective_delay_with_compute_us,
    };
    SimTime::from_us(delay_us)
}

/// The collective that moves one rank's payload of `bytes` by `exchange`, and the links it
/// keeps busy.
fn exchange_cost(
    scenario: &Scenario,
    servers: Servers,
    piece: &Piece,
    device: &DeviceProfile,
    exchange: Exchange,
    bytes: u64,
    naming: Naming,
) -> Result<(Estimate, Links)> {
    let cluster = &scenario.cluster;
    let world = RankGroup::world(cluster);
    let over_world = |op, bytes| collective::estimate_named(cluster, op, bytes, world, naming);
    let mut estimate = match exchange {
        Exchange::HierarchicalAllreduce => {
            collective::estimate_hierarchical_allreduce(cluster, bytes)?
        }
        Exchange::Allreduce => over_world(Op::Allreduce, bytes)?,
        Exchange::ReduceScatter => over_world(Op::ReduceScatter, bytes)?,
        // Every chunk's payload (`bytes` in all) to the rank that keeps it: in two hops, first
        // to the rank of the keeper's place in the node, which decodes, adds and re-encodes the
        // node's payloads of the chunks it collects (one per node), then across nodes.
        Exchange::AlltoallReduceScatter => {
            let per_node = u64::from(cluster.gpus_per_node);
            let across = collected_bytes(piece, scenario.world());
            let mut estimate = collective::estimate_two_hop_alltoall(cluster, bytes, across)?;
            if scenario.world().two_hop_alltoall() {
                let chunk = piece.codec_calls().iter().copied().max().unwrap_or(1);
                let curves = CodecCurves::on(&piece.compressor, device);
                let collected = curves.call_time(chunk, per_node) + curves.encode_time(chunk);
                estimate.time += SimTime(collected.as_ns() * u64::from(cluster.nodes));
            }
            estimate
        }
        Exchange::HybridReduceScatter => {
            collective::estimate_hybrid_reduce_scatter(cluster, bytes)?
        }
        Exchange::AllgatherShards => allgather_shards(scenario, bytes, world, naming)?,
        Exchange::Allgather => over_world(Op::Allgather, bytes * u64::from(world.ranks))?,
        Exchange::CompressedRing => {
            // A ring allreduce moves the compressed shards; in its reduce-scatter half each of
            // the n-1 hops decodes the incoming shard, adds and re-encodes it.
            let mut estimate = over_world(Op::Allreduce, bytes)?;
            let shard = piece.numel.max(1).div_ceil(u64::from(world.ranks)).max(1);
            let curves = CodecCurves::on(&piece.compressor, device);
            let hop = curves.call_time(shard, 1) + curves.encode_time(shard);
            estimate.time += SimTime(hop.as_ns() * u64::from(world.ranks - 1));
            estimate
        }
        Exchange::PushPull { server } => {
            return push_pull_cost(scenario, servers, piece, device, server, bytes)
        }
    };
    // The library sums a float16 payload at its rate for float16 sums, on the ranks' CPUs
    // beside the transfer.
    if piece.compressor == Compressor::Fp16 {
        let sums = fp16_sums(cluster, exchange, bytes);
        estimate.time += sums;
        estimate.fixed += sums;
    }
    Ok((estimate, Links::Every))
}

/// What the library's float16 sums add to `exchange` of a float16 payload of `bytes`
/// (`collective::fp16_sum_time`): the exchanges that reduce through the library.
fn fp16_sums(cluster: &Cluster, exchange: Exchange, bytes: u64) -> SimTime {
    let world = RankGroup::world(cluster);
    match exchange {
        Exchange::Allreduce => collective::fp16_sum_time(cluster, Op::Allreduce, bytes, world),
        Exchange::ReduceScatter => {
            collective::fp16_sum_time(cluster, Op::ReduceScatter, bytes, world)
        }
        Exchange::HierarchicalAllreduce => collective::fp16_sum_time_hierarchical(cluster, bytes),
        Exchange::HybridReduceScatter => collective::fp16_sum_time_hybrid(cluster, bytes),
        _ => SimTime::ZERO,
    }
}

/// The most bytes a rank sends across nodes in the second hop of an all-to-all
/// reduce-scatter: the payloads of the chunks whose keepers share its place in their node.
fn collected_bytes(piece: &Piece, world: crate::schedule::World) -> u64 {
    let (ranks, per_node) = (world.ranks() as usize, world.ranks_per_node as usize);
    let mut at_place = vec![0u64; per_node.max(1)];
    for (c, &n) in piece.codec_calls().iter().enumerate() {
        let place = crate::schedule::chunk_keeper(c, ranks) % per_node;
        at_place[place] += piece.compressor.wire_bytes_as(n, piece.wire);
    }
    at_place.into_iter().max().unwrap_or(0)
}

/// An all-gather of shards that make `bytes` in all, over `group`.
fn allgather_shards(
    scenario: &Scenario,
    bytes: u64,
    group: RankGroup,
    naming: Naming,
) -> Result<Estimate> {
    let cluster = &scenario.cluster;
    match cluster.library.tcp() {
        // The CPU backends ring the shards over point-to-point messages (the MPI transport's
        // `allgather_chunks`), not through the library's allgather that a lab's sweep times
        // (`MPI_Iallgatherv`, 1.5–2.1× the ring there): the model's ring prices them.
        Some(_) => collective::estimate_modeled(cluster, Op::Allgather, bytes, group),
        None => collective::estimate_named(cluster, Op::Allgather, bytes, group, naming),
    }
}

/// A sharded plan's gather of one unit's `numel` parameters, each rank contributing its shard:
/// over every rank, or inside each node under hybrid sharding. A quantized gather (ZeRO++'s
/// int8) encodes the rank's shard before the collective and decodes every shard after it, in
/// turn with it on the gather's stream. A float8 gather's cast is the framework's copy into the
/// gather buffer, like any cast; the iteration's first gathers the float8 scales before it.
fn gather_cost(
    scenario: &Scenario,
    shard: ParamShard,
    numel: u64,
    naming: Naming,
) -> Result<(Estimate, Links)> {
    let group = match shard.within_node {
        true => RankGroup::one_node(&scenario.cluster),
        false => RankGroup::world(&scenario.cluster),
    };
    let world = scenario.world();
    let bytes = shard.gathered_bytes(world).ok_or_else(|| {
        SimError::bad_value(
            "sharding",
            format!(
                "{} bytes per shard over {} ranks",
                shard.bytes,
                shard.ranks(world)
            ),
            "a gathered unit's bytes overflow",
        )
    })?;
    let mut estimate = allgather_shards(scenario, bytes, group, naming)?;
    estimate.delay_with_compute = delay_with_compute(scenario, Exchange::AllgatherShards);
    if shard.amaxes > 0 {
        // The float8 scales are agreed on first, in turn: every rank's maxima, 4 bytes each,
        // all-gathered over the same ranks (`ParamShard::amaxes`).
        let maxima = u64::from(shard.amaxes) * 4 * u64::from(shard.ranks(world));
        let agreed = allgather_shards(scenario, maxima, group, naming)?;
        estimate.time += agreed.time;
        estimate.fixed += agreed.fixed;
    }
    if let Some(quantizer) = shard.dtype.quantizer() {
        let ranks = shard.ranks(world);
        let shard_numel = crate::sharding::shard_numel(numel, ranks);
        let curves = CodecCurves::on(&quantizer, &scenario.device);
        let codec =
            curves.encode_time(shard_numel) + curves.call_time(shard_numel, u64::from(ranks));
        // Kernels of the rank's own: links shared with another collective do not stretch them.
        estimate.time += codec;
        estimate.fixed += codec;
    }
    Ok((estimate, Links::Every))
}

/// A push-pull round to `server`: BytePS's reduce inside each node, push and pull between
/// nodes with the server's decode, sum and re-encode between them, broadcast inside each node.
fn push_pull_cost(
    scenario: &Scenario,
    servers: Servers,
    piece: &Piece,
    device: &DeviceProfile,
    server: u32,
    bytes: u64,
) -> Result<(Estimate, Links)> {
    let cluster = &scenario.cluster;
    let at = match servers {
        Servers::Colocated => ServerLink::Node(server / cluster.gpus_per_node.max(1)),
        Servers::Dedicated(_) => ServerLink::Dedicated(server),
    };
    let (mut estimate, links) = collective::push_pull(cluster, bytes, at)?;
    // The server decodes every node's payload in one call and re-encodes the sum between push
    // and pull, inside the round: it slows as the round does (shared links, crowded hosts,
    // compute beside it), not as the codec stream does.
    let nodes = u64::from(cluster.nodes);
    let curves = CodecCurves::on(&piece.compressor, device);
    estimate.time += per_call(piece.codec_calls(), |n| {
        curves.call_time(n, nodes) + curves.encode_time(n)
    });
    if cluster.gpus_per_node > 1 {
        // On the devices, around the push-pull's own copies to and from the host.
        let local = RankGroup::one_node(cluster);
        let bare = collective::without_staging(cluster);
        estimate.time += collective::estimate(&bare, Op::Reduce, bytes, local)?.time
            + collective::estimate(&bare, Op::Broadcast, bytes, local)?.time;
    }
    Ok((estimate, links))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::Wire;
    use crate::inputs::device::CostCurve;
    use crate::inputs::model::ModelProfile;
    use crate::inputs::topology::ClusterOverrides;
    use crate::plan::{CodecCalls, Scheme};
    use crate::strategy::per_tensor_plan;

    /// The cost of the first piece of `group` lowered with `encoding`, and its element count.
    fn first_piece(scenario: &Scenario, group: &Group, encoding: Encoding) -> (PieceCost, u64) {
        let pieces = lower_group(
            &scenario.model,
            scenario.world(),
            Servers::Colocated,
            0,
            0,
            group,
            encoding,
        );
        let cost = piece_cost(scenario, Servers::Colocated, &pieces[0], Naming::Priced).unwrap();
        (cost, pieces[0].numel)
    }

    /// The decode op of the first tensor's signsgd allgather on `ranks` ranks, with its
    /// per-payload curve set by hand and `aggregate` as the per-call part; and its element count.
    fn decode_at(ranks: u32, aggregate: CostCurve) -> (SimTime, u64) {
        let model = ModelProfile::load("resnet50").unwrap();
        let overrides = ClusterOverrides {
            nodes: Some(ranks),
            gpus_per_node: Some(1),
            inter_gbps: None,
        };
        let cluster = Cluster::load("v100-tcp", overrides).unwrap();
        let mut scenario = Scenario::new(model, cluster).unwrap();
        let cost = scenario.device.compression.get_mut("signsgd").unwrap();
        cost.decode = CostCurve {
            floor_us: 10.0,
            ns_per_element: 1.0,
            ..CostCurve::default()
        };
        cost.aggregate = aggregate;
        let mut plan = per_tensor_plan(&scenario.model);
        plan.groups[0].compressor = Compressor::SignSgd;
        plan.groups[0].scheme = Scheme::Allgather;
        let (cost, numel) = first_piece(&scenario, &plan.groups[0], Encoding::default());
        (cost.decode, numel)
    }

    #[test]
    fn gloo_sums_a_float16_payload_at_its_float16_rate_and_others_by_their_bytes() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../experiments/ddp-lab/clusters/lab-2n-1g-gloo.json"
        );
        let exchange = |compressor, per_element| {
            let mut cluster = Cluster::load(path, ClusterOverrides::default()).unwrap();
            cluster.library.tcp_mut().unwrap().fp16_sum_ns_per_element = per_element;
            let model = ModelProfile::load("resnet50").unwrap();
            let scenario = Scenario::new(model, cluster).unwrap();
            let mut plan = per_tensor_plan(&scenario.model);
            let last = plan.groups.len() - 1;
            plan.groups[last].compressor = compressor;
            let (cost, numel) = first_piece(&scenario, &plan.groups[last], Encoding::default());
            let bytes = compressor.wire_bytes_as(numel, Wire::default());
            let sums = collective::fp16_sum_time(
                &scenario.cluster,
                Op::Allreduce,
                bytes,
                RankGroup::world(&scenario.cluster),
            );
            (cost.rounds[0].0, sums)
        };
        let (bare, _) = exchange(Compressor::Fp16, None);
        let (summed, sums) = exchange(Compressor::Fp16, Some(7.0));
        assert!(sums > SimTime::ZERO);
        assert_eq!(summed.time, bare.time + sums);
        // The sums run on the ranks' CPUs, beside what shares the links.
        assert_eq!(summed.fixed, bare.fixed + sums);
        // A float32 payload is summed by its bytes whatever gloo's float16 rate.
        assert_eq!(
            exchange(Compressor::None, Some(7.0)).0,
            exchange(Compressor::None, None).0
        );
    }

    #[test]
    fn a_group_compressed_tensor_by_tensor_pays_the_codec_floor_once_per_tensor() {
        let model = ModelProfile::load("resnet50").unwrap();
        let overrides = ClusterOverrides {
            nodes: Some(4),
            gpus_per_node: Some(1),
            inter_gbps: None,
        };
        let cluster = Cluster::load("v100-tcp", overrides).unwrap();
        let mut scenario = Scenario::new(model, cluster).unwrap();
        let floor = CostCurve {
            floor_us: 10.0,
            ns_per_element: 1.0,
            ..CostCurve::default()
        };
        let cost = scenario.device.compression.get_mut("signsgd").unwrap();
        (cost.encode, cost.decode, cost.aggregate) = (floor, floor, floor);
        let mut plan = per_tensor_plan(&scenario.model);
        plan.groups[0].tensors = vec![0, 1, 2];
        plan.groups.drain(1..4);
        plan.groups[0].compressor = Compressor::SignSgd;
        plan.groups[0].scheme = Scheme::Allgather;
        let piece = |calls| {
            let encoding = Encoding {
                wire: Wire::Packed,
                calls,
            };
            first_piece(&scenario, &plan.groups[0], encoding).0
        };
        let (fused, each) = (piece(CodecCalls::Group), piece(CodecCalls::Tensor));
        // Two more floors for the encode; per call, one for its aggregate and one for each of
        // the four ranks' payloads.
        let floor = SimTime::from_us(10.0);
        assert_eq!(each.encode - fused.encode, SimTime(2 * floor.as_ns()));
        assert_eq!(each.decode - fused.decode, SimTime(2 * 5 * floor.as_ns()));
    }

    #[test]
    fn curves_that_count_the_passes_around_a_codec_replace_them() {
        let model = ModelProfile::load("resnet50").unwrap();
        let cluster = Cluster::load("v100-tcp", ClusterOverrides::default()).unwrap();
        let mut scenario = Scenario::new(model, cluster).unwrap();
        let mut plan = per_tensor_plan(&scenario.model);
        plan.groups[0].compressor = Compressor::SignSgd;
        plan.groups[0].scheme = Scheme::Allgather;
        plan.groups[0].memory = Memory::Residual;
        let mut cost = |includes_passes| {
            let curves = scenario.device.compression.get_mut("signsgd").unwrap();
            curves.includes_passes = includes_passes;
            first_piece(&scenario, &plan.groups[0], Encoding::default()).0
        };
        let (around, counted) = (cost(false), cost(true));
        // The executors' compensation, zeroing, memory update (a second decode and its pass)
        // go; the codec's own curves stay.
        assert!(around.compensate > SimTime::ZERO && around.update_memory > SimTime::ZERO);
        assert_eq!(counted.compensate, SimTime::ZERO);
        assert_eq!(counted.update_memory, SimTime::ZERO);
        assert!(counted.decode < around.decode);
        assert_eq!(counted.encode, around.encode);
    }

    #[test]
    fn an_allgather_decode_pays_each_payload_once_per_rank_and_its_call_once() {
        let call = CostCurve {
            floor_us: 300.0,
            ns_per_element: 2.0,
            ..CostCurve::default()
        };
        let (two, n) = decode_at(2, CostCurve::default());
        let (eight, _) = decode_at(8, CostCurve::default());
        let payload = SimTime::from_ns(10e3 + n as f64);
        assert_eq!(eight - two, SimTime(payload.as_ns() * 6));
        for ranks in [2, 8] {
            let without = decode_at(ranks, CostCurve::default()).0;
            let with = decode_at(ranks, call).0;
            assert_eq!(with - without, call.time(n, 0), "{ranks} ranks");
        }
    }
}
