//! Sharded data parallelism: DeepSpeed's ZeRO stages 1 and 2, and PyTorch FSDP (ZeRO-3).
//!
//! ZeRO-1 and 2 (deepspeed/runtime/zero/stage_1_and_2.py) fill buckets of `reduce_bucket_size`
//! elements (5e8 by default, `DeepSpeedZeroConfig` in deepspeed/runtime/zero/config.py) as
//! gradients arrive and reduce-scatter each (`reduce_scatter: true`); stage 2 does it from the
//! gradient hooks during backward (modeled with `overlap_comm: true`, off its own stream),
//! stage 1 once backward is done. Each rank then updates its partition and all-gathers the
//! updated parameters before the next forward. FSDP wraps each repeated block as a unit and
//! the rest of the model as the root (the usual `fully_shard` per transformer block, then on
//! the model), prefetches one unit ahead, and by default frees each unit's parameters after
//! its forward, the root's excepted.

use super::ddp::fill_buckets;
use super::{plan_order, uniform_groups, StrategyOptions};
use crate::inputs::model::ModelProfile;
use crate::plan::{Plan, Scheme};
use crate::predict::scenario::Scenario;
use crate::sharding::{block_units, ParamDtype, Sharding, Stage};

/// DeepSpeed's `reduce_bucket_size` default, in elements.
pub(super) const ZERO_BUCKET_ELEMENTS: u64 = 500_000_000;

/// The choices of a sharded strategy, with FSDP's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardOptions {
    /// Units gathered ahead of the one computing (FSDP: one).
    pub prefetch: u32,
    /// Free each unit's parameters after its forward (FSDP's `reshard_after_forward`, true).
    pub reshard_after_forward: bool,
    /// The precision parameters are gathered in (FSDP's `param_dtype`; none: fp32).
    pub param_dtype: ParamDtype,
    /// FSDP: consecutive blocks sharded together as one unit (one `fully_shard` call on a
    /// list of blocks; FSDP's usual wrapping: one).
    pub blocks_per_unit: u32,
    /// ZeRO-1 and 2: elements per gradient bucket (DeepSpeed's `reduce_bucket_size`).
    pub bucket_elements: u64,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            prefetch: 1,
            reshard_after_forward: true,
            param_dtype: ParamDtype::Fp32,
            blocks_per_unit: 1,
            bucket_elements: ZERO_BUCKET_ELEMENTS,
        }
    }
}

/// A ZeRO stage 1 or 2 plan: DeepSpeed's buckets, each reduce-scattered with the options'
/// compressor, the parameters gathered after the step.
pub(super) fn zero_plan(
    name: &str,
    scenario: &Scenario,
    options: &StrategyOptions,
    stage: Stage,
) -> Plan {
    let model = &scenario.model;
    let buckets = fill_buckets(
        0..model.num_tensors(),
        |t| model.tensors[t].numel,
        |_, elements| elements >= options.sharding.bucket_elements,
    );
    let sharding = Sharding {
        stage,
        prefetch: options.sharding.prefetch,
        reshard_after_forward: false,
        resident: Vec::new(),
        param_dtype: options.sharding.param_dtype,
    };
    sharded(name, scenario, options, buckets, sharding)
}

/// An FSDP plan: a unit per `blocks_per_unit` consecutive blocks and the root, reduce-scattered
/// with the options' compressor.
pub(super) fn fsdp_plan(name: &str, scenario: &Scenario, options: &StrategyOptions) -> Plan {
    let (units, root) = merged_blocks(&scenario.model, options.sharding.blocks_per_unit);
    fsdp_units_plan(name, scenario, options, units, root)
}

/// An FSDP plan of the given units (in backward order), `root` among them kept gathered.
pub fn fsdp_units_plan(
    name: &str,
    scenario: &Scenario,
    options: &StrategyOptions,
    units: Vec<Vec<usize>>,
    root: Option<usize>,
) -> Plan {
    let sharding = Sharding {
        stage: Stage::Zero3,
        prefetch: options.sharding.prefetch,
        reshard_after_forward: options.sharding.reshard_after_forward,
        resident: root.into_iter().collect(),
        param_dtype: options.sharding.param_dtype,
    };
    sharded(name, scenario, options, units, sharding)
}

/// The model's blocks (`block_units`) merged `per_unit` at a time in forward order, as
/// `fully_shard(blocks[i:i + per_unit])` wraps them, with the root apart: the units in the
/// order their gradients are ready, and the root's index among them.
pub fn merged_blocks(model: &ModelProfile, per_unit: u32) -> (Vec<Vec<usize>>, Option<usize>) {
    let (blocks, root) = block_units(model);
    let root_tensors = root.map(|r| blocks[r].clone());
    // block_units orders the blocks by their last gradient: forward order is the reverse.
    let forward: Vec<Vec<usize>> = blocks
        .into_iter()
        .enumerate()
        .rev()
        .filter(|&(index, _)| Some(index) != root)
        .map(|(_, block)| block)
        .collect();
    let mut units: Vec<Vec<usize>> = forward
        .chunks(per_unit.max(1) as usize)
        .map(|chunk| {
            let mut unit = chunk.concat();
            unit.sort_unstable();
            unit
        })
        .collect();
    units.extend(root_tensors.clone());
    units.sort_by_key(|unit| unit.last().copied());
    let root = root_tensors.and_then(|r| units.iter().position(|unit| *unit == r));
    (units, root)
}

fn sharded(
    name: &str,
    scenario: &Scenario,
    options: &StrategyOptions,
    units: Vec<Vec<usize>>,
    sharding: Sharding,
) -> Plan {
    let groups = uniform_groups(units, options, Scheme::ReduceScatter);
    let mut plan = scenario.plan(name, groups, plan_order(0.0));
    plan.sharding = Some(sharding);
    plan
}
