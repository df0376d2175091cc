//! Sharded data parallelism: DeepSpeed's ZeRO stages 1 and 2, and PyTorch FSDP (ZeRO-3).
//!
//! ZeRO-1 and 2 (deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeed 0.19.8) fill buckets of
//! `reduce_bucket_size` elements (5e8 by default, `DeepSpeedZeroConfig` in
//! deepspeed/runtime/zero/config.py) as gradients arrive and allreduce each whole, every rank
//! keeping its partition (`average_tensor` → `allreduce_and_scatter` with
//! `use_multi_rank_bucket_allreduce`, its default: an allreduce, not a reduce-scatter); stage 2
//! does it from the gradient hooks during backward (modeled with `overlap_comm: true`, off its
//! own stream), stage 1 once backward is done. Each rank then updates its partition and all-gathers the
//! updated parameters before the next forward. FSDP wraps each repeated block as a unit and
//! the rest of the model as the root (the usual `fully_shard` per transformer block, then on
//! the model), prefetches one unit ahead, and by default frees each unit's parameters after
//! its forward, the root's excepted.

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
    /// FSDP: ZeRO++'s hpZ, a second shard inside the node for the gathers before backward.
    pub secondary_within_node: bool,
    /// FSDP: torchao's float8 all-gather of the float8 linears' weights.
    pub float8_all_gather: bool,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            prefetch: 1,
            reshard_after_forward: true,
            param_dtype: ParamDtype::Fp32,
            blocks_per_unit: 1,
            bucket_elements: ZERO_BUCKET_ELEMENTS,
            secondary_within_node: false,
            float8_all_gather: false,
        }
    }
}

/// A ZeRO stage 1 or 2 plan: DeepSpeed's buckets, each allreduced with the options'
/// compressor, the parameters gathered after the step.
pub(super) fn zero_plan(
    name: &str,
    scenario: &Scenario,
    options: &StrategyOptions,
    stage: Stage,
) -> Plan {
    let buckets = zero_buckets(&scenario.model, stage, options.sharding.bucket_elements);
    let sharding = Sharding {
        stage,
        prefetch: options.sharding.prefetch,
        reshard_after_forward: false,
        resident: Vec::new(),
        param_dtype: options.sharding.param_dtype,
        within_node: false,
        // ZeRO-1 and 2 keep every parameter: `Plan::validate` refuses a second shard.
        secondary_within_node: options.sharding.secondary_within_node,
        float8_all_gather: options.sharding.float8_all_gather,
    };
    sharded(name, scenario, options, buckets, Scheme::Auto, sharding)
}

/// DeepSpeed's ZeRO buckets in the order it reduces them. Each gradient goes into the bucket
/// unless it would take it over `limit` elements, which flushes the bucket first
/// (`reduce_independent_p_g_buckets_and_remove_grads`); a gradient over the limit is reduced
/// alone. Stage 2 fills them from the gradient hooks, in backward order; stage 1 (without
/// `overlap_comm`, its default) once backward is done, in registration order
/// (`reduce_gradients`), the reverse of the profile's backward order.
pub fn zero_buckets(model: &ModelProfile, stage: Stage, limit: u64) -> Vec<Vec<usize>> {
    let backward = 0..model.num_tensors();
    let order: Vec<usize> = match stage {
        Stage::Zero1 => backward.rev().collect(),
        _ => backward.collect(),
    };
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut elements = 0u64;
    for t in order {
        let numel = model.tensors[t].numel;
        if !current.is_empty() && elements.saturating_add(numel) > limit {
            buckets.push(std::mem::take(&mut current));
            elements = 0;
        }
        current.push(t);
        elements = elements.saturating_add(numel);
    }
    buckets.extend((!current.is_empty()).then_some(current));
    buckets
}

/// An FSDP plan: a unit per `blocks_per_unit` consecutive blocks and the root, reduce-scattered
/// with the options' compressor; `within_node`, sharded inside each node and replicated across
/// nodes (HSDP).
pub(super) fn fsdp_plan(
    name: &str,
    scenario: &Scenario,
    options: &StrategyOptions,
    within_node: bool,
) -> Plan {
    let (units, root) = merged_blocks(&scenario.model, options.sharding.blocks_per_unit);
    fsdp_units_plan(name, scenario, options, (units, root), within_node)
}

/// An FSDP plan of the given units (in backward order) and the root among them, kept
/// gathered; `within_node`, sharded inside each node (HSDP).
pub fn fsdp_units_plan(
    name: &str,
    scenario: &Scenario,
    options: &StrategyOptions,
    (units, root): (Vec<Vec<usize>>, Option<usize>),
    within_node: bool,
) -> Plan {
    let sharding = Sharding {
        stage: Stage::Zero3,
        prefetch: options.sharding.prefetch,
        reshard_after_forward: options.sharding.reshard_after_forward,
        resident: root.into_iter().collect(),
        param_dtype: options.sharding.param_dtype,
        within_node,
        secondary_within_node: options.sharding.secondary_within_node,
        float8_all_gather: options.sharding.float8_all_gather,
    };
    let scheme = Scheme::scattering(&sharding, options.compressor);
    sharded(name, scenario, options, units, scheme, sharding)
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
    let units: Vec<Vec<usize>> = forward
        .chunks(per_unit.max(1) as usize)
        .map(|chunk| {
            let mut unit = chunk.concat();
            unit.sort_unstable();
            unit
        })
        .collect();
    with_root(units, root_tensors)
}

/// `units` and the `root` unit (disjoint tensor lists) in a sharded plan's group order, by the
/// last gradient each needs, with the root's index among them.
pub fn with_root(
    mut units: Vec<Vec<usize>>,
    root: Option<Vec<usize>>,
) -> (Vec<Vec<usize>>, Option<usize>) {
    units.extend(root.clone());
    units.sort_by_key(|unit| unit.iter().max().copied());
    let index = root.and_then(|r| units.iter().position(|unit| *unit == r));
    (units, index)
}

fn sharded(
    name: &str,
    scenario: &Scenario,
    options: &StrategyOptions,
    units: Vec<Vec<usize>>,
    scheme: Scheme,
    sharding: Sharding,
) -> Plan {
    let groups = uniform_groups(units, options, scheme);
    let mut plan = scenario.plan(name, groups, plan_order(0.0));
    plan.sharding = Some(sharding);
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_buckets_flush_before_a_gradient_would_overflow_them() {
        let model = ModelProfile::load("gpt2-xl").unwrap();
        let limit = 50_000_000;
        let elements = |b: &[usize]| b.iter().map(|&t| model.tensors[t].numel).sum::<u64>();
        for stage in [Stage::Zero1, Stage::Zero2] {
            let buckets = zero_buckets(&model, stage, limit);
            let flat: Vec<usize> = buckets.iter().flatten().copied().collect();
            let backward: Vec<usize> = (0..model.num_tensors()).collect();
            match stage {
                // Stage 1 after backward in registration order, stage 2 as gradients arrive.
                Stage::Zero1 => assert_eq!(flat, backward.into_iter().rev().collect::<Vec<_>>()),
                _ => assert_eq!(flat, backward),
            }
            for (bucket, next) in buckets.iter().zip(&buckets[1..]) {
                // Within the limit unless one gradient alone exceeds it, and flushed only
                // because the next gradient would have taken it over.
                assert!(elements(bucket) <= limit || bucket.len() == 1);
                assert!(elements(bucket) + model.tensors[next[0]].numel > limit);
            }
        }
        // The default limit holds GPT-2 XL's 1.56 billion elements in four buckets.
        assert_eq!(
            zero_buckets(&model, Stage::Zero2, ZERO_BUCKET_ELEMENTS).len(),
            4
        );
    }
}
