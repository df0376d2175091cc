//! ByteScheduler: every tensor partitioned, partitions of front layers first (they are needed
//! first by the next forward), a credit of partitions in flight, and each layer's update just
//! before its next forward.

use super::{partitioned_by_layer, StrategyOptions};
use crate::base::error::Result;
use crate::inputs::model::ModelProfile;
use crate::plan::{Launch, Plan, Policy, Scheme};

pub(super) fn plan(name: &str, model: &ModelProfile, options: &StrategyOptions) -> Result<Plan> {
    let policy = Policy {
        launch: Launch::Priority,
        comm_streams: options.credit.max(1),
        cycle_time_us: 0.0,
        overlap_forward: true,
        ps_servers: 0,
    };
    Ok(Plan::new(
        name,
        model,
        partitioned_by_layer(model, options, Scheme::Auto)?,
        policy,
    ))
}
