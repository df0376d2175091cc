//! Every shipped data file loads, and model profiles match the exact tensor inventories.

use crate::common::validation_data;
use syncopate_sim::data::DataKind;
use syncopate_sim::device::DeviceProfile;
use syncopate_sim::model::ModelProfile;
use syncopate_sim::topology::{Cluster, ClusterOverrides};

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
    assert_eq!(DataKind::Model.shipped_names().len(), 17);
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
