//! Parameter-server strategies: BytePS (servers colocated with the workers) and dedicated
//! servers, both aggregating inside each node first, partitioning tensors and scheduling
//! partitions by layer priority with a credit, as BytePS does.

use super::{partitioned_by_layer, StrategyOptions};
use crate::error::Result;
use crate::model::ModelProfile;
use crate::plan::{Launch, Plan, Policy, Scheme};

/// `servers`: 0 for colocated servers, otherwise the number of dedicated server machines.
pub(super) fn plan(
    name: &str,
    model: &ModelProfile,
    options: &StrategyOptions,
    servers: u32,
) -> Result<Plan> {
    let policy = Policy {
        launch: Launch::Priority,
        comm_streams: options.credit.max(1),
        cycle_time_us: 0.0,
        overlap_forward: false,
        ps_servers: servers,
    };
    Ok(Plan::new(
        name,
        model,
        partitioned_by_layer(model, options, Scheme::Ps)?,
        policy,
    ))
}
