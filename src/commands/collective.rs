//! `syncopate collective`: nccl-tests-style predictions, comparison with measurements, fitting.

use crate::cli::{CollectiveArgs, Format};
use anyhow::Context;
use serde::Serialize;
use syncopate_sim::calibrate::{self, Measurement};
use syncopate_sim::collective::{self, Estimate, Group, Op};
use syncopate_sim::topology::Cluster;
use syncopate_sim::units::{format_bytes, parse_byte_list, parse_bytes};

/// One row of the prediction table (and of the JSON output).
#[derive(Serialize)]
struct Row {
    bytes: u64,
    time_us: f64,
    /// nccl-tests' algorithm bandwidth in GB/s.
    algbw_gbps: f64,
    /// nccl-tests' bus bandwidth in GB/s.
    busbw_gbps: f64,
    algorithm: &'static str,
    protocol: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    measured_time_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_pct: Option<f64>,
}

impl Row {
    fn new(op: Op, ranks: u32, bytes: u64, estimate: &Estimate, measured: Option<f64>) -> Row {
        let algbw = estimate.algbw_gbytes_per_s(bytes);
        Row {
            bytes,
            time_us: round3(estimate.time.as_us()),
            algbw_gbps: round3(algbw),
            busbw_gbps: round3(algbw * op.bus_factor(ranks)),
            algorithm: estimate.algorithm.name(),
            protocol: estimate.protocol.name(),
            measured_time_us: measured,
            error_pct: measured.map(|m| round3((estimate.time.as_us() - m) / m * 100.0)),
        }
    }
}

fn round3(value: f64) -> f64 {
    (value * 1e3).round() / 1e3
}

pub fn run(args: &CollectiveArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster.cluster, args.cluster.overrides())?;
    let op: Op = args.op.parse()?;
    match &args.compare {
        None => predict(&cluster, op, args),
        Some(path) => compare(&cluster, op, path, args),
    }
}

fn predict(cluster: &Cluster, op: Op, args: &CollectiveArgs) -> anyhow::Result<()> {
    let sizes = parse_byte_list(&args.bytes)?;
    let group = Group::world(cluster);
    let rows = sizes
        .iter()
        .map(|&bytes| {
            Ok(Row::new(
                op,
                group.ranks,
                bytes,
                &collective::estimate(cluster, op, bytes, group)?,
                None,
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    match args.format {
        Format::Json => super::print_json(&rows),
        Format::Text => {
            println!(
                "# {op} on {} ({} nodes x {} GPUs = {} ranks), {} library",
                cluster.name,
                cluster.nodes,
                cluster.gpus_per_node,
                group.ranks,
                library_name(cluster)
            );
            print_table(&rows);
            Ok(())
        }
    }
}

fn library_name(cluster: &Cluster) -> &'static str {
    match cluster.library {
        syncopate_sim::topology::Library::Nccl(_) => "NCCL",
        syncopate_sim::topology::Library::Mpi(_) => "MPI/TCP",
    }
}

fn print_table(rows: &[Row]) {
    print_header(rows.iter().any(|r| r.measured_time_us.is_some()));
    rows.iter().for_each(print_row);
}

fn print_header(measured: bool) {
    print!(
        "{:>12} {:>12} {:>10} {:>10}  {:<13} {:<7}",
        "size(B)", "time(us)", "algbw", "busbw", "algorithm", "proto"
    );
    if measured {
        print!(" {:>12} {:>8}", "measured", "err(%)");
    }
    println!();
}

fn print_row(r: &Row) {
    print!(
        "{:>12} {:>12.2} {:>10.2} {:>10.2}  {:<13} {:<7}",
        r.bytes, r.time_us, r.algbw_gbps, r.busbw_gbps, r.algorithm, r.protocol
    );
    if let (Some(m), Some(e)) = (r.measured_time_us, r.error_pct) {
        print!(" {m:>12.2} {e:>8.1}");
    }
    println!();
}

fn compare(
    cluster: &Cluster,
    op: Op,
    path: &std::path::Path,
    args: &CollectiveArgs,
) -> anyhow::Result<()> {
    let (min, max) = (parse_bytes(&args.min_bytes)?, parse_bytes(&args.max_bytes)?);
    let measurements: Vec<Measurement> =
        calibrate::read_measurements(path, op, args.column.as_deref(), cluster.world_size())?
            .into_iter()
            .filter(|m| (min..=max).contains(&m.bytes))
            .collect();
    anyhow::ensure!(
        !measurements.is_empty(),
        "{}: no measurements between {} and {} bytes",
        path.display(),
        format_bytes(min),
        format_bytes(max)
    );
    let cluster = match &args.fit_out {
        None => cluster.clone(),
        Some(out) => {
            let (fitted, score) =
                calibrate::fit(cluster, op, &measurements, args.fit_only.as_deref())?;
            let text = serde_json::to_string_pretty(&fitted)? + "\n";
            std::fs::write(out, text).with_context(|| format!("cannot write {}", out.display()))?;
            let fields = match &args.fit_only {
                Some(names) => names.join(", "),
                None => calibrate::fitted_fields().join(", "),
            };
            eprintln!(
                "fitted {fields} (objective {score:.2}); wrote {}",
                out.display()
            );
            fitted
        }
    };
    let predictions = calibrate::predict(&cluster, op, &measurements)?;
    let table = calibrate::error_table(&measurements, &predictions);
    match args.format {
        Format::Json => {
            #[derive(Serialize)]
            struct Report<'a> {
                rows: Vec<Row>,
                error_by_gpus: Vec<ErrorJson>,
                cluster: &'a str,
            }
            #[derive(Serialize)]
            struct ErrorJson {
                gpus: u32,
                points: usize,
                mean_abs_error_pct: f64,
                max_abs_error_pct: f64,
            }
            let rows = rows_with_measurements(op, &measurements, &predictions);
            let error_by_gpus = table
                .iter()
                .map(|r| ErrorJson {
                    gpus: r.gpus,
                    points: r.points,
                    mean_abs_error_pct: round3(r.mean_abs_pct),
                    max_abs_error_pct: round3(r.max_abs_pct),
                })
                .collect();
            super::print_json(&Report {
                rows,
                error_by_gpus,
                cluster: &cluster.name,
            })
        }
        Format::Text => {
            let rows = rows_with_measurements(op, &measurements, &predictions);
            let mut gpus = 0;
            for (m, row) in measurements.iter().zip(&rows) {
                if m.gpus != gpus {
                    gpus = m.gpus;
                    println!("\n# {op}, {gpus} GPUs on {}", cluster.name);
                    print_header(true);
                }
                print_row(row);
            }
            println!(
                "\n# error of predicted vs measured time, {} to {}",
                format_bytes(min),
                format_bytes(max)
            );
            println!(
                "{:>6} {:>7} {:>14} {:>13}",
                "gpus", "points", "mean |err| %", "max |err| %"
            );
            for r in &table {
                println!(
                    "{:>6} {:>7} {:>14.1} {:>13.1}",
                    r.gpus, r.points, r.mean_abs_pct, r.max_abs_pct
                );
            }
            Ok(())
        }
    }
}

fn rows_with_measurements(
    op: Op,
    measurements: &[Measurement],
    predictions: &[Estimate],
) -> Vec<Row> {
    measurements
        .iter()
        .zip(predictions)
        .map(|(m, p)| Row::new(op, m.gpus, m.bytes, p, Some(m.time_us)))
        .collect()
}
