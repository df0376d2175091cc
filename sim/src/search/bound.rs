//! A lower bound on a plan's iteration time: compute cannot shrink, the last gradient's
//! synchronization cannot overlap backward, and the link must carry every byte at its best
//! bandwidth.

use crate::base::error::Result;
use crate::base::time::SimTime;
use crate::collective::{self, Group as RankGroup, ServerLink};
use crate::collective_op::Op;
use crate::compress::Aggregation;
use crate::plan::Plan;
use crate::predict::scenario::Scenario;

/// Sizes between which the asymptotic per-byte cost of a collective is measured.
const LARGE: u64 = 4 << 30;

/// max(compute + the last-ready tensor's payload at full bandwidth, every payload at full
/// bandwidth). Full bandwidth is the cheaper of a flat ring's and colocated servers' slope at
/// multi-GiB sizes, below any real cost.
pub fn lower_bound(scenario: &Scenario, plan: &Plan) -> Result<SimTime> {
    let model = &scenario.model;
    // The plan's own compute per steady-state iteration: DeAR's updates touch only their shard.
    let compute = SimTime::from_us(
        crate::predict::simulate::schedule(scenario, plan)?
            .steps
            .iter()
            .filter_map(|s| s.profiled_us)
            .sum::<f64>()
            * scenario.compute_scale,
    );
    let world = scenario.cluster.world_size();
    if world == 1 {
        return Ok(compute);
    }
    let group = RankGroup::world(&scenario.cluster);
    // What the links carry: a collective's fixed part runs beside other transfers.
    let transfer = |bytes: u64, op: Op| -> Result<f64> {
        let estimate = collective::estimate(&scenario.cluster, op, bytes, group)?;
        Ok(estimate.time.saturating_sub(estimate.fixed).as_ns() as f64)
    };
    let slope = |op: Op| -> Result<f64> {
        let once = transfer(LARGE, op)?;
        let twice = transfer(2 * LARGE, op)?;
        let asymptotic = (twice - once) / LARGE as f64;
        // A cluster's measured sizes may cost less per byte than its model's slope.
        Ok(collective::least_ns_per_byte(&scenario.cluster, op, group)
            .map_or(asymptotic, |least| asymptotic.min(least)))
    };
    let (allreduce, allgather) = (slope(Op::Allreduce)?, slope(Op::Allgather)?);
    // With every node serving a round at once, a byte to colocated servers costs 1/nodes of
    // one server's round; dedicated servers leave the workers' links free for up to 2 × nodes
    // rounds at once (each loads a worker's link a half over the senders in each direction).
    let ps = {
        let cluster = &scenario.cluster;
        let nodes = f64::from(cluster.nodes.max(1));
        let slope = |server: ServerLink| -> Result<f64> {
            let round = |bytes: u64| -> Result<f64> {
                Ok(collective::push_pull(cluster, bytes, server)?
                    .0
                    .time
                    .as_ns() as f64)
            };
            Ok((round(2 * LARGE)? - round(LARGE)?) / LARGE as f64)
        };
        let colocated = slope(ServerLink::Node(0))? / nodes;
        match plan.policy.ps_servers {
            0 => colocated,
            _ => colocated.min(slope(ServerLink::Dedicated(0))? / (2.0 * nodes)),
        }
    };
    let payload_ns = |bytes: u64, aggregation: Aggregation| match aggregation {
        Aggregation::Allgather => bytes as f64 * f64::from(world) * allgather,
        Aggregation::Allreduce => bytes as f64 * allreduce.min(ps),
        Aggregation::ParameterServer => bytes as f64 * ps.min(allreduce),
    };
    let all: f64 = plan
        .groups
        .iter()
        .map(|g| payload_ns(g.wire_bytes(model, plan.wire), g.aggregation()))
        .sum();
    // Without overlap, the optimizer (and so the next forward) waits for the last gradient to
    // become ready, the last tensor in backward order, to be synchronized. With overlap only the
    // first layers wait, and which group that is depends on the plan: no tail then.
    let last = model.num_tensors() - 1;
    let tail = match plan.policy.overlap_forward {
        true => 0.0,
        false => plan
            .groups
            .iter()
            .find(|g| g.tensors.contains(&last))
            .map(|g| {
                let share = model.tensors[last].numel as f64 / g.numel(model) as f64;
                payload_ns(
                    (g.wire_bytes(model, plan.wire) as f64 * share) as u64,
                    g.aggregation(),
                )
            })
            .unwrap_or(0.0),
    };
    Ok(SimTime::from_ns((compute.as_ns() as f64 + tail).max(all)))
}
