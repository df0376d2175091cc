//! Parameter-server strategies: BytePS (servers colocated with the workers) and dedicated
//! servers, both aggregating inside each node first, partitioning tensors and scheduling
//! partitions by layer priority with a credit, as BytePS does.

use super::{partitions_for, uniform_groups, StrategyOptions};
use crate::model::ModelProfile;
use crate::plan::{Launch, Plan, Policy, Scheme};

/// `servers`: 0 for colocated servers, otherwise the number of dedicated server machines.
pub(super) fn plan(
    name: &str,
    model: &ModelProfile,
    options: &StrategyOptions,
    servers: u32,
) -> Plan {
    let mut groups = uniform_groups(super::per_tensor(model), options, Scheme::Ps);
    for group in &mut groups {
        let tensor = &model.tensors[group.tensors[0]];
        group.partitions =
            partitions_for(tensor.numel * tensor.dtype.bytes(), options.partition_bytes);
        group.priority = tensor.registration_index as i64;
    }
    let policy = Policy {
        launch: Launch::Priority,
        comm_streams: options.credit.max(1),
        cycle_time_us: 0.0,
        overlap_forward: false,
        ps_servers: servers,
    };
    Plan::new(name, model, groups, policy)
}
