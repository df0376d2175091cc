//! Parameter-server strategies: BytePS (servers colocated with the workers) and dedicated
//! servers, both aggregating inside each node first, partitioning tensors and scheduling
//! partitions by layer priority with a partition in flight per server, as BytePS does.

use super::{partitioned_by_layer, StrategyOptions};
use crate::base::error::Result;
use crate::base::limits;
use crate::compress::{Compressor, Memory};
use crate::inputs::model::ModelProfile;
use crate::plan::{Launch, Plan, Policy, Scheme};

/// `servers`: 0 for colocated servers (one on each of the `nodes`), otherwise the number of
/// dedicated server machines.
pub(super) fn plan(
    name: &str,
    model: &ModelProfile,
    options: &StrategyOptions,
    nodes: u32,
    servers: u32,
) -> Result<Plan> {
    // A partition belongs to one server; with one in flight per server every link is busy.
    // BytePS credits only its node-local reduce queue (common/scheduled_queue.cc), so pushes
    // to different servers do not wait for each other.
    let in_flight = match servers {
        0 => nodes,
        dedicated => dedicated,
    };
    // BytePS with one worker machine is not a distributed job (`_num_worker > 1` in
    // byteps/common/global.cc): it reduces and broadcasts over NCCL inside the machine, with no
    // push, pull or server, and sets up a compressor only for distributed jobs
    // (byteps/common/operations.cc), so its gradients travel whole.
    let whole = StrategyOptions {
        compressor: Compressor::None,
        memory: Memory::None,
        ..*options
    };
    let (options, scheme) = match (servers, nodes) {
        (0, 1) => (&whole, Scheme::Allreduce),
        _ => (options, Scheme::Ps),
    };
    let policy = Policy {
        launch: Launch::Priority,
        comm_streams: options
            .credit
            .max(in_flight)
            .clamp(1, limits::MAX_COMM_STREAMS),
        cycle_time_us: 0.0,
        overlap_forward: false,
        ps_servers: servers,
    };
    Ok(Plan::new(
        name,
        model,
        partitioned_by_layer(model, options, scheme)?,
        policy,
    ))
}
