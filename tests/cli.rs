//! The command line end to end: outputs, exit codes and error messages.

use crate::common::{read_json, simulate_json, stderr, stdout, syncopate};

#[test]
fn collective_text_table_looks_like_nccl_tests() {
    let out = syncopate(&[
        "collective",
        "--cluster",
        "dgx-h100",
        "--op",
        "allreduce",
        "--bytes",
        "4K,1M,1G",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("busbw") && text.contains("algbw"), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .count(),
        3
    );
}

#[test]
fn collective_json_has_the_documented_keys() {
    let out = syncopate(&[
        "collective",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "2",
        "--op",
        "allgather",
        "--bytes",
        "1M,64M",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for key in [
        "bytes",
        "time_us",
        "algbw_gbytes_per_s",
        "busbw_gbytes_per_s",
        "algorithm",
        "protocol",
    ] {
        assert!(rows[0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(rows[1]["bytes"], 64 << 20);
}

#[test]
fn every_operation_runs_on_every_cluster() {
    for cluster in ["dgx1-v100", "v100-tcp", "dgx-h100", "v100-pcie-25gbe"] {
        for op in [
            "allreduce",
            "allgather",
            "reduce-scatter",
            "broadcast",
            "reduce",
            "alltoall",
        ] {
            let out = syncopate(&[
                "collective",
                "--cluster",
                cluster,
                "--op",
                op,
                "--bytes",
                "4K,256M",
            ]);
            assert!(out.status.success(), "{cluster} {op}: {}", stderr(&out));
        }
    }
}

#[test]
fn compare_prints_the_error_table() {
    let data = crate::common::validation_data("echo_nccl_allreduce_a100_ib200.csv");
    let out = syncopate(&[
        "collective",
        "--cluster",
        "a100-ib200",
        "--compare",
        data.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["error_by_gpus"].as_array().unwrap().len(), 6);
}

#[test]
fn a_carried_profile_names_the_profiles_measured_on_the_target_gpu() {
    let simulate = |model: &str| {
        let out = syncopate(&[
            "simulate",
            "--model",
            model,
            "--cluster",
            "dgx-h200",
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let carried = simulate("resnet50");
    assert!(
        carried.contains("compute carried to h200-sxm-141gb")
            && carried.contains(
                "profiles measured on h200-sxm-141gb (--model): resnet50-h200-amp, resnet50-h200-fp32"
            ),
        "{carried}"
    );
    // Measured there, it runs at its own times and points nowhere.
    let measured = simulate("resnet50-h200-fp32");
    assert!(!measured.contains("carried") && !measured.contains("profiles measured"));
}

#[test]
fn list_commands_print_shipped_names() {
    let out = syncopate(&["list", "clusters"]);
    assert!(out.status.success());
    for name in [
        "dgx1-v100",
        "v100-pcie",
        "v100-10gbe",
        "v100-100gib",
        "v100-nvlink-100gbe",
        "v100-pcie-25gbe",
        "v100-tcp",
        "a100-ib200",
        "dgx-a100",
        "dgx-h100",
    ] {
        assert!(stdout(&out).contains(name), "{name}");
    }
    let out = syncopate(&["list", "models"]);
    assert!(stdout(&out).contains("bert-large"));
    for what in ["devices", "compressors", "strategies"] {
        assert!(syncopate(&["list", what]).status.success(), "{what}");
    }
}

#[test]
fn bad_input_exits_non_zero_with_a_clear_message() {
    let cases: [(&[&str], &str); 7] = [
        (&["collective", "--cluster", "dgx-z100"], "valid clusters"),
        (
            &["collective", "--cluster", "dgx-h100", "--inter-gbps", "0"],
            "--inter-gbps",
        ),
        (
            &["collective", "--cluster", "dgx-h100", "--inter-gbps", "-5"],
            "--inter-gbps",
        ),
        (
            &["collective", "--cluster", "dgx-h100", "--nodes", "0"],
            "--nodes",
        ),
        (
            &[
                "collective",
                "--cluster",
                "dgx-h100",
                "--gpus-per-node",
                "0",
            ],
            "--gpus-per-node",
        ),
        (
            &["collective", "--cluster", "dgx-h100", "--bytes", "12Q"],
            "byte size",
        ),
        (
            &["collective", "--cluster", "dgx-h100", "--op", "allscatter"],
            "valid operations",
        ),
    ];
    for (args, expected) in cases {
        let out = syncopate(args);
        // A value a flag's parser refuses is a usage error (2); one the command refuses, 1.
        let usage = args.contains(&"0") && ["--nodes", "--gpus-per-node"].contains(&expected);
        assert_eq!(
            out.status.code(),
            Some(if usage { 2 } else { 1 }),
            "{args:?}"
        );
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(!stderr(&out).contains("panicked"), "{args:?}");
    }
}

#[test]
fn missing_file_and_usage_errors_have_their_exit_codes() {
    let out = syncopate(&["collective", "--cluster", "no/such/cluster.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no/such/cluster.json"));
    let out = syncopate(&["collective"]);
    assert_eq!(out.status.code(), Some(2), "usage errors exit 2");
}

#[test]
fn simulate_json_has_the_documented_keys() {
    let summary = crate::common::simulate_json(&[
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "2",
        "--strategy",
        "ddp",
    ]);
    for key in [
        "iteration_time_ms",
        "throughput_samples_per_s",
        "scaling_efficiency",
        "world_size",
        "compute_ms",
        "exposed_comm_ms",
        "compression_ms",
        "wire_bytes_per_rank",
        "seed",
        "strategy",
        "compute_scale",
        "collective_slowdown",
    ] {
        assert!(summary.get(key).is_some(), "missing {key}");
    }
    // NCCL's kernels share the V100 with backward.
    assert!(summary["collective_slowdown"].as_f64().unwrap() > 1.0);
    assert_eq!(summary["world_size"], 8);
    assert!(summary["scaling_efficiency"].as_f64().unwrap() <= 1.0);
}

#[test]
fn saved_plan_reproduces_the_strategy_exactly() {
    let dir = crate::common::scratch("save-plan");
    let plan = dir.join("plan.json");
    let plan_arg = plan.to_str().unwrap();
    let common = [
        "simulate",
        "--model",
        "bert-base",
        "--cluster",
        "v100-100gib",
        "--nodes",
        "4",
        "--format",
        "json",
    ];
    let first = syncopate(
        &[
            &common[..],
            &[
                "--strategy",
                "horovod",
                "--compressor",
                "fp16",
                "--save-plan",
                plan_arg,
            ],
        ]
        .concat(),
    );
    assert!(first.status.success(), "{}", stderr(&first));
    let second = syncopate(&[&common[..], &["--plan", plan_arg]].concat());
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(stdout(&first), stdout(&second));
    // The plan records its model and cluster: `--plan` alone runs the same scenario.
    let alone = syncopate(&["simulate", "--plan", plan_arg, "--format", "json"]);
    assert!(alone.status.success(), "{}", stderr(&alone));
    assert_eq!(stdout(&first), stdout(&alone));
    // Without a plan, the model and the cluster are named or refused by flag.
    for (args, flag) in [
        (["--model", "bert-base"], "--cluster"),
        (["--cluster", "v100-100gib"], "--model"),
    ] {
        let out = syncopate(&[&["simulate"][..], &args].concat());
        assert_eq!(out.status.code(), Some(1));
        assert!(stderr(&out).contains(flag), "{}", stderr(&out));
    }
}

/// `lower` writes the schedule a saved plan means, for the model and cluster the plan records;
/// `--nodes` lowers it for another world.
#[test]
fn lower_writes_the_schedule_of_a_saved_plan() {
    let dir = crate::common::scratch("lower");
    let plan = dir.join("plan.json");
    let out = syncopate(&[
        "simulate",
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "2",
        "--strategy",
        "dear",
        "--save-plan",
        plan.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let schedule = dir.join("schedule.json");
    let out = syncopate(&[
        "lower",
        "--plan",
        plan.to_str().unwrap(),
        "--out",
        schedule.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let loaded = syncopate_sim::schedule::Schedule::load(schedule.to_str().unwrap()).unwrap();
    assert_eq!((loaded.world.nodes, loaded.world.ranks_per_node), (2, 4));
    assert_eq!(loaded.strategy, "dear");
    assert!(
        loaded.steps.iter().any(|s| s.from_iteration == 1),
        "DeAR's updates"
    );
    let out = syncopate(&["lower", "--plan", plan.to_str().unwrap(), "--nodes", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let one: syncopate_sim::schedule::Schedule = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(one.world.nodes, 1);
    // A plan for another model is refused, naming the plan file.
    let out = syncopate(&[
        "lower",
        "--plan",
        plan.to_str().unwrap(),
        "--model",
        "vgg16",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("plan.json") && stderr(&out).contains("made for"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn same_seed_gives_byte_identical_output_and_trace() {
    let dir = crate::common::scratch("determinism");
    let run = |name: &str| {
        let trace = dir.join(name);
        let out = syncopate(&[
            "simulate",
            "--model",
            "gpt2",
            "--cluster",
            "a100-ib200",
            "--nodes",
            "2",
            "--strategy",
            "wfbp",
            "--jitter",
            "0.1",
            "--straggler",
            "0.1,1.5",
            "--iterations",
            "5",
            "--seed",
            "42",
            "--format",
            "json",
            "--trace",
            trace.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        (out.stdout, std::fs::read(trace).unwrap())
    };
    let (a_out, a_trace) = run("a.json");
    let (b_out, b_trace) = run("b.json");
    assert_eq!(a_out, b_out);
    assert_eq!(a_trace, b_trace);
    let summary: serde_json::Value = serde_json::from_slice(&a_out).unwrap();
    for key in ["mean_ms", "p50_ms", "p99_ms", "ci95_low_ms", "ci95_high_ms"] {
        assert!(
            summary["statistics"].get(key).is_some(),
            "missing statistics.{key}"
        );
    }
    let trace: serde_json::Value = serde_json::from_slice(&a_trace).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["name"]
        .as_str()
        .unwrap()
        .starts_with("bwd transformer.h.0")));
    assert!(events.iter().any(|e| e["args"]["bytes"].as_u64().is_some()));
}

#[test]
fn bad_plans_and_names_are_explained() {
    let dir = crate::common::scratch("bad-plans");
    let plan = dir.join("plan.json");
    let out = syncopate(&[
        "simulate",
        "--model",
        "vgg16",
        "--cluster",
        "dgx1-v100",
        "--strategy",
        "ddp",
        "--save-plan",
        plan.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let original: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let check = |edit: &dyn Fn(&mut serde_json::Value), model: &str, expected: &str| {
        let mut value = original.clone();
        edit(&mut value);
        std::fs::write(&plan, value.to_string()).unwrap();
        let out = syncopate(&[
            "simulate",
            "--model",
            model,
            "--cluster",
            "dgx1-v100",
            "--plan",
            plan.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{expected}");
        assert!(
            stderr(&out).contains(expected),
            "expected `{expected}` in: {}",
            stderr(&out)
        );
    };
    check(&|_| {}, "resnet50", "was made for `vgg16`");
    check(
        &|v| {
            v["groups"][0]["tensors"]
                .as_array_mut()
                .unwrap()
                .push(0.into())
        },
        "vgg16",
        "is also in groups",
    );
    check(
        &|v| {
            v["groups"][0]["tensors"].as_array_mut().unwrap().pop();
        },
        "vgg16",
        "in no group",
    );
    check(
        &|v| v["groups"][0]["tensors"][0] = 999.into(),
        "vgg16",
        "out of range",
    );
    check(
        &|v| {
            v["groups"][0]["compressor"] = "topk:0.01".into();
            v["groups"][0]["scheme"] = "allreduce".into();
        },
        "vgg16",
        "cannot be aggregated",
    );
    check(
        &|v| v["groups"][0]["scheme"] = "ring-of-fire".into(),
        "vgg16",
        "groups[0].scheme",
    );
    check(
        &|v| v["groups"][0]["compressor"] = "zip".into(),
        "vgg16",
        "valid forms",
    );
    for (flag, value, expected) in [
        ("--strategy", "bytescheduler2", "valid strategies"),
        ("--strategy", "fixed-groups:0", "≥ 1"),
        ("--strategy", "fixed-groups:99", "between 1 and"),
        ("--compressor", "topk:1.5", "valid forms"),
        ("--jitter", "-1", "--jitter"),
        ("--straggler", "2,2", "probability"),
    ] {
        let out = syncopate(&[
            "simulate",
            "--model",
            "vgg16",
            "--cluster",
            "dgx1-v100",
            flag,
            value,
        ]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{flag} {value}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains(expected),
            "{flag} {value}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn host_profile_drives_cpu_compression() {
    let dir = crate::common::scratch("host-profile");
    let profile = dir.join("host.json");
    let out = syncopate(&[
        "profile",
        "--backend",
        "host",
        "--largest",
        "65536",
        "--out",
        profile.to_str().unwrap(),
        "--repeats",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let loaded =
        syncopate_sim::inputs::device::DeviceProfile::load(profile.to_str().unwrap()).unwrap();
    assert_eq!(loaded.kind, syncopate_sim::inputs::device::DeviceKind::Cpu);
    assert_eq!(
        loaded.compression.len(),
        syncopate_sim::compress::catalog().len()
    );
    let args = [
        "simulate",
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "2",
        "--compressor",
        "efsignsgd",
        "--format",
        "json",
    ];
    let gpu = syncopate(&args);
    let cpu = syncopate(&[&args[..], &["--cpu-compression", profile.to_str().unwrap()]].concat());
    assert!(
        gpu.status.success() && cpu.status.success(),
        "{}",
        stderr(&cpu)
    );
    let compression = |out: &std::process::Output| {
        serde_json::from_str::<serde_json::Value>(&stdout(out)).unwrap()["compression_ms"]
            .as_f64()
            .unwrap()
    };
    assert!(compression(&cpu) > 0.0 && compression(&gpu) > 0.0);
    let not_cpu = syncopate(&[&args[..], &["--cpu-compression", "v100-sxm2-32gb"]].concat());
    assert_eq!(not_cpu.status.code(), Some(1));
    assert!(stderr(&not_cpu).contains("kind `cpu`"));
}

/// `collective --fit-out` on an MPI cluster: the host cap and per-message overhead fitted to
/// an allreduce sweep (the fit `lab up` makes), the file otherwise as it was.
#[test]
fn an_mpi_cluster_is_refitted_to_an_allreduce_sweep() {
    let dir = crate::common::scratch("mpi-refit");
    let shipped = crate::common::root().join("experiments/lab-validation/clusters/lab-2n-1g.json");
    let cluster = dir.join("lab.json");
    let mut original: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&shipped).unwrap()).unwrap();
    // A device named beside the shipped file is named by its full path in the copy.
    let device = original["device"].as_str().unwrap().to_string();
    if device.ends_with(".json") {
        let beside = shipped.parent().unwrap().join(&device);
        original["device"] = beside.to_string_lossy().into_owned().into();
    }
    std::fs::write(&cluster, original.to_string()).unwrap();
    // A path that moves 0.5 Gb/s per rank, plus 100 µs per message, at 2 ranks.
    let mut csv = String::from("gpus,size_bytes,time_us\n");
    for bytes in [1u64 << 12, 1 << 16, 1 << 20, 4 << 20, 16 << 20, 32 << 20] {
        csv.push_str(&format!(
            "2,{bytes},{:.1}\n",
            200.0 + bytes as f64 * 8.0 / 0.5e3
        ));
    }
    let sweep = dir.join("lab.sweep.csv");
    std::fs::write(&sweep, csv).unwrap();
    let args = |op: &str| {
        vec![
            "collective".to_string(),
            "--cluster".into(),
            cluster.to_string_lossy().into_owned(),
            "--op".into(),
            op.into(),
            "--compare".into(),
            sweep.to_string_lossy().into_owned(),
            "--fit-out".into(),
            cluster.to_string_lossy().into_owned(),
        ]
    };
    let refused = syncopate(
        &args("allgather")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("--op"), "{}", stderr(&refused));
    let out = syncopate(
        &args("allreduce")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let refit: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cluster).unwrap()).unwrap();
    assert_eq!(refit["device"], original["device"]);
    assert_eq!(refit["contention"], original["contention"]);
    let cap = refit["library"]["host_gbps"].as_f64().unwrap();
    assert!((cap / 0.5 - 1.0).abs() < 0.1, "{cap}");
    let method = refit["library"]["provenance"]["method"].as_str().unwrap();
    assert!(
        method.starts_with("refitted by `syncopate collective"),
        "{method}"
    );
}

#[test]
fn codecs_written_as_framework_ops_cost_their_ops_once_per_codec_call() {
    // MergeComp's DGC is 21 PyTorch ops per encode: compressing ResNet-50 tensor by tensor pays
    // them 161 times, compressing its merged groups a few times; the device's fused kernels
    // (the native curves) pay a launch or two per call.
    let time = |codecs: &str, calls: &str| {
        let summary = simulate_json(&[
            "--model",
            "resnet50",
            "--cluster",
            "v100-pcie",
            "--nodes",
            "1",
            "--gpus-per-node",
            "4",
            "--strategy",
            "horovod",
            "--compressor",
            "dgc:0.01",
            "--memory",
            "dgc",
            "--codec-calls",
            calls,
            "--codecs",
            codecs,
        ]);
        if codecs != "native" {
            assert_eq!(summary["codecs"], codecs);
        }
        summary["iteration_time_ms"].as_f64().unwrap()
    };
    let written = time("mergecomp", "tensor");
    let merged = time("mergecomp", "group");
    let native = time("native", "tensor");
    assert!(written > merged, "{written} vs {merged}");
    assert!(written > native, "{written} vs {native}");
}

#[test]
fn pytorch_codecs_run_in_line_on_the_compute_stream_and_a_plan_says_so() {
    // MergeComp's compressors are PyTorch ops called from Horovod's hook and synchronize():
    // their kernels queue on the default stream, so a GPU rank computes, then compresses.
    let dir = crate::common::scratch("codec-stream");
    let plan = dir.join("plan.json");
    let scenario = [
        "--model",
        "resnet50",
        "--cluster",
        "v100-pcie-mpi",
        "--gpus-per-node",
        "4",
        "--framework",
        "horovod",
        "--codecs",
        "mergecomp",
    ];
    let args = [
        "--strategy",
        "mergecomp",
        "--compressor",
        "randomk-indexed:0.01",
        "--memory",
        "dgc:0",
        "--format",
        "json",
        "--save-plan",
        plan.to_str().unwrap(),
    ];
    let out = syncopate(&[&["simulate"][..], &scenario, &args].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let ms = |key: &str| summary[key].as_f64().unwrap();
    assert!(ms("compression_ms") > 1.0, "{summary}");
    // Nothing of the codecs' time hides behind the backward pass.
    assert!(
        ms("iteration_time_ms") >= ms("compute_ms") + ms("compression_ms") - 1e-3,
        "{summary}"
    );
    let mut saved = read_json(&plan);
    assert_eq!(saved["codec_stream"], "compute");
    // Every strategy that tune compares plans its codecs on the set's stream, and so does the
    // tuned plan.
    let tuned = dir.join("tuned.json");
    let search = [
        "--search",
        "compression",
        "--compressor",
        "dgc:0.01",
        "--out",
        tuned.to_str().unwrap(),
    ];
    let out = syncopate(&[&["tune"][..], &scenario, &search].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stdout(&out).contains("codec_stream"), "{}", stdout(&out));
    assert_eq!(read_json(&tuned)["codec_stream"], "compute");
    // exec runs such a plan with its own kernels and says so.
    let out = syncopate(&[
        "exec",
        "--plan",
        tuned.to_str().unwrap(),
        "--backend",
        "host",
        "--ranks",
        "2",
        "--warmup",
        "1",
        "--iterations",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("framework `horovod` and codecs `mergecomp`"),
        "{}",
        stderr(&out)
    );
    // The same plan with its codecs beside the backward pass is not what the set runs.
    saved["codec_stream"] = "side".into();
    std::fs::write(&plan, saved.to_string()).unwrap();
    let out = syncopate(&["simulate", "--plan", plan.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("codec_stream") && stderr(&out).contains("mergecomp"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn sharded_strategies_report_memory_and_the_cuda_executor_refuses_their_plans() {
    let dir = crate::common::scratch("sharded");
    let plan = dir.join("fsdp.json");
    let plan_arg = plan.to_str().unwrap();
    // Large enough for several of ZeRO's 5e8-element buckets.
    let common = [
        "--model",
        "gpt2-xl",
        "--cluster",
        "dgx-h100",
        "--nodes",
        "1",
    ];
    let memory = |strategy: &str| {
        let summary =
            crate::common::simulate_json(&[&common[..], &["--strategy", strategy]].concat());
        let memory = summary["memory_per_rank"].clone();
        assert_eq!(memory["capacity_bytes"].as_u64(), Some(80 << 30));
        memory["model_states_bytes"].as_u64().unwrap()
    };
    let ddp = memory("ddp");
    let zero1 = memory("zero1");
    let zero2 = memory("zero2");
    let fsdp = memory("fsdp");
    assert!(
        fsdp < zero2 && zero2 < zero1 && zero1 < ddp,
        "{fsdp} {zero2} {zero1} {ddp}"
    );
    let out = syncopate(
        &[
            &["simulate"][..],
            &[
                "--model",
                "gpt2",
                "--cluster",
                "dgx-h100",
                "--gpus-per-node",
                "2",
            ],
            &[
                "--strategy",
                "fsdp",
                "--param-dtype",
                "bf16",
                "--save-plan",
                plan_arg,
            ],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("memory per rank"), "{}", stdout(&out));
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    assert_eq!(saved["sharding"]["stage"], "zero3");
    assert_eq!(saved["sharding"]["param_dtype"], "bf16");
    // The host and MPI backends run a sharded plan (tests/runtime.rs checks them); the CUDA
    // backend refuses it by name before it looks for a GPU.
    let out = syncopate(&["exec", "--plan", plan_arg, "--backend", "cuda"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("sharding") && err.contains("cuda backend") && err.contains("--backend host"),
        "{err}"
    );
    let out = syncopate(
        &[
            &["simulate"][..],
            &common,
            &["--strategy", "fsdp", "--prefetch", "65"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--prefetch"), "{}", stderr(&out));
    // ZeRO++'s flags where they cannot apply are refused by name, never left out silently.
    for (flags, named) in [
        (&["--strategy", "ddp", "--hpz"][..], "--hpz"),
        (&["--strategy", "zero2", "--hpz"], "--hpz"),
        (&["--strategy", "hsdp", "--hpz"], "--hpz"),
        (
            &["--strategy", "ddp", "--param-dtype", "int8"],
            "--param-dtype",
        ),
        (
            &["--strategy", "zero1", "--param-dtype", "int8"],
            "--param-dtype",
        ),
        (&["--strategy", "fsdp", "--compressor", "int4:0"], "int4:0"),
        // torchao's float8 gathers: FSDP2's, of nn.Linear weights (HF GPT-2's are Conv1D).
        (
            &["--strategy", "ddp", "--float8-all-gather"],
            "--float8-all-gather",
        ),
        (
            &["--strategy", "zero2", "--float8-all-gather"],
            "--float8-all-gather",
        ),
        (&["--strategy", "fsdp", "--float8-all-gather"], "Conv1D"),
    ] {
        let out = syncopate(&[&["simulate"][..], &common, flags].concat());
        assert_eq!(out.status.code(), Some(1), "{flags:?}");
        assert!(stderr(&out).contains(named), "{flags:?}: {}", stderr(&out));
    }
}
