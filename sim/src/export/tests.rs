//! Exports reproduce the groups they can express and say what they cannot.

use super::*;
use crate::model::ModelProfile;
use crate::strategy::{Strategy, StrategyOptions};
use crate::topology::{Cluster, ClusterOverrides};

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
        "--strategy ddp --bucket-mb 5 --first-bucket-mb 5 --framework pytorch-ddp-bucket-view --compressor powersgd:4 --memory residual"
    );
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
    assert!(caveats(Target::Ddp, &base.model).is_empty());
    base.model.tensors[0].dtype = crate::model::DType::F16;
    let near = nearest(Target::Ddp, &plan, &base.model);
    assert!(
        near.unexpressed.iter().any(|n| n.contains("dtypes")),
        "{:?}",
        near.unexpressed
    );
    assert!(caveats(Target::Horovod, &base.model).is_empty());
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
    // The grid: fp32, and the casts asked for.
    let grid = candidates(Target::DeepSpeed, &[(Compressor::Fp16, Memory::None)]);
    assert_eq!(grid.len(), 2);
}
