//! Espresso: per-tensor compression decisions, greedy: tensors from the largest down (ties from
//! the output side), each taking whichever of no compression, compression on the GPU or on the
//! CPU makes the simulated iteration fastest given the choices made so far.

use super::{require_compressor, StrategyOptions};
use crate::base::error::Result;
use crate::plan::{CompressOn, Plan};
use crate::predict::evaluate::Evaluator;
use crate::predict::scenario::Scenario;

/// Tensors below this size are never compressed: encode and decode floors exceed any saving
/// (Espresso likewise leaves small tensors alone).
const MIN_COMPRESSED_ELEMENTS: u64 = 1 << 14;

pub(super) fn plan(name: &str, scenario: &Scenario, options: &StrategyOptions) -> Result<Plan> {
    let compressor = require_compressor(name, options)?;
    let model = &scenario.model;
    let mut plan = super::per_tensor_plan(model);
    plan.strategy = name.to_string();
    plan.codec_stream = scenario.codec_stream();
    let evaluator = Evaluator::new(scenario.clone());
    let mut best_time = evaluator.iteration_time(&plan)?;
    let mut order: Vec<usize> = (0..model.num_tensors())
        .filter(|&t| model.tensors[t].numel >= MIN_COMPRESSED_ELEMENTS)
        .collect();
    order.sort_by_key(|&t| (std::cmp::Reverse(model.tensors[t].numel), t));
    let places: &[CompressOn] = if scenario.host_codec.is_some() {
        &[CompressOn::Gpu, CompressOn::Cpu]
    } else {
        &[CompressOn::Gpu]
    };
    // One group per tensor in backward order, so group index = tensor index.
    for t in order {
        for &place in places {
            let mut candidate = plan.clone();
            let group = &mut candidate.groups[t];
            group.compressor = compressor;
            group.memory = options.memory;
            group.compress_on = place;
            let time = evaluator.iteration_time(&candidate)?;
            if time < best_time {
                (plan, best_time) = (candidate, time);
            }
        }
    }
    Ok(plan)
}
