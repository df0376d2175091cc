//! Fast repeated evaluation of plans for one model on one cluster: the scenario is resolved once
//! and the single-GPU baseline computed once, so a search pays only for building and running
//! each candidate's task graph. Its times equal `simulate`'s on the symmetric path.

use crate::base::error::Result;
use crate::base::time::SimTime;
use crate::collective::Naming;
use crate::plan::Plan;
use crate::predict::engine;
use crate::predict::noise::Noise;
use crate::predict::scenario::Scenario;
use crate::predict::simulate::{
    engine_config, mean_ns, rank_skew_cv, schedule, simulate, task_graph, SimOptions,
};

/// Warm-up iterations before the measured one, as `simulate`'s default.
const WARMUP: u32 = 1;

/// Evaluates plans on a fixed model and cluster.
#[derive(Clone)]
pub struct Evaluator {
    scenario: Scenario,
}

impl Evaluator {
    /// Evaluates plans on `scenario`.
    pub fn new(scenario: Scenario) -> Evaluator {
        Evaluator { scenario }
    }

    /// Steady-state iteration time of `plan` (lowering validates it against the model).
    pub fn iteration_time(&self, plan: &Plan) -> Result<SimTime> {
        steady_iteration_time(&self.scenario, plan)
    }
}

/// The iteration after one warm-up, on the symmetric path without noise; with a skew between
/// ranks, `simulate`'s mean iteration.
///
/// When nothing of an iteration outlives its optimizer step (no overlap with the next forward)
/// and no cycle ties launches to absolute time, every iteration repeats the first one exactly,
/// so one iteration's makespan is the steady-state time and half the work is saved.
pub fn steady_iteration_time(scenario: &Scenario, plan: &Plan) -> Result<SimTime> {
    // Ranks that differ (a measured skew) are simulated one by one over many iterations.
    if rank_skew_cv(scenario).is_some() {
        let outcome = simulate(scenario, plan, &SimOptions::default())?;
        return Ok(SimTime::from_ns(mean_ns(&outcome.iteration_times)));
    }
    let policy = &plan.policy;
    let schedule = schedule(scenario, plan)?;
    let config = engine_config(scenario, &schedule, 1, 0);
    if !policy.overlap_forward && policy.cycle_time_us == 0.0 {
        let graph = task_graph(scenario, &schedule, 1, Naming::Priced)?;
        return Ok(engine::run(&graph, &config, &Noise::default())?.makespan);
    }
    let graph = task_graph(scenario, &schedule, WARMUP + 1, Naming::Priced)?;
    let result = engine::run(&graph, &config, &Noise::default())?;
    let ends = &result.iteration_end;
    Ok(ends[WARMUP as usize] - ends[WARMUP as usize - 1])
}
