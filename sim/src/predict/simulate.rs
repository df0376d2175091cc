//! Runs a scenario: picks the symmetric or explicit path, draws noise, runs the engine over
//! warm-up and measured iterations, and summarizes the steady state.

use crate::base::error::{Result, SimError};
use crate::base::limits;
use crate::base::stats::percentile;
use crate::base::stats::round6;
use crate::base::time::SimTime;
use crate::codec::CodecCurves;
use crate::collective::Naming;
use crate::compress::{Compressor, Memory};
use crate::inputs::device::DeviceKind;
use crate::inputs::topology::Cluster;
use crate::plan::{CompressOn, Plan};
use crate::predict::blocking;
use crate::predict::cost::step_costs;
use crate::predict::engine::{self, CoreShare, EngineConfig, EngineResult};
use crate::predict::graph::TaskGraph;
use crate::predict::memory::memory_use;
use crate::predict::noise::NoiseSpec;
use crate::predict::scenario::Scenario;
use crate::predict::summary::{CostFallback, Statistics, Summary};
use crate::predict::trace::Trace;
use crate::schedule::{lower, LaunchPolicy, Piece, Schedule, Stream};
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::collections::BTreeSet;

/// How to run a simulation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimOptions {
    /// Iterations run before measuring (at least 1: the first iteration has no overlap with a
    /// previous one, so it is not steady state).
    pub warmup: u32,
    /// Measured iterations; `Some` adds Monte Carlo statistics to the summary.
    pub iterations: Option<u32>,
    /// Randomness to add; its rank skew is always taken from the model profile.
    pub noise: NoiseSpec,
    /// Simulate every rank even without noise (the symmetric path gives the same answer).
    pub force_explicit: bool,
    /// Keep a timeline of this many ranks (0: no trace).
    pub trace_ranks: u32,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            warmup: 1,
            iterations: None,
            noise: NoiseSpec::default(),
            force_explicit: false,
            trace_ranks: 0,
        }
    }
}

/// A finished simulation.
pub struct Outcome {
    /// The steady state, summarized.
    pub summary: Summary,
    /// Per measured iteration, its duration.
    pub iteration_times: Vec<SimTime>,
    /// The timeline of the recorded ranks, when `trace_ranks` asked for one.
    pub trace: Option<Trace>,
}

/// The plan lowered for the scenario's world (errors name it by its strategy), with the
/// framework's waits for its blocking calls where the ranks are CPUs (`blocking`).
pub fn schedule(scenario: &Scenario, plan: &Plan) -> Result<Schedule> {
    // The codec set prices its ops where they run: a plan on another stream means something
    // else. (Its compressors are checked where a plan meets the set, once, not per candidate.)
    if let Some(set) = &scenario.codecs {
        set.check_stream(plan)?;
    }
    check_float8_device(scenario, plan)?;
    let mut schedule = lower(
        &scenario.model,
        scenario.world(),
        scenario.cpu_ranks(),
        plan,
        &format!("strategy {}", plan.strategy),
    )?;
    if scenario.calls_hold_compute() {
        blocking::hold_compute(&mut schedule);
    }
    Ok(schedule)
}

/// torchao's float8 linears need float8 matrix products: a GPU whose profile states its float8
/// peak (compute capability 8.9 or later), or a CPU, where PyTorch emulates them.
pub fn check_float8_device(scenario: &Scenario, plan: &Plan) -> Result<()> {
    let float8 = plan.sharding.as_ref().is_some_and(|s| s.float8_all_gather);
    let device = &scenario.device;
    if !float8 || device.kind == DeviceKind::Cpu || device.peak_fp8_tflops.is_some() {
        return Ok(());
    }
    Err(SimError::invalid(
        &format!("strategy {}", plan.strategy),
        "sharding.float8_all_gather",
        format!(
            "device {} has no float8 matrix products (its profile states no peak_fp8_tflops), which torchao's float8 linears need: compute capability 8.9 or later",
            device.name
        ),
    ))
}

/// `iterations` iterations of the schedule, every task priced by the cost pass.
/// `naming` says whether the estimates carry NCCL's tuner's algorithm and protocol, which only a
/// trace shows (the times are the same either way).
pub fn task_graph(
    scenario: &Scenario,
    schedule: &Schedule,
    iterations: u32,
    naming: Naming,
) -> Result<TaskGraph> {
    let costs = step_costs(scenario, schedule, naming)?;
    TaskGraph::new(schedule, &costs, iterations)
}

/// Measured iterations when the model's ranks differ and no count is asked for: the mean over
/// random iterations needs many (64 keep its standard error near 1 % at the skews measured on
/// this project's 2-core lab).
const SKEWED_ITERATIONS: u32 = 64;

/// The model profile's measured skew between ranks, when the world has ranks to differ.
pub fn rank_skew_cv(scenario: &Scenario) -> Option<f64> {
    let skew = scenario.model.rank_skew.as_ref()?;
    (scenario.cluster.world_size() > 1 && skew.cv > 0.0).then_some(skew.cv)
}

/// Simulates `plan` on `scenario`: warm-up then measured iterations, with noise and the
/// model's rank skew, summarized.
pub fn simulate(scenario: &Scenario, plan: &Plan, options: &SimOptions) -> Result<Outcome> {
    let skew = rank_skew_cv(scenario);
    let noise = NoiseSpec {
        rank_skew_cv: skew.unwrap_or(0.0),
        ..options.noise
    };
    let options = &SimOptions { noise, ..*options };
    options.noise.validate()?;
    if options.warmup == 0 {
        return Err(SimError::bad_value(
            "--warmup",
            0,
            "at least one warm-up iteration is needed",
        ));
    }
    let measured = options
        .iterations
        .unwrap_or(if skew.is_some() { SKEWED_ITERATIONS } else { 1 });
    if measured == 0 {
        return Err(SimError::bad_value(
            "--iterations",
            0,
            "at least one measured iteration is needed",
        ));
    }
    let world = scenario.cluster.world_size();
    let explicit = options.force_explicit || !options.noise.is_quiet();
    let ranks = if explicit { world } else { 1 };
    let total = options.warmup.checked_add(measured).ok_or_else(|| {
        SimError::bad_value(
            "--warmup/--iterations",
            format!("{}/{measured}", options.warmup),
            "their sum exceeds 2^32",
        )
    })?;
    let schedule = schedule(scenario, plan)?;
    let record_ranks = options.trace_ranks.min(ranks);
    let naming = match record_ranks > 0 {
        true => Naming::Library,
        false => Naming::Priced,
    };
    // The engine holds the (task, rank) pairs of the iterations in flight, a few at a time.
    let steps = schedule.steps.len();
    if u64::from(ranks) * steps as u64 > limits::MAX_RANK_TASKS {
        return Err(SimError::bad_value(
            "--explicit/--jitter/--straggler/the model's rank_skew",
            format!("{ranks} ranks × {steps} steps per iteration"),
            format!(
                "simulating every rank tracks more than {} (rank, task) pairs per iteration: use fewer ranks or tensors, or the symmetric path (no noise)",
                limits::MAX_RANK_TASKS
            ),
        ));
    }
    let graph = task_graph(scenario, &schedule, total, naming)?;
    let noise = options.noise.draw(&graph, ranks)?;
    let config = engine_config(scenario, &schedule, ranks, record_ranks);
    let result = engine::run(&graph, &config, &noise)?;
    let iteration_times = steady_iterations(&result, options.warmup);
    let single = single_gpu_time(scenario, plan, options.warmup)?;
    let summary = summarize(
        scenario,
        plan,
        options,
        &schedule,
        &result,
        &iteration_times,
        single,
        explicit,
    );
    let trace = (config.record_ranks > 0)
        .then(|| Trace::from_run(&scenario.model, &schedule, &graph, &result, &summary));
    Ok(Outcome {
        summary,
        iteration_times,
        trace,
    })
}

/// The cluster's compute slowdown with every rank computing at once, unless the model profile
/// was recorded with as many ranks computing at once (its `rank_skew`): its times then hold
/// that pace already, and its skew draws each rank's, the slowest setting the collectives'.
fn ranks_pace(scenario: &Scenario, with_ranks: f64) -> f64 {
    match &scenario.model.rank_skew {
        Some(skew) if skew.ranks == scenario.cluster.world_size() => 1.0,
        _ => with_ranks,
    }
}

/// How long a rank's connections take to drain `TcpParams::queue_behind_bytes` at the goodput
/// its collectives get, in ns; 0 without a queue.
fn queue_behind_ns(cluster: &Cluster) -> f64 {
    let Some(bytes) = cluster.library.tcp().and_then(|p| p.queue_behind_bytes) else {
        return 0.0;
    };
    bytes as f64 / crate::collective::rank_goodput_bytes_per_us(cluster) * 1e3
}

/// The engine settings a schedule and the scenario's device imply.
pub fn engine_config(
    scenario: &Scenario,
    schedule: &Schedule,
    ranks: u32,
    record_ranks: u32,
) -> EngineConfig {
    // The cluster's measured contention (CPU ranks sharing cores) overrides the device's.
    let device = &scenario.device.contention;
    // A CPU rank's compression and compute share cores: each slows the other alike.
    let (alone, collective, codec, comm, codec_beside_compute) = match &scenario.cluster.contention
    {
        Some(c) => (
            ranks_pace(scenario, c.compute_slowdown_with_ranks),
            c.compute_slowdown_with_collective,
            c.compute_slowdown_with_compression,
            c.collective_slowdown_with_compute,
            c.compute_slowdown_with_compression,
        ),
        None => (
            1.0,
            scenario.collective_slowdown,
            device.compute_slowdown_with_compression,
            1.0,
            1.0,
        ),
    };
    EngineConfig {
        ranks,
        policy: schedule.policy,
        compute_slowdown: alone,
        slowdown_with_collective: collective,
        slowdown_with_codec: codec,
        comm_slowdown_with_compute: comm,
        codec_slowdown_with_compute: codec_beside_compute,
        shared_cores: scenario
            .cluster
            .contention
            .as_ref()
            .and_then(|c| c.shared_cores)
            .map(|shared| CoreShare {
                ranks: shared.ranks(&scenario.cluster),
                cores: shared.cores_per_host,
            }),
        push_pulls_at_once: scenario
            .cluster
            .library
            .tcp()
            .and_then(|p| p.p2p_rounds_at_once),
        queue_behind_ns: queue_behind_ns(&scenario.cluster),
        record_ranks,
    }
}

/// Durations of the iterations after warm-up: from one iteration's closing step (its last
/// backward step) to the next. The simulator has no first-time costs, so unlike a real run
/// (`crate::inputs::real_run`) its first iteration after warm-up is already steady.
fn steady_iterations(result: &EngineResult, warmup: u32) -> Vec<SimTime> {
    let ends = &result.iteration_end;
    (warmup as usize..ends.len())
        .map(|k| ends[k] - ends[k - 1])
        .collect()
}

fn single_gpu_time(scenario: &Scenario, plan: &Plan, warmup: u32) -> Result<SimTime> {
    let single = scenario.single_gpu();
    let schedule = schedule(&single, plan)?;
    let graph = task_graph(&single, &schedule, warmup + 1, Naming::Priced)?;
    let config = EngineConfig::uncontended(
        1,
        LaunchPolicy {
            launch: plan.policy.launch,
            comm_streams: 1,
            cycle_ns: 0,
        },
    );
    let result = engine::run(&graph, &config, &Default::default())?;
    Ok(*steady_iterations(&result, warmup)
        .last()
        .expect("one measured iteration"))
}

/// The mean of iteration durations, in ns.
pub fn mean_ns(times: &[SimTime]) -> f64 {
    times.iter().map(|t| t.as_ns() as f64).sum::<f64>() / times.len() as f64
}

fn ms(time: SimTime) -> f64 {
    round6(time.as_ms())
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    scenario: &Scenario,
    plan: &Plan,
    options: &SimOptions,
    schedule: &Schedule,
    result: &EngineResult,
    times: &[SimTime],
    single: SimTime,
    explicit: bool,
) -> Summary {
    let world = scenario.cluster.world_size();
    let ranks = if explicit { world } else { 1 } as f64;
    let measured = options.warmup as usize..result.iteration_end.len();
    let per_iteration = |busy: &[SimTime]| {
        let total: f64 = measured.clone().map(|k| busy[k].as_ns() as f64).sum();
        total / times.len() as f64
    };
    let mean_ns = mean_ns(times);
    let compute_ns = per_iteration(&result.compute_busy) / ranks;
    let batch = f64::from(scenario.model.batch_size_per_gpu);
    let collectives = schedule
        .steps
        .iter()
        .filter(|s| s.stream == Stream::Comm)
        .count();
    Summary {
        model: scenario.model.name.clone(),
        cluster: scenario.cluster.name.clone(),
        strategy: plan.strategy.clone(),
        framework: scenario.framework.as_ref().map(|f| f.name.clone()),
        codecs: scenario.codecs.as_ref().map(|c| c.name.clone()),
        world_size: world,
        path: if explicit { "explicit" } else { "symmetric" },
        rank_skew_cv: rank_skew_cv(scenario),
        iteration_time_ms: round6(mean_ns / 1e6),
        throughput_samples_per_s: round6(f64::from(world) * batch / (mean_ns / 1e9)),
        scaling_efficiency: round6(single.as_ns() as f64 / mean_ns),
        single_gpu_iteration_time_ms: ms(single),
        compute_ms: round6(compute_ns / 1e6),
        exposed_comm_ms: round6(per_iteration(&result.comm_exposed) / ranks / 1e6),
        compression_ms: round6(per_iteration(&result.codec_busy) / ranks / 1e6),
        comm_ms: round6(per_iteration(&result.comm_busy) / 1e6),
        // What the lowered pieces move (one rank has none): each piece encoded on its own, and
        // each codec call when the plan compresses tensor by tensor.
        wire_bytes_per_rank: schedule
            .pieces
            .iter()
            .map(Piece::payload_bytes)
            .sum::<u64>()
            + schedule.gather_bytes(),
        groups: plan.groups.len(),
        collectives_per_iteration: collectives,
        memory_per_rank: memory_use(&scenario.model, plan, schedule, &scenario.device),
        compute_scale: round6(scenario.compute_ratio),
        collective_slowdown: round6(scenario.collective_slowdown),
        seed: options.noise.seed,
        warmup_iterations: options.warmup,
        measured_iterations: times.len() as u32,
        events: result.events,
        statistics: options.iterations.map(|_| statistics(times)),
        codec_cost_fallback: cost_fallbacks(scenario, plan),
    }
}

/// The plan's compressors that the cost pass priced by the fallback: those of groups that run a
/// codec (a compressor, or an error-feedback memory) on a device without their cost curves.
fn cost_fallbacks(scenario: &Scenario, plan: &Plan) -> Vec<CostFallback> {
    let mut found = BTreeSet::new();
    for group in &plan.groups {
        if group.compressor == Compressor::None && group.memory == Memory::None {
            continue;
        }
        let device = match group.compress_on {
            CompressOn::Gpu => Some(&scenario.device),
            CompressOn::Cpu => scenario.host_codec.as_ref(),
        };
        if let Some(device) = device {
            if CodecCurves::on(&group.compressor, device).fallback {
                found.insert(CostFallback {
                    compressor: group.compressor.key(),
                    device: device.name.clone(),
                });
            }
        }
    }
    found.into_iter().collect()
}

fn statistics(times: &[SimTime]) -> Statistics {
    let mut sorted: Vec<f64> = times.iter().map(|t| t.as_ms()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    let mean = sorted.iter().sum::<f64>() / n;
    let variance = if sorted.len() > 1 {
        sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    let std_dev = variance.sqrt();
    let half_width = if sorted.len() > 1 {
        let t = StudentsT::new(0.0, 1.0, n - 1.0).map_or(1.96, |d| d.inverse_cdf(0.975));
        t * std_dev / n.sqrt()
    } else {
        0.0
    };
    Statistics {
        mean_ms: round6(mean),
        std_dev_ms: round6(std_dev),
        p50_ms: round6(percentile(&sorted, 0.50)),
        p99_ms: round6(percentile(&sorted, 0.99)),
        ci95_low_ms: round6(mean - half_width),
        ci95_high_ms: round6(mean + half_width),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::model::ModelProfile;
    use crate::inputs::topology::{Cluster, ClusterOverrides};
    use crate::strategy::{Strategy, StrategyOptions};

    fn summary(scenario: &Scenario) -> Summary {
        let options = StrategyOptions {
            compressor: "topk:0.01".parse().unwrap(),
            ..StrategyOptions::default()
        };
        let plan = "horovod"
            .parse::<Strategy>()
            .unwrap()
            .plan(scenario, &options)
            .unwrap();
        simulate(scenario, &plan, &SimOptions::default())
            .unwrap()
            .summary
    }

    #[test]
    fn the_summary_names_compressors_priced_by_the_fallback() {
        let overrides = ClusterOverrides {
            nodes: Some(2),
            ..ClusterOverrides::default()
        };
        let mut scenario = Scenario::new(
            ModelProfile::load("resnet50").unwrap(),
            Cluster::load("v100-10gbe", overrides).unwrap(),
        )
        .unwrap();
        let profiled = summary(&scenario);
        assert!(profiled.codec_cost_fallback.is_empty());
        let json = serde_json::to_value(&profiled).unwrap();
        assert!(json.get("codec_cost_fallback").is_none());

        scenario.device.compression.remove("topk");
        let estimated = summary(&scenario);
        let expected = [CostFallback {
            compressor: "topk",
            device: scenario.device.name.clone(),
        }];
        assert_eq!(estimated.codec_cost_fallback, expected);
        let json = serde_json::to_value(&estimated).unwrap();
        assert_eq!(json["codec_cost_fallback"][0]["compressor"], "topk");
        // The V100's calibrated top-k costs 16× the bandwidth bound the fallback charges.
        assert!(estimated.compression_ms < profiled.compression_ms);
    }

    /// ResNet-50 on 2 nodes of `cluster` under Horovod's plan.
    fn horovod_on(cluster: &str) -> (Scenario, Plan) {
        let overrides = ClusterOverrides {
            nodes: Some(2),
            ..ClusterOverrides::default()
        };
        let scenario = Scenario::new(
            ModelProfile::load("resnet50").unwrap(),
            Cluster::load(cluster, overrides).unwrap(),
        )
        .unwrap();
        let plan = "horovod"
            .parse::<Strategy>()
            .unwrap()
            .plan(&scenario, &StrategyOptions::default())
            .unwrap();
        (scenario, plan)
    }

    #[test]
    fn only_a_trace_asks_nccls_tuner_for_names_and_the_times_agree() {
        let (scenario, plan) = horovod_on("v100-10gbe");
        let run = |trace_ranks| {
            let options = SimOptions {
                trace_ranks,
                ..SimOptions::default()
            };
            simulate(&scenario, &plan, &options).unwrap()
        };
        let (plain, traced) = (run(0), run(1));
        assert_eq!(plain.iteration_times, traced.iteration_times);
        assert!(plain.trace.is_none());
        let trace = traced.trace.unwrap();
        let named = trace
            .trace_events
            .iter()
            .filter(|e| e.args.get("algorithm").is_some())
            .count();
        assert!(named > 0, "no collective of the trace is named");
    }

    #[test]
    fn only_a_collective_on_the_device_slows_its_compute() {
        let slowdown = |cluster: &str| {
            let (scenario, plan) = horovod_on(cluster);
            let schedule = schedule(&scenario, &plan).unwrap();
            engine_config(&scenario, &schedule, 2, 0).slowdown_with_collective
        };
        // The same V100: NCCL's kernels share it, MPI over TCP runs on the host.
        let nccl = slowdown("v100-10gbe");
        assert!(nccl > 1.0, "{nccl}");
        assert_eq!(slowdown("v100-tcp"), 1.0);
    }

    #[test]
    fn a_profile_recorded_with_every_rank_computing_is_not_slowed_by_the_ranks_again() {
        let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let lab = |nodes| {
            let overrides = ClusterOverrides {
                nodes: Some(nodes),
                ..ClusterOverrides::default()
            };
            let path = format!("{repo}/experiments/lab-validation/clusters/lab-4n-1g.json");
            Cluster::load(&path, overrides).unwrap()
        };
        let with_ranks = lab(4)
            .contention
            .as_ref()
            .unwrap()
            .compute_slowdown_with_ranks;
        assert!(with_ranks > 1.0, "{with_ranks}");
        // digits-w4.json was recorded with 4 ranks computing at once.
        let mut model = ModelProfile::load(&format!(
            "{repo}/experiments/lab4-real/profiles/digits-w4.json"
        ))
        .unwrap();
        // Named relative to the experiment's directory, where simulate runs.
        model.device = format!("{repo}/experiments/lab-validation/device.json");
        assert_eq!(model.rank_skew.as_ref().unwrap().ranks, 4);
        let pace = |nodes| {
            let scenario = Scenario::new(model.clone(), lab(nodes)).unwrap();
            let plan = "horovod"
                .parse::<Strategy>()
                .unwrap()
                .plan(&scenario, &StrategyOptions::default())
                .unwrap();
            let schedule = schedule(&scenario, &plan).unwrap();
            engine_config(&scenario, &schedule, 1, 0).compute_slowdown
        };
        assert_eq!(pace(4), 1.0);
        // On 8 ranks the profile's pace is not the cluster's.
        assert_eq!(pace(8), with_ranks);
    }
}
