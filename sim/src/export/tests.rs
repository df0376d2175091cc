//! Exports reproduce the groups they can express and say what they cannot.

use super::*;
use crate::inputs::model::ModelProfile;
use crate::inputs::topology::{Cluster, ClusterOverrides};
use crate::strategy::{Strategy, StrategyOptions};

fn scenario(model: &str) -> Scenario {
    let cluster = Cluster::load(
        "v100-10gbe",
        ClusterOverrides {
            nodes: Some(2),
            ..ClusterOverrides::default()
        },
    )
    .unwrap();
    Scenario::new(ModelProfile::load(model).unwrap(), cluster).unwrap()
}

fn groups(plan: &Plan) -> Vec<Vec<usize>> {
    plan.groups.iter().map(|g| g.tensors.clone()).collect()
}

/// The groups of the plan `target` runs with the settings nearest to `plan`.
fn exported_groups(target: Target, plan: &Plan, base: &Scenario) -> Vec<Vec<usize>> {
    let near = nearest(target, plan, &base.model);
    let scenario = near.settings.scenario(base).unwrap();
    groups(&near.settings.plan(&scenario).unwrap())
}

#[test]
fn a_ddp_plan_exports_as_ddp_s_defaults_and_a_fixed_grouping_as_caps_that_rebuild_it() {
    let base = scenario("resnet50");
    let ddp = Strategy::Ddp
        .plan(&base, &StrategyOptions::default())
        .unwrap();
    let near = nearest(Target::Ddp, &ddp, &base.model);
    let Settings::Ddp(settings) = &near.settings else {
        panic!()
    };
    assert_eq!(settings.caps, DdpCaps::Default);
    assert!(near.unexpressed.is_empty(), "{:?}", near.unexpressed);
    // Any contiguous grouping in DDP's order is rebuilt exactly by its caps.
    for count in [3, 7, 20] {
        let plan = Strategy::FixedGroups {
            count,
            rule: crate::strategy::GroupingRule::Bytes,
        }
        .plan(&base, &StrategyOptions::default())
        .unwrap();
        assert_eq!(
            exported_groups(Target::Ddp, &plan, &base),
            groups(&plan),
            "{count} groups"
        );
    }
}

#[test]
fn what_a_framework_cannot_express_is_named() {
    let base = scenario("resnet50");
    let options = StrategyOptions {
        compressor: "topk:0.01".parse().unwrap(),
        memory: "residual".parse().unwrap(),
        ..StrategyOptions::default()
    };
    let plan = Strategy::ByteScheduler.plan(&base, &options).unwrap();
    let near = nearest(Target::Ddp, &plan, &base.model);
    let notes = near.unexpressed.join("\n");
    assert!(notes.contains("partitions"), "{notes}");
    assert!(notes.contains("priority"), "{notes}");
    assert!(notes.contains("topk"), "{notes}");
    let Settings::Ddp(settings) = &near.settings else {
        panic!()
    };
    assert_eq!(settings.hook.0, Compressor::None);
}

#[test]
fn horovod_exports_its_own_fusion_as_settings_and_other_groups_explicitly() {
    let base = scenario("resnet50");
    let horovod = StrategyOptions {
        fusion_bytes: 128 << 20,
        cycle_us: 1000.0,
        ..StrategyOptions::default()
    };
    let own = Strategy::Horovod.plan(&base, &horovod).unwrap();
    let near = nearest(Target::Horovod, &own, &base.model);
    let Settings::Horovod(settings) = &near.settings else {
        panic!()
    };
    assert_eq!(settings.groups, None);
    assert!(near.settings.is_default());
    let fixed = Strategy::FixedGroups {
        count: 4,
        rule: crate::strategy::GroupingRule::Bytes,
    }
    .plan(&base, &StrategyOptions::default())
    .unwrap();
    assert_eq!(
        exported_groups(Target::Horovod, &fixed, &base),
        groups(&fixed)
    );
    let near = nearest(Target::Horovod, &fixed, &base.model);
    let text = near.settings.render(&base.model, &[]);
    assert!(text.contains("\"fc.weight\""), "{text}");
    assert!(text.contains("HOROVOD_DISABLE_GROUP_FUSION"), "{text}");
}

#[test]
fn simulate_flags_name_the_settings_a_strategy_runs() {
    let settings = Settings::Ddp(DdpSettings {
        caps: DdpCaps::Uniform(5 << 20),
        gradient_as_bucket_view: true,
        hook: ("powersgd:4".parse().unwrap(), "residual".parse().unwrap()),
    });
    let flags = settings.simulate_flags().unwrap().join(" ");
    assert_eq!(
        flags,
        "--strategy ddp --bucket-mb 5 --first-bucket-mb 5 --framework pytorch-ddp-bucket-view --compressor powersgd:4 --memory residual --codecs pytorch-ddp"
    );
    // PowerSGD's hook is written with error feedback: without it, the device's curves price it.
    let without = Settings::Ddp(DdpSettings {
        caps: DdpCaps::Uniform(5 << 20),
        gradient_as_bucket_view: true,
        hook: ("powersgd:4".parse().unwrap(), "none".parse().unwrap()),
    });
    let flags = without.simulate_flags().unwrap().join(" ");
    assert!(!flags.contains("--codecs"), "{flags}");
    let text = settings.render(
        &ModelProfile::load("resnet50").unwrap(),
        &["a header".into()],
    );
    assert!(text.starts_with("# a header\n"), "{text}");
    assert!(text.contains("bucket_cap_mb=5,"), "{text}");
    assert!(text.contains("matrix_approximation_rank=4"), "{text}");
}

#[test]
fn a_model_of_several_dtypes_is_named_as_what_ddp_buckets_apart() {
    let mut base = scenario("resnet50");
    let plan = Strategy::Ddp
        .plan(&base, &StrategyOptions::default())
        .unwrap();
    let ddp = nearest(Target::Ddp, &plan, &base.model).settings;
    assert!(caveats(&ddp, &base.model).is_empty());
    base.model.tensors[0].dtype = crate::inputs::model::DType::F16;
    let near = nearest(Target::Ddp, &plan, &base.model);
    assert!(
        near.unexpressed.iter().any(|n| n.contains("dtypes")),
        "{:?}",
        near.unexpressed
    );
    let horovod = nearest(Target::Horovod, &plan, &base.model).settings;
    assert!(caveats(&horovod, &base.model).is_empty());
}

#[test]
fn deepspeed_exports_its_communication_type_and_names_the_buckets_it_cannot_change() {
    let base = scenario("bert-large");
    let options = StrategyOptions {
        compressor: Compressor::Bf16,
        ..StrategyOptions::default()
    };
    // Its own plan: nothing left out.
    let own = Strategy::DeepSpeed.plan(&base, &options).unwrap();
    let near = nearest(Target::DeepSpeed, &own, &base.model);
    assert!(near.unexpressed.is_empty(), "{:?}", near.unexpressed);
    let text = near.settings.render(&base.model, &[]);
    assert!(
        text.contains("\"communication_data_type\": \"bf16\"") && text.contains("\"stage\": 0"),
        "{text}"
    );
    // DDP's buckets, fp16 with error feedback: the buckets and the memory are named.
    let ddp = Strategy::Ddp
        .plan(
            &base,
            &StrategyOptions {
                compressor: Compressor::Fp16,
                memory: Memory::Residual,
                ..StrategyOptions::default()
            },
        )
        .unwrap();
    let near = nearest(Target::DeepSpeed, &ddp, &base.model);
    let notes = near.unexpressed.join("\n");
    assert!(
        notes.contains("after backward") && notes.contains("communication_data_type"),
        "{notes}"
    );
    assert_eq!(
        near.settings.compression(),
        (Compressor::None, Memory::None)
    );
    // The grid: fp32, and the casts asked for, at each stage and bucket size, and stage 3
    // prefetching one or two units.
    let grid = candidates(Target::DeepSpeed, &[(Compressor::Fp16, Memory::None)], 8);
    assert_eq!(grid.len(), (1 + 2 * 7) * 2 + 2 * 2);
}

#[test]
fn byteps_runs_each_gradient_in_partitions_first_in_first_out() {
    let base = scenario("resnet50");
    let byteps = Strategy::BytePs
        .plan(&base, &StrategyOptions::default())
        .unwrap();
    let near = nearest(Target::BytePs, &byteps, &base.model);
    assert_eq!(
        near.settings,
        Settings::BytePs(BytePsSettings {
            partition_bytes: 4_096_000,
            fp16: false
        })
    );
    // The strategy's priorities are the one thing BytePS's PyTorch plugin does not run.
    assert_eq!(near.unexpressed.len(), 1, "{:?}", near.unexpressed);
    assert!(near.unexpressed[0].contains("priority"));
    let scenario = near.settings.scenario(&base).unwrap();
    let runs = near.settings.plan(&scenario).unwrap();
    assert_eq!(runs.policy.launch, Launch::PlanOrder);
    assert_eq!(
        runs.policy.comm_streams,
        crate::base::limits::MAX_COMM_STREAMS
    );
    assert_eq!(groups(&runs), groups(&byteps));
    for group in &runs.groups {
        let bytes = base.model.bytes_of(&group.tensors);
        assert_eq!(
            u64::from(group.partitions),
            bytes.div_ceil(4_096_000).max(1)
        );
        assert_eq!(group.scheme, Scheme::Ps);
    }
}

#[test]
fn byteps_cuts_the_half_tensor_and_rounds_partitions_to_its_pages() {
    let base = scenario("resnet50");
    let largest = (0..base.model.num_tensors())
        .map(|t| base.model.bytes_of(&[t]))
        .max()
        .unwrap();
    let settings = |fp16| BytePsSettings {
        partition_bytes: 1_000_000,
        fp16,
    };
    let partitions = |settings: BytePsSettings, base: &Scenario| {
        let settings = Settings::BytePs(settings);
        let plan = settings.plan(&settings.scenario(base).unwrap()).unwrap();
        plan.groups.iter().map(|g| g.partitions).max().unwrap()
    };
    // 1,000,000 rounded up to 4 GPUs' pages (16,384 B): 1,015,808; fp16 halves the bytes.
    let core = 1_015_808u64;
    assert_eq!(
        u64::from(partitions(settings(false), &base)),
        largest.div_ceil(core)
    );
    assert_eq!(
        u64::from(partitions(settings(true), &base)),
        (largest / 2).div_ceil(core)
    );
    // On one machine BytePS sends whole tensors over NCCL, but the plugin's cast still runs.
    let mut one = base.clone();
    one.cluster.nodes = 1;
    let settings = Settings::BytePs(settings(true));
    let plan = settings.plan(&settings.scenario(&one).unwrap()).unwrap();
    assert!(plan
        .groups
        .iter()
        .all(|g| g.compressor == Compressor::Fp16 && g.scheme == Scheme::Allreduce));
}

#[test]
fn byteps_names_the_fusion_and_allreduce_it_cannot_run() {
    let base = scenario("resnet50");
    let ddp = Strategy::Ddp
        .plan(&base, &StrategyOptions::default())
        .unwrap();
    let near = nearest(Target::BytePs, &ddp, &base.model);
    let notes = near.unexpressed.join("\n");
    assert!(notes.contains("pushes each gradient by itself"), "{notes}");
    assert!(
        notes.contains("another scheme than parameter servers"),
        "{notes}"
    );
    assert!(!notes.contains("partitions"), "{notes}");
    let text = near.settings.render(&base.model, &[]);
    assert!(
        text.contains("BYTEPS_PARTITION_BYTES\"] = \"4096000\""),
        "{text}"
    );
    assert!(!text.contains("Compression.fp16"), "{text}");
}

#[test]
fn deepspeed_says_its_sign_optimizers_are_gone() {
    let base = scenario("resnet50");
    let options = StrategyOptions {
        compressor: Compressor::OneBit,
        memory: "residual".parse().unwrap(),
        ..StrategyOptions::default()
    };
    let plan = Strategy::Ddp.plan(&base, &options).unwrap();
    let notes = nearest(Target::DeepSpeed, &plan, &base.model).unexpressed;
    assert!(
        notes.iter().any(|n| n.contains("removed in 0.19.7")),
        "{notes:?}"
    );
}

#[test]
fn an_fsdp_plan_exports_its_block_units_and_a_split_module_joins_the_root() {
    let base = scenario("gpt2-xl");
    let mut options = StrategyOptions::default();
    options.sharding.blocks_per_unit = 4;
    options.sharding.prefetch = 2;
    let plan = Strategy::Fsdp.plan(&base, &options).unwrap();
    let near = nearest(Target::Fsdp, &plan, &base.model);
    assert!(near.unexpressed.is_empty(), "{:?}", near.unexpressed);
    let Settings::Fsdp(settings) = &near.settings else {
        panic!()
    };
    assert_eq!(settings.units, FsdpUnits::Blocks(4));
    assert_eq!(exported_groups(Target::Fsdp, &plan, &base), groups(&plan));
    // 48 blocks, 4 a unit: 12 fully_shard calls on lists of 4 blocks, in forward order.
    let text = near.settings.render(&base.model, &[]);
    assert!(text.contains("    [\"transformer.h.0\", \"transformer.h.1\", \"transformer.h.2\", \"transformer.h.3\"],\n"), "{text}");
    assert_eq!(text.matches("\"transformer.h.").count(), 48);
    assert!(text.contains("set_modules_to_forward_prefetch"), "{text}");

    // A unit that takes one weight out of a block's layer: fully_shard cannot split the
    // layer, so the weight joins the root and the note says so.
    let mut split = plan.clone();
    let root = plan.sharding.as_ref().unwrap().resident[0];
    let (from, to) = match root {
        0 | 1 => (2, 3),
        _ => (1, 0),
    };
    let moved = split.groups[from].tensors.pop().unwrap();
    split.groups[to].tensors.push(moved);
    split.groups[to].tensors.sort_unstable();
    let near = nearest(Target::Fsdp, &split, &base.model);
    assert!(
        near.unexpressed.iter().any(|n| n.contains("join the root")),
        "{:?}",
        near.unexpressed
    );
    let Settings::Fsdp(settings) = &near.settings else {
        panic!()
    };
    assert!(matches!(settings.units, FsdpUnits::Explicit(_)));
    let exported = exported_groups(Target::Fsdp, &split, &base);
    let wte = base
        .model
        .tensors
        .iter()
        .position(|t| t.name == "transformer.wte.weight");
    let root = exported.iter().find(|g| g.contains(&wte.unwrap())).unwrap();
    assert!(root.contains(&moved));
}

#[test]
fn a_unit_of_every_block_shards_the_blocks_not_the_list_that_holds_them() {
    // GPT-2's blocks sit in a ModuleList (`transformer.h`) that forward iterates but never
    // calls: fully_shard on it would never gather (seen in experiments/fsdp-lab).
    let base = scenario("gpt2-xl");
    let mut options = StrategyOptions::default();
    options.sharding.blocks_per_unit = 48;
    let plan = Strategy::Fsdp.plan(&base, &options).unwrap();
    let near = nearest(Target::Fsdp, &plan, &base.model);
    assert!(near.unexpressed.is_empty(), "{:?}", near.unexpressed);
    let text = near.settings.render(&base.model, &[]);
    assert!(!text.contains("\"transformer.h\""), "{text}");
    assert_eq!(text.matches("\"transformer.h.").count(), 48);
    assert_eq!(exported_groups(Target::Fsdp, &plan, &base), groups(&plan));
}

#[test]
fn fsdp_names_what_it_cannot_run_and_other_frameworks_name_sharding() {
    let base = scenario("gpt2-xl");
    let ddp = Strategy::Ddp
        .plan(&base, &StrategyOptions::default())
        .unwrap();
    let near = nearest(Target::Fsdp, &ddp, &base.model);
    assert!(near
        .unexpressed
        .iter()
        .any(|n| n.contains("replicated plan")));
    let mut options = StrategyOptions::default();
    options.sharding.prefetch = 0;
    options.sharding.param_dtype = crate::sharding::ParamDtype::Bf16;
    let fsdp = Strategy::Fsdp.plan(&base, &options).unwrap();
    let near = nearest(Target::Fsdp, &fsdp, &base.model);
    let notes = near.unexpressed.join("\n");
    assert!(
        notes.contains("no prefetch") && notes.contains("bf16"),
        "{notes}"
    );
    let near = nearest(Target::Ddp, &fsdp, &base.model);
    assert!(near
        .unexpressed
        .iter()
        .any(|n| n.contains("sharding zero3")));
}

#[test]
fn tuned_fsdp_settings_fit_and_beat_the_default_wrapping() {
    let base = scenario("gpt2-xl");
    let bf16 = [(Compressor::Bf16, Memory::None)];
    let search = || {
        tune_settings(
            &base,
            Target::Fsdp,
            crate::search::SearchSpace::All,
            &bf16,
            &|_| {},
        )
    };
    let tuned = search().unwrap();
    assert!(tuned.default.is_default());
    assert!(tuned.best_time <= tuned.default_time);
    let scenario = tuned.best.scenario(&base).unwrap();
    let plan = tuned.best.plan(&scenario).unwrap();
    crate::predict::memory::check_plan_fits(&scenario, &plan, "test").unwrap();
    // Deterministic: the same search finds the same settings.
    let again = search().unwrap();
    assert_eq!(again.best, tuned.best);
}

/// With `fp8:e4m3` named, `tune --framework fsdp` tries torchao's float8 gathers: on gpt2-xl
/// whose block weights are nn.Linear's (nanoGPT's layout) on H100s with 25 Gb/s NICs they win,
/// and the plan exports back to the same settings; where they cannot run (HF GPT-2's Conv1D
/// weights, a V100 without float8 products) they are skipped.
#[test]
fn tune_tries_float8_gathers_where_the_model_has_float8_linears() {
    let float8 = [(
        Compressor::Fp8(crate::compress::Fp8Format::E4m3),
        Memory::None,
    )];
    let search = |base: &Scenario| {
        tune_settings(
            base,
            Target::Fsdp,
            crate::search::SearchSpace::All,
            &float8,
            &|_| {},
        )
        .unwrap()
    };
    let h100 = |model: ModelProfile| {
        let overrides = ClusterOverrides {
            nodes: Some(2),
            inter_gbps: Some(25.0),
            ..ClusterOverrides::default()
        };
        Scenario::new(model, Cluster::load("dgx-h100", overrides).unwrap()).unwrap()
    };
    let mut linear = ModelProfile::load("gpt2-xl").unwrap();
    for t in &mut linear.tensors {
        if t.module.as_deref() == Some("Conv1D") {
            t.module = Some("Linear".into());
        }
    }
    let mut v100 = scenario("gpt2-xl");
    v100.model = linear.clone();
    for base in [h100(ModelProfile::load("gpt2-xl").unwrap()), v100] {
        let Settings::Fsdp(best) = search(&base).best else {
            panic!()
        };
        assert!(!best.float8_all_gather);
    }
    let base = h100(linear);
    let tuned = search(&base);
    let Settings::Fsdp(best) = &tuned.best else {
        panic!()
    };
    assert!(best.float8_all_gather, "{}", tuned.best.describe());
    assert!(tuned.best_time < tuned.default_time);
    assert_eq!(tuned.best.precision(), float8[0]);
    let plan = tuned
        .best
        .plan(&tuned.best.scenario(&base).unwrap())
        .unwrap();
    assert!(plan.sharding.as_ref().unwrap().float8_all_gather);
    let near = nearest(Target::Fsdp, &plan, &base.model);
    assert_eq!(near.settings, tuned.best);
    let text = near.settings.render(&base.model, &[]);
    assert!(
        text.contains("enable_fsdp_float8_all_gather=True"),
        "{text}"
    );
    assert!(
        text.contains("\"transformer.h.0.attn.c_attn\",\n"),
        "{text}"
    );
    assert!(!text.contains("transformer.wte"), "{text}");
}

#[test]
fn zero_plans_export_as_deepspeed_stages_with_the_bucket_size_that_rebuilds_them() {
    let base = scenario("gpt2-xl");
    for (strategy, stage) in [(Strategy::Zero1, 1), (Strategy::Zero2, 2)] {
        let mut options = StrategyOptions::default();
        options.sharding.bucket_elements = 50_000_000;
        let plan = strategy.plan(&base, &options).unwrap();
        let near = nearest(Target::DeepSpeed, &plan, &base.model);
        assert!(near.unexpressed.is_empty(), "{:?}", near.unexpressed);
        let Settings::DeepSpeed(settings) = &near.settings else {
            panic!()
        };
        assert_eq!(
            (settings.stage, settings.bucket_elements),
            (stage, 50_000_000)
        );
        assert_eq!(
            exported_groups(Target::DeepSpeed, &plan, &base),
            groups(&plan)
        );
        let text = near.settings.render(&base.model, &[]);
        assert!(text.contains("\"reduce_bucket_size\": 50000000"), "{text}");
        // Stage 2 is priced with its reductions overlapping backward: the export says so.
        assert_eq!(
            text.contains("\"overlap_comm\": True"),
            stage == 2,
            "{text}"
        );
        assert_eq!(near.settings.framework(), "deepspeed-zero");
    }
    // FSDP's parameter sharding is DeepSpeed's stage 3, with buckets of a block; what
    // DeepSpeed does its own way is said.
    let fsdp = Strategy::Fsdp
        .plan(&base, &StrategyOptions::default())
        .unwrap();
    let near = nearest(Target::DeepSpeed, &fsdp, &base.model);
    assert_eq!(near.unexpressed.len(), 1, "{:?}", near.unexpressed);
    assert!(near.unexpressed[0].contains("module by module"));
    assert_eq!(
        exported_groups(Target::DeepSpeed, &fsdp, &base),
        groups(&fsdp)
    );
    let text = near.settings.render(&base.model, &[]);
    // GPT-2 XL's block: 12 tensors, 30.7 million elements.
    for key in [
        "\"stage\": 3",
        "\"reduce_bucket_size\": 30740800",
        "\"stage3_prefetch_bucket_size\": 30740800",
        "\"zero_quantized_weights\": False",
        "\"zero_quantized_gradients\": False",
    ] {
        assert!(text.contains(key), "{key}: {text}");
    }
    // The grid: stage 0, and both stages at seven bucket sizes, in fp32 and bf16, and stage 3
    // prefetching one or two units.
    let grid = candidates(Target::DeepSpeed, &[(Compressor::Bf16, Memory::None)], 8);
    assert_eq!(grid.len(), (1 + 2 * 7) * 2 + 2 * 2);
}

/// ZeRO++: a plan gathering in int8 and reducing in int4 exports as stage 3 with both
/// switches, priced as the plan itself is; `tune` tries them when an `int4` is named.
#[test]
fn zero_plus_plus_plans_export_with_quantized_weights_and_gradients() {
    let base = scenario("gpt2-xl");
    let mut options = StrategyOptions {
        compressor: Compressor::Int4 { block: 2048 },
        ..StrategyOptions::default()
    };
    options.sharding.param_dtype = crate::sharding::ParamDtype::Int8;
    let plan = Strategy::Fsdp.plan(&base, &options).unwrap();
    let near = nearest(Target::DeepSpeed, &plan, &base.model);
    let Settings::DeepSpeed(settings) = &near.settings else {
        panic!()
    };
    assert!(settings.quantized_weights && settings.communication == options.compressor);
    assert!(
        near.unexpressed.iter().any(|n| n.contains("qgZ")),
        "{:?}",
        near.unexpressed
    );
    let (scenario, exported) = near.settings.scenario_and_plan(&base).unwrap();
    assert_eq!(groups(&exported), groups(&plan));
    assert_eq!(exported.sharding, plan.sharding);
    let own = crate::predict::evaluate::steady_iteration_time(&scenario, &plan).unwrap();
    assert_eq!(near.settings.iteration_time(&base).unwrap(), own);
    let text = near.settings.render(&base.model, &[]);
    assert!(text.contains("\"zero_quantized_weights\": True"), "{text}");
    assert!(
        text.contains("\"zero_quantized_gradients\": True"),
        "{text}"
    );
    // Stage 0 to 2 in fp32, and stage 3 without ZeRO++, or with it, its weights quantized or
    // not, with hpZ over a node or not (one rank a node: no hpZ).
    let choices = [(options.compressor, Memory::None)];
    assert_eq!(
        candidates(Target::DeepSpeed, &choices, 8).len(),
        1 + 2 * 7 + 2 * (1 + 2 * 2)
    );
    assert_eq!(
        candidates(Target::DeepSpeed, &choices, 1).len(),
        1 + 2 * 7 + 2 * (1 + 2)
    );
}

#[test]
fn an_hsdp_plan_exports_as_fsdp2_on_a_two_dimensional_mesh() {
    let base = scenario("gpt2-xl");
    let hsdp = Strategy::Hsdp
        .plan(&base, &StrategyOptions::default())
        .unwrap();
    let near = nearest(Target::Fsdp, &hsdp, &base.model);
    assert!(near.unexpressed.is_empty(), "{:?}", near.unexpressed);
    let Settings::Fsdp(settings) = &near.settings else {
        panic!()
    };
    assert!(settings.hybrid);
    assert_eq!(exported_groups(Target::Fsdp, &hsdp, &base), groups(&hsdp));
    let text = near.settings.render(&base.model, &[]);
    assert!(
        text.contains("def hybrid_mesh(") && text.contains("mesh = hybrid_mesh()"),
        "{text}"
    );
    let flags = near.settings.simulate_flags().unwrap();
    assert_eq!(flags[..2], ["--strategy", "hsdp"]);
}
