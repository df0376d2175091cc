//! `tune --framework F`: the fastest of F's settings, next to F's defaults.
//!
//! Each setting is priced as F runs it.

use super::{candidates, nearest, Settings, Target};
use crate::base::error::{Result, SimError};
use crate::base::time::SimTime;
use crate::compress::{Compressor, Memory};
use crate::predict::evaluate::steady_iteration_time;
use crate::predict::memory::check_plan_fits;
use crate::predict::scenario::Scenario;
use crate::search::{refine_groups, Choice, SearchSpace};
use rayon::prelude::*;

/// The outcome of a search over one framework's settings.
#[derive(Clone, Debug)]
pub struct NativeTune {
    /// The fastest settings found.
    pub best: Settings,
    /// Their iteration time.
    pub best_time: SimTime,
    /// The framework's settings left at their defaults (no compression), priced the same way.
    pub default: Settings,
    /// The defaults' iteration time.
    pub default_time: SimTime,
    /// How many settings were priced (the grid, the refinement and the defaults).
    pub evaluated: u64,
}

/// Searches `target`'s settings on `base`: `fusion` its caps or thresholds with the first of
/// `choices` (or none) everywhere, `compression` its compression at default fusion, `all`
/// both. Ties go to the earliest candidate, so the result is deterministic.
pub fn tune_settings(
    base: &Scenario,
    target: Target,
    space: SearchSpace,
    choices: &[Choice],
    progress: &(dyn Fn(u64) + Sync),
) -> Result<NativeTune> {
    let ranks_per_node = base.world().ranks_per_node;
    let default = candidates(target, &[], ranks_per_node)
        .into_iter()
        .find(Settings::is_default)
        .expect("every target's grid holds its defaults");
    let all = candidates(target, choices, ranks_per_node);
    let none = (Compressor::None, Memory::None);
    let fixed_choice = choices.first().copied();
    let chosen: Vec<Settings> = all
        .into_iter()
        .filter(|s| match space {
            SearchSpace::All => true,
            SearchSpace::Fusion => s.precision() == fixed_choice.unwrap_or(none),
            SearchSpace::Compression => s.has_default_fusion(),
        })
        .collect();
    if chosen.is_empty() {
        return Err(SimError::bad_value(
            "--compressor",
            fixed_choice.map(|c| c.0.to_string()).unwrap_or_default(),
            format!("the {} framework cannot run it", target.name()),
        ));
    }
    let done = std::sync::atomic::AtomicU64::new(0);
    let price = |settings: &Settings| -> Result<SimTime> {
        // Settings whose model states do not fit the device are skipped like any that cannot run.
        let (scenario, plan) = settings.scenario_and_plan(base)?;
        check_plan_fits(&scenario, &plan, "tune")?;
        let time = steady_iteration_time(&scenario, &plan)?;
        progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
        Ok(time)
    };
    let times: Vec<Result<SimTime>> = chosen.par_iter().map(price).collect();
    // A candidate that cannot run here is skipped; if none can, the first reason is the error.
    let mut best: Option<(usize, SimTime)> = None;
    let mut first_error = None;
    for (i, time) in times.into_iter().enumerate() {
        match time {
            Ok(time) if best.is_none_or(|(_, t)| time < t) => best = Some((i, time)),
            Ok(_) => {}
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    let Some((index, best_time)) = best else {
        return Err(first_error.expect("a failed candidate"));
    };
    // The refinement's plans count on from the grid's.
    let grid = chosen.len() as u64;
    let (best, best_time, refined) =
        refine(base, target, chosen[index].clone(), best_time, &|n| {
            progress(grid + n)
        })?;
    let default_time = price(&default)?;
    Ok(NativeTune {
        best,
        best_time,
        default,
        default_time,
        evaluated: grid + 1 + refined,
    })
}

/// Plans the refinement of the best grid settings may score: a few hundred, so that a
/// framework's search stays within seconds where the full `tune` takes its 3,000.
const REFINE_BUDGET: usize = 400;

/// The best grid settings' buckets refined one boundary at a time (per-bucket caps for DDP,
/// explicit groups for Horovod), kept when the settings that express the result are faster as
/// the framework runs them; the plans scored.
fn refine(
    base: &Scenario,
    target: Target,
    start: Settings,
    start_time: SimTime,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(Settings, SimTime, u64)> {
    if !target.expresses_groups() {
        return Ok((start, start_time, 0));
    }
    let (scenario, plan) = start.scenario_and_plan(base)?;
    let ((refined, _), scored) =
        refine_groups(&scenario, (plan, start_time), REFINE_BUDGET, progress);
    // Priced again as the settings that express it, so the time is the settings' own.
    let settings = nearest(target, &refined, &base.model).settings;
    let time = settings.iteration_time(base)?;
    Ok(if time < start_time {
        (settings, time, scored + 1)
    } else {
        (start, start_time, scored + 1)
    })
}
