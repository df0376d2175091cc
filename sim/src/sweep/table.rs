//! A sweep's rows as CSV and as chart panels (throughput and scaling efficiency per bandwidth).

use super::{Outcome, Row};
use crate::base::chart::{Panel, Series};
use crate::base::csv::Csv;
use crate::compress::Compressor;
use crate::predict::summary::Summary;

/// The label of a line: strategy, and the compressor when it is not `none`.
pub fn config_label(row: &Row) -> String {
    match row.point.compressor {
        Compressor::None => row.point.strategy.to_string(),
        c => format!("{} + {c}", row.point.strategy),
    }
}

/// One line per row: the point, its layout, and the prediction or why it was skipped.
pub fn csv(rows: &[Row]) -> Csv {
    let mut csv = Csv::new(
        &[
            &["model", "cluster"][..],
            &LAYOUT_COLUMNS,
            &CONFIG_COLUMNS,
            &OUTCOME_COLUMNS,
            &["exposed_comm_ms", "wire_bytes_per_rank"],
        ]
        .concat(),
    );
    for row in rows {
        let mut fields = vec![row.point.model.clone(), row.point.cluster.clone()];
        fields.extend(layout_fields(row));
        fields.extend(config_fields(row));
        fields.extend(outcome_fields(row));
        fields.extend(match row.summary() {
            Some(s) => [
                format!("{:.4}", s.exposed_comm_ms),
                s.wire_bytes_per_rank.to_string(),
            ],
            None => Default::default(),
        });
        csv.row(fields);
    }
    csv
}

/// The columns of [`layout_fields`], [`config_fields`] and [`outcome_fields`].
pub const LAYOUT_COLUMNS: [&str; 4] = ["inter_gbps", "nodes", "gpus_per_node", "gpus"];
/// The columns of [`config_fields`].
pub const CONFIG_COLUMNS: [&str; 6] = [
    "strategy",
    "compressor",
    "memory",
    "codec_calls",
    "framework",
    "codecs",
];
/// The columns of [`outcome_fields`].
pub const OUTCOME_COLUMNS: [&str; 4] = [
    "status",
    "iteration_time_ms",
    "throughput_samples_per_s",
    "scaling_efficiency",
];

/// The layout's columns: `inter_gbps`, `nodes`, `gpus_per_node`, `gpus`.
pub fn layout_fields(row: &Row) -> [String; 4] {
    let layout = &row.layout;
    [
        layout.inter_gbps.to_string(),
        layout.nodes.to_string(),
        layout.gpus_per_node.to_string(),
        layout.gpus().to_string(),
    ]
}

/// The configuration's columns: `strategy`, `compressor`, `memory`, `codec_calls`, the
/// `framework` that ran the plan (`none` without one) and the `codecs` that compressed it
/// (`native`: the device's curves; a file by its name, so that a table does not depend on where
/// the checkout lies).
pub fn config_fields(row: &Row) -> [String; 6] {
    let p = &row.point;
    [
        p.strategy.to_string(),
        p.compressor.to_string(),
        p.memory.to_string(),
        p.codec_calls.name().to_string(),
        p.framework
            .name(p.strategy)
            .unwrap_or_else(|| "none".to_string()),
        p.codecs.as_deref().map_or_else(
            || crate::codec::NATIVE.to_string(),
            |c| {
                std::path::Path::new(c)
                    .file_stem()
                    .map_or_else(|| c.to_string(), |s| s.to_string_lossy().into_owned())
            },
        ),
    ]
}

/// `status` (`ok`, or `skipped: ` and why), then `iteration_time_ms`,
/// `throughput_samples_per_s` and `scaling_efficiency`, empty for a skipped row.
pub fn outcome_fields(row: &Row) -> [String; 4] {
    match &row.outcome {
        Outcome::Done(s) => [
            "ok".to_string(),
            format!("{:.4}", s.iteration_time_ms),
            format!("{:.2}", s.throughput_samples_per_s),
            format!("{:.4}", s.scaling_efficiency),
        ],
        Outcome::Skipped(why) => [
            format!("skipped: {why}"),
            String::new(),
            String::new(),
            String::new(),
        ],
    }
}

/// Per bandwidth, a throughput panel and a scaling-efficiency panel, one line per configuration.
pub fn panels(rows: &[Row], inter_gbps: &[f64]) -> Vec<Panel> {
    let mut panels = Vec::new();
    for &gbps in inter_gbps {
        let at: Vec<&Row> = rows
            .iter()
            .filter(|r| r.layout.inter_gbps == gbps)
            .collect();
        let mut labels: Vec<String> = Vec::new();
        for row in &at {
            let label = config_label(row);
            if !labels.contains(&label) {
                labels.push(label);
            }
        }
        let series = |metric: fn(&Summary) -> f64| {
            labels
                .iter()
                .map(|label| Series {
                    label: label.clone(),
                    points: at
                        .iter()
                        .filter(|r| &config_label(r) == label)
                        .filter_map(|r| Some((f64::from(r.layout.gpus()), metric(r.summary()?))))
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect()
        };
        let unit = at
            .first()
            .map(|r| r.point.model.clone())
            .unwrap_or_default();
        panels.push(Panel {
            title: format!("throughput at {gbps} Gb/s per NIC"),
            x_label: "GPUs".to_string(),
            y_label: format!("samples/s ({unit}, all GPUs)"),
            series: series(|s| s.throughput_samples_per_s),
        });
        panels.push(Panel {
            title: format!("scaling efficiency at {gbps} Gb/s per NIC"),
            x_label: "GPUs".to_string(),
            y_label: "scaling efficiency (%)".to_string(),
            series: series(|s| s.scaling_efficiency * 100.0),
        });
    }
    panels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::Memory;
    use crate::plan::CodecCalls;
    use crate::strategy::{Strategy, StrategyOptions};
    use crate::sweep::{self, Grid};

    fn rows() -> Vec<Row> {
        let strategies: [Strategy; 2] = ["horovod".parse().unwrap(), "mergecomp".parse().unwrap()];
        let grid = Grid {
            model: "resnet50",
            cluster: "v100-10gbe",
            nodes: &[1, 2],
            gpus_per_node: Some(1),
            inter_gbps: &[10.0, 25.0],
            strategies: &strategies,
            compressors: &[Compressor::None],
            memory: Memory::None,
            codec_calls: CodecCalls::Group,
            framework: &sweep::FrameworkChoice::None,
            codecs: None,
        };
        sweep::run(&grid.points(), &StrategyOptions::default()).unwrap()
    }

    #[test]
    fn every_row_has_every_column_and_skipped_rows_say_why() {
        let rows = rows();
        let text = csv(&rows).into_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + rows.len());
        let columns = lines[0].split(',').count();
        for (line, row) in lines[1..].iter().zip(&rows) {
            match row.summary() {
                Some(_) => {
                    assert_eq!(line.split(',').count(), columns, "{line}");
                    assert!(line.contains(",ok,"), "{line}");
                }
                None => assert!(
                    line.contains("skipped: ") && line.ends_with(",,,,,"),
                    "{line}"
                ),
            }
        }
        assert!(rows.iter().any(|r| r.summary().is_none()));
    }

    #[test]
    fn each_bandwidth_has_a_throughput_and_an_efficiency_panel_of_the_configs_that_ran() {
        let panels = panels(&rows(), &[10.0, 25.0]);
        let titles: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "throughput at 10 Gb/s per NIC",
                "scaling efficiency at 10 Gb/s per NIC",
                "throughput at 25 Gb/s per NIC",
                "scaling efficiency at 25 Gb/s per NIC",
            ]
        );
        for panel in &panels {
            assert_eq!(panel.series.len(), 1, "{panel:?}");
            assert_eq!(panel.series[0].label, "horovod");
            let gpus: Vec<f64> = panel.series[0].points.iter().map(|p| p.0).collect();
            assert_eq!(gpus, [1.0, 2.0]);
        }
    }
}
