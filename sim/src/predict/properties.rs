//! Property tests of the whole pipeline over random small models, plans and worlds.
//!
//! The pipeline is lower → unroll → cost → engine.

use crate::base::time::SimTime;
use crate::collective::Naming;
use crate::compress::{Compressor, Memory};
use crate::inputs::model::ModelProfile;
use crate::inputs::topology::{Cluster, ClusterOverrides};
use crate::plan::{CompressOn, Group, Launch, Plan, Policy, Scheme};
use crate::predict::engine::{self, EngineConfig, EngineResult};
use crate::predict::noise::NoiseSpec;
use crate::predict::scenario::Scenario;
use crate::predict::simulate::{engine_config, schedule, task_graph};
use crate::schedule::Stream;
use proptest::prelude::*;
use std::collections::HashMap;

const COMPRESSORS: [&str; 7] = [
    "none",
    "fp16",
    "topk:0.1",
    "dgc:0.1",
    "onebit",
    "powersgd:2",
    "randomk:0.2",
];

/// A random model: sizes, shapes and times of up to six tensors.
fn models() -> impl Strategy<Value = ModelProfile> {
    prop::collection::vec(
        (1u64..3000, 0.0f64..3000.0, 0.0f64..1500.0, any::<bool>()),
        1..7,
    )
    .prop_flat_map(|tensors| {
        let n = tensors.len();
        (
            Just(tensors),
            Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
            0.0f64..2000.0,
        )
    })
    .prop_map(|(tensors, registration, optimizer_us)| {
        let mut model = ModelProfile::load("resnet50").unwrap();
        let template = model.tensors[0].clone();
        model.name = "random".into();
        model.optimizer_us = optimizer_us;
        model.tensors = tensors
            .iter()
            .zip(registration)
            .enumerate()
            .map(|(i, (&(numel, backward_us, forward_us, matrix), reg))| {
                let mut t = template.clone();
                t.name = format!("t{i}");
                // A matrix shape lets PowerSGD compress; the element count stays `numel`.
                t.shape = if matrix && numel % 4 == 0 {
                    vec![4, numel / 4]
                } else {
                    vec![numel]
                };
                t.numel = numel;
                t.registration_index = reg;
                t.backward_us = backward_us;
                t.forward_us = forward_us;
                t
            })
            .collect();
        model
    })
}

/// One group's choices: compressor, scheme pick, partitions, priority, residual memory.
type GroupChoice = (usize, u8, u32, i64, bool);

/// A random valid plan for `model`: tensors shuffled into groups, each with a compressor, an
/// aggregation scheme it allows, partitions and a priority; a random launch policy.
fn plans(model: ModelProfile) -> impl Strategy<Value = (ModelProfile, Plan)> {
    let n = model.num_tensors();
    (
        Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
        prop::collection::vec(any::<bool>(), n),
        prop::collection::vec(
            (
                0..COMPRESSORS.len(),
                0u8..4,
                1u32..4,
                -3i64..3,
                any::<bool>(),
            ),
            n,
        ),
        (
            any::<bool>(),
            1u32..4,
            prop_oneof![Just(0.0), 100.0f64..3000.0],
            any::<bool>(),
        ),
    )
        .prop_map(move |(order, cuts, choices, policy)| {
            let plan = plan(&model, &order, &cuts, &choices, policy);
            (model.clone(), plan)
        })
}

fn plan(
    model: &ModelProfile,
    order: &[usize],
    cuts: &[bool],
    choices: &[GroupChoice],
    (priority, comm_streams, cycle_time_us, overlap_forward): (bool, u32, f64, bool),
) -> Plan {
    let mut members: Vec<Vec<usize>> = vec![Vec::new()];
    for (&t, &cut) in order.iter().zip(cuts) {
        if cut && !members.last().unwrap().is_empty() {
            members.push(Vec::new());
        }
        members.last_mut().unwrap().push(t);
    }
    let groups = members
        .into_iter()
        .zip(choices)
        .map(|(tensors, &(c, pick, partitions, priority, residual))| {
            let compressor: Compressor = COMPRESSORS[c].parse().unwrap();
            let allowed = compressor.allowed_aggregations();
            let summable = allowed.contains(&crate::compress::Aggregation::Allreduce);
            let scheme = match pick {
                1 if summable && compressor.allreduce_rounds() == 1 => {
                    Scheme::ReduceScatterAllgather
                }
                2 if summable => Scheme::Hierarchical,
                3 if allowed.contains(&crate::compress::Aggregation::ParameterServer) => {
                    if residual || compressor.why_no_ring_hops().is_some() {
                        Scheme::Ps
                    } else {
                        Scheme::CompressedRing
                    }
                }
                _ => Scheme::Auto,
            };
            Group {
                tensors,
                compressor,
                memory: if residual && compressor != Compressor::None {
                    Memory::Residual
                } else {
                    Memory::None
                },
                compress_on: CompressOn::Gpu,
                scheme,
                partitions,
                priority,
            }
        })
        .collect();
    let policy = Policy {
        launch: if priority {
            Launch::Priority
        } else {
            Launch::PlanOrder
        },
        comm_streams,
        cycle_time_us,
        overlap_forward,
        ps_servers: 0,
    };
    Plan::new("random", model, groups, policy)
}

fn scenario(model: ModelProfile, nodes: u32, gpus: u32) -> Scenario {
    let overrides = ClusterOverrides {
        nodes: Some(nodes),
        gpus_per_node: Some(gpus),
        inter_gbps: None,
    };
    Scenario::new(model, Cluster::load("v100-10gbe", overrides).unwrap()).unwrap()
}

/// Runs three iterations of the plan with every rank explicit and jitter on.
fn run(
    scenario: &Scenario,
    plan: &Plan,
    seed: u64,
) -> (crate::predict::graph::TaskGraph, EngineConfig, EngineResult) {
    let schedule = schedule(scenario, plan).unwrap();
    let graph = task_graph(scenario, &schedule, 3, Naming::Priced).unwrap();
    let ranks = scenario.cluster.world_size();
    let config = engine_config(scenario, &schedule, ranks, ranks);
    let noise = NoiseSpec {
        jitter_cv: 0.3,
        seed,
        ..NoiseSpec::default()
    }
    .draw(&graph, ranks)
    .unwrap();
    let result = engine::run(&graph, &config, &noise).unwrap();
    (graph, config, result)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_step_runs_once_in_order_without_overlap(
        (model, plan) in models().prop_flat_map(plans),
        nodes in 1u32..3,
        gpus in 1u32..3,
        seed in any::<u64>(),
    ) {
        let scenario = scenario(model, nodes, gpus);
        let (graph, config, result) = run(&scenario, &plan, seed);
        let ranks = config.ranks;
        // (rank, task) -> span; collectives are recorded once and span every rank.
        let mut spans: HashMap<(u32, u32), (SimTime, SimTime)> = HashMap::new();
        for r in &result.records {
            let global = graph.task(r.task).stream == Stream::Comm;
            for rank in if global { 0..ranks } else { r.rank..r.rank + 1 } {
                prop_assert!(spans.insert((rank, r.task), (r.start, r.end)).is_none(), "a task ran twice");
            }
        }
        prop_assert_eq!(spans.len(), graph.len() * ranks as usize, "every task ran on every rank");
        for u in 0..graph.len() as u32 {
            for &v in graph.successors(u) {
                for rank in 0..ranks {
                    prop_assert!(spans[&(rank, v)].0 >= spans[&(rank, u)].1, "{} before its input {}", graph.task(v).label(), graph.task(u).label());
                }
            }
        }
        for stream in [Stream::Compute, Stream::Codec, Stream::Cpu] {
            for rank in 0..ranks {
                let mut busy: Vec<(SimTime, SimTime)> = spans
                    .iter()
                    .filter(|((r, t), _)| *r == rank && graph.task(*t).stream == stream)
                    .map(|(_, &s)| s)
                    .collect();
                busy.sort();
                for pair in busy.windows(2) {
                    prop_assert!(pair[1].0 >= pair[0].1, "overlap on {:?} of rank {}", stream, rank);
                }
            }
        }
        // At most `comm_streams` collectives run at once.
        let mut edges: Vec<(SimTime, i32)> = result
            .records
            .iter()
            .filter(|r| graph.task(r.task).stream == Stream::Comm)
            .flat_map(|r| [(r.start, 1), (r.end, -1)])
            .collect();
        edges.sort_by_key(|&(t, d)| (t, d));
        let mut running = 0;
        for (_, d) in edges {
            running += d;
            prop_assert!(running <= config.policy.comm_streams as i32);
        }
        prop_assert!(result.iteration_end.windows(2).all(|w| w[1] >= w[0]));
    }

    #[test]
    fn the_same_seed_gives_the_same_run(
        (model, plan) in models().prop_flat_map(plans),
        seed in any::<u64>(),
    ) {
        let scenario = scenario(model, 2, 2);
        let (_, _, a) = run(&scenario, &plan, seed);
        let (_, _, b) = run(&scenario, &plan, seed);
        prop_assert_eq!(a, b);
    }
}
