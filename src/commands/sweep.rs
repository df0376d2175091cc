//! `syncopate sweep`: a grid of GPU counts × bandwidths × strategies × compressors, as a table, CSV and SVG.

use crate::cli::SweepArgs;
use crate::csv::Csv;
use crate::plot::{self, Panel, Series};
use anyhow::Context;
use syncopate_sim::compress::{Compressor, Memory};
use syncopate_sim::strategy::{Strategy, StrategyOptions};
use syncopate_sim::sweep::{self, Grid, Outcome, Row};
use syncopate_sim::topology::{Cluster, ClusterOverrides};
use syncopate_sim::SimError;

pub fn run(args: &SweepArgs) -> anyhow::Result<()> {
    let strategies = args
        .strategy
        .iter()
        .map(|s| s.trim().parse())
        .collect::<Result<Vec<Strategy>, _>>()?;
    let compressors = args
        .compressor
        .iter()
        .map(|c| c.trim().parse())
        .collect::<Result<Vec<Compressor>, _>>()?;
    let memory: Memory = args.memory.parse()?;
    if let Some(&zero) = args.nodes.iter().find(|&&n| n == 0) {
        return Err(
            SimError::bad_value("--nodes", zero, "a cluster needs at least one node").into(),
        );
    }
    let inter_gbps = if args.inter_gbps.is_empty() {
        let cluster = Cluster::load(&args.cluster, ClusterOverrides::default())?;
        vec![cluster.inter_node.nic_bandwidth_gbps]
    } else {
        args.inter_gbps.clone()
    };
    let grid = Grid {
        model: &args.model,
        cluster: &args.cluster,
        nodes: &args.nodes,
        gpus_per_node: args.gpus_per_node,
        inter_gbps: &inter_gbps,
        strategies: &strategies,
        compressors: &compressors,
        memory,
    };
    let rows = sweep::run(&grid.points(), &StrategyOptions::default())?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let csv_path = args.out.join("sweep.csv");
    let svg_path = args.out.join("sweep.svg");
    csv(&rows).write(&csv_path)?;
    let title = format!("{} on {}", args.model, args.cluster);
    plot::write_svg(&svg_path, &title, &panels(&rows, &inter_gbps), 2)?;
    print_table(&rows);
    println!("wrote {} and {}", csv_path.display(), svg_path.display());
    Ok(())
}

/// The label of a line: strategy, and the compressor when it is not `none`.
fn config_label(row: &Row) -> String {
    match row.point.compressor {
        Compressor::None => row.point.strategy.to_string(),
        c => format!("{} + {c}", row.point.strategy),
    }
}

fn csv(rows: &[Row]) -> Csv {
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
fn panels(rows: &[Row], inter_gbps: &[f64]) -> Vec<Panel> {
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
        let series = |metric: fn(&syncopate_sim::simulate::Summary) -> f64| {
            labels
                .iter()
                .map(|label| Series {
                    label: label.clone(),
                    points: at
                        .iter()
                        .filter(|r| &config_label(r) == label)
                        .filter_map(|r| match &r.outcome {
                            Outcome::Done(s) => Some((f64::from(r.layout.gpus()), metric(s))),
                            Outcome::Skipped(_) => None,
                        })
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

fn print_table(rows: &[Row]) {
    println!(
        "{:>8} {:>6} {:>5}  {:<28} {:>10} {:>12} {:>7}",
        "Gb/s", "nodes", "GPUs", "strategy + compressor", "iter ms", "samples/s", "eff %"
    );
    for row in rows {
        let head = format!(
            "{:>8} {:>6} {:>5}  {:<28}",
            row.layout.inter_gbps,
            row.layout.nodes,
            row.layout.gpus(),
            config_label(row)
        );
        match &row.outcome {
            Outcome::Done(s) => println!(
                "{head} {:>10.3} {:>12.1} {:>7.1}",
                s.iteration_time_ms,
                s.throughput_samples_per_s,
                s.scaling_efficiency * 100.0
            ),
            Outcome::Skipped(why) => println!("{head} skipped: {why}"),
        }
    }
}
