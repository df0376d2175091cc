//! HiPress: CaSync synchronizes compressed gradients over a parameter server (decode, aggregate,
//! re-encode on the server) or a ring (each hop decodes, adds, re-encodes); SeCoPa decides per
//! gradient whether to compress and into how many partitions to split it, by comparing the
//! pipelined cost of encode, communication and decode with plain synchronization.

use super::{require_compressor, CaSyncTopology, StrategyOptions};
use crate::base::error::Result;
use crate::base::limits;
use crate::base::time::SimTime;
use crate::compress::{Compressor, Memory};
use crate::plan::{CompressOn, Group, Launch, Plan, Policy, Scheme};
use crate::predict::cost::piece_stages;
use crate::predict::scenario::Scenario;
use crate::schedule::Encoding;

/// Partition counts SeCoPa considers; a piece stays at least this many elements.
const MAX_PARTITIONS: u32 = 16;
const MIN_PIECE_ELEMENTS: u64 = 1 << 16;

pub(super) fn plan(
    name: &str,
    scenario: &Scenario,
    options: &StrategyOptions,
    topology: CaSyncTopology,
) -> Result<Plan> {
    let compressor = require_compressor(name, options)?;
    let model = &scenario.model;
    let (plain_scheme, compressed_scheme) = match topology {
        CaSyncTopology::Ps => (Scheme::Ps, Scheme::Ps),
        CaSyncTopology::Ring => (Scheme::Allreduce, Scheme::CompressedRing),
    };
    let groups = (0..model.num_tensors())
        .map(|t| {
            let group =
                |compressor: Compressor, memory: Memory, scheme: Scheme, partitions: u32| Group {
                    tensors: vec![t],
                    compressor,
                    memory,
                    compress_on: CompressOn::Gpu,
                    scheme,
                    partitions,
                    priority: t as i64,
                };
            let mut best = group(Compressor::None, Memory::None, plain_scheme, 1);
            let mut best_time = pipelined(scenario, &best)?;
            let mut partitions = 1;
            while partitions <= MAX_PARTITIONS
                && model.tensors[t].numel / u64::from(partitions) >= MIN_PIECE_ELEMENTS
            {
                let candidate = group(compressor, options.memory, compressed_scheme, partitions);
                let time = pipelined(scenario, &candidate)?;
                if time < best_time {
                    (best, best_time) = (candidate, time);
                }
                partitions *= 2;
            }
            Ok(best)
        })
        .collect::<Result<Vec<_>>>()?;
    // CaSync-PS spreads a gradient's partitions over the servers and keeps them all busy; a
    // ring synchronizes one piece at a time.
    let comm_streams = match topology {
        CaSyncTopology::Ps => scenario.cluster.nodes.clamp(1, limits::MAX_COMM_STREAMS),
        CaSyncTopology::Ring => 1,
    };
    let policy = Policy {
        launch: Launch::PlanOrder,
        comm_streams,
        cycle_time_us: 0.0,
        overlap_forward: false,
        ps_servers: 0,
    };
    Ok(Plan::new(name, model, groups, policy))
}

/// SeCoPa's estimate: the pieces flow through encode, communication and decode as a pipeline,
/// so after the first piece's three stages each further piece adds its slowest stage. Over a
/// parameter server, pieces on different servers communicate at once: a piece's share of the
/// communication stage is its round over the servers it spreads across.
fn pipelined(scenario: &Scenario, group: &Group) -> Result<SimTime> {
    // HiPress prices the catalog's packed formats in one call per piece (its plans say so:
    // `Strategy::check_codec_calls` refuses per-tensor calls for it).
    let mut stages = piece_stages(scenario, group, Encoding::default())?;
    if group.scheme == Scheme::Ps {
        let servers = (stages.len() as u64).min(u64::from(scenario.cluster.nodes.max(1)));
        for stage in &mut stages {
            stage[1] = SimTime(stage[1].as_ns() / servers);
        }
    }
    let first: SimTime = stages[0].iter().copied().sum();
    let rest: SimTime = stages[1..]
        .iter()
        .map(|s| *s.iter().max().expect("three stages"))
        .sum();
    Ok(first + rest)
}
