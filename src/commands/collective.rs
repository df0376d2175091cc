//! `syncopate collective`: nccl-tests-style predictions, comparison with measurements, fitting.

use crate::cli::{CollectiveArgs, Format};
use syncopate_sim::calibrate::{self, Measurement};
use syncopate_sim::collective::{Group, Op};
use syncopate_sim::compare::{self, Row};
use syncopate_sim::topology::{Cluster, Library};
use syncopate_sim::units::{format_bytes, parse_byte_list, parse_bytes};

pub fn run(args: &CollectiveArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster.cluster, args.cluster.overrides())?;
    let op: Op = args.op.parse()?;
    match &args.compare {
        None => predict(&cluster, op, args),
        Some(path) => compare(&cluster, op, path, args),
    }
}

fn predict(cluster: &Cluster, op: Op, args: &CollectiveArgs) -> anyhow::Result<()> {
    let rows = compare::predict(cluster, op, &parse_byte_list(&args.bytes)?)?;
    match args.format {
        Format::Json => super::print_json(&rows),
        Format::Text => {
            let library = match cluster.library {
                Library::Nccl(_) => "NCCL",
                Library::Mpi(_) => "MPI/TCP",
            };
            println!(
                "# {op} on {} ({} nodes x {} GPUs = {} ranks), {library} library",
                cluster.name,
                cluster.nodes,
                cluster.gpus_per_node,
                Group::world(cluster).ranks,
            );
            print_header(false);
            rows.iter().for_each(print_row);
            Ok(())
        }
    }
}

fn print_header(measured: bool) {
    print!(
        "{:>12} {:>12} {:>12} {:>12}  {:<13} {:<7}",
        "size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "algorithm", "proto"
    );
    if measured {
        print!(" {:>12} {:>8}", "measured", "err(%)");
    }
    println!();
}

fn print_row(r: &Row) {
    print!(
        "{:>12} {:>12.2} {:>12.2} {:>12.2}  {:<13} {:<7}",
        r.bytes, r.time_us, r.algbw_gbytes_per_s, r.busbw_gbytes_per_s, r.algorithm, r.protocol
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
            super::write_json(out, &fitted)?;
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
    let comparison = compare::compare(&cluster, op, &measurements)?;
    match args.format {
        Format::Json => super::print_json(&comparison),
        Format::Text => {
            let mut gpus = 0;
            for row in &comparison.rows {
                if row.gpus != gpus {
                    gpus = row.gpus;
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
            for r in &comparison.errors {
                println!(
                    "{:>6} {:>7} {:>14.1} {:>13.1}",
                    r.gpus, r.points, r.mean_abs_pct, r.max_abs_pct
                );
            }
            Ok(())
        }
    }
}
