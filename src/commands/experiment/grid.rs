//! Grid experiments: panels (model on cluster) × GPU layouts × configurations, with throughput and speedup plots.

use crate::csv::Csv;
use crate::plot::{self, Panel, Series};
use serde::Deserialize;
use std::fmt::Write as _;
use std::path::Path;
use syncopate_sim::compress::{Compressor, Memory};
use syncopate_sim::plan::Scheme;
use syncopate_sim::strategy::StrategyOptions;
use syncopate_sim::sweep::{self, Outcome, Point, Row};
use syncopate_sim::topology::ClusterOverrides;
use syncopate_sim::SimError;

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

/// A shipped name stays a name; a path is taken relative to the experiment directory.
pub fn resolve(dir: &Path, name_or_path: &str) -> String {
    if name_or_path.ends_with(".json") || name_or_path.contains('/') {
        dir.join(name_or_path).to_string_lossy().into_owned()
    } else {
        name_or_path.to_string()
    }
}

pub fn run(spec: &GridSpec, label: &str, dir: &Path) -> anyhow::Result<String> {
    super::check_version(label, spec.format_version)?;
    for (field, empty) in [
        ("panels", spec.panels.is_empty()),
        ("layouts", spec.layouts.is_empty()),
        ("configs", spec.configs.is_empty()),
    ] {
        if empty {
            return Err(SimError::invalid(label, field, "needs at least one entry").into());
        }
    }
    if let Some(base) = &spec.baseline {
        if !spec.configs.iter().any(|c| &c.label == base) {
            return Err(SimError::invalid(
                label,
                "baseline",
                format!("`{base}` is not the label of any config"),
            )
            .into());
        }
    }
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
    let rows = sweep::run(&points, &StrategyOptions::default())?;
    let results = Results { spec, rows: &rows };
    results.csv().write(&dir.join("results.csv"))?;
    plot::write_svg(
        &dir.join("throughput.svg"),
        &spec.title,
        &results.panels(|r| r.throughput(), "throughput (samples/s, all GPUs)"),
        2,
    )?;
    if let Some(base) = &spec.baseline {
        plot::write_svg(
            &dir.join("speedup.svg"),
            &format!("{} — speedup over {base}", spec.title),
            &results.panels(|r| r.speedup, &format!("speedup over {base} (×)")),
            2,
        )?;
    }
    Ok(results.markdown())
}

/// One cell of the results: a row with its speedup over the baseline at the same panel and layout.
struct Cell<'a> {
    panel: &'a PanelSpec,
    config: &'a ConfigSpec,
    row: &'a Row,
    speedup: Option<f64>,
}

impl Cell<'_> {
    fn throughput(&self) -> Option<f64> {
        match &self.row.outcome {
            Outcome::Done(s) => Some(s.throughput_samples_per_s),
            Outcome::Skipped(_) => None,
        }
    }
}

struct Results<'a> {
    spec: &'a GridSpec,
    rows: &'a [Row],
}

impl Results<'_> {
    /// Rows were generated panel-major, then layout, then config.
    fn cells(&self) -> Vec<Cell<'_>> {
        let per_layout = self.spec.configs.len();
        let per_panel = per_layout * self.spec.layouts.len();
        self.rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let config = &self.spec.configs[i % per_layout];
                let first = i - i % per_layout;
                let base = self.spec.baseline.as_ref().and_then(|base| {
                    let at = self.spec.configs.iter().position(|c| &c.label == base)?;
                    match &self.rows[first + at].outcome {
                        Outcome::Done(s) => Some(s.throughput_samples_per_s),
                        Outcome::Skipped(_) => None,
                    }
                });
                let speedup = match (&row.outcome, base) {
                    (Outcome::Done(s), Some(b)) => Some(s.throughput_samples_per_s / b),
                    _ => None,
                };
                Cell {
                    panel: &self.spec.panels[i / per_panel],
                    config,
                    row,
                    speedup,
                }
            })
            .collect()
    }

    fn csv(&self) -> Csv {
        let mut csv = Csv::new(&[
            "panel",
            "model",
            "cluster",
            "inter_gbps",
            "nodes",
            "gpus_per_node",
            "gpus",
            "config",
            "strategy",
            "compressor",
            "memory",
            "status",
            "iteration_time_ms",
            "throughput_samples_per_s",
            "scaling_efficiency",
            "speedup_vs_baseline",
        ]);
        for cell in self.cells() {
            let (row, p) = (cell.row, &cell.row.point);
            let mut fields = vec![
                cell.panel.title.clone(),
                cell.panel.model.clone(),
                cell.panel.cluster.clone(),
                row.layout.inter_gbps.to_string(),
                row.layout.nodes.to_string(),
                row.layout.gpus_per_node.to_string(),
                row.layout.gpus().to_string(),
                cell.config.label.clone(),
                p.strategy.to_string(),
                p.compressor.to_string(),
                p.memory.to_string(),
            ];
            match &row.outcome {
                Outcome::Done(s) => fields.extend([
                    "ok".to_string(),
                    format!("{:.4}", s.iteration_time_ms),
                    format!("{:.2}", s.throughput_samples_per_s),
                    format!("{:.4}", s.scaling_efficiency),
                    cell.speedup.map(|x| format!("{x:.4}")).unwrap_or_default(),
                ]),
                Outcome::Skipped(why) => {
                    fields.push(format!("skipped: {why}"));
                    fields.extend(std::iter::repeat_n(String::new(), 4));
                }
            }
            csv.row(fields);
        }
        csv
    }

    fn panels(&self, metric: impl Fn(&Cell) -> Option<f64>, y_label: &str) -> Vec<Panel> {
        let cells = self.cells();
        self.spec
            .panels
            .iter()
            .map(|panel| Panel {
                title: panel.title.clone(),
                x_label: "GPUs".to_string(),
                y_label: y_label.to_string(),
                series: self
                    .spec
                    .configs
                    .iter()
                    .map(|config| Series {
                        label: config.label.clone(),
                        points: cells
                            .iter()
                            .filter(|c| {
                                std::ptr::eq(c.panel, panel) && std::ptr::eq(c.config, config)
                            })
                            .filter_map(|c| Some((f64::from(c.row.layout.gpus()), metric(c)?)))
                            .collect(),
                    })
                    .filter(|s| !s.points.is_empty())
                    .collect(),
            })
            .collect()
    }

    /// Throughput per configuration (columns) for each panel and layout (rows), with the
    /// speedup over the baseline when there is one.
    fn markdown(&self) -> String {
        let mut md = String::from("| setup | GPUs |");
        for config in &self.spec.configs {
            let _ = write!(md, " {} |", config.label);
        }
        md.push_str("\n|---|---|");
        md.push_str(&"---|".repeat(self.spec.configs.len()));
        md.push('\n');
        let cells = self.cells();
        for line in cells.chunks(self.spec.configs.len()) {
            let _ = write!(
                md,
                "| {} | {} |",
                line[0].panel.title,
                line[0].row.layout.gpus()
            );
            for cell in line {
                match (cell.throughput(), cell.speedup) {
                    (Some(t), Some(s)) => {
                        let _ = write!(md, " {t:.0} ({s:.2}×) |");
                    }
                    (Some(t), None) => {
                        let _ = write!(md, " {t:.0} |");
                    }
                    (None, _) => md.push_str(" skipped |"),
                }
            }
            md.push('\n');
        }
        md.push_str("\nThroughput in samples/s over all GPUs");
        if let Some(base) = &self.spec.baseline {
            let _ = write!(
                md,
                "; in parentheses the speedup over {base} at the same GPU count"
            );
        }
        md.push_str(". Regenerate with `syncopate experiment run` on this directory.\n");
        md
    }
}
