//! Strategies of the seed systems and `tune`: plans they make, optimality on small models,
//! never worse than a baseline, lower bounds, and the CLI.

use crate::common::{simulate_json, stderr, stdout, syncopate, syncopate_json};
use syncopate_sim::base::time::SimTime;
use syncopate_sim::compress::{Compressor, Memory};
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::plan::{CodecCalls, Launch, Scheme};
use syncopate_sim::predict::evaluate::Evaluator;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::search::{contiguous_plan, lower_bound, tune, Choice, SearchSpace, TuneRequest};
use syncopate_sim::strategy::{Strategy, StrategyOptions};

fn scenario(model: ModelProfile, cluster: &str, nodes: u32) -> Scenario {
    let cluster = Cluster::load(
        cluster,
        ClusterOverrides {
            nodes: Some(nodes),
            ..Default::default()
        },
    )
    .unwrap();
    Scenario::new(model, cluster).unwrap()
}

/// A model of `n` tensors with sizes and backward times that vary, so that grouping matters.
fn small_model(n: usize) -> ModelProfile {
    let mut model = ModelProfile::load("resnet50").unwrap();
    model.name = format!("small-{n}");
    model.tensors.truncate(n);
    for (i, tensor) in model.tensors.iter_mut().enumerate() {
        let numel = [
            4_000u64, 2_000_000, 64, 500_000, 9_000_000, 1_000, 3_000_000, 200_000, 50, 800_000,
        ][i % 10];
        tensor.name = format!("t{i}");
        tensor.shape = vec![numel / 50 + 1, 50];
        tensor.numel = tensor.shape.iter().product();
        tensor.registration_index = n - 1 - i;
        tensor.backward_us = [
            300.0, 2500.0, 40.0, 900.0, 6000.0, 80.0, 3000.0, 400.0, 30.0, 1200.0,
        ][i % 10];
        tensor.forward_us = tensor.backward_us / 2.0;
    }
    model
}

/// Every contiguous partition of n tensors: each of the n-1 gaps is a boundary or not.
fn partitions(n: usize) -> Vec<Vec<Vec<usize>>> {
    (0..1u32 << (n - 1))
        .map(|mask| {
            let mut groups = vec![vec![0]];
            for t in 1..n {
                if mask & (1 << (t - 1)) != 0 {
                    groups.push(Vec::new());
                }
                groups.last_mut().unwrap().push(t);
            }
            groups
        })
        .collect()
}

#[test]
fn tuned_plan_is_within_one_percent_of_exhaustive_search_on_small_models() {
    let choices: Vec<Choice> = vec![
        (Compressor::None, Memory::None),
        (Compressor::Fp16, Memory::None),
    ];
    for (n, cluster, nodes) in [(8, "v100-10gbe", 2), (7, "v100-pcie-25gbe", 2)] {
        let base = scenario(small_model(n), cluster, nodes);
        let evaluator = Evaluator::new(base.clone());
        let mut best = SimTime(u64::MAX);
        for groups in partitions(n) {
            // Every assignment of a choice to each group.
            for code in 0..choices.len().pow(groups.len() as u32) {
                let mut code = code;
                let assigned = groups
                    .iter()
                    .map(|g| {
                        let choice = choices[code % choices.len()];
                        code /= choices.len();
                        (g.clone(), choice)
                    })
                    .collect();
                best = best.min(
                    evaluator
                        .iteration_time(&contiguous_plan(&base, assigned, CodecCalls::Group))
                        .unwrap(),
                );
            }
        }
        let request = TuneRequest {
            space: SearchSpace::All,
            compressors: choices[1..].to_vec(),
            options: StrategyOptions::default(),
            codec_calls: CodecCalls::Group,
        };
        let tuned = tune(&base, &request, &|_| {}).unwrap();
        assert!(
            tuned.iteration_time.as_ns() as f64 <= best.as_ns() as f64 * 1.01,
            "{n} tensors on {cluster}: tuned {} vs exhaustive {}",
            tuned.iteration_time,
            best
        );
        assert!(tuned.lower_bound <= tuned.iteration_time);
    }
}

#[test]
fn tuned_plan_is_never_slower_than_a_baseline_and_bounds_hold() {
    for (model, cluster, nodes, space, compressor) in [
        ("resnet50", "v100-10gbe", 4, SearchSpace::Fusion, None),
        (
            "vgg16",
            "v100-pcie-25gbe",
            2,
            SearchSpace::All,
            Some("dgc:0.01"),
        ),
        (
            "bert-base",
            "dgx-h100",
            2,
            SearchSpace::Compression,
            Some("fp16"),
        ),
    ] {
        let base = scenario(ModelProfile::load(model).unwrap(), cluster, nodes);
        let compressors = compressor
            .map(|c| vec![(c.parse::<Compressor>().unwrap(), Memory::Residual)])
            .unwrap_or_default();
        let request = TuneRequest {
            space,
            compressors,
            options: StrategyOptions::default(),
            codec_calls: CodecCalls::Group,
        };
        let result = tune(&base, &request, &|_| {}).unwrap();
        assert!(result.baselines.len() >= 7, "{model}");
        for baseline in &result.baselines {
            if let Ok(time) = baseline.iteration_time {
                assert!(
                    result.iteration_time <= time,
                    "{model}: slower than {}",
                    baseline.strategy
                );
            }
        }
        assert!(
            result.lower_bound <= result.iteration_time,
            "{model}: bound above the tuned time"
        );
        assert!(result.plans_evaluated > 50);
        // The evaluator's time is what `simulate` reports for the plan.
        let simulated =
            syncopate_sim::predict::simulate::simulate(&base, &result.plan, &Default::default())
                .unwrap()
                .summary;
        assert_eq!(
            simulated.iteration_time_ms,
            (result.iteration_time.as_ns() as f64 / 1e6 * 1e6).round() / 1e6
        );
    }
}

#[test]
fn seed_strategies_make_the_plans_their_papers_describe() {
    let base = scenario(ModelProfile::load("resnet50").unwrap(), "v100-10gbe", 4);
    let plan = |s: &str, compressor: Compressor| {
        let options = StrategyOptions {
            compressor,
            ..Default::default()
        };
        s.parse::<Strategy>()
            .unwrap()
            .plan(&base, &options)
            .unwrap()
    };
    let none = Compressor::None;
    let bs = plan("bytescheduler", none);
    assert_eq!(bs.policy.launch, Launch::Priority);
    assert!(bs.policy.overlap_forward && bs.policy.comm_streams == 4);
    let fc = bs.groups.iter().find(|g| g.tensors == [1]).unwrap();
    assert_eq!(
        fc.partitions, 2,
        "fc.weight (8 MB) splits into 4 MB partitions"
    );
    let dear = plan("dear", none);
    assert!(dear
        .groups
        .iter()
        .all(|g| g.scheme == Scheme::ReduceScatterAllgather));
    assert!(dear.policy.overlap_forward);
    let mg = plan("mgwfbp", none);
    assert!(mg.groups.len() < base.model.num_tensors() && mg.groups.len() > 1);
    let ps = plan("ps", none);
    assert_eq!(ps.policy.ps_servers, 4);
    assert!(ps.groups.iter().all(|g| g.scheme == Scheme::Ps));
    assert_eq!(plan("byteps", none).policy.ps_servers, 0);
    // Across machines BytePS pushes its compressed partitions to the servers; a job of one
    // machine is not distributed: NCCL inside it, gradients whole.
    let pushed = plan("byteps", Compressor::OneBit);
    assert!(pushed
        .groups
        .iter()
        .all(|g| g.scheme == Scheme::Ps && g.compressor == Compressor::OneBit));
    let one_machine = scenario(ModelProfile::load("resnet50").unwrap(), "dgx1-v100", 1);
    let options = StrategyOptions {
        compressor: Compressor::OneBit,
        ..Default::default()
    };
    let local = Strategy::BytePs.plan(&one_machine, &options).unwrap();
    assert!(local
        .groups
        .iter()
        .all(|g| g.scheme == Scheme::Allreduce && g.compressor == Compressor::None));
    let onebit = Compressor::OneBit;
    let hipress = plan("hipress:ring", onebit);
    assert!(hipress
        .groups
        .iter()
        .any(|g| g.scheme == Scheme::CompressedRing));
    // SeCoPa leaves small gradients (biases, batch norms) uncompressed.
    assert!(hipress
        .groups
        .iter()
        .filter(|g| g.numel(&base.model) < 4096)
        .all(|g| g.compressor == Compressor::None));
    let espresso = plan("espresso", Compressor::Dgc { ratio: 0.01 });
    assert!(espresso
        .groups
        .iter()
        .all(|g| g.compressor == Compressor::None || g.numel(&base.model) >= 1 << 14));
    let mergecomp = plan("mergecomp", Compressor::EfSignSgd);
    assert!(mergecomp
        .groups
        .iter()
        .all(|g| g.compressor == Compressor::EfSignSgd));
    let options = StrategyOptions::default();
    let message = "mergecomp"
        .parse::<Strategy>()
        .unwrap()
        .plan(&base, &options)
        .unwrap_err()
        .to_string();
    assert!(message.contains("compresses gradients"), "{message}");
    // Every strategy's plan runs and stays above the lower bound.
    for s in [
        "wfbp",
        "horovod",
        "ddp",
        "fixed-groups:5",
        "bytescheduler",
        "mgwfbp",
        "dear",
        "byteps",
        "ps",
    ] {
        let p = plan(s, none);
        let t = Evaluator::new(base.clone()).iteration_time(&p).unwrap();
        assert!(lower_bound(&base, &p).unwrap() <= t, "{s}");
    }
}

#[test]
fn tune_cli_writes_a_plan_that_simulate_reproduces() {
    let dir = crate::common::scratch("tune-cli");
    let out = dir.join("tuned.json");
    let tuned = syncopate(&[
        "tune",
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "2",
        "--compressor",
        "fp16",
        "--search",
        "all",
        "--out",
        out.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(tuned.status.success(), "{}", stderr(&tuned));
    let report: serde_json::Value = serde_json::from_str(&stdout(&tuned)).unwrap();
    for key in [
        "best_iteration_time_ms",
        "lower_bound_ms",
        "plans_evaluated",
        "search_ms",
        "baselines",
        "plan",
    ] {
        assert!(report.get(key).is_some(), "missing {key}");
    }
    let summary = simulate_json(&[
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "2",
        "--plan",
        out.to_str().unwrap(),
    ]);
    assert_eq!(
        summary["iteration_time_ms"],
        report["best_iteration_time_ms"]
    );
    let bad = syncopate(&[
        "tune",
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--search",
        "all",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("--compressor"), "{}", stderr(&bad));
    let bad = syncopate(&[
        "tune",
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--search",
        "everything",
    ]);
    assert!(stderr(&bad).contains("valid: fusion, compression, all"));
}

#[test]
fn tune_compresses_tensor_by_tensor_when_asked() {
    let dir = crate::common::scratch("tune-tensor-calls");
    let out = dir.join("tuned.json");
    let args = |calls: &str, compressor: &str| {
        syncopate(&[
            "tune",
            "--model",
            "resnet50",
            "--cluster",
            "v100-10gbe",
            "--nodes",
            "2",
            "--compressor",
            compressor,
            "--search",
            "all",
            "--codec-calls",
            calls,
            "--out",
            out.to_str().unwrap(),
            "--format",
            "json",
        ])
    };
    let tuned = args("tensor", "auto");
    assert!(tuned.status.success(), "{}", stderr(&tuned));
    let report: serde_json::Value = serde_json::from_str(&stdout(&tuned)).unwrap();
    assert_eq!(report["plan"]["codec_calls"], "tensor");
    // Every compressed group can be split into calls: `auto`'s PowerSGD is left out.
    for group in report["plan"]["groups"].as_array().unwrap() {
        let compressor = group["compressor"].as_str().unwrap_or("none");
        assert!(!compressor.starts_with("powersgd"), "{compressor}");
    }
    // The strategies that price one call per group say why they were skipped.
    let mergecomp = report["baselines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["strategy"] == "mergecomp")
        .unwrap();
    assert!(mergecomp["skipped"]
        .as_str()
        .unwrap()
        .contains("--codec-calls"));
    let summary = simulate_json(&["--plan", out.to_str().unwrap()]);
    assert_eq!(
        summary["iteration_time_ms"],
        report["best_iteration_time_ms"]
    );
    let refused = args("tensor", "powersgd:4");
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("--codec-calls"),
        "{}",
        stderr(&refused)
    );
}

/// `--compressor auto` with every search on every GPU cluster: candidates a scheme cannot carry
/// (PowerSGD's two rounds under DeAR's split) are skipped and counted, never fatal; baselines
/// that cannot run say why; the bound stays below the tuned time.
#[test]
fn tune_skips_infeasible_candidates_and_says_why_baselines_cannot_run() {
    let base = scenario(ModelProfile::load("resnet50").unwrap(), "dgx-h100", 1);
    let compressors = syncopate_sim::compress::auto_specs()
        .iter()
        .map(|s| {
            let c: Compressor = s.parse().unwrap();
            (c, c.default_memory())
        })
        .collect();
    let request = TuneRequest {
        space: SearchSpace::All,
        compressors,
        options: StrategyOptions::default(),
        codec_calls: CodecCalls::Group,
    };
    let result = tune(&base, &request, &|_| {}).unwrap();
    assert!(result.infeasible > 0);
    assert!(
        result
            .infeasible_example
            .as_deref()
            .is_some_and(|why| why.contains("powersgd")),
        "{:?}",
        result.infeasible_example
    );
    assert!(result.lower_bound <= result.iteration_time);
    let out = crate::common::syncopate(&[
        "tune",
        "--model",
        "resnet50",
        "--cluster",
        "dgx-h100",
        "--search",
        "compression",
        "--compressor",
        "powersgd:4",
    ]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    // PowerSGD's two rounds cannot run under DeAR's split: skipped, with the reason.
    let text = crate::common::stdout(&out);
    assert!(
        text.contains("could not run and were skipped") && text.contains("powersgd:4"),
        "{text}"
    );
}

#[test]
fn tune_for_a_framework_writes_settings_whose_simulation_gives_the_tuned_time() {
    let dir = crate::common::scratch("tune-framework");
    for (model, cluster) in [("resnet50", "v100-10gbe"), ("bert-large", "dgx-h100")] {
        for (framework, compressor) in [
            ("ddp", "powersgd:4"),
            ("horovod", "fp16"),
            ("deepspeed", "bf16"),
            ("byteps", "fp16"),
            ("fsdp", "bf16"),
        ] {
            let export = dir.join(format!("{model}-{framework}.py"));
            let plan = dir.join(format!("{model}-{framework}.json"));
            let report = syncopate_json(&[
                "tune",
                "--model",
                model,
                "--cluster",
                cluster,
                "--nodes",
                "4",
                "--framework",
                framework,
                "--compressor",
                compressor,
                "--search",
                "all",
                "--export",
                export.to_str().unwrap(),
                "--out",
                plan.to_str().unwrap(),
            ]);
            let tuned = report["iteration_ms"].as_f64().unwrap();
            assert!(tuned <= report["compared_with"]["iteration_ms"].as_f64().unwrap());
            let text = std::fs::read_to_string(&export).unwrap();
            assert!(text.contains(&format!("{tuned:.3} ms")), "{text}");
            // The command the export names (the strategy's flags, or the saved plan when the
            // settings need per-bucket caps or explicit groups) reproduces the tuned time.
            let command = report["simulate"].as_str().unwrap();
            let words: Vec<&str> = command.split(' ').collect();
            assert_eq!(words[..2], ["syncopate", "simulate"]);
            let simulated = simulate_json(&words[2..]);
            assert_eq!(
                simulated["iteration_time_ms"].as_f64().unwrap(),
                tuned,
                "{command}"
            );
        }
    }
}

#[test]
fn export_refuses_frameworks_it_does_not_write_and_tune_refuses_export_without_one() {
    let plan = crate::common::scratch("export-refusals").join("plan.json");
    let out = syncopate(&[
        "simulate",
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--strategy",
        "ddp",
        "--save-plan",
        plan.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = syncopate(&["export", "--plan", plan.to_str().unwrap(), "--to", "mxnet"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--to")
            && stderr(&out).contains("valid: ddp, horovod, deepspeed, byteps, fsdp"),
        "{}",
        stderr(&out)
    );
    let out = syncopate(&[
        "tune",
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--export",
        "x.py",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--export"), "{}", stderr(&out));
    // The sharded strategies' unit and bucket sizes: whole and positive.
    for (flag, value) in [
        ("--blocks-per-unit", "0"),
        ("--reduce-bucket-size", "1.5"),
        ("--reduce-bucket-size", "NaN"),
        ("--reduce-bucket-size", "1e300"),
    ] {
        let out = syncopate(&[
            "simulate",
            "--model",
            "gpt2-xl",
            "--cluster",
            "dgx-h100",
            "--strategy",
            "zero2",
            flag,
            value,
        ]);
        assert_eq!(
            out.status.code(),
            Some(2).filter(|_| flag == "--blocks-per-unit").or(Some(1))
        );
        assert!(
            stderr(&out).contains(flag),
            "{flag} {value}: {}",
            stderr(&out)
        );
    }
}
