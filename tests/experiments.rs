//! `syncopate sweep` and `syncopate experiment run` end to end.
//!
//! Every shipped experiment regenerates its results.

use crate::common::{root, scratch, stderr, stdout, syncopate, validation_data};
use std::path::Path;

const EXPERIMENTS: [&str; 8] = [
    "mergecomp",
    "dear",
    "hipress",
    "dgc-scaling",
    "lab4-fp16-fp8",
    "grace",
    "lab-validation",
    "ddp-dgx1",
];

/// Copies an experiment into a scratch directory so the run does not rewrite the shipped files;
/// GRACE's data and a framework check's measurements are made absolute since the copy no
/// longer sits in the repository.
fn copy_experiment(name: &str) -> std::path::PathBuf {
    let from = root().join("experiments").join(name);
    let to = scratch(&format!("experiment-{name}"));
    copy_dir(&from, &to);
    let spec_path = to.join("spec.json");
    let mut spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    if spec.get("data").is_some() {
        let data = validation_data("grace_imagenet_throughput.csv");
        spec["data"] = serde_json::Value::String(data.to_string_lossy().into_owned());
        std::fs::write(&spec_path, serde_json::to_string_pretty(&spec).unwrap()).unwrap();
    }
    if let Some(measurements) = spec.get("measurements").and_then(|m| m.as_str()) {
        let path = from.join(measurements).to_string_lossy().into_owned();
        spec["measurements"] = serde_json::Value::String(path);
        std::fs::write(&spec_path, serde_json::to_string_pretty(&spec).unwrap()).unwrap();
    }
    to
}

/// Copies a directory's files and, one level down, its subdirectories' (lab-validation keeps
/// its measured cluster files in `clusters/`).
fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

fn has_svg(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().any(|e| {
        let path = e.unwrap().path();
        path.extension().is_some_and(|x| x == "svg")
            && std::fs::read_to_string(&path).unwrap().contains("<text")
    })
}

#[test]
fn every_shipped_experiment_regenerates_its_results() {
    for name in EXPERIMENTS {
        let dir = copy_experiment(name);
        // The GRACE fit is the slow part in a debug build; the test evaluates the shipped fit.
        let out = syncopate(&["experiment", "run", dir.to_str().unwrap(), "--reuse-fit"]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
        assert!(csv.lines().count() > 2, "{name}: results.csv has no rows");
        // What is shipped is what the code gives: a change of the model regenerates it.
        let shipped = root().join("experiments").join(name).join("results.csv");
        let shipped = std::fs::read_to_string(shipped).unwrap();
        let differing = csv
            .lines()
            .zip(shipped.lines())
            .find(|(given, kept)| given != kept);
        assert!(
            csv == shipped,
            "{name}: results.csv differs from what the code gives (first: {differing:?}): rerun `syncopate experiment run experiments/{name} --reuse-fit`"
        );
        // So is the comparison with the paper's published numbers, where there is one.
        let shipped = root()
            .join("experiments")
            .join(name)
            .join("against-paper.csv");
        if shipped.exists() {
            assert_eq!(
                std::fs::read_to_string(dir.join("against-paper.csv")).unwrap(),
                std::fs::read_to_string(shipped).unwrap(),
                "{name}: against-paper.csv differs from what the code gives"
            );
        }
        // An experiment that plots (ddp-dgx1 only tabulates) writes its plots again.
        if has_svg(&root().join("experiments").join(name)) {
            assert!(has_svg(&dir), "{name}: no SVG with text");
        }
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        let table = readme
            .split("<!-- results:begin -->")
            .nth(1)
            .and_then(|rest| rest.split("<!-- results:end -->").next())
            .unwrap();
        assert!(table.contains("|---|"), "{name}: README table missing");
    }
}

#[test]
fn grace_reports_the_overall_error_of_the_shipped_fit() {
    let dir = copy_experiment("grace");
    let out = syncopate(&["experiment", "run", dir.to_str().unwrap(), "--reuse-fit"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("**overall**"), "{text}");
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    // ResNet-50's 1-worker row defines compute: it is reproduced exactly.
    let one = csv
        .lines()
        .find(|l| l.starts_with("resnet50,1,none"))
        .expect("the 1-worker row is compared");
    let error: f64 = one.split(',').nth(9).unwrap().parse().unwrap();
    assert!(error.abs() < 1.0, "{one}");
    // The consistency rules flag rows in a column of their own instead of dropping them.
    assert!(csv.lines().next().unwrap().ends_with(",excluded"), "{csv}");
    let flagged = |prefix: &str, reason: &str| {
        csv.lines()
            .any(|l| l.starts_with(prefix) && l.contains(reason))
    };
    assert!(
        flagged("vgg19,2,randomk,0.01,false", "upper-bound"),
        "{csv}"
    );
    assert!(flagged("vgg19,1,none", "slower per worker"), "{csv}");
    assert!(!flagged("resnet50,1,none", "slower per worker"), "{csv}");
    assert!(text.contains("Excluded as inconsistent"), "{text}");
    // The fit saw the rows with at most 2 workers only; the rest are held out, and the held-out
    // statistics (median absolute error per worker count, Spearman at 8 workers) are printed.
    for line in csv.lines().skip(1) {
        let fields: Vec<&str> = line.split(',').collect();
        let workers: u32 = fields[1].parse().unwrap();
        let role = if workers <= 2 { "fit" } else { "held-out" };
        assert_eq!(fields[10], role, "{line}");
    }
    for needle in [
        "**Held out**",
        "| 4 |",
        "| 8 |",
        "**Spearman rank correlation**",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // The shipped results are what the shipped calibrated files give.
    let shipped = root().join("experiments").join("grace");
    assert_eq!(
        csv,
        std::fs::read_to_string(shipped.join("results.csv")).unwrap(),
        "results.csv differs from what the shipped fit gives: rerun the experiment"
    );
    let block = |readme: &str| {
        readme
            .split("<!-- results:begin -->")
            .nth(1)
            .and_then(|rest| rest.split("<!-- results:end -->").next())
            .unwrap()
            .to_string()
    };
    assert_eq!(
        block(&std::fs::read_to_string(dir.join("README.md")).unwrap()),
        block(&std::fs::read_to_string(shipped.join("README.md")).unwrap()),
        "the README's results block differs from what the shipped fit gives"
    );
}

#[test]
fn experiment_without_markers_names_the_readme() {
    let dir = copy_experiment("dgc-scaling");
    std::fs::write(dir.join("README.md"), "# no markers\n").unwrap();
    let out = syncopate(&["experiment", "run", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("README.md"), "{}", stderr(&out));
}

#[test]
fn sweep_writes_table_csv_and_svg() {
    let out_dir = scratch("sweep");
    let out = syncopate(&[
        "sweep",
        "--model",
        "resnet50",
        "--cluster",
        "v100-100gib",
        "--nodes",
        "1,2",
        "--inter-gbps",
        "25,100",
        "--strategy",
        "horovod,mergecomp",
        "--compressor",
        "none,fp16",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    // mergecomp without a compressor cannot run: a skipped row, not a failure.
    assert!(text.contains("skipped"), "{text}");
    let csv = std::fs::read_to_string(out_dir.join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 2 * 2 * 2 * 2);
    assert!(has_svg(&out_dir));
}

/// The cell of sweep.csv in `column` on the row of `strategy`, both found by the header's names.
fn sweep_cell(csv: &str, strategy: &str, column: &str) -> String {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let line = lines
        .find(|l| l.split(',').nth(at("strategy")) == Some(strategy))
        .unwrap();
    line.split(',').nth(at(column)).unwrap().to_string()
}

/// sweep.csv of a successful sweep of ResNet-50 on two `v100-10gbe` nodes with `args`, in a
/// scratch folder named `tag`.
fn resnet50_sweep(tag: &str, args: &[&str]) -> String {
    let out_dir = scratch(tag);
    let out_arg = out_dir.to_str().unwrap();
    let base = [
        "sweep",
        "--model",
        "resnet50",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "2",
        "--out",
        out_arg,
    ];
    let out = syncopate(&[&base[..], args].concat());
    assert!(out.status.success(), "{tag}: {}", stderr(&out));
    std::fs::read_to_string(out_dir.join("sweep.csv")).unwrap()
}

#[test]
fn sweep_prices_the_framework_asked_for() {
    let run = |framework: &str| {
        let out_dir = scratch(&format!("sweep-framework-{framework}"));
        let out = syncopate(&[
            "sweep",
            "--model",
            "resnet50",
            "--cluster",
            "dgx1-v100",
            "--nodes",
            "1",
            "--strategy",
            "ddp,wfbp",
            "--framework",
            framework,
            "--out",
            out_dir.to_str().unwrap(),
        ]);
        (out.status.code(), stderr(&out), out_dir)
    };
    let time = |dir: &std::path::Path, strategy: &str| -> (String, f64) {
        let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
        (
            sweep_cell(&csv, strategy, "framework"),
            sweep_cell(&csv, strategy, "iteration_time_ms")
                .parse()
                .unwrap(),
        )
    };
    let (code, err, none) = run("none");
    assert_eq!(code, Some(0), "{err}");
    let (code, err, own) = run("strategy");
    assert_eq!(code, Some(0), "{err}");
    // DDP pays its reducer's costs; wfbp has no framework of its own.
    let (bare, with_ddp) = (time(&none, "ddp"), time(&own, "ddp"));
    assert_eq!(
        (bare.0.as_str(), with_ddp.0.as_str()),
        ("none", "pytorch-ddp")
    );
    assert!(with_ddp.1 > bare.1, "{bare:?} {with_ddp:?}");
    assert_eq!(time(&none, "wfbp"), time(&own, "wfbp"));
    let (code, err, _) = run("no-such-framework");
    assert_eq!(code, Some(1));
    assert!(err.contains("--framework no-such-framework"), "{err}");
}

#[test]
fn sweep_compresses_tensor_by_tensor_when_asked() {
    let run = |calls: &str| {
        resnet50_sweep(
            &format!("sweep-calls-{calls}"),
            &[
                "--strategy",
                "horovod,mergecomp",
                "--compressor",
                "topk:0.01",
                "--memory",
                "residual",
                "--codec-calls",
                calls,
            ],
        )
    };
    let (group, tensor) = (run("group"), run("tensor"));
    assert_eq!(sweep_cell(&group, "horovod", "codec_calls"), "group");
    assert_eq!(sweep_cell(&tensor, "horovod", "codec_calls"), "tensor");
    // 161 top-k calls instead of one per fusion group: more floors to pay.
    let time = |csv: &str| -> f64 {
        sweep_cell(csv, "horovod", "iteration_time_ms")
            .parse()
            .unwrap()
    };
    assert!(
        time(&tensor) > time(&group),
        "{} vs {}",
        time(&tensor),
        time(&group)
    );
    // MergeComp prices one call per group: skipped with the reason, not failed.
    assert!(sweep_cell(&tensor, "mergecomp", "status").contains("codec_calls"));
    assert_eq!(sweep_cell(&group, "mergecomp", "status"), "ok");
}

#[test]
fn sweep_rejects_unknown_strategy_and_zero_bandwidth() {
    let out_dir = scratch("sweep-bad");
    let base = [
        "sweep",
        "--model",
        "resnet50",
        "--cluster",
        "v100-100gib",
        "--nodes",
        "1",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let unknown = syncopate(&[&base[..], &["--strategy", "warp"]].concat());
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stderr(&unknown).contains("warp"), "{}", stderr(&unknown));
    let zero = syncopate(&[&base[..], &["--inter-gbps", "0"]].concat());
    assert_eq!(zero.status.code(), Some(1));
    assert!(stderr(&zero).contains("--inter-gbps"), "{}", stderr(&zero));
}

#[test]
fn sweep_names_the_codecs_that_priced_each_row() {
    let run = |codecs: &str| {
        let csv = resnet50_sweep(
            &format!("sweep-codecs-{codecs}"),
            &[
                "--strategy",
                "horovod",
                "--compressor",
                "fp16",
                "--framework",
                "horovod",
                "--codecs",
                codecs,
            ],
        );
        sweep_cell(&csv, "horovod", "codecs")
    };
    // `native` is the device's curves, as without the flag; a set is named by its name.
    assert_eq!(run("native"), "native");
    assert_eq!(run("horovod"), "horovod");
}
