//! Grid experiments: panels (model on cluster) × GPU layouts × configurations, with throughput and speedup charts.

mod results;

use super::{resolve, Results};
use crate::chart::Chart;
use crate::compress::{Compressor, Memory};
use crate::data;
use crate::error::{Result, SimError};
use crate::plan::Scheme;
use crate::strategy::StrategyOptions;
use crate::sweep::{self, Point};
use crate::topology::ClusterOverrides;
use results::Table;
use serde::Deserialize;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridSpec {
    format_version: u32,
    title: String,
    panels: Vec<PanelSpec>,
    layouts: Vec<LayoutSpec>,
    configs: Vec<ConfigSpec>,
    /// A config label: every other config's speedup over it is reported and plotted.
    #[serde(default)]
    baseline: Option<String>,
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
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LayoutSpec {
    nodes: u32,
    gpus_per_node: u32,
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
}

fn no_memory() -> Memory {
    Memory::None
}

pub fn run(spec: &GridSpec, label: &str, dir: &Path) -> Result<Results> {
    check(spec, label)?;
    let rows = sweep::run(&points(spec, label, dir)?, &StrategyOptions::default())?;
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
    Ok(Results {
        inputs: Vec::new(),
        csv: table.csv().into_text(),
        charts,
        table: table.markdown(),
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
                });
            }
        }
    }
    Ok(points)
}
