//! The simulator: closed-form cases by hand, engine invariants, the symmetric fast path, noise.

use std::collections::HashMap;
use syncopate_sim::base::time::SimTime;
use syncopate_sim::collective::{Links, Naming, ServerLink};
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::plan::{Launch, Plan};
use syncopate_sim::predict::engine::{self, CoreShare, EngineConfig};
use syncopate_sim::predict::graph::TaskGraph;
use syncopate_sim::predict::noise::{Noise, NoiseSpec};
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::predict::simulate::{schedule, simulate, task_graph, SimOptions};
use syncopate_sim::schedule::{LaunchPolicy, Stream};
use syncopate_sim::strategy::{Strategy, StrategyOptions};

/// A device without contention (measured: none), so that closed forms hold exactly.
fn quiet_device(dir: &std::path::Path) -> String {
    let mut device = serde_json::to_value(DeviceProfile::load("v100-sxm2-32gb").unwrap()).unwrap();
    device["name"] = "quiet".into();
    device["contention"]["compute_slowdown_with_collective"] = 1.0.into();
    device["contention"]["compute_slowdown_with_compression"] = 1.0.into();
    let path = dir.join("quiet-device.json");
    std::fs::write(&path, device.to_string()).unwrap();
    path.to_string_lossy().into_owned()
}

/// Two tensors of `numel` elements whose gradients become ready 10 ms apart; no forward and no
/// optimizer time, so an iteration is backward plus exposed communication.
fn two_tensor_model(device: &str, numel: u64) -> ModelProfile {
    let mut model = ModelProfile::load("alexnet").unwrap();
    model.name = "two-tensors".into();
    model.device = device.to_string();
    model.optimizer_us = 0.0;
    model.tensors.truncate(2);
    for (i, tensor) in model.tensors.iter_mut().enumerate() {
        tensor.name = format!("t{i}");
        tensor.shape = vec![numel];
        tensor.numel = numel;
        tensor.registration_index = 1 - i;
        tensor.backward_us = 10_000.0;
        tensor.forward_us = 0.0;
    }
    model
}

/// Two nodes of one GPU on MPI over 10 Gb/s TCP: for two ranks recursive doubling is one
/// exchange, α + S·β (with the CPU reduction made negligibly fast).
fn one_link_cluster(device: &str) -> Cluster {
    let mut cluster = Cluster::load("v100-tcp", ClusterOverrides::default()).unwrap();
    cluster.device = device.to_string();
    cluster.nodes = 2;
    if let syncopate_sim::inputs::topology::Library::Mpi(p) = &mut cluster.library {
        p.reduce_gbytes_per_s = 1e12;
    }
    cluster
}

fn run(
    model: &ModelProfile,
    cluster: &Cluster,
    strategy: &str,
) -> syncopate_sim::predict::summary::Summary {
    let strategy: Strategy = strategy.parse().unwrap();
    let scenario = Scenario::new(model.clone(), cluster.clone()).unwrap();
    let plan = strategy
        .plan(&scenario, &StrategyOptions::default())
        .unwrap();
    simulate(&scenario, &plan, &SimOptions::default())
        .unwrap()
        .summary
}

/// `iterations` iterations of the plan on the scenario, priced.
fn graph(scenario: &Scenario, plan: &Plan, iterations: u32) -> TaskGraph {
    let schedule = schedule(scenario, plan).unwrap();
    task_graph(scenario, &schedule, iterations, Naming::Library).unwrap()
}

#[test]
fn two_tensors_on_one_link_fused_versus_unfused_by_hand() {
    let dir = crate::common::scratch("closed-form");
    let device = quiet_device(&dir);
    let cluster = one_link_cluster(&device);
    // α = 30 µs MPI overhead + 25 µs hop; β = 1 / (10 Gb/s · 0.8) = 1 ns per byte.
    let alpha_ms = 0.055;
    // An uncompressed collective also copies its gradient into the buffer it sends (8 B per
    // element) and zeroes its result (4 B), at the V100's 900 GB/s; its cast costs nothing.
    let passes_ms = |bytes: f64| 12.0 * bytes / 4.0 / 900e9 * 1e3;
    let transfer_ms = |bytes: f64| bytes / 1e6 + passes_ms(bytes);

    // Large tensors (4 MB each): sending the first while the second is computed wins.
    let model = two_tensor_model(&device, 1_000_000);
    let t = alpha_ms + transfer_ms(4e6);
    let unfused = run(&model, &cluster, "wfbp");
    let fused = run(&model, &cluster, "fixed-groups:1");
    assert!(
        (unfused.iteration_time_ms - (f64::max(20.0, 10.0 + t) + t)).abs() < 1e-5,
        "{unfused:?}"
    );
    assert!(
        (fused.iteration_time_ms - (20.0 + alpha_ms + transfer_ms(8e6))).abs() < 1e-5,
        "{fused:?}"
    );
    assert!(unfused.iteration_time_ms < fused.iteration_time_ms);

    // Tiny tensors (4 bytes each): latency dominates and one fused message wins.
    let model = two_tensor_model(&device, 1);
    let unfused = run(&model, &cluster, "wfbp");
    let fused = run(&model, &cluster, "fixed-groups:1");
    // The first message hides under the second tensor's backward; only the last is exposed.
    assert!((unfused.iteration_time_ms - (20.0 + alpha_ms + transfer_ms(4.0))).abs() < 1e-5);
    assert!((fused.iteration_time_ms - (20.0 + alpha_ms + transfer_ms(8.0))).abs() < 1e-5);
    assert_eq!(fused.single_gpu_iteration_time_ms, 20.0);
    assert_eq!(fused.wire_bytes_per_rank, 8);
}

fn scenario(
    model: &str,
    cluster: &str,
    nodes: u32,
    strategy: &str,
    compressor: &str,
) -> (Scenario, Plan) {
    let model = ModelProfile::load(model).unwrap();
    let cluster = Cluster::load(
        cluster,
        ClusterOverrides {
            nodes: Some(nodes),
            ..Default::default()
        },
    )
    .unwrap();
    let options = StrategyOptions {
        compressor: compressor.parse().unwrap(),
        ..StrategyOptions::default()
    };
    let scenario = Scenario::new(model, cluster).unwrap();
    let plan = strategy
        .parse::<Strategy>()
        .unwrap()
        .plan(&scenario, &options)
        .unwrap();
    (scenario, plan)
}

const CASES: [(&str, &str, u32, &str, &str); 10] = [
    ("resnet50", "v100-10gbe", 2, "wfbp", "none"),
    ("resnet50", "v100-100gib", 2, "horovod", "none"),
    ("bert-base", "dgx1-v100", 1, "ddp", "fp16"),
    ("vgg16", "v100-pcie-25gbe", 2, "fixed-groups:3", "dgc:0.01"),
    ("resnet50", "v100-10gbe", 2, "dear", "none"),
    ("bert-base", "v100-100gib", 2, "bytescheduler", "fp16"),
    ("vgg16", "v100-10gbe", 2, "byteps", "none"),
    (
        "resnet50",
        "v100-nvlink-100gbe",
        2,
        "hipress:ring",
        "onebit",
    ),
    (
        "gpt2",
        "a100-ib200",
        2,
        "fixed-groups:8:count",
        "powersgd:4",
    ),
    ("lstm", "v100-tcp", 4, "wfbp", "efsignsgd"),
];

#[test]
fn precedence_holds_and_no_resource_runs_two_tasks_at_once() {
    for (model, cluster, nodes, strategy, compressor) in CASES {
        let (scenario, plan) = scenario(model, cluster, nodes, strategy, compressor);
        let graph = graph(&scenario, &plan, 3);
        let ranks = 3.min(scenario.cluster.world_size());
        let config = EngineConfig {
            ranks,
            policy: LaunchPolicy {
                launch: Launch::PlanOrder,
                comm_streams: 1,
                cycle_ns: SimTime::from_us(plan.policy.cycle_time_us).as_ns(),
            },
            compute_slowdown: 1.15,
            slowdown_with_collective: 1.2,
            slowdown_with_codec: 1.1,
            comm_slowdown_with_compute: 1.3,
            codec_slowdown_with_compute: 1.2,
            shared_cores: Some(CoreShare { ranks: 4, cores: 2 }),
            push_pulls_at_once: Some(1.5),
            queue_behind_ns: 5000.0,
            record_ranks: ranks,
        };
        let noise = NoiseSpec {
            jitter_cv: 0.2,
            seed: 7,
            ..Default::default()
        }
        .draw(&graph, ranks)
        .unwrap();
        let result = engine::run(&graph, &config, &noise).unwrap();
        // (rank, task) -> (start, end); collectives are recorded once for all ranks.
        let mut spans = std::collections::HashMap::new();
        for r in &result.records {
            let global = graph.task(r.task).stream == Stream::Comm;
            for rank in if global { 0..ranks } else { r.rank..r.rank + 1 } {
                assert!(spans.insert((rank, r.task), (r.start, r.end)).is_none());
            }
        }
        assert_eq!(
            spans.len(),
            graph.len() * ranks as usize,
            "{model}: every task ran on every rank"
        );
        for u in 0..graph.len() as u32 {
            for &v in graph.successors(u) {
                for rank in 0..ranks {
                    assert!(
                        spans[&(rank, v)].0 >= spans[&(rank, u)].1,
                        "{model}: edge {u}->{v} on rank {rank}"
                    );
                }
            }
        }
        for resource in [Stream::Compute, Stream::Codec, Stream::Comm] {
            for rank in 0..ranks {
                let mut busy: Vec<(SimTime, SimTime)> = spans
                    .iter()
                    .filter(|((r, t), _)| *r == rank && graph.task(*t).stream == resource)
                    .map(|(_, &s)| s)
                    .collect();
                busy.sort();
                for pair in busy.windows(2) {
                    assert!(
                        pair[1].0 >= pair[0].1,
                        "{model}: overlap on {resource:?} of rank {rank}"
                    );
                }
            }
        }
    }
}

#[test]
fn iteration_time_is_at_least_the_lower_bound() {
    for (model, cluster, nodes, strategy, compressor) in CASES {
        let (scenario, plan) = scenario(model, cluster, nodes, strategy, compressor);
        let summary = simulate(&scenario, &plan, &SimOptions::default())
            .unwrap()
            .summary;
        let graph = graph(&scenario, &plan, 1);
        // Collectives on every link run one at a time; a push-pull holds each direction of its
        // server's link for half of its time (more of it when the engine slows it).
        let (mut compute, mut everywhere) = (0u64, 0u64);
        let mut on_server: HashMap<ServerLink, u64> = HashMap::new();
        for task in graph.tasks() {
            let ns = task.duration.as_ns();
            match (task.stream, task.links) {
                (Stream::Compute, _) => compute += ns,
                (Stream::Comm, Links::Every) => everywhere += ns,
                (Stream::Comm, Links::Server { server, .. }) => {
                    *on_server.entry(server).or_default() += ns / 2
                }
                _ => {}
            }
        }
        let busiest_server = on_server.values().copied().max().unwrap_or(0);
        let bound_ms = compute.max(everywhere + busiest_server) as f64 / 1e6;
        assert!(
            summary.iteration_time_ms >= bound_ms - 1e-6,
            "{model}: {} < {bound_ms}",
            summary.iteration_time_ms
        );
        assert!(
            summary.compute_ms >= compute as f64 / 1e6 - 1e-6,
            "{model}: contention only slows"
        );
    }
}

#[test]
fn symmetric_and_explicit_paths_agree() {
    for (model, cluster, nodes, strategy, compressor) in CASES {
        let (scenario, plan) = scenario(model, cluster, nodes, strategy, compressor);
        let symmetric = simulate(&scenario, &plan, &SimOptions::default())
            .unwrap()
            .summary;
        let explicit = simulate(
            &scenario,
            &plan,
            &SimOptions {
                force_explicit: true,
                ..Default::default()
            },
        )
        .unwrap()
        .summary;
        assert_eq!(symmetric.path, "symmetric");
        assert_eq!(explicit.path, "explicit");
        assert_eq!(
            symmetric.iteration_time_ms, explicit.iteration_time_ms,
            "{model} {strategy}"
        );
        assert_eq!(
            symmetric.compute_ms, explicit.compute_ms,
            "{model} {strategy}"
        );
        assert_eq!(
            symmetric.compression_ms, explicit.compression_ms,
            "{model} {strategy}"
        );
        assert_eq!(symmetric.comm_ms, explicit.comm_ms, "{model} {strategy}");
    }
}

#[test]
fn horovod_launches_half_a_cycle_after_a_collective_is_ready() {
    for (cluster, nodes) in [("dgx1-v100", 1), ("v100-10gbe", 2)] {
        let (scenario, plan) = scenario("resnet50", cluster, nodes, "horovod", "none");
        let outcome = simulate(
            &scenario,
            &plan,
            &SimOptions {
                trace_ranks: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let half_cycle_us = plan.policy.cycle_time_us / 2.0;
        let trace = outcome.trace.unwrap();
        let spans = |cat: &str| -> Vec<(f64, f64)> {
            let mut spans: Vec<(f64, f64)> = trace
                .trace_events
                .iter()
                .filter(|e| e.ph == "X" && e.cat == cat)
                .map(|e| (e.ts, e.ts + e.dur))
                .collect();
            spans.sort_by(|a, b| a.0.total_cmp(&b.0));
            spans
        };
        let (comm, compute) = (spans("comm"), spans("compute"));
        assert!(!comm.is_empty());
        // A collective is ready when the backward step of its group's last gradient ends (the
        // expected phase of a free-running loop puts the next tick half a cycle later on
        // average); it starts then, or, when the link is still busy, as the previous one ends.
        let mut waited = 0;
        for (i, &(start, _)) in comm.iter().enumerate() {
            let on_tick = compute
                .iter()
                .any(|&(_, end)| (start - half_cycle_us - end).abs() < 1e-3);
            let queued = i > 0 && (start - comm[i - 1].1).abs() < 1e-3;
            assert!(on_tick || queued, "{cluster}: collective at {start} µs");
            waited += usize::from(on_tick);
        }
        assert!(waited > 0, "{cluster}: no collective waited for its tick");
    }
}

#[test]
fn contention_slows_compute_only_while_comm_runs() {
    let (base, plan) = scenario("bert-base", "v100-10gbe", 2, "wfbp", "none");
    let quiet = {
        let mut s = base.clone();
        s.collective_slowdown = 1.0;
        s
    };
    let slowed = simulate(&base, &plan, &SimOptions::default())
        .unwrap()
        .summary;
    let unslowed = simulate(&quiet, &plan, &SimOptions::default())
        .unwrap()
        .summary;
    assert!(slowed.compute_ms > unslowed.compute_ms);
    assert!(slowed.compute_ms < unslowed.compute_ms * base.collective_slowdown);
}

#[test]
fn noise_gives_statistics_and_is_seeded() {
    let (scenario, plan) = scenario("resnet50", "v100-100gib", 2, "ddp", "none");
    let options = SimOptions {
        iterations: Some(30),
        noise: NoiseSpec {
            jitter_cv: 0.1,
            straggler_probability: 0.05,
            straggler_slowdown: 2.0,
            rank_skew_cv: 0.0,
            seed: 3,
        },
        ..Default::default()
    };
    let a = simulate(&scenario, &plan, &options).unwrap();
    let b = simulate(&scenario, &plan, &options).unwrap();
    assert_eq!(a.summary, b.summary);
    let stats = a.summary.statistics.clone().unwrap();
    assert!(stats.ci95_low_ms <= stats.mean_ms && stats.mean_ms <= stats.ci95_high_ms);
    assert!(stats.p50_ms <= stats.p99_ms);
    assert_eq!(a.iteration_times.len(), 30);
    let other = simulate(
        &scenario,
        &plan,
        &SimOptions {
            noise: NoiseSpec {
                seed: 4,
                ..options.noise
            },
            ..options
        },
    )
    .unwrap();
    assert_ne!(a.summary.iteration_time_ms, other.summary.iteration_time_ms);
    assert!(Noise::default().is_none());
}

/// A model runs at its profiled times on a re-profiled copy of its own device (same name,
/// another speed estimate) and is scaled by the speed ratio on any other device.
#[test]
fn compute_is_carried_only_across_different_devices() {
    let dir = crate::common::scratch("same-device");
    let mut h100 = DeviceProfile::load("h100-sxm5-80gb").unwrap();
    h100.compute_speed_vs_v100 *= 0.5;
    h100.peak_fp32_tflops *= 0.5;
    h100.memory_bandwidth_gbytes_per_s *= 0.5;
    let remeasured = dir.join("h100-remeasured.json");
    std::fs::write(&remeasured, serde_json::to_string(&h100).unwrap()).unwrap();
    let mut model = ModelProfile::load("resnet50").unwrap();
    model.device = "h100-sxm5-80gb".into();
    let mut cluster = Cluster::load("dgx-h100", ClusterOverrides::default()).unwrap();
    cluster.device = remeasured.to_string_lossy().into_owned();
    let same = Scenario::new(model.clone(), cluster.clone()).unwrap();
    assert_eq!((same.compute_scale, same.compute_ratio), (1.0, 1.0));
    assert_eq!(same.model.tensors, model.tensors);
    // Another GPU with half the peak and half the memory bandwidth takes every step twice as long.
    h100.name = "another-gpu".into();
    std::fs::write(&remeasured, serde_json::to_string(&h100).unwrap()).unwrap();
    let other = Scenario::new(model.clone(), cluster.clone()).unwrap();
    assert!(
        (other.compute_ratio - 2.0).abs() < 1e-12,
        "{}",
        other.compute_ratio
    );
    assert_eq!(other.compute_scale, 1.0);
    for (carried, measured) in other.model.tensors.iter().zip(&model.tensors) {
        assert!((carried.backward_us - 2.0 * measured.backward_us).abs() < 1e-9);
    }
    // A profile without FLOP counts cannot be split: the devices' speeds carry it whole.
    model.arithmetic = None;
    let bare = Scenario::new(model, cluster).unwrap();
    assert!(
        (bare.compute_scale - 2.0).abs() < 1e-12,
        "{}",
        bare.compute_scale
    );
}

/// The two-tensor model with a measured skew of `cv` between ranks.
fn skewed(model: &ModelProfile, cv: f64) -> ModelProfile {
    let mut model = model.clone();
    model.rank_skew = Some(syncopate_sim::inputs::model::RankSkew {
        cv,
        ranks: 2,
        provenance: syncopate_sim::inputs::model::Provenance {
            status: syncopate_sim::inputs::model::Status::Measured,
            method: "a test's".into(),
        },
    });
    model
}

#[test]
fn a_skew_between_ranks_makes_the_slowest_rank_set_the_pace_deterministically() {
    let dir = crate::common::scratch("rank-skew");
    let device = quiet_device(&dir);
    let model = two_tensor_model(&device, 1 << 20);
    let cluster = one_link_cluster(&device);
    let plain = run(&model, &cluster, "ddp");
    let skewed_model = skewed(&model, 0.2);
    let skewed = run(&skewed_model, &cluster, "ddp");
    assert_eq!((plain.path, plain.rank_skew_cv), ("symmetric", None));
    assert_eq!((skewed.path, skewed.rank_skew_cv), ("explicit", Some(0.2)));
    assert_eq!(skewed.measured_iterations, 64);
    // Each rank's compute keeps its mean, but every collective waits for the later rank: two
    // ranks of 20 ms ± 20 % meet about 2 ms later than one mean rank would.
    assert!((skewed.compute_ms / plain.compute_ms - 1.0).abs() < 0.05);
    assert!(
        skewed.iteration_time_ms > plain.iteration_time_ms + 1.0,
        "{} vs {}",
        skewed.iteration_time_ms,
        plain.iteration_time_ms
    );
    assert_eq!(run(&skewed_model, &cluster, "ddp"), skewed);
    // The tuner's evaluator prices a plan as `simulate` does.
    let scenario = Scenario::new(skewed_model.clone(), cluster.clone()).unwrap();
    let plan = "ddp"
        .parse::<Strategy>()
        .unwrap()
        .plan(&scenario, &StrategyOptions::default())
        .unwrap();
    let evaluated =
        syncopate_sim::predict::evaluate::steady_iteration_time(&scenario, &plan).unwrap();
    assert!((evaluated.as_ms() - skewed.iteration_time_ms).abs() < 1e-5);
    // One rank has no one to wait for.
    let mut single = cluster.clone();
    single.nodes = 1;
    assert_eq!(run(&skewed_model, &single, "ddp").path, "symmetric");
}

#[test]
fn a_rank_skew_scales_each_ranks_compute_in_an_iteration_alike_and_leaves_other_draws() {
    let (scenario, plan) = scenario("resnet50", "v100-100gib", 2, "ddp", "none");
    let graph = graph(&scenario, &plan, 3);
    let ranks = 4;
    let jitter = NoiseSpec {
        jitter_cv: 0.1,
        seed: 5,
        ..Default::default()
    };
    let skewed = NoiseSpec {
        rank_skew_cv: 0.3,
        ..jitter
    };
    let plain = jitter.draw(&graph, ranks).unwrap();
    let both = skewed.draw(&graph, ranks).unwrap();
    let only_skew = NoiseSpec {
        jitter_cv: 0.0,
        ..skewed
    }
    .draw(&graph, ranks)
    .unwrap();
    let tasks = graph.len();
    let mut speeds = std::collections::BTreeSet::new();
    for rank in 0..ranks as usize {
        for iteration in 0..3 {
            let factors: Vec<f32> = (0..tasks)
                .filter(|&t| graph.task(t as u32).iteration == iteration)
                .map(|t| (t, only_skew.rank_task(t as u32, rank as u32)))
                .filter(|&(t, _)| graph.task(t as u32).stream == Stream::Compute)
                .map(|(_, f)| f)
                .collect();
            // One factor for all of the rank's compute in the iteration.
            assert!(factors.windows(2).all(|w| w[0] == w[1]), "{factors:?}");
            speeds.insert(factors[0].to_bits());
        }
    }
    assert!(speeds.len() > 1, "ranks and iterations differ");
    for t in 0..tasks {
        let compute = graph.task(t as u32).stream == Stream::Compute;
        for rank in 0..ranks {
            let t = t as u32;
            if !compute {
                // Not compute: no skew, and the jitter drawn as without it.
                assert_eq!(only_skew.rank_task(t, rank), 1.0);
                assert_eq!(both.rank_task(t, rank), plain.rank_task(t, rank));
            }
        }
    }
    assert_eq!(both.per_collective, plain.per_collective);
}

/// A (task, rank) factor is drawn from its key alone: the same in any order, and over many
/// keys lognormal with mean 1 and the coefficient of variation asked for.
#[test]
fn jitter_factors_are_keyed_draws_with_the_mean_and_spread_asked_for() {
    let (scenario, plan) = scenario("resnet50", "v100-100gib", 2, "ddp", "none");
    let graph = graph(&scenario, &plan, 2);
    let ranks = 64;
    let cv = 0.1;
    let noise = NoiseSpec {
        jitter_cv: cv,
        seed: 11,
        ..Default::default()
    }
    .draw(&graph, ranks)
    .unwrap();
    let local: Vec<u32> = (0..graph.len() as u32)
        .filter(|&t| graph.task(t).stream != Stream::Comm)
        .collect();
    let forward: Vec<f64> = local
        .iter()
        .flat_map(|&t| (0..ranks).map(move |r| (t, r)))
        .map(|(t, r)| f64::from(noise.rank_task(t, r)))
        .collect();
    let backward: Vec<f64> = local
        .iter()
        .rev()
        .flat_map(|&t| (0..ranks).rev().map(move |r| (t, r)))
        .map(|(t, r)| f64::from(noise.rank_task(t, r)))
        .collect();
    assert!(forward.iter().eq(backward.iter().rev()));
    let n = forward.len() as f64;
    assert!(n > 10_000.0, "{n}");
    let mean = forward.iter().sum::<f64>() / n;
    let sd = (forward.iter().map(|f| (f - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    assert!((mean - 1.0).abs() < 0.005, "mean {mean}");
    assert!((sd / mean / cv - 1.0).abs() < 0.05, "cv {}", sd / mean);
    let distinct: std::collections::BTreeSet<u32> =
        forward.iter().map(|f| (*f as f32).to_bits()).collect();
    assert!(
        distinct.len() as f64 > 0.99 * n,
        "{} of {n}",
        distinct.len()
    );
    assert_eq!(
        noise.rank_task(local[0], ranks),
        1.0,
        "a rank the noise was not drawn for"
    );
}

#[test]
fn the_tuners_evaluator_prices_plans_with_shared_links_as_simulate_does() {
    // Plans whose collectives share links change each other's rates, which leaves superseded
    // events in the engine's queue past the last task; the steady time is the last task's end.
    for (strategy, compressor) in [
        ("byteps", "none"),
        ("bytescheduler", "none"),
        ("ps", "fp16"),
        ("ddp", "none"),
        ("dear", "none"),
    ] {
        let (scenario, mut plan) = scenario("resnet50", "v100-10gbe", 4, strategy, compressor);
        plan.policy.comm_streams = 16;
        let evaluated =
            syncopate_sim::predict::evaluate::steady_iteration_time(&scenario, &plan).unwrap();
        let simulated = simulate(&scenario, &plan, &SimOptions::default()).unwrap();
        assert_eq!(
            evaluated, simulated.iteration_times[0],
            "{strategy} with {compressor}"
        );
    }
}
