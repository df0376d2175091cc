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

use crate::base::error::{Result, SimError};
use crate::base::time::SimTime;
use crate::compress::{Compressor, Memory};
use crate::plan::{CodecCalls, CompressOn, Group, Plan, Scheme};
use crate::predict::evaluate::Evaluator;
use crate::predict::scenario::Scenario;
use crate::schedule::Encoding;
use crate::strategy::{plan_order, Strategy, StrategyOptions};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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
    /// What the search may change.
    pub space: SearchSpace,
    /// Compressors a group may use besides none (with their memory); for `fusion` the first one,
    /// if any, is applied to every group.
    pub compressors: Vec<Choice>,
    /// Strategy options the baselines are planned with (the compressor aside).
    pub options: StrategyOptions,
    /// How every candidate's codecs run: one call per group, or one per tensor.
    pub codec_calls: CodecCalls,
}

/// A baseline strategy's time on the same scenario, or why it cannot run there.
#[derive(Clone, Debug, PartialEq)]
pub struct Baseline {
    /// The strategy's name (`horovod`, `ddp`, ...).
    pub strategy: String,
    /// Its predicted iteration time, or why it cannot run.
    pub iteration_time: std::result::Result<SimTime, String>,
}

/// The outcome of a search.
#[derive(Clone, Debug)]
pub struct TuneResult {
    /// The fastest plan found.
    pub plan: Plan,
    /// Predicted iteration time of `plan`.
    pub iteration_time: SimTime,
    /// A lower bound on the iteration time of `plan` (see [`lower_bound`]).
    pub lower_bound: SimTime,
    /// Candidate plans scored, baselines included.
    pub plans_evaluated: u64,
    /// Candidates that could not run (a compressor its scheme cannot carry, …): skipped.
    pub infeasible: u64,
    /// Why the first skipped candidate could not run.
    pub infeasible_example: Option<String>,
    /// Every baseline strategy's time on the scenario.
    pub baselines: Vec<Baseline>,
}

/// Shared state of a search: the scenario, the evaluation counters and the progress callback.
struct Search<'a> {
    base: &'a Scenario,
    evaluated: AtomicU64,
    infeasible: AtomicU64,
    first_infeasible: Mutex<Option<String>>,
    progress: &'a (dyn Fn(u64) + Sync),
}

impl<'a> Search<'a> {
    fn new(base: &'a Scenario, progress: &'a (dyn Fn(u64) + Sync)) -> Search<'a> {
        Search {
            base,
            evaluated: AtomicU64::new(0),
            infeasible: AtomicU64::new(0),
            first_infeasible: Mutex::new(None),
            progress,
        }
    }

    /// Scores plans on both cores, in input order; a plan that cannot run is skipped and
    /// counted, never fatal.
    fn evaluate_all(&self, plans: Vec<Plan>) -> Vec<(Plan, SimTime)> {
        plans
            .into_par_iter()
            // Few, large batches: each batch clones the scenario once for its evaluator.
            .with_min_len(32)
            .map_init(
                || Evaluator::new(self.base.clone()),
                |evaluator, plan| {
                    let time = evaluator.iteration_time(&plan);
                    let done = self.evaluated.fetch_add(1, Ordering::Relaxed) + 1;
                    (self.progress)(done);
                    match time {
                        Ok(time) => Some((plan, time)),
                        Err(err) => {
                            self.infeasible.fetch_add(1, Ordering::Relaxed);
                            let mut first = self.first_infeasible.lock().expect("a search lock");
                            first.get_or_insert_with(|| err.to_string());
                            None
                        }
                    }
                },
            )
            .flatten()
            .collect()
    }
}

/// The fastest of scored plans; ties go to the earliest, so searches are deterministic.
fn fastest(scored: Vec<(Plan, SimTime)>) -> Option<(Plan, SimTime)> {
    scored
        .into_iter()
        .reduce(|best, next| if next.1 < best.1 { next } else { best })
}

/// Searches for the fastest plan on `base`: baselines, a DP over contiguous groups,
/// fusion thresholds, then local search; `progress` gets the count of plans scored.
pub fn tune(
    base: &Scenario,
    request: &TuneRequest,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<TuneResult> {
    let search = Search::new(base, progress);
    let uniform = match request.space {
        SearchSpace::Fusion => request.compressors.first().copied(),
        SearchSpace::Compression | SearchSpace::All => None,
    };
    let encoding = Encoding {
        calls: request.codec_calls,
        ..Encoding::default()
    };
    let mut choices: Vec<Choice> = vec![(Compressor::None, Memory::None)];
    if request.space != SearchSpace::Fusion {
        choices.extend(request.compressors.iter().copied());
    }

    // (1) Baselines: each runs, or says why it cannot.
    let mut baselines = Vec::new();
    let mut scored = Vec::new();
    for (strategy, plan) in baselines_of(base, request, uniform)? {
        let time = plan.and_then(|plan| {
            let evaluator = Evaluator::new(base.clone());
            let time = evaluator.iteration_time(&plan)?;
            scored.push((plan, time));
            Ok(time)
        });
        (search.progress)(search.evaluated.fetch_add(1, Ordering::Relaxed) + 1);
        baselines.push(Baseline {
            strategy,
            iteration_time: time.map_err(|e| e.to_string()),
        });
    }
    let mut best = fastest(scored).ok_or_else(|| {
        let reasons: Vec<String> = baselines
            .iter()
            .map(|b| {
                format!(
                    "{}: {}",
                    b.strategy,
                    b.iteration_time.as_ref().err().map_or("", String::as_str)
                )
            })
            .collect();
        SimError::bad_value(
            "--compressor",
            "(every baseline)",
            format!(
                "no baseline strategy can run this scenario: {}",
                reasons.join("; ")
            ),
        )
    })?;

    // (2) Every group count, boundaries and compressors by the surrogate's DP.
    if request.space != SearchSpace::Compression {
        let dp_choices: Vec<Choice> = match uniform {
            Some(choice) => vec![choice],
            None => choices.clone(),
        };
        let costs = surrogate::Costs::new(base, &dp_choices, encoding)?;
        let candidates: Vec<Plan> = costs
            .best_per_group_count(dp_choices.len())
            .into_iter()
            .map(|groups| {
                let groups = groups
                    .into_iter()
                    .map(|(a, b, c)| ((a..=b).collect(), dp_choices[c]))
                    .collect();
                contiguous_plan(base, groups, request.codec_calls)
            })
            .collect();
        if let Some(found) = fastest(search.evaluate_all(candidates)) {
            best = keep_faster(best, found);
        }
        // (3) Thresholds of the fusing strategies.
        for found in thresholds(&search, request, uniform)? {
            best = keep_faster(best, found);
        }
    }

    // (4) Local search from the best so far.
    let budget = local::budget(base.model.num_tensors());
    let best = local::improve(&search, best, &choices, request.space, budget);
    let lower_bound = lower_bound(base, &best.0)?;
    Ok(TuneResult {
        plan: best.0,
        iteration_time: best.1,
        lower_bound,
        plans_evaluated: search.evaluated.load(Ordering::Relaxed),
        infeasible: search.infeasible.load(Ordering::Relaxed),
        infeasible_example: search.first_infeasible.into_inner().expect("a search lock"),
        baselines,
    })
}

/// Steepest descent over the groups of `start` on `base` (move a boundary, merge, split; every
/// group keeps its compressor), within `budget` plans: the best found, and the plans scored.
/// A contiguous plan stays contiguous, so a framework that closes buckets at per-bucket caps
/// (DDP) or takes explicit groups (Horovod) can run the result.
pub fn refine_groups(
    base: &Scenario,
    start: (Plan, SimTime),
    budget: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> ((Plan, SimTime), u64) {
    let search = Search::new(base, progress);
    let best = local::improve(&search, start, &[], SearchSpace::Fusion, budget);
    (best, search.evaluated.load(Ordering::Relaxed))
}

fn keep_faster(best: (Plan, SimTime), other: (Plan, SimTime)) -> (Plan, SimTime) {
    if other.1 < best.1 {
        other
    } else {
        best
    }
}

/// The strategies a tuned plan is compared with (and starts from): the fusion strategies with
/// the uniform compressor, and the compressing systems when compressors are searched. Each
/// comes with its plan, or with why it cannot make one for this compressor.
fn baselines_of(
    base: &Scenario,
    request: &TuneRequest,
    uniform: Option<Choice>,
) -> Result<Vec<(String, Result<Plan>)>> {
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
    let plan = |name: &str, options: &StrategyOptions| -> Result<(String, Result<Plan>)> {
        let strategy: Strategy = name.parse()?;
        // A plan the strategy makes but the compressor cannot run (DeAR's all-gather with a
        // gathered payload) is as unusable as one it cannot make.
        let plan = strategy
            .check_codec_calls(request.codec_calls, "--codec-calls")
            .and_then(|()| strategy.plan(base, options))
            .and_then(|mut plan| {
                plan.codec_calls = request.codec_calls;
                plan.validate(&format!("strategy {name}"), &base.model)?;
                Ok(plan)
            });
        Ok((name.to_string(), plan))
    };
    let mut plans = strategies
        .into_iter()
        .map(|s| plan(s, &options))
        .collect::<Result<Vec<_>>>()?;
    if request.space != SearchSpace::Fusion {
        if let Some(&(compressor, memory)) = request.compressors.first() {
            let options = StrategyOptions {
                compressor,
                memory,
                ..request.options
            };
            for s in ["mergecomp", "hipress:ring", "hipress:ps", "espresso"] {
                plans.push(plan(s, &options)?);
            }
        }
    }
    Ok(plans)
}

/// Plan-order plan of contiguous groups, each with its own compressor choice, its codecs run
/// as `codec_calls` says.
pub fn contiguous_plan(
    base: &Scenario,
    groups: Vec<(Vec<usize>, Choice)>,
    codec_calls: CodecCalls,
) -> Plan {
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
    let mut plan = base.plan("tuned", groups, plan_order(0.0));
    plan.codec_calls = codec_calls;
    plan
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
            plan.codec_calls = request.codec_calls;
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
            let scored = search.evaluate_all(vec![plan_at(left)?, plan_at(right)?]);
            let [a, b] = scored.as_slice() else {
                // A threshold whose plan cannot run (counted as infeasible): stop this search.
                break;
            };
            if a.1 <= b.1 {
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
