//! MergeComp: compression applied per group of y contiguous tensors (balanced by bytes); the
//! scheduler searches y, increasing it while the iteration gets faster, as MergeComp's does.

use super::{fixed_groups, require_compressor, uniform_groups, GroupingRule, StrategyOptions};
use crate::base::error::Result;
use crate::plan::{Plan, Scheme};
use crate::predict::evaluate::Evaluator;
use crate::predict::scenario::Scenario;

/// Extra group counts tried after the best one before the search stops.
const PATIENCE: usize = 2;

pub(super) fn plan(name: &str, scenario: &Scenario, options: &StrategyOptions) -> Result<Plan> {
    require_compressor(name, options)?;
    let model = &scenario.model;
    let evaluator = Evaluator::new(scenario.clone());
    let candidate = |y: usize| -> Result<Plan> {
        let groups = fixed_groups::groups(model, y, GroupingRule::Bytes)?;
        Ok(scenario.plan(
            name,
            uniform_groups(groups, options, Scheme::Auto),
            super::plan_order(0.0),
        ))
    };
    let mut best = (candidate(1)?, None);
    let mut since_best = 0;
    for y in 1..=model.num_tensors() {
        let plan = candidate(y)?;
        let time = evaluator.iteration_time(&plan)?;
        if best.1.is_none_or(|t| time < t) {
            best = (plan, Some(time));
            since_best = 0;
        } else {
            since_best += 1;
            if since_best > PATIENCE {
                break;
            }
        }
    }
    Ok(best.0)
}
