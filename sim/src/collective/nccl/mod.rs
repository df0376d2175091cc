//! NCCL collectives: the algorithm and protocol NCCL runs, and the calibrated time of a collective.
//!
//! Two questions with two answers. Which algorithm (ring, tree, NVLS) and protocol (LL, LL128,
//! Simple) runs is NCCL's tuner's decision, made from its own tables (`tuner`); how long a
//! collective takes is the calibrated cost model's answer (`cost`): the cheapest candidate at
//! that size. A cluster file without NCCL's setup has no tuner inputs, and the cheapest
//! candidate is also the one reported.

mod cost;
mod tuner;

pub(crate) use cost::tree_latency;

use super::{Estimate, Group, Naming, Protocol};
use crate::base::time::SimTime;
use crate::collective_op::{Algorithm, Op};
use crate::inputs::topology::{Cluster, NcclParams, PerProtocol};

/// The time is the minimum over the candidates of their calibrated costs at `bytes`, not the
/// calibrated cost of the tuner's choice: the tuner switches where its own tables cross, and
/// where the calibration disagrees with them the choice's cost jumps down at the switch (the
/// dgx-h100 at four nodes: tree LL at 128 KiB cost 132 µs, tree LL128 at 256 KiB 116 µs), so a
/// larger message would come out faster. Each candidate's cost rises with size, so their
/// minimum does too; where tuner and calibration agree it is the choice's own cost.
pub(super) fn estimate(
    cluster: &Cluster,
    params: &NcclParams,
    op: Op,
    bytes: u64,
    group: Group,
    naming: Naming,
) -> Estimate {
    if group.ranks == 1 {
        return cost::local_copy(cluster, bytes);
    }
    let costs = cost::Costs::new(cluster, params, group);
    let (cheapest_algorithm, cheapest_protocol, time_us) =
        fastest(&costs, cluster, op, bytes, group);
    let (algorithm, protocol) = match (&params.setup, naming) {
        (Some(setup), Naming::Library) => tuner::choose(cluster, setup, op, bytes, group),
        _ => (cheapest_algorithm, cheapest_protocol),
    };
    Estimate {
        time: SimTime::from_us(time_us),
        algorithm,
        protocol,
        fixed: SimTime::ZERO,
        delay_with_compute: SimTime::ZERO,
    }
}

/// The candidates NCCL offers for `op` on `group`, each priced by the calibrated model; the
/// cheapest wins.
fn fastest(
    costs: &cost::Costs,
    cluster: &Cluster,
    op: Op,
    bytes: u64,
    group: Group,
) -> (Algorithm, Protocol, f64) {
    let mut best = (Algorithm::Ring, Protocol::Simple, f64::INFINITY);
    for (algorithm, protocol) in candidates(cluster, op, group) {
        let time_us = costs.time_us(op, algorithm, protocol, bytes);
        if time_us < best.2 {
            best = (algorithm, protocol, time_us);
        }
    }
    best
}

const PROTOCOLS: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];

/// Every algorithm × protocol NCCL can run `op` with on `group` (in a fixed order, so ties are
/// broken the same way every time).
fn candidates(
    cluster: &Cluster,
    op: Op,
    group: Group,
) -> impl Iterator<Item = (Algorithm, Protocol)> {
    let alltoall = op == Op::Alltoall;
    let allreduce = op == Op::Allreduce;
    let tree = allreduce && group.nodes > 1;
    let nvls = allreduce && cluster.intra_node.nvls && group.ranks_per_node() > 1;
    let p2p = alltoall.then_some((Algorithm::P2p, Protocol::Simple));
    let rings = PROTOCOLS
        .into_iter()
        .filter(move |_| !alltoall)
        .map(|p| (Algorithm::Ring, p));
    let trees = PROTOCOLS
        .into_iter()
        .filter(move |_| tree)
        .map(|p| (Algorithm::Tree, p));
    let nvls = nvls.then_some((Algorithm::Nvls, Protocol::Simple));
    p2p.into_iter().chain(rings).chain(trees).chain(nvls)
}

/// The value of `protocol` in a per-protocol table.
fn per_protocol(values: &PerProtocol, protocol: Protocol) -> f64 {
    match protocol {
        Protocol::Ll => values.ll,
        Protocol::Ll128 => values.ll128,
        _ => values.simple,
    }
}

/// Network levels of NCCL's double binary tree over `nodes` nodes (log2i in NCCL).
fn tree_levels(nodes: u32) -> u32 {
    nodes.max(1).ilog2()
}
