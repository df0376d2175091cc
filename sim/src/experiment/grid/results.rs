//! A grid experiment's rows as CSV, chart panels and a Markdown table.
//!
//! They include each config's speedup over the baseline.

use super::{ConfigSpec, GridSpec, PanelSpec};
use crate::base::chart::{Panel, Series};
use crate::base::csv::Csv;
use crate::sweep::table::{
    config_fields, layout_fields, outcome_fields, CONFIG_COLUMNS, LAYOUT_COLUMNS, OUTCOME_COLUMNS,
};
use crate::sweep::Row;
use std::fmt::Write as _;

/// One cell of the results: a row with its speedup over the baseline at the same panel and layout.
pub(super) struct Cell<'a> {
    pub panel: &'a PanelSpec,
    pub config: &'a ConfigSpec,
    pub row: &'a Row,
    pub speedup: Option<f64>,
}

impl Cell<'_> {
    pub(super) fn throughput(&self) -> Option<f64> {
        self.row.summary().map(|s| s.throughput_samples_per_s)
    }
}

/// The rows of a grid, in the order its points were generated.
pub(super) struct Table<'a> {
    pub spec: &'a GridSpec,
    pub rows: &'a [Row],
}

impl Table<'_> {
    /// Rows were generated panel-major, then layout, then config.
    pub(super) fn cells(&self) -> Vec<Cell<'_>> {
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
                    self.rows[first + at]
                        .summary()
                        .map(|s| s.throughput_samples_per_s)
                });
                let speedup = match (row.summary(), base) {
                    (Some(s), Some(b)) => Some(s.throughput_samples_per_s / b),
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

    pub(super) fn csv(&self) -> Csv {
        let mut csv = Csv::new(
            &[
                &["panel", "model", "cluster"][..],
                &LAYOUT_COLUMNS,
                &["config"],
                &CONFIG_COLUMNS,
                &OUTCOME_COLUMNS,
                &["speedup_vs_baseline"],
            ]
            .concat(),
        );
        for cell in self.cells() {
            let mut fields = vec![
                cell.panel.title.clone(),
                cell.panel.model.clone(),
                cell.panel.cluster.clone(),
            ];
            fields.extend(layout_fields(cell.row));
            fields.push(cell.config.label.clone());
            fields.extend(config_fields(cell.row));
            fields.extend(outcome_fields(cell.row));
            fields.push(cell.speedup.map(|x| format!("{x:.4}")).unwrap_or_default());
            csv.row(fields);
        }
        csv
    }

    /// One panel per spec panel, one line per config: `metric` against the GPU count.
    pub(super) fn panels(
        &self,
        metric: impl Fn(&Cell) -> Option<f64>,
        y_label: &str,
    ) -> Vec<Panel> {
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
    pub(super) fn markdown(&self) -> String {
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
