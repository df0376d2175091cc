//! ByteScheduler: every tensor partitioned, partitions of front layers first (they are needed
//! first by the next forward), a credit of partitions in flight, and each layer's update just
//! before its next forward.

use super::{partitions_for, uniform_groups, StrategyOptions};
use crate::model::ModelProfile;
use crate::plan::{Launch, Plan, Policy, Scheme};

pub(super) fn plan(name: &str, model: &ModelProfile, options: &StrategyOptions) -> Plan {
    let groups = super::per_tensor(model);
    let mut groups = uniform_groups(groups, options, Scheme::Auto);
    for group in &mut groups {
        let tensor = &model.tensors[group.tensors[0]];
        group.partitions =
            partitions_for(tensor.numel * tensor.dtype.bytes(), options.partition_bytes);
        // Front layers (registered first) have the highest priority.
        group.priority = tensor.registration_index as i64;
    }
    let policy = Policy {
        launch: Launch::Priority,
        comm_streams: options.credit.max(1),
        cycle_time_us: 0.0,
        overlap_forward: true,
        ps_servers: 0,
    };
    Plan::new(name, model, groups, policy)
}
