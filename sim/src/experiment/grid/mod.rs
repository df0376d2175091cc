//! Grid experiments: panels × GPU layouts × configurations, with throughput and speedup charts.
//!
//! A panel is a model on a cluster.

mod published;
mod results;

use super::{resolve, Results};
use crate::base::chart::Chart;
use crate::base::data;
use crate::base::error::{Result, SimError};
use crate::base::limits;
use crate::compress::{Compressor, Memory};
use crate::inputs::topology::ClusterOverrides;
use crate::plan::{CodecCalls, Scheme};
use crate::strategy::HorovodFusion;
use crate::sweep::{self, FrameworkChoice, Point};
use published::Published;
use results::Table;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GridSpec {
    format_version: u32,
    title: String,
    panels: Vec<PanelSpec>,
    layouts: Vec<LayoutSpec>,
    configs: Vec<ConfigSpec>,
    /// A config label: every other config's speedup over it is reported and plotted.
    #[serde(default)]
    baseline: Option<String>,
    /// The paper's numbers for these setups (`published.json`, relative to the experiment),
    /// reported beside the predictions.
    #[serde(default)]
    published: Option<String>,
    /// The Horovod release the paper ran, whose fusion threshold and cycle time its Horovod
    /// plans use; absent: the current release's.
    #[serde(default)]
    horovod: Option<HorovodFusion>,
}

/// A model on a cluster; model and cluster are shipped names or paths relative to the experiment.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PanelSpec {
    title: String,
    model: String,
    cluster: String,
    #[serde(default)]
    inter_gbps: Option<f64>,
    /// Samples per GPU the paper ran, where its batch is not the model profile's: the profile's
    /// compute is scaled to it (`ModelProfile::at_batch`).
    #[serde(default)]
    batch_size_per_gpu: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutSpec {
    nodes: u32,
    gpus_per_node: u32,
}

impl LayoutSpec {
    /// The layout's GPU count; `None` when it overflows.
    fn gpus(&self) -> Option<u32> {
        self.nodes.checked_mul(self.gpus_per_node)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigSpec {
    label: String,
    strategy: String,
    compressor: Compressor,
    #[serde(default = "no_memory")]
    memory: Memory,
    #[serde(default)]
    scheme: Option<Scheme>,
    /// One codec call per group (default) or per tensor.
    #[serde(default)]
    codec_calls: CodecCalls,
    /// The framework that runs the plan: a name or path, `strategy` for the strategy's own;
    /// absent: none.
    #[serde(default)]
    framework: Option<String>,
    /// The codec set that compresses the plan (`profiles/codecs/`: a name, or a path relative
    /// to the experiment), its ops priced by the framework; absent: the device's curves.
    #[serde(default)]
    codecs: Option<String>,
    /// Horovod's cycle time (`HOROVOD_CYCLE_TIME`) in ms, where a run set its own; absent:
    /// Horovod's default.
    #[serde(default)]
    cycle_ms: Option<f64>,
    /// Ops per parameter tensor of the update the system's code makes in place of the
    /// framework's optimizer step (`Framework::step_ops_per_tensor`); absent: the framework's.
    #[serde(default)]
    step_ops_per_tensor: Option<f64>,
    /// What differs on some panels, by panel title: a paper's bar of one name may have run
    /// otherwise on one of its setups (MergeComp's NVLink "FP16" is Horovod's own cast).
    #[serde(default)]
    on: BTreeMap<String, PanelConfig>,
}

/// A config's settings on one panel, each replacing the config's where given.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PanelConfig {
    #[serde(default)]
    codecs: Option<String>,
    #[serde(default)]
    cycle_ms: Option<f64>,
}

fn no_memory() -> Memory {
    Memory::None
}

pub(super) fn run(spec: &GridSpec, label: &str, dir: &Path) -> Result<Results> {
    check(spec, label)?;
    let published = match &spec.published {
        Some(file) => Some(Published::load(&dir.join(file), spec)?),
        None => None,
    };
    let options = HorovodFusion::options(spec.horovod.as_ref())?;
    let rows = sweep::run(&points(spec, label, dir)?, &options)?;
    let table = Table { spec, rows: &rows };
    let mut charts = vec![Chart {
        file: "throughput.svg".to_string(),
        title: spec.title.clone(),
        panels: table.panels(|c| c.throughput(), "throughput (samples/s, all GPUs)"),
        columns: 2,
    }];
    if let Some(base) = &spec.baseline {
        charts.push(Chart {
            file: "speedup.svg".to_string(),
            title: format!("{} — speedup over {base}", spec.title),
            panels: table.panels(|c| c.speedup, &format!("speedup over {base} (×)")),
            columns: 2,
        });
    }
    let mut markdown = table.markdown();
    let comparison = published.map(|p| {
        let (csv, md) = p.report(spec, &table.cells());
        markdown.push_str(&md);
        csv
    });
    Ok(Results {
        inputs: Vec::new(),
        csv: table.csv().into_text(),
        comparison,
        charts,
        table: markdown,
    })
}

/// The spec's version, that every list has an entry and that the baseline names a config.
fn check(spec: &GridSpec, label: &str) -> Result<()> {
    data::check_format_version(label, spec.format_version)?;
    for (field, empty) in [
        ("panels", spec.panels.is_empty()),
        ("layouts", spec.layouts.is_empty()),
        ("configs", spec.configs.is_empty()),
    ] {
        if empty {
            return Err(SimError::invalid(label, field, "needs at least one entry"));
        }
    }
    for (i, config) in spec.configs.iter().enumerate() {
        if let Some(title) = config
            .on
            .keys()
            .find(|t| !spec.panels.iter().any(|p| &p.title == *t))
        {
            return Err(SimError::invalid(
                label,
                format!("configs[{i}].on"),
                format!("`{title}` is not the title of any panel"),
            ));
        }
    }
    if let Some(base) = &spec.baseline {
        if !spec.configs.iter().any(|c| &c.label == base) {
            return Err(SimError::invalid(
                label,
                "baseline",
                format!("`{base}` is not the label of any config"),
            ));
        }
    }
    Ok(())
}

/// The simulations, panel-major, then layout, then config.
fn points(spec: &GridSpec, label: &str, dir: &Path) -> Result<Vec<Point>> {
    let mut points = Vec::new();
    for panel in &spec.panels {
        for layout in &spec.layouts {
            for (i, config) in spec.configs.iter().enumerate() {
                let strategy = config.strategy.parse().map_err(|e| {
                    SimError::invalid(label, format!("configs[{i}].strategy"), format!("{e}"))
                })?;
                let here = config.on.get(&panel.title);
                let (cycle_ms, cycle_field) = match here.and_then(|p| p.cycle_ms) {
                    Some(ms) => (
                        Some(ms),
                        format!("configs[{i}].on.{}.cycle_ms", panel.title),
                    ),
                    None => (config.cycle_ms, format!("configs[{i}].cycle_ms")),
                };
                points.push(Point {
                    model: resolve(dir, &panel.model),
                    cluster: resolve(dir, &panel.cluster),
                    overrides: ClusterOverrides {
                        nodes: Some(layout.nodes),
                        gpus_per_node: Some(layout.gpus_per_node),
                        inter_gbps: panel.inter_gbps,
                    },
                    strategy,
                    compressor: config.compressor,
                    memory: config.memory,
                    scheme: config.scheme,
                    codec_calls: config.codec_calls,
                    framework: config
                        .framework
                        .as_deref()
                        .map_or(FrameworkChoice::None, FrameworkChoice::parse),
                    codecs: here
                        .and_then(|p| p.codecs.as_deref())
                        .or(config.codecs.as_deref())
                        .map(|c| resolve(dir, c)),
                    cycle_us: cycle_ms
                        .map(|ms| {
                            limits::check_duration_us(label, &cycle_field, ms * 1e3)
                                .map(|()| ms * 1e3)
                        })
                        .transpose()?,
                    batch: panel.batch_size_per_gpu,
                    step_ops_per_tensor: config.step_ops_per_tensor,
                });
            }
        }
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(baseline: &str) -> GridSpec {
        let text = format!(
            r#"{{
                "format_version": 1,
                "title": "t",
                "panels": [{{ "title": "ResNet-50", "model": "resnet50", "cluster": "v100-10gbe" }}],
                "layouts": [{{ "nodes": 1, "gpus_per_node": 1 }}, {{ "nodes": 2, "gpus_per_node": 1 }}],
                "configs": [
                    {{ "label": "dense", "strategy": "horovod", "compressor": "none" }},
                    {{ "label": "half", "strategy": "horovod", "compressor": "fp16" }},
                    {{ "label": "merged", "strategy": "mergecomp", "compressor": "none" }}
                ],
                "baseline": {baseline}
            }}"#
        );
        data::parse_json("spec.json", &text).unwrap()
    }

    #[test]
    fn speedups_are_over_the_baseline_at_the_same_layout() {
        let results = run(&spec("\"dense\""), "spec.json", Path::new(".")).unwrap();
        let lines: Vec<&str> = results.csv.lines().collect();
        assert_eq!(lines.len(), 1 + 2 * 3, "{}", results.csv);
        assert!(lines[0].ends_with(",speedup_vs_baseline"));
        // The baseline's own speedup is 1; a skipped config has neither throughput nor speedup.
        assert!(
            lines[1].contains(",dense,") && lines[1].ends_with(",1.0000"),
            "{}",
            lines[1]
        );
        assert!(lines[3].contains(",merged,") && lines[3].contains(",skipped: "));
        assert!(lines[3].ends_with(",,,,"), "{}", lines[3]);
        let files: Vec<&str> = results.charts.iter().map(|c| c.file.as_str()).collect();
        assert_eq!(files, ["throughput.svg", "speedup.svg"]);
        // One line per config that ran, one point per layout.
        let series = &results.charts[0].panels[0].series;
        assert_eq!(series.len(), 2);
        assert!(series.iter().all(|s| s.points.len() == 2));
        assert!(results.table.contains("(1.00×)") && results.table.contains("skipped"));
        assert!(results.inputs.is_empty());
    }

    #[test]
    fn without_a_baseline_there_is_no_speedup_chart() {
        let results = run(&spec("null"), "spec.json", Path::new(".")).unwrap();
        assert_eq!(results.charts.len(), 1);
        assert!(!results.table.contains('×'));
    }

    fn cycle_spec(cycle_ms: &str) -> GridSpec {
        let text = format!(
            r#"{{
                "format_version": 1,
                "title": "t",
                "panels": [{{ "title": "ResNet-50", "model": "resnet50", "cluster": "v100-10gbe" }}],
                "layouts": [{{ "nodes": 4, "gpus_per_node": 1 }}],
                "configs": [
                    {{ "label": "default", "strategy": "horovod", "compressor": "none" }},
                    {{ "label": "own", "strategy": "horovod", "compressor": "none", "cycle_ms": {cycle_ms} }}
                ]
            }}"#
        );
        data::parse_json("spec.json", &text).unwrap()
    }

    #[test]
    fn a_config_runs_at_its_own_cycle_time_and_a_bad_one_is_named() {
        let results = run(&cycle_spec("0.1"), "spec.json", Path::new(".")).unwrap();
        let scaling = |label: &str| -> f64 {
            let line = results
                .csv
                .lines()
                .find(|l| l.contains(&format!(",{label},")));
            let fields: Vec<&str> = line.unwrap().split(',').collect();
            fields.iter().rev().find_map(|f| f.parse().ok()).unwrap()
        };
        assert_ne!(scaling("default"), scaling("own"), "{}", results.csv);
        for bad in ["-1", "1e300"] {
            let err = run(&cycle_spec(bad), "spec.json", Path::new("."))
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains("configs[1].cycle_ms"), "{err}");
        }
    }

    /// The same model at the profile's batch and at the batch a paper ran, one GPU each.
    fn batch_spec(batch: &str) -> GridSpec {
        let text = format!(
            r#"{{
                "format_version": 1,
                "title": "t",
                "panels": [
                    {{ "title": "32", "model": "resnet50", "cluster": "v100-10gbe" }},
                    {{ "title": "paper", "model": "resnet50", "cluster": "v100-10gbe", "batch_size_per_gpu": {batch} }}
                ],
                "layouts": [{{ "nodes": 1, "gpus_per_node": 1 }}],
                "configs": [{{ "label": "dense", "strategy": "horovod", "compressor": "none" }}]
            }}"#
        );
        data::parse_json("spec.json", &text).unwrap()
    }

    #[test]
    fn a_panel_runs_at_the_paper_s_batch_and_a_bad_one_is_named() {
        let results = run(&batch_spec("64"), "spec.json", Path::new(".")).unwrap();
        let time = |panel: &str| -> f64 {
            let line = results
                .csv
                .lines()
                .find(|l| l.starts_with(&format!("{panel},")));
            let fields: Vec<&str> = line.unwrap().split(',').collect();
            fields[15].parse().unwrap()
        };
        // Twice the compute, the same optimizer step.
        let ratio = time("paper") / time("32");
        assert!((1.9..2.0).contains(&ratio), "{ratio}: {}", results.csv);
        for bad in ["0", "1000000000"] {
            let err = run(&batch_spec(bad), "spec.json", Path::new("."))
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains("batch"), "{bad}: {err}");
        }
    }

    /// A config whose code replaces the framework's optimizer step, on two ranks.
    fn step_spec(framework: &str, ops: &str) -> GridSpec {
        let text = format!(
            r#"{{
                "format_version": 1,
                "title": "t",
                "panels": [{{ "title": "ResNet-50", "model": "resnet50", "cluster": "dgx1-v100" }}],
                "layouts": [{{ "nodes": 1, "gpus_per_node": 2 }}],
                "configs": [
                    {{ "label": "sgd", "strategy": "horovod", "compressor": "none"{framework} }},
                    {{ "label": "own", "strategy": "horovod", "compressor": "none"{framework}, "step_ops_per_tensor": {ops} }}
                ]
            }}"#
        );
        data::parse_json("spec.json", &text).unwrap()
    }

    #[test]
    fn a_config_s_own_step_replaces_the_framework_s_and_needs_one() {
        let framework = r#", "framework": "horovod""#;
        let results = run(&step_spec(framework, "1"), "spec.json", Path::new(".")).unwrap();
        let time = |label: &str| -> f64 {
            let line = results
                .csv
                .lines()
                .find(|l| l.contains(&format!(",{label},")));
            let fields: Vec<&str> = line.unwrap().split(',').collect();
            fields[15].parse().unwrap()
        };
        // One op per tensor launches faster than Horovod's SGD's four.
        assert!(time("own") < time("sgd"), "{}", results.csv);
        for (framework, ops) in [("", "1"), (framework, "-1"), (framework, "1e9")] {
            let err = run(&step_spec(framework, ops), "spec.json", Path::new("."))
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains("step_ops_per_tensor"), "{ops}: {err}");
        }
    }

    #[test]
    fn a_config_may_differ_on_a_panel_named_by_its_title() {
        let spec = |on: &str| -> GridSpec {
            let text = format!(
                r#"{{
                    "format_version": 1,
                    "title": "t",
                    "panels": [
                        {{ "title": "a", "model": "resnet50", "cluster": "v100-10gbe" }},
                        {{ "title": "b", "model": "resnet50", "cluster": "v100-10gbe" }}
                    ],
                    "layouts": [{{ "nodes": 4, "gpus_per_node": 1 }}],
                    "configs": [
                        {{ "label": "c", "strategy": "horovod", "compressor": "none", "cycle_ms": 0.1, "on": {on} }}
                    ]
                }}"#
            );
            data::parse_json("spec.json", &text).unwrap()
        };
        let time = |results: &Results, panel: &str| -> String {
            let line = results
                .csv
                .lines()
                .find(|l| l.starts_with(&format!("{panel},")));
            line.unwrap().split(',').nth(15).unwrap().to_string()
        };
        let same = run(&spec("{}"), "spec.json", Path::new(".")).unwrap();
        assert_eq!(time(&same, "a"), time(&same, "b"));
        let differs = run(
            &spec(r#"{ "b": { "cycle_ms": 5 } }"#),
            "spec.json",
            Path::new("."),
        );
        let differs = differs.unwrap();
        assert_eq!(time(&differs, "a"), time(&same, "a"));
        assert_ne!(time(&differs, "b"), time(&same, "b"));
        for (on, field) in [
            (r#"{ "z": { "cycle_ms": 5 } }"#, "configs[0].on"),
            (r#"{ "b": { "cycle_ms": -1 } }"#, "configs[0].on.b.cycle_ms"),
        ] {
            let err = run(&spec(on), "spec.json", Path::new("."))
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains(field), "{on}: {err}");
        }
    }

    #[test]
    fn a_baseline_that_is_no_config_is_an_error_naming_it() {
        let err = run(&spec("\"sparse\""), "spec.json", Path::new("."))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("baseline") && err.contains("`sparse`"),
            "{err}"
        );
    }
}
