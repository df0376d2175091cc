//! Every shipped data file loads, and model profiles match the exact tensor inventories.

use crate::common::{stderr, stdout, syncopate, validation_data};
use syncopate_sim::base::data::DataKind;
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::flops::{self, Verdict};
use syncopate_sim::inputs::model::{ModelProfile, Precision, Status};
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};

#[test]
fn every_shipped_file_loads_and_validates() {
    for name in DataKind::Model.shipped_names() {
        ModelProfile::load(name).unwrap_or_else(|e| panic!("model {name}: {e}"));
    }
    for name in DataKind::Device.shipped_names() {
        DeviceProfile::load(name).unwrap_or_else(|e| panic!("device {name}: {e}"));
    }
    for name in DataKind::Cluster.shipped_names() {
        Cluster::load(name, ClusterOverrides::default())
            .unwrap_or_else(|e| panic!("cluster {name}: {e}"));
    }
    assert_eq!(DataKind::Model.shipped_names().len(), 32);
}

/// (profile captured on an H200, the shipped V100 profile of the same model and batch).
const H200_CAPTURES: [(&str, &str); 9] = [
    ("resnet50-h200-fp32", "resnet50"),
    ("resnet50-h200-amp", "resnet50"),
    ("bert-base-h200-fp32", "bert-base"),
    ("bert-base-h200-amp", "bert-base"),
    ("gpt2-h200-fp32", "gpt2"),
    ("gpt2-h200-amp", "gpt2"),
    ("resnet101-h200-fp32", "resnet101"),
    ("vgg16-h200-fp32", "vgg16"),
    ("bert-large-h200-fp32", "bert-large"),
];

/// DeAR's workloads captured on an H200 (`experiments/dear`): no shipped profile of the same model
/// and batch gives them FLOP counts, so they carry by the devices' `compute_speed_vs_v100`.
const H200_CAPTURES_WITHOUT_FLOPS: [&str; 5] = [
    "dear-resnet50-h200-fp32",
    "dear-densenet201-h200-fp32",
    "dear-inception-v4-h200-fp32",
    "dear-bert-base-h200-fp32",
    "dear-bert-large-h200-fp32",
];

#[test]
fn h200_captures_hold_their_models_tensors_and_flop_counts_measured_on_the_h200() {
    for (captured, shipped) in H200_CAPTURES {
        let (captured, shipped) = (
            ModelProfile::load(captured).unwrap(),
            ModelProfile::load(shipped).unwrap(),
        );
        assert_eq!(captured.device, "h200-sxm-141gb", "{}", captured.name);
        assert_eq!(captured.batch_size_per_gpu, shipped.batch_size_per_gpu);
        // The same tensors with the same counts; autocast may make some ready in another order.
        let counts = |m: &ModelProfile| {
            let mut all: Vec<_> = m
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.numel, t.uses_per_sample))
                .collect();
            all.sort();
            all
        };
        assert_eq!(counts(&captured), counts(&shipped), "{}", captured.name);
        assert_eq!(
            flops::forward_macs_per_sample(&captured),
            flops::forward_macs_per_sample(&shipped)
        );
        let timing = &captured.timing;
        for provenance in [
            Some(&timing.backward),
            Some(&timing.forward),
            Some(&timing.optimizer),
            timing.first_gradient.as_ref(),
            timing.batch.as_ref(),
        ] {
            assert_eq!(
                provenance.unwrap().status,
                Status::Measured,
                "{}",
                captured.name
            );
        }
        let precision = captured.arithmetic.as_ref().unwrap().precision;
        let amp = captured.name.ends_with("-amp");
        assert_eq!(precision == Precision::Fp16, amp, "{}", captured.name);
    }
}

#[test]
fn shipped_names_match_the_name_field() {
    for name in DataKind::Model.shipped_names() {
        assert_eq!(ModelProfile::load(name).unwrap().name, name);
    }
    for name in DataKind::Cluster.shipped_names() {
        assert_eq!(
            Cluster::load(name, ClusterOverrides::default())
                .unwrap()
                .name,
            name
        );
    }
}

/// (shipped model, inventory file) for every model with an exact inventory.
const INVENTORIES: [(&str, &str); 14] = [
    ("resnet50", "inventory_resnet50.csv"),
    ("resnet101", "inventory_resnet101.csv"),
    ("resnet152", "inventory_resnet152.csv"),
    ("vgg16", "inventory_vgg16.csv"),
    ("vgg19", "inventory_vgg19.csv"),
    ("alexnet", "inventory_alexnet.csv"),
    ("inception-v3", "inventory_inception_v3.csv"),
    ("densenet201", "inventory_densenet201.csv"),
    ("bert-base", "inventory_bert_base_squad_hf.csv"),
    ("bert-large", "inventory_bert_large_squad_hf.csv"),
    ("gpt2", "inventory_gpt2_small_lmhead_hf.csv"),
    ("gpt2-medium", "inventory_gpt2_medium_lmhead_hf.csv"),
    ("gpt2-large", "inventory_gpt2_large_lmhead_hf.csv"),
    ("gpt2-xl", "inventory_gpt2_xl_lmhead_hf.csv"),
];

/// (name, numel, registration index) rows of an inventory CSV, in file order.
fn inventory(file: &str) -> Vec<(String, u64, usize)> {
    let text = std::fs::read_to_string(validation_data(file)).unwrap();
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            (
                fields[1].to_string(),
                fields[3].parse().unwrap(),
                fields[4].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn models_match_their_inventories_exactly() {
    for (model_name, file) in INVENTORIES {
        let model = ModelProfile::load(model_name).unwrap();
        let rows = inventory(file);
        assert_eq!(
            model.num_tensors(),
            rows.len(),
            "{model_name}: tensor count"
        );
        assert_eq!(
            model.total_numel(),
            rows.iter().map(|r| r.1).sum::<u64>(),
            "{model_name}: total elements"
        );
        let mut model_set: Vec<(&str, u64, usize)> = model
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.numel, t.registration_index))
            .collect();
        let mut inventory_set: Vec<(&str, u64, usize)> =
            rows.iter().map(|r| (r.0.as_str(), r.1, r.2)).collect();
        model_set.sort();
        inventory_set.sort();
        assert_eq!(
            model_set, inventory_set,
            "{model_name}: names, sizes and registration indices"
        );
    }
}

#[test]
fn measured_models_keep_espresso_backward_totals() {
    // Espresso's ready times since the first gradient; the profile adds only the estimated time
    // before the first gradient.
    for (model_name, file) in [
        ("resnet50", "espresso_v100_readygap_resnet50.csv"),
        ("vgg16", "espresso_v100_readygap_vgg16.csv"),
        ("bert-large", "espresso_v100_readygap_bert_large.csv"),
    ] {
        let text = std::fs::read_to_string(validation_data(file)).unwrap();
        let last_ready_us: f64 = text
            .lines()
            .last()
            .unwrap()
            .split(',')
            .nth(4)
            .unwrap()
            .parse()
            .unwrap();
        let model = ModelProfile::load(model_name).unwrap();
        let after_first: f64 = model.tensors.iter().skip(1).map(|t| t.backward_us).sum();
        assert!(
            (after_first - last_ready_us).abs() < 1.0,
            "{model_name}: {after_first} vs {last_ready_us}"
        );
    }
}

#[test]
fn every_shipped_profile_passes_the_flops_check_or_says_why_not() {
    for name in DataKind::Model.shipped_names() {
        let model = ModelProfile::load(name).unwrap();
        let device = DeviceProfile::load(&model.device).unwrap();
        let Some(check) = flops::check(&model, &device) else {
            // Only a capture measured whole may go without FLOP counts, and it says so.
            assert!(
                H200_CAPTURES_WITHOUT_FLOPS.contains(&name)
                    && model.source.contains("no FLOP counts")
                    && model.timing.backward.status == Status::Measured,
                "{name}: no arithmetic section, so no FLOP/s check"
            );
            continue;
        };
        match check.verdict {
            Verdict::Plausible | Verdict::Suspicious => {}
            Verdict::AbovePeakExplained => {
                let reason = model
                    .arithmetic
                    .as_ref()
                    .unwrap()
                    .above_peak_reason
                    .as_ref();
                assert!(
                    model.source.contains(reason.unwrap().as_str()),
                    "{name}: the reason for {:.0} % of peak belongs in `source` too",
                    100.0 * check.fraction_of_peak
                );
            }
            Verdict::Impossible => panic!("{name}: {check:?}"),
        }
    }
}

#[test]
fn shipped_profiles_say_where_their_batch_and_first_gradient_come_from() {
    for name in DataKind::Model.shipped_names() {
        let model = ModelProfile::load(name).unwrap();
        let batch = model.timing.batch.as_ref().expect(name);
        assert!(
            batch
                .method
                .contains(&format!("batch {}", model.batch_size_per_gpu)),
            "{name}: {}",
            batch.method
        );
        assert!(model.timing.first_gradient.is_some(), "{name}");
    }
}

#[test]
fn espresso_batches_that_would_beat_the_peak_are_inferred_not_kept() {
    // At the scripts' 8 sequences the BERT traces imply 109 % and 123 % of the V100's FP32 peak.
    for name in ["bert-base", "bert-large"] {
        let model = ModelProfile::load(name).unwrap();
        assert_eq!(model.batch_size_per_gpu, 4, "{name}");
        let batch = model.timing.batch.unwrap();
        assert_eq!(batch.status, Status::Estimated, "{name}");
        assert!(
            batch
                .method
                .contains("batch 4 per GPU, inferred from FLOPs"),
            "{name}"
        );
        assert!(model.source.contains("inferred from FLOPs"), "{name}");
    }
}

#[test]
fn the_time_before_the_first_gradient_holds_the_head_flops() {
    // A gradient-ready trace starts at the first ready gradient; the profile adds the head's
    // backward at the rate the trace shows after it, plus a 5 us floor for the loss's kernels.
    for name in DataKind::Model.shipped_names() {
        let model = ModelProfile::load(name).unwrap();
        if model.timing.first_gradient.as_ref().unwrap().status == Status::Measured {
            continue; // a capture times the backward pass from its start
        }
        let total = flops::forward_macs_per_sample(&model).unwrap() as f64;
        let head = flops::head_macs_per_sample(&model).unwrap() as f64;
        if total - head < 0.1 * total {
            continue; // NCF: its trace after the first gradient holds no rate to use
        }
        let after: f64 = model.tensors.iter().skip(1).map(|t| t.backward_us).sum();
        let expected = after * head / (total - head) + 5.0;
        let first = model.first_gradient_time().as_us();
        assert!(
            (first - expected).abs() < 0.01 + 1e-6 * expected,
            "{name}: {first} us vs {expected} us"
        );
    }
    // GPT-2's tied language-model head: tens of ms before ln_f's gradient is ready.
    let gpt2 = ModelProfile::load("gpt2").unwrap();
    let first_ms = gpt2.first_gradient_time().as_us() / 1e3;
    assert!((20.0..200.0).contains(&first_ms), "{first_ms} ms");
}

#[test]
fn list_models_check_prints_every_verdict_and_refuses_other_lists() {
    let out = syncopate(&["list", "models", "--check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for name in DataKind::Model.shipped_names() {
        assert!(text.contains(name), "{name}: {text}");
    }
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap()
            .to_string()
    };
    assert!(row("vgg16").contains("above peak, explained"), "{text}");
    assert!(row("bert-base").ends_with(" ok"), "{text}");
    let out = syncopate(&["list", "devices", "--check"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn list_models_check_exits_1_on_an_impossible_profile_and_accepts_an_explained_one() {
    let dir = crate::common::scratch("check-impossible");
    let mut model = serde_json::to_value(ModelProfile::load("gpt2").unwrap()).unwrap();
    // A tenth of the measured time: about five times the V100's FP32 peak.
    for tensor in model["tensors"].as_array_mut().unwrap() {
        for field in ["backward_us", "forward_us"] {
            let us = tensor[field].as_f64().unwrap();
            tensor[field] = serde_json::json!(us / 10.0);
        }
    }
    let path = dir.join("fast.json");
    std::fs::write(&path, serde_json::to_string(&model).unwrap()).unwrap();
    let path = path.to_str().unwrap();
    let out = syncopate(&["list", "models", "--check", "resnet50", path]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("IMPOSSIBLE"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("gpt2") && stderr(&out).contains("above_peak_reason"),
        "{}",
        stderr(&out)
    );
    model["arithmetic"]["above_peak_reason"] = serde_json::json!("a test says so");
    std::fs::write(path, serde_json::to_string(&model).unwrap()).unwrap();
    let out = syncopate(&["list", "models", "--check", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("above peak, explained"),
        "{}",
        stdout(&out)
    );
    let out = syncopate(&["list", "models", "resnet50"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn arithmetic_naming_no_tensor_or_giving_an_empty_reason_is_rejected() {
    let dir = crate::common::scratch("bad-arithmetic");
    let path = dir.join("model.json");
    let refusal = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut model = serde_json::to_value(ModelProfile::load("gpt2").unwrap()).unwrap();
        edit(&mut model);
        std::fs::write(&path, serde_json::to_string(&model).unwrap()).unwrap();
        ModelProfile::load(path.to_str().unwrap())
            .unwrap_err()
            .to_string()
    };
    let message = refusal(&|m| {
        m["arithmetic"]["head_tensors"][0] = serde_json::json!("lm_head.weight");
    });
    assert!(
        message.contains("arithmetic.head_tensors[0]") && message.contains("lm_head.weight"),
        "{message}"
    );
    let message = refusal(&|m| m["arithmetic"]["above_peak_reason"] = serde_json::json!(" "));
    assert!(
        message.contains("arithmetic.above_peak_reason"),
        "{message}"
    );
}

#[test]
fn malformed_json_names_file_line_and_field() {
    let dir = crate::common::scratch("malformed");
    let path = dir.join("bad-model.json");
    let mut model = serde_json::to_value(ModelProfile::load("alexnet").unwrap()).unwrap();
    model["tensors"][3]["numel"] = serde_json::json!("many");
    std::fs::write(&path, serde_json::to_string_pretty(&model).unwrap()).unwrap();
    let message = ModelProfile::load(path.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(message.contains("bad-model.json"), "{message}");
    assert!(message.contains("line "), "{message}");
    assert!(message.contains("tensors[3].numel"), "{message}");
}

#[test]
fn inconsistent_model_is_rejected_with_the_tensor_named() {
    let dir = crate::common::scratch("inconsistent");
    let path = dir.join("model.json");
    let mut model = serde_json::to_value(ModelProfile::load("alexnet").unwrap()).unwrap();
    model["tensors"][2]["numel"] = serde_json::json!(7);
    std::fs::write(&path, serde_json::to_string(&model).unwrap()).unwrap();
    let message = ModelProfile::load(path.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("tensors[2]") && message.contains("does not match shape"),
        "{message}"
    );
}

#[test]
fn unknown_fields_and_versions_are_rejected() {
    let dir = crate::common::scratch("unknown-field");
    let path = dir.join("cluster.json");
    let mut cluster =
        serde_json::to_value(Cluster::load("dgx-h100", ClusterOverrides::default()).unwrap())
            .unwrap();
    cluster["intra_node"]["speed"] = serde_json::json!(1);
    std::fs::write(&path, serde_json::to_string(&cluster).unwrap()).unwrap();
    let message = Cluster::load(path.to_str().unwrap(), ClusterOverrides::default())
        .unwrap_err()
        .to_string();
    assert!(message.contains("unknown field `speed`"), "{message}");

    cluster["intra_node"]
        .as_object_mut()
        .unwrap()
        .remove("speed");
    cluster["format_version"] = serde_json::json!(7);
    std::fs::write(&path, serde_json::to_string(&cluster).unwrap()).unwrap();
    let message = Cluster::load(path.to_str().unwrap(), ClusterOverrides::default())
        .unwrap_err()
        .to_string();
    assert!(message.contains("format_version"), "{message}");
}

#[test]
fn zero_bandwidth_in_a_file_is_rejected() {
    let dir = crate::common::scratch("zero-bw");
    let path = dir.join("cluster.json");
    let mut cluster =
        serde_json::to_value(Cluster::load("v100-10gbe", ClusterOverrides::default()).unwrap())
            .unwrap();
    cluster["inter_node"]["nic_bandwidth_gbps"] = serde_json::json!(0.0);
    std::fs::write(&path, serde_json::to_string(&cluster).unwrap()).unwrap();
    let message = Cluster::load(path.to_str().unwrap(), ClusterOverrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("inter_node.nic_bandwidth_gbps"),
        "{message}"
    );
}

#[test]
fn unknown_names_list_the_valid_ones() {
    let message = ModelProfile::load("resnet9000").unwrap_err().to_string();
    assert!(
        message.contains("resnet50") && message.contains("gpt2-xl"),
        "{message}"
    );
    let message = Cluster::load("dgx-z100", ClusterOverrides::default())
        .unwrap_err()
        .to_string();
    assert!(message.contains("dgx-h100"), "{message}");
}

/// `resnet50-cifar10` is torchvision's ResNet-50 on 32x32 images (kuangliu/pytorch-cifar's, as
/// MergeComp runs it): a 3x3 stem instead of 7x7 and a 10-way head, 23,520,842 parameters, and
/// compute derived by multiply-adds, so its timings imply the measured profile's FLOP/s.
#[test]
fn the_cifar_resnet50_is_resnet50_on_small_images_at_resnet50_s_rate() {
    let imagenet = ModelProfile::load("resnet50").unwrap();
    let cifar = ModelProfile::load("resnet50-cifar10").unwrap();
    assert_eq!(
        cifar.total_numel(),
        imagenet.total_numel() - 7 * 7 * 3 * 64 + 3 * 3 * 3 * 64 - 1000 * 2049 + 10 * 2049
    );
    assert_eq!(cifar.total_numel(), 23_520_842);
    let macs = |m: &ModelProfile| -> f64 {
        m.tensors
            .iter()
            .map(|t| (t.numel * t.uses_per_sample) as f64)
            .sum()
    };
    // Every stage sees (32/56)² of the pixels; the stem and the head shrink more.
    let ratio = macs(&cifar) / macs(&imagenet);
    assert!((0.31..0.3265).contains(&ratio), "{ratio}");
    let rate = |m: &ModelProfile| macs(m) / m.backward_time().as_us();
    let (a, b) = (rate(&cifar), rate(&imagenet));
    assert!((a / b - 1.0).abs() < 0.05, "{a} vs {b} MACs per µs");
}
