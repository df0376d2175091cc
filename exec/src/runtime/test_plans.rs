//! Plans the runtime's unit tests lower: groups of ResNet-50's tensors, or a small sharded model.

use syncopate_sim::compress::Memory;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::plan::{CompressOn, Group, Launch, Plan, Policy, Scheme};
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::predict::simulate::schedule;
use syncopate_sim::schedule::{lower, Schedule, StepKind, World};
use syncopate_sim::sharding::ParamDtype;
use syncopate_sim::strategy::{ShardOptions, Strategy, StrategyOptions};

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

/// A `strategy` plan compressed by `spec` (a sharded strategy's, its parameters gathered in
/// `param_dtype`) of a small model on `nodes` nodes of `per_node` ranks. The model has two blocks and a
/// root (FSDP's three units, ZeRO's one bucket), none of whose sizes three ranks divide, so the
/// last shard of each unit is padded and the ring's chunks are uneven.
pub(crate) fn small_sharded(
    strategy: &str,
    spec: &str,
    param_dtype: ParamDtype,
    topology: (u32, u32),
) -> Schedule {
    let sharding = ShardOptions {
        param_dtype,
        ..ShardOptions::default()
    };
    small_sharded_with(strategy, spec, sharding, topology)
}

/// [`small_sharded`] with every sharding option given.
pub(crate) fn small_sharded_with(
    strategy: &str,
    spec: &str,
    sharding: ShardOptions,
    topology: (u32, u32),
) -> Schedule {
    let tensors: [(&str, &[u64], &str); 6] = [
        ("head.weight", &[10, 7], "Linear"),
        ("h.1.bias", &[13], "Linear"),
        ("h.1.weight", &[13, 6], "Linear"),
        ("h.0.bias", &[11], "Linear"),
        ("h.0.weight", &[11, 7], "Linear"),
        ("wte.weight", &[17, 5], "Embedding"),
    ];
    small_model_sharded(
        &tensors,
        (strategy, spec),
        sharding,
        ("v100-10gbe", topology),
    )
}

/// An `fsdp` plan with torchao's float8 gathers, the other tensors in `param_dtype`, of a small
/// model of the same layout whose linear weights have dimensions of multiples of 16 (float8
/// ones) but the head's; no unit's float8 weights or other tensors divide by three ranks.
pub(crate) fn small_float8(param_dtype: ParamDtype, topology: (u32, u32)) -> Schedule {
    let tensors: [(&str, &[u64], &str); 6] = [
        ("head.weight", &[10, 16], "Linear"),
        ("h.1.bias", &[13], "Linear"),
        ("h.1.weight", &[16, 16], "Linear"),
        ("h.0.bias", &[11], "Linear"),
        ("h.0.weight", &[16, 32], "Linear"),
        ("wte.weight", &[17, 5], "Embedding"),
    ];
    let sharding = ShardOptions {
        param_dtype,
        float8_all_gather: true,
        ..ShardOptions::default()
    };
    // Float8 products: Hopper's.
    small_model_sharded(&tensors, ("fsdp", "none"), sharding, ("dgx-h100", topology))
}

/// A plan of `strategy` compressed by `spec` over a model of `tensors` (name, shape, module),
/// listed in backward order, on `nodes` nodes of `per_node` ranks of `cluster`.
fn small_model_sharded(
    tensors: &[(&str, &[u64], &str)],
    (strategy, spec): (&str, &str),
    sharding: ShardOptions,
    (cluster, (nodes, per_node)): (&str, (u32, u32)),
) -> Schedule {
    let mut model = resnet50();
    let template = model.tensors[0].clone();
    model.arithmetic = None;
    model.tensors = tensors
        .iter()
        .enumerate()
        .map(|(i, (name, shape, module))| {
            let mut t = template.clone();
            t.name = name.to_string();
            t.shape = shape.to_vec();
            t.numel = shape.iter().product();
            t.registration_index = tensors.len() - 1 - i;
            t.module = Some(module.to_string());
            t
        })
        .collect();
    let world = ClusterOverrides {
        nodes: Some(nodes),
        gpus_per_node: Some(per_node),
        ..ClusterOverrides::default()
    };
    let scenario = Scenario::new(model, Cluster::load(cluster, world).unwrap()).unwrap();
    let options = StrategyOptions {
        compressor: spec.parse().unwrap(),
        sharding,
        ..StrategyOptions::default()
    };
    let plan = strategy
        .parse::<Strategy>()
        .unwrap()
        .plan(&scenario, &options)
        .unwrap();
    schedule(&scenario, &plan).unwrap()
}

/// The first gather step of `schedule` and its unit's group.
pub(crate) fn first_gather(schedule: &Schedule) -> (u32, usize) {
    schedule
        .steps
        .iter()
        .enumerate()
        .find_map(|(i, s)| match s.kind {
            StepKind::Gather { group, .. } => Some((i as u32, group as usize)),
            _ => None,
        })
        .expect("a sharded schedule gathers")
}
