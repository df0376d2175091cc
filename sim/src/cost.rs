//! The cost pass: how long each step of a schedule takes on a scenario's hardware, from the compute profile, the codec curves and the collective models.

use crate::collective::{self, Estimate, Group as RankGroup, Op, ServerPlacement};
use crate::compress::{Aggregation, Compressor, Memory};
use crate::device::{DeviceKind, DeviceProfile};
use crate::error::{Result, SimError};
use crate::plan::{CompressOn, Group, Plan};
use crate::scenario::Scenario;
use crate::schedule::{lower_group, Exchange, Piece, Schedule, StepKind};
use crate::time::SimTime;

/// GPU-to-host bandwidth of a PCIe 3.0 x16 link as NCCL's topology model counts it (PCI_BW,
/// src/graph/topo.h): compression on the host pays it for the gradient and for the result.
const HOST_LINK_GBYTES_PER_S: f64 = 12.0;

/// The predicted duration of one step, and for collectives the algorithm and protocol.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepCost {
    pub duration: SimTime,
    pub estimate: Option<Estimate>,
}

/// Encode, every round's collective and decode of one piece.
struct PieceCost {
    encode: SimTime,
    rounds: Vec<Estimate>,
    decode: SimTime,
}

/// The cost of every step of `schedule` (one entry per step) on the scenario's hardware.
/// `plan` is the plan the schedule was lowered from (for the dedicated servers of `ps`).
pub fn step_costs(scenario: &Scenario, plan: &Plan, schedule: &Schedule) -> Result<Vec<StepCost>> {
    let pieces: Vec<PieceCost> = schedule
        .pieces
        .iter()
        .map(|piece| piece_cost(scenario, plan.policy.ps_servers, piece))
        .collect::<Result<_>>()?;
    Ok(schedule
        .steps
        .iter()
        .map(|step| {
            let piece = step.piece.map(|p| &pieces[p as usize]);
            let local = |duration| StepCost {
                duration,
                estimate: None,
            };
            match (step.kind, piece) {
                (StepKind::Encode { .. }, Some(p)) => local(p.encode),
                (StepKind::Decode { .. }, Some(p)) => local(p.decode),
                (StepKind::Collective { round, .. }, Some(p)) => {
                    let estimate = p.rounds[round as usize];
                    StepCost {
                        duration: estimate.time,
                        estimate: Some(estimate),
                    }
                }
                _ => local(compute_time(scenario, step.profiled_us.unwrap_or(0.0))),
            }
        })
        .collect())
}

/// A compute step's time on the scenario's device.
pub fn compute_time(scenario: &Scenario, profiled_us: f64) -> SimTime {
    SimTime::from_us(profiled_us * scenario.compute_scale)
}

/// Encode, communication (all rounds) and decode time of each piece of one group, as the
/// engine will run them: the stages a pipelining strategy (HiPress's SeCoPa) reasons about.
pub fn piece_stages(scenario: &Scenario, group: &Group) -> Result<Vec<[SimTime; 3]>> {
    lower_group(&scenario.model, scenario.world(), 0, group)
        .iter()
        .map(|piece| {
            let cost = piece_cost(scenario, 0, piece)?;
            Ok([
                cost.encode,
                cost.rounds.iter().map(|r| r.time).sum(),
                cost.decode,
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

fn piece_cost(scenario: &Scenario, ps_servers: u32, piece: &Piece) -> Result<PieceCost> {
    let cluster = &scenario.cluster;
    let device = codec_device(scenario, piece)?;
    let world = u64::from(cluster.world_size());
    // Compressing on the host moves the fp32 gradient to the host and the decoded result back.
    let host_copy = |numel: u64| match device.kind {
        DeviceKind::Cpu => SimTime::from_secs(4.0 * numel as f64 / (HOST_LINK_GBYTES_PER_S * 1e9)),
        DeviceKind::Gpu => SimTime::ZERO,
    };
    let numel = piece.numel.max(1);
    let compressor = piece.compressor;
    let compressing = compressor != Compressor::None;
    let encode = if compressing || piece.memory != Memory::None {
        compressor.encode_time(device, numel)?
            + piece.memory.update_time(device, numel)
            + host_copy(numel)
    } else {
        SimTime::ZERO
    };
    let decode = if compressing {
        let one = compressor.decode_time(device, numel)?;
        let decoded = match (piece.aggregation, piece.rounds.first().map(|r| r.exchange)) {
            // Every rank decodes every rank's payload.
            (Aggregation::Allgather, _) => SimTime(one.as_ns() * world),
            // The server decodes the pushed payloads of its shard and re-encodes the sum; the
            // worker decodes the pulled result.
            (_, Some(Exchange::PushPull { .. })) => {
                one + one + compressor.encode_time(device, numel / u64::from(cluster.nodes))?
            }
            // The ring's per-hop work is in its collective; the result is decoded once.
            _ => one,
        };
        decoded + host_copy(numel)
    } else {
        SimTime::ZERO
    };
    let rounds = piece
        .rounds
        .iter()
        .map(|round| {
            exchange_cost(
                scenario,
                ps_servers,
                piece,
                device,
                round.exchange,
                round.bytes,
            )
        })
        .collect::<Result<_>>()?;
    Ok(PieceCost {
        encode,
        rounds,
        decode,
    })
}

/// The collective that moves one rank's payload of `bytes` by `exchange`.
fn exchange_cost(
    scenario: &Scenario,
    ps_servers: u32,
    piece: &Piece,
    device: &DeviceProfile,
    exchange: Exchange,
    bytes: u64,
) -> Result<Estimate> {
    let cluster = &scenario.cluster;
    let world = RankGroup::world(cluster);
    Ok(match exchange {
        Exchange::HierarchicalAllreduce => {
            collective::estimate_hierarchical_allreduce(cluster, bytes)?
        }
        Exchange::Allreduce => collective::estimate(cluster, Op::Allreduce, bytes, world)?,
        Exchange::ReduceScatter => collective::estimate(cluster, Op::ReduceScatter, bytes, world)?,
        Exchange::AllgatherShards => collective::estimate(cluster, Op::Allgather, bytes, world)?,
        Exchange::Allgather => collective::estimate(
            cluster,
            Op::Allgather,
            bytes * u64::from(world.ranks),
            world,
        )?,
        Exchange::CompressedRing => {
            // A ring allreduce moves the compressed shards; in its reduce-scatter half each of
            // the n-1 hops decodes the incoming shard, adds and re-encodes it.
            let mut estimate = collective::estimate(cluster, Op::Allreduce, bytes, world)?;
            let shard = piece.numel.max(1).div_ceil(u64::from(world.ranks)).max(1);
            let hop = piece.compressor.decode_time(device, shard)?
                + piece.compressor.encode_time(device, shard)?;
            estimate.time += SimTime(hop.as_ns() * u64::from(world.ranks - 1));
            estimate
        }
        Exchange::PushPull { .. } => {
            let placement = match ps_servers {
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
            estimate
        }
    })
}
