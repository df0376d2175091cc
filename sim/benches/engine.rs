//! Simulator speed: gpt2-xl (580 tensors) on 1024 A100s (a100-ib200, 128 nodes of 8) with wfbp
//! and horovod, on the symmetric path and with all ranks explicit under jitter, and horovod on
//! 8192 (1024 nodes) explicit: issue 38's command. Throughput is in simulated iterations per
//! second (each run simulates one warm-up and four measured iterations).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::plan::Plan;
use syncopate_sim::predict::noise::NoiseSpec;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::predict::simulate::{simulate, SimOptions};
use syncopate_sim::strategy::{Strategy, StrategyOptions};

const ITERATIONS: u32 = 4;

fn scenario(strategy: &str, nodes: u32) -> (Scenario, Plan) {
    let model = ModelProfile::load("gpt2-xl").unwrap();
    let cluster = Cluster::load(
        "a100-ib200",
        ClusterOverrides {
            nodes: Some(nodes),
            gpus_per_node: Some(8),
            ..Default::default()
        },
    )
    .unwrap();
    let scenario = Scenario::new(model, cluster).unwrap();
    let plan = strategy
        .parse::<Strategy>()
        .unwrap()
        .plan(&scenario, &StrategyOptions::default())
        .unwrap();
    (scenario, plan)
}

fn engine(c: &mut Criterion) {
    for (strategy, nodes) in [("wfbp", 128), ("horovod", 128), ("horovod", 1024)] {
        let (scenario, plan) = scenario(strategy, nodes);
        let mut group = c.benchmark_group(format!("gpt2-xl/{}xA100/{strategy}", nodes * 8));
        group.throughput(Throughput::Elements(u64::from(ITERATIONS + 1)));
        let symmetric = SimOptions {
            iterations: Some(ITERATIONS),
            ..Default::default()
        };
        let outcome = simulate(&scenario, &plan, &symmetric).unwrap();
        eprintln!("{strategy} symmetric: {} events", outcome.summary.events);
        group.bench_function("symmetric", |b| {
            b.iter(|| simulate(black_box(&scenario), &plan, &symmetric).unwrap())
        });
        let explicit = SimOptions {
            noise: NoiseSpec {
                jitter_cv: 0.05,
                seed: 1,
                ..Default::default()
            },
            ..symmetric
        };
        let outcome = simulate(&scenario, &plan, &explicit).unwrap();
        eprintln!(
            "{strategy} explicit+jitter: {} events",
            outcome.summary.events
        );
        group.sample_size(10);
        group.bench_function("explicit-jitter", |b| {
            b.iter(|| simulate(black_box(&scenario), &plan, &explicit).unwrap())
        });
        group.finish();
    }
}

criterion_group!(benches, engine);
criterion_main!(benches);
