//! Plans the runtime's unit tests lower: groups of ResNet-50's tensors on one node.

use syncopate_sim::compress::Memory;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::plan::{CompressOn, Group, Launch, Plan, Policy, Scheme};
use syncopate_sim::schedule::{lower, Schedule, World};

/// ResNet-50's `tensors` in one group compressed by `spec` with `memory`, aggregated by
/// `scheme`, in `partitions` pieces.
pub(crate) fn group(
    tensors: Vec<usize>,
    spec: &str,
    memory: Memory,
    scheme: Scheme,
    partitions: u32,
) -> Group {
    Group {
        tensors,
        compressor: spec.parse().unwrap(),
        memory,
        compress_on: CompressOn::Gpu,
        scheme,
        partitions,
        priority: 0,
    }
}

/// The plan of `groups` on `ranks` ranks of one node, launched in plan order on one stream.
pub(crate) fn lowered(groups: Vec<Group>, ranks: u32) -> Schedule {
    let model = resnet50();
    let policy = Policy {
        launch: Launch::PlanOrder,
        comm_streams: 1,
        cycle_time_us: 0.0,
        overlap_forward: false,
        ps_servers: 0,
    };
    let plan = Plan::new("test", &model, groups, policy);
    let world = World {
        nodes: 1,
        ranks_per_node: ranks,
    };
    lower(&model, world, false, &plan, "test").unwrap()
}

/// The model every plan here groups.
pub(crate) fn resnet50() -> ModelProfile {
    ModelProfile::load("resnet50").unwrap()
}
