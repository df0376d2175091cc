//! Search speed: plan evaluations per second for resnet50 on 64 GPUs (v100-10gbe, 16 nodes of
//! 4; the candidates a fusion search scores, on one thread and on both cores as `tune` runs
//! them), and a whole `tune --search all --compressor auto` of bert-large on 64 GPUs.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rayon::prelude::*;
use std::hint::black_box;
use syncopate_sim::compress::{auto_specs, Compressor, Memory};
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::plan::{CodecCalls, Plan};
use syncopate_sim::predict::evaluate::Evaluator;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::search::{contiguous_plan, tune, SearchSpace, TuneRequest};
use syncopate_sim::strategy::{GroupingRule, Strategy, StrategyOptions};

fn base(model: &str) -> Scenario {
    let model = ModelProfile::load(model).unwrap();
    let cluster = Cluster::load("v100-10gbe", ClusterOverrides::default()).unwrap();
    assert_eq!(cluster.world_size(), 64);
    Scenario::new(model, cluster).unwrap()
}

/// The plans a fusion search scores most: contiguous groupings of every count.
fn candidates(base: &Scenario) -> Vec<Plan> {
    let n = base.model.num_tensors();
    (1..=n)
        .map(|count| {
            let strategy = Strategy::FixedGroups {
                count,
                rule: GroupingRule::Bytes,
            };
            let plan = strategy.plan(base, &StrategyOptions::default()).unwrap();
            let groups = plan
                .groups
                .into_iter()
                .map(|g| (g.tensors, (Compressor::None, Memory::None)))
                .collect();
            contiguous_plan(base, groups, CodecCalls::Group)
        })
        .collect()
}

fn search(c: &mut Criterion) {
    let resnet = base("resnet50");
    let plans = candidates(&resnet);
    let mut group = c.benchmark_group("resnet50/64xV100");
    group.throughput(Throughput::Elements(plans.len() as u64));
    group.bench_function("plan-evaluations", |b| {
        let evaluator = Evaluator::new(resnet.clone());
        b.iter(|| {
            for plan in &plans {
                black_box(evaluator.iteration_time(plan).unwrap());
            }
        })
    });
    group.bench_function("plan-evaluations-both-cores", |b| {
        b.iter(|| {
            plans
                .par_iter()
                .with_min_len(16)
                .map_init(
                    || Evaluator::new(resnet.clone()),
                    |evaluator, plan| evaluator.iteration_time(plan).unwrap(),
                )
                .collect::<Vec<_>>()
        })
    });
    group.finish();

    let bert = base("bert-large");
    let request = TuneRequest {
        space: SearchSpace::All,
        compressors: auto_specs()
            .into_iter()
            .map(|s| {
                let compressor: Compressor = s.parse().unwrap();
                (compressor, compressor.default_memory())
            })
            .collect(),
        options: StrategyOptions::default(),
        codec_calls: CodecCalls::Group,
    };
    let mut group = c.benchmark_group("bert-large/64xV100");
    group.sample_size(10);
    group.bench_function("tune-search-all-auto", |b| {
        b.iter(|| tune(black_box(&bert), &request, &|_| {}).unwrap())
    });
    group.finish();
}

criterion_group!(benches, search);
criterion_main!(benches);
