//! A sweep's rows as CSV and as chart panels (throughput and scaling efficiency per bandwidth).

use super::{Outcome, Row};
use crate::chart::{Panel, Series};
use crate::compress::Compressor;
use crate::csv::Csv;
use crate::simulate::Summary;

/// The label of a line: strategy, and the compressor when it is not `none`.
pub fn config_label(row: &Row) -> String {
    match row.point.compressor {
        Compressor::None => row.point.strategy.to_string(),
        c => format!("{} + {c}", row.point.strategy),
    }
}

/// One line per row: the point, its layout, and the prediction or why it was skipped.
pub fn csv(rows: &[Row]) -> Csv {
    let mut csv = Csv::new(&[
        "model",
        "cluster",
        "inter_gbps",
        "nodes",
        "gpus_per_node",
        "gpus",
        "strategy",
        "compressor",
        "memory",
        "status",
        "iteration_time_ms",
        "throughput_samples_per_s",
        "scaling_efficiency",
        "exposed_comm_ms",
        "wire_bytes_per_rank",
    ]);
    for row in rows {
        let p = &row.point;
        let mut fields = vec![
            p.model.clone(),
            p.cluster.clone(),
            row.layout.inter_gbps.to_string(),
            row.layout.nodes.to_string(),
            row.layout.gpus_per_node.to_string(),
            row.layout.gpus().to_string(),
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
                format!("{:.4}", s.exposed_comm_ms),
                s.wire_bytes_per_rank.to_string(),
            ]),
            Outcome::Skipped(why) => {
                fields.push(format!("skipped: {why}"));
                fields.extend(std::iter::repeat_n(String::new(), 5));
            }
        }
        csv.row(fields);
    }
    csv
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
