//! Bad input never panics, aborts or hangs.
//!
//! The tests are the committed corpus of bad invocations and files, and property tests that mutate
//! shipped JSON and numeric flags.

use crate::common::{root, scratch, syncopate};
use proptest::prelude::*;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::plan::Plan;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::predict::simulate::{simulate, SimOptions};
use syncopate_sim::strategy::{Strategy as Named, StrategyOptions};

/// Longest any one bad invocation may take: a hang is a failure.
const CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the binary with `args`, killing it after [`CASE_TIMEOUT`].
fn bounded(args: &[String]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_syncopate"))
        .args(args)
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the syncopate binary runs");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("waiting for the binary").is_some() {
            return child.wait_with_output().expect("its output");
        }
        if started.elapsed() > CASE_TIMEOUT {
            let _ = child.kill();
            panic!("{args:?} ran longer than {CASE_TIMEOUT:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The exit was an error with a message, not a crash: code 1 or 2, `error` on stderr, no
/// panic, no signal.
fn assert_refused(args: &[String], out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        matches!(out.status.code(), Some(1 | 2)),
        "{args:?}: exit {:?}\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert!(stderr.contains("error"), "{args:?}: {stderr}");
    stderr
}

/// A valid plan (alexnet on v100-10gbe × 2, Horovod) for the invocations that need one.
fn valid_plan(dir: &Path) -> String {
    let plan = dir.join("plan.json");
    let out = syncopate(&[
        "simulate",
        "--model",
        "alexnet",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "2",
        "--save-plan",
        plan.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    plan.to_string_lossy().into_owned()
}

#[test]
fn every_bad_invocation_of_the_corpus_is_refused_with_its_reason() {
    let corpus = root().join("tests/corpus");
    let dir = scratch("corpus");
    let plan = valid_plan(&dir);
    let text = std::fs::read_to_string(corpus.join("invocations.txt")).unwrap();
    let mut cases = 0;
    for line in text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let (command, expected) = line.split_once(" => ").expect("`ARGS => EXPECTED`");
        let args: Vec<String> = command
            .split_whitespace()
            .map(|a| {
                a.replace("{corpus}", corpus.to_str().unwrap())
                    .replace("{plan}", &plan)
                    .replace("{scratch}", dir.to_str().unwrap())
            })
            .collect();
        let stderr = assert_refused(&args, &bounded(&args));
        assert!(
            stderr.contains(expected.trim()),
            "{args:?}: the message does not name `{expected}`:\n{stderr}"
        );
        cases += 1;
    }
    assert!(cases >= 90, "{cases} cases");
    // Nothing was left half-written by the refused commands.
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "plan.json")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Extreme values a number in a data file or on the command line may take.
fn extreme_numbers() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::json!(0)),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(-1e300)),
        Just(serde_json::json!(1e300)),
        Just(serde_json::json!(1e-300)),
        Just(serde_json::json!(4294967295u64)),
        Just(serde_json::json!(18446744073709551615u64)),
        Just(serde_json::json!(0.5)),
        Just(serde_json::json!("NaN")),
        Just(serde_json::Value::Null),
        (-1e6f64..1e6).prop_map(|v| serde_json::json!(v)),
    ]
}

/// Every path to a number in a JSON value.
fn number_paths(value: &serde_json::Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        serde_json::Value::Number(_) => out.push(at.clone()),
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                at.push(k.clone());
                number_paths(v, at, out);
                at.pop();
            }
        }
        // Only the first elements of long arrays (tensors): enough to reach every field.
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate().take(3) {
                at.push(i.to_string());
                number_paths(v, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn set(value: &mut serde_json::Value, path: &[String], new: serde_json::Value) {
    let mut at = value;
    for key in path {
        at = match at {
            serde_json::Value::Array(items) => &mut items[key.parse::<usize>().unwrap()],
            other => &mut other[key.as_str()],
        };
    }
    *at = new;
}

/// A shipped file with `edits` numbers replaced by extreme values.
fn mutated(text: &str, edits: &[(usize, serde_json::Value)]) -> String {
    let mut value: serde_json::Value = serde_json::from_str(text).unwrap();
    let mut paths = Vec::new();
    number_paths(&value, &mut Vec::new(), &mut paths);
    for (pick, new) in edits {
        let path = &paths[pick % paths.len()];
        set(&mut value, path, new.clone());
    }
    value.to_string()
}

/// Loads and, when it loads, simulates the mutated inputs; any panic fails the test (the
/// harness runs each case in this thread, so a panic surfaces as the property's failure).
fn load_and_simulate(dir: &Path, model: &str, cluster: &str, device: &str) {
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let device_path = write("device.json", device);
    let mut cluster: serde_json::Value = serde_json::from_str(cluster).unwrap_or_default();
    if cluster.is_object() {
        cluster["device"] = device_path.clone().into();
    }
    let cluster_path = write("cluster.json", &cluster.to_string());
    let model_path = write("model.json", model);
    let _ = DeviceProfile::load(&device_path);
    let (Ok(model), Ok(cluster)) = (
        ModelProfile::load(&model_path),
        Cluster::load(&cluster_path, ClusterOverrides::default()),
    ) else {
        return;
    };
    let Ok(scenario) = Scenario::new(model, cluster) else {
        return;
    };
    for strategy in ["wfbp", "horovod", "bytescheduler"] {
        let plan: std::result::Result<Plan, _> = strategy
            .parse::<Named>()
            .unwrap()
            .plan(&scenario, &StrategyOptions::default());
        if let Ok(plan) = plan {
            let _ = simulate(&scenario, &plan, &SimOptions::default());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Shipped model, cluster and device files with numbers replaced by extreme values load
    /// with an error or simulate: never a panic, never a hang.
    #[test]
    fn mutated_data_files_never_panic(
        model_edits in prop::collection::vec((any::<usize>(), extreme_numbers()), 0..3),
        cluster_edits in prop::collection::vec((any::<usize>(), extreme_numbers()), 0..3),
        device_edits in prop::collection::vec((any::<usize>(), extreme_numbers()), 0..3),
    ) {
        let dir = scratch("mutated");
        let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
        let model = mutated(&read("profiles/models/alexnet.json"), &model_edits);
        let cluster = mutated(&read("topologies/v100-10gbe.json"), &cluster_edits);
        let device = mutated(&read("profiles/devices/v100-sxm2-32gb.json"), &device_edits);
        let started = Instant::now();
        load_and_simulate(&dir, &model, &cluster, &device);
        prop_assert!(started.elapsed() < CASE_TIMEOUT, "a case ran {:?}", started.elapsed());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Numeric flags of `simulate` with extreme values: a result or a refusal, never a crash.
#[test]
fn extreme_numeric_flags_are_answered_or_refused() {
    let values = [
        "-1",
        "0",
        "-0",
        "1e308",
        "-1e308",
        "nan",
        "inf",
        "1e-300",
        "4294967296",
        "18446744073709551616",
        "0.5",
        "3",
    ];
    let flags = [
        "--nodes",
        "--gpus-per-node",
        "--inter-gbps",
        "--fusion-mb",
        "--cycle-ms",
        "--bucket-mb",
        "--first-bucket-mb",
        "--partition-mb",
        "--credit",
        "--ps-servers",
        "--jitter",
        "--iterations",
        "--warmup",
        "--seed",
        "--trace-ranks",
        "--comm-streams",
        "--batch-size",
    ];
    for flag in flags {
        for value in values {
            let args: Vec<String> = [
                "simulate",
                "--model",
                "alexnet",
                "--cluster",
                "v100-10gbe",
                "--strategy",
                "bytescheduler",
                flag,
                value,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let out = bounded(&args);
            if !out.status.success() {
                assert_refused(&args, &out);
            }
        }
    }
}
