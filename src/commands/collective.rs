//! `syncopate collective`: nccl-tests-style predictions, comparison with measurements, fitting.

use crate::cli::{CollectiveArgs, Format};
use syncopate_sim::calibrate::{self, Measurement};
use syncopate_sim::collective::{Group, Op};
use syncopate_sim::compare::{self, Row};
use syncopate_sim::data::{self, DataKind};
use syncopate_sim::model::{Provenance, Status};
use syncopate_sim::mpi_fit;
use syncopate_sim::topology::{Cluster, Library};
use syncopate_sim::units::{format_bytes, parse_byte_list, parse_bytes};
use syncopate_sim::SimError;

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

/// What a refit appends to a cluster's `source`.
const REFIT_NOTE: &str = " The MPI host cap and message overhead above were since refitted";

/// An MPI cluster's host cap and per-message overhead fitted to allreduce times
/// (`syncopate_sim::mpi_fit`, the fit `lab up` makes), written to `out` as the input file with
/// only its library replaced: its device stays named as the file names it.
fn refit_mpi(
    cluster: &Cluster,
    op: Op,
    measurements: &[Measurement],
    path: &std::path::Path,
    args: &CollectiveArgs,
    out: &std::path::Path,
) -> anyhow::Result<Cluster> {
    if op != Op::Allreduce {
        return Err(SimError::bad_value(
            "--op",
            op,
            "an MPI cluster is fitted to allreduce times: pass --op allreduce",
        )
        .into());
    }
    let fitted = mpi_fit::fit(cluster, measurements)?;
    let mut refit = mpi_fit::apply(cluster, &fitted);
    let method = format!(
        "refitted by `syncopate collective --cluster {} --op allreduce --compare {} --fit-out {}`: {}",
        args.cluster.cluster,
        path.display(),
        out.display(),
        mpi_fit::describe(&refit, measurements, &fitted)?
    );
    if let Library::Mpi(params) = &mut refit.library {
        params.provenance = Provenance {
            status: Status::Calibrated,
            method,
        };
    }
    let written = data::locate(DataKind::Cluster, &args.cluster.cluster)?;
    let mut file: serde_json::Value = serde_json::from_str(&written.text)?;
    file["library"] = serde_json::to_value(&refit.library)?;
    // A second refit replaces the first one's note.
    let source = refit.source.split(REFIT_NOTE).next().unwrap_or_default();
    let refitted = format!(
        "{REFIT_NOTE}: library.provenance says how (host_gbps {}, message_overhead_us {:.2}).",
        fitted
            .host_gbps
            .map_or_else(|| "none".to_string(), |cap| format!("{cap:.4}")),
        fitted.message_overhead_us
    );
    file["source"] = format!("{source}{refitted}").into();
    super::write_json(out, &file)?;
    eprintln!(
        "fitted the MPI host cap and message overhead (mean |error| {:.1} %); wrote {}",
        fitted.mean_error_pct,
        out.display()
    );
    Ok(refit)
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
        Some(out) if matches!(cluster.library, Library::Mpi(_)) => {
            refit_mpi(cluster, op, &measurements, path, args, out)?
        }
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
