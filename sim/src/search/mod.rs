//! `tune`: searches fusion groups, thresholds and per-group compression for the fastest plan,
//! next to every baseline strategy and a lower bound.
//!
//! Every candidate is scored by the simulator itself (the symmetric path of `simulate`), so the
//! tuned time is exactly what `simulate --plan` reports. Candidates come from (1) the baseline
//! strategies, (2) a dynamic program over contiguous groups for every group count y under a fast
//! surrogate, (3) golden-section searches of the fusion thresholds of Horovod, DDP and DeAR, and
//! (4) local search (move a boundary, merge, split, change a group's compressor) from the best.

mod bound;
mod local;
mod surrogate;

pub use bound::lower_bound;
pub use surrogate::Choice;

use crate::compress::{Compressor, Memory};
use crate::error::{Result, SimError};
use crate::evaluate::Evaluator;
use crate::plan::{CompressOn, Group, Plan, Scheme};
use crate::scenario::Scenario;
use crate::strategy::{plan_order, Strategy, StrategyOptions};
use crate::time::SimTime;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// What `tune` may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchSpace {
    /// Group boundaries, group count and thresholds, with one compressor for every group.
    Fusion,
    /// Each group's compressor (or none), on the best baseline's groups.
    Compression,
    /// Both.
    All,
}

impl std::str::FromStr for SearchSpace {
    type Err = SimError;
    fn from_str(text: &str) -> Result<SearchSpace> {
        match text {
            "fusion" => Ok(SearchSpace::Fusion),
            "compression" => Ok(SearchSpace::Compression),
            "all" => Ok(SearchSpace::All),
            _ => Err(SimError::bad_value(
                "--search",
                text,
                "valid: fusion, compression, all",
            )),
        }
    }
}

/// A tuning request.
#[derive(Clone, Debug)]
pub struct TuneRequest {
    pub space: SearchSpace,
    /// Compressors a group may use besides none (with their memory); for `fusion` the first one,
    /// if any, is applied to every group.
    pub compressors: Vec<Choice>,
    pub options: StrategyOptions,
}

/// A baseline strategy's time on the same scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Baseline {
    pub strategy: String,
    pub iteration_time: SimTime,
}

/// The outcome of a search.
#[derive(Clone, Debug)]
pub struct TuneResult {
    pub plan: Plan,
    pub iteration_time: SimTime,
    pub lower_bound: SimTime,
    pub plans_evaluated: u64,
    pub baselines: Vec<Baseline>,
}

/// Shared state of a search: the scenario, the evaluation counter and the progress callback.
struct Search<'a> {
    base: &'a Scenario,
    evaluated: AtomicU64,
    progress: &'a (dyn Fn(u64) + Sync),
}

impl Search<'_> {
    /// Scores plans on both cores; results come back in input order.
    fn evaluate_all(&self, plans: Vec<Plan>) -> Result<Vec<(Plan, SimTime)>> {
        plans
            .into_par_iter()
            // Few, large batches: each batch clones the scenario once for its evaluator.
            .with_min_len(32)
            .map_init(
                || Evaluator::new(self.base.clone()),
                |evaluator, plan| {
                    let time = evaluator.iteration_time(&plan)?;
                    let done = self.evaluated.fetch_add(1, Ordering::Relaxed) + 1;
                    (self.progress)(done);
                    Ok((plan, time))
                },
            )
            .collect()
    }
}

/// The fastest of scored plans; ties go to the earliest, so searches are deterministic.
fn fastest(scored: Vec<(Plan, SimTime)>) -> Option<(Plan, SimTime)> {
    scored
        .into_iter()
        .reduce(|best, next| if next.1 < best.1 { next } else { best })
}

pub fn tune(
    base: &Scenario,
    request: &TuneRequest,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<TuneResult> {
    let search = Search {
        base,
        evaluated: AtomicU64::new(0),
        progress,
    };
    let uniform = match request.space {
        SearchSpace::Fusion => request.compressors.first().copied(),
        SearchSpace::Compression | SearchSpace::All => None,
    };
    let mut choices: Vec<Choice> = vec![(Compressor::None, Memory::None)];
    if request.space != SearchSpace::Fusion {
        choices.extend(request.compressors.iter().copied());
    }

    // (1) Baselines.
    let baseline_plans = baselines(base, request, uniform)?;
    let names: Vec<String> = baseline_plans.iter().map(|p| p.strategy.clone()).collect();
    let scored = search.evaluate_all(baseline_plans)?;
    let baselines: Vec<Baseline> = names
        .into_iter()
        .zip(&scored)
        .map(|(strategy, (_, time))| Baseline {
            strategy,
            iteration_time: *time,
        })
        .collect();
    let mut best = fastest(scored).expect("there is always a baseline");

    // (2) Every group count, boundaries and compressors by the surrogate's DP.
    if request.space != SearchSpace::Compression {
        let dp_choices: Vec<Choice> = match uniform {
            Some(choice) => vec![choice],
            None => choices.clone(),
        };
        let costs = surrogate::Costs::new(base, &dp_choices)?;
        let candidates: Vec<Plan> = costs
            .best_per_group_count(dp_choices.len())
            .into_iter()
            .map(|groups| {
                let groups = groups
                    .into_iter()
                    .map(|(a, b, c)| ((a..=b).collect(), dp_choices[c]))
                    .collect();
                contiguous_plan(base, groups)
            })
            .collect();
        if let Some(found) = fastest(search.evaluate_all(candidates)?) {
            best = keep_faster(best, found);
        }
        // (3) Thresholds of the fusing strategies.
        for found in thresholds(&search, request, uniform)? {
            best = keep_faster(best, found);
        }
    }

    // (4) Local search from the best so far.
    let best = local::improve(&search, best, &choices, request.space)?;
    let lower_bound = lower_bound(base, &best.0)?;
    Ok(TuneResult {
        plan: best.0,
        iteration_time: best.1,
        lower_bound,
        plans_evaluated: search.evaluated.load(Ordering::Relaxed),
        baselines,
    })
}

fn keep_faster(best: (Plan, SimTime), other: (Plan, SimTime)) -> (Plan, SimTime) {
    if other.1 < best.1 {
        other
    } else {
        best
    }
}

/// The strategies a tuned plan is compared with (and starts from): the fusion strategies with
/// the uniform compressor, and the compressing systems when compressors are searched.
fn baselines(base: &Scenario, request: &TuneRequest, uniform: Option<Choice>) -> Result<Vec<Plan>> {
    let (compressor, memory) = uniform.unwrap_or((Compressor::None, Memory::None));
    let options = StrategyOptions {
        compressor,
        memory,
        ..request.options
    };
    let mut strategies = vec![
        "wfbp",
        "horovod",
        "ddp",
        "mgwfbp",
        "dear",
        "bytescheduler",
        "byteps",
    ];
    if base.cluster.nodes > 1 {
        strategies.push("ps");
    }
    let mut plans: Vec<Plan> = strategies
        .into_iter()
        .map(|s| s.parse::<Strategy>()?.plan(base, &options))
        .collect::<Result<_>>()?;
    // DeAR's all-gather cannot carry payloads that need gathering; skip it there.
    plans.retain(|plan| plan.validate("baseline", &base.model).is_ok());
    if request.space != SearchSpace::Fusion {
        if let Some(&(compressor, memory)) = request.compressors.first() {
            let options = StrategyOptions {
                compressor,
                memory,
                ..request.options
            };
            for s in ["mergecomp", "hipress:ring", "hipress:ps", "espresso"] {
                plans.push(s.parse::<Strategy>()?.plan(base, &options)?);
            }
        }
    }
    Ok(plans)
}

/// Plan-order plan of contiguous groups, each with its own compressor choice.
pub fn contiguous_plan(base: &Scenario, groups: Vec<(Vec<usize>, Choice)>) -> Plan {
    let groups = groups
        .into_iter()
        .enumerate()
        .map(|(i, (tensors, (compressor, memory)))| Group {
            tensors,
            compressor,
            memory,
            compress_on: CompressOn::Gpu,
            scheme: Scheme::Auto,
            partitions: 1,
            priority: i as i64,
        })
        .collect();
    Plan::new("tuned", &base.model, groups, plan_order(0.0))
}

/// Sets one strategy's fusion threshold in bytes.
type SetThreshold = fn(&mut StrategyOptions, u64);

/// Golden-section search, in log space between 1 MiB and 1 GiB, of each fusing strategy's
/// threshold (Horovod's fusion buffer, DDP's bucket cap, DeAR's threshold).
fn thresholds(
    search: &Search,
    request: &TuneRequest,
    uniform: Option<Choice>,
) -> Result<Vec<(Plan, SimTime)>> {
    const STEPS: usize = 12;
    let (compressor, memory) = uniform.unwrap_or((Compressor::None, Memory::None));
    let strategies: [(&str, SetThreshold); 3] = [
        ("horovod", |o, bytes| o.fusion_bytes = bytes),
        ("ddp", |o, bytes| o.bucket_bytes = bytes),
        ("dear", |o, bytes| o.bucket_bytes = bytes),
    ];
    let mut found = Vec::new();
    for (name, set) in strategies {
        let strategy: Strategy = name.parse()?;
        let plan_at = |log_bytes: f64| -> Result<Plan> {
            let mut options = StrategyOptions {
                compressor,
                memory,
                ..request.options
            };
            set(&mut options, log_bytes.exp2() as u64);
            let mut plan = strategy.plan(search.base, &options)?;
            plan.strategy = format!("{name} (threshold {:.1} MiB)", log_bytes.exp2() / 1048576.0);
            Ok(plan)
        };
        if plan_at(20.0)?
            .validate("threshold search", &search.base.model)
            .is_err()
        {
            continue;
        }
        let golden = (5f64.sqrt() - 1.0) / 2.0;
        let (mut lo, mut hi) = (20.0_f64, 30.0_f64);
        let mut best: Option<(Plan, SimTime)> = None;
        for _ in 0..STEPS {
            let left = hi - golden * (hi - lo);
            let right = lo + golden * (hi - lo);
            let scored = search.evaluate_all(vec![plan_at(left)?, plan_at(right)?])?;
            if scored[0].1 <= scored[1].1 {
                hi = right;
            } else {
                lo = left;
            }
            for candidate in scored {
                best = Some(match best {
                    Some(b) => keep_faster(b, candidate),
                    None => candidate,
                });
            }
        }
        found.extend(best);
    }
    Ok(found)
}
