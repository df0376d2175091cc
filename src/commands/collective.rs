//! `syncopate collective`: nccl-tests-style predictions, comparison with measurements, fitting.

use crate::cli::{CollectiveArgs, Format, TcpLibrary};
use syncopate_sim::base::data::{self, DataKind};
use syncopate_sim::base::units::{format_bytes, parse_byte_list, parse_bytes};
use syncopate_sim::calibrate::beside_compute;
use syncopate_sim::calibrate::compare::{self, Row};
use syncopate_sim::calibrate::tcp_fit::{self, Timed};
use syncopate_sim::calibrate::{self, FitReport, Holdout, Measurement, RowFilter};
use syncopate_sim::calibrate::{fp16_sum_fit, p2p_fit};
use syncopate_sim::collective::Group;
use syncopate_sim::collective_op::Op;
use syncopate_sim::inputs::model::{Provenance, Status};
use syncopate_sim::inputs::topology::{Cluster, ClusterContention, Library, TcpParams};
use syncopate_sim::SimError;

pub fn run(args: &CollectiveArgs) -> anyhow::Result<()> {
    let mut cluster = Cluster::load(&args.cluster.cluster, args.cluster.overrides())?;
    if let Some(library) = args.library {
        cluster.library = as_library(&cluster, library)?;
    }
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
            let library = cluster.library.label();
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

/// `cluster`'s TCP parameters as `library`'s.
fn as_library(cluster: &Cluster, library: TcpLibrary) -> anyhow::Result<Library> {
    let Some(params) = cluster.library.tcp() else {
        return Err(SimError::bad_value(
            "--library",
            format!("{library:?}").to_lowercase(),
            format!(
                "`{}` runs NCCL; only a TCP cluster (library mpi or gloo) is priced as another TCP library",
                cluster.name
            ),
        )
        .into());
    };
    // Sweeps measured another library's collectives: this one's are priced by the model.
    let mut params = params.clone();
    let same = matches!(
        (&cluster.library, library),
        (Library::Mpi(_), TcpLibrary::Mpi) | (Library::Gloo(_), TcpLibrary::Gloo)
    );
    if !same {
        params.measured.clear();
        // A pinned allreduce was what that library was told to run.
        params.allreduce_algorithm = None;
        // The queue was measured on that library's sockets.
        params.queue_behind_bytes = None;
        // The float16 sums were that library's.
        params.fp16_sum_ns_per_element = None;
    }
    Ok(match library {
        TcpLibrary::Mpi => Library::Mpi(params),
        TcpLibrary::Gloo => Library::Gloo(params),
    })
}

/// What a refit appends to a cluster's `source`.
const REFIT_NOTE: &str = " The TCP host cap and overheads above were since refitted";

/// The collectives a TCP library's fit reads: MPI's sweep times allreduce; gloo's sweep
/// (`python -m syncopate.torch.sweep`) times allreduce and allgather, which the fit needs both
/// of to tell a call's cost from a message's.
fn fitted_ops(library: &Library) -> &'static [Op] {
    match library {
        Library::Gloo(_) => &[Op::Allreduce, Op::Allgather],
        _ => &[Op::Allreduce],
    }
}

/// A TCP cluster's host cap and overheads fitted to the times not held out
/// (`syncopate_sim::calibrate::tcp_fit`, the fit `lab up` makes for MPI), written to `out` as the input
/// file with only its library replaced: its device stays named as the file names it.
fn refit_tcp(
    cluster: &Cluster,
    measurements: &[Timed],
    kept: &[Timed],
    path: &std::path::Path,
    args: &CollectiveArgs,
    out: &std::path::Path,
    beside: Option<&(beside_compute::SweepFit, &std::path::Path)>,
) -> anyhow::Result<Cluster> {
    let fitted = tcp_fit::fit(cluster, measurements)?;
    let measured = [measurements, kept].concat();
    let mut refit = tcp_fit::attach(&tcp_fit::apply(cluster, &fitted), &measured);
    let mut described = tcp_fit::describe(&refit, measurements, &fitted)?;
    // A sweep that timed the parameter server's messages gives their cost on the fitted links.
    let has_ops = calibrate::has_op_column(path)?;
    let named = |name| match has_ops {
        true => calibrate::read_named(path, name, cluster.world_size()),
        false => Ok(Vec::new()),
    };
    let pushes = named(p2p_fit::OP)?;
    if !pushes.is_empty() {
        let all = named(p2p_fit::OP_ALL)?;
        let p2p = p2p_fit::fit(&refit, &pushes, &all, &path.display().to_string())?;
        refit = p2p_fit::apply(&refit, &p2p);
        described = format!("{described}; {}", p2p_fit::describe(&p2p));
        eprintln!(
            "fitted {:.1} µs per point-to-point message from {} push-pull rows{}",
            p2p.per_message_us,
            p2p.rows.len(),
            p2p.rounds_at_once.map_or_else(String::new, |r| format!(
                ", {r:.2} rounds to different servers at once"
            ))
        );
    } else if let Some(note) = kept_from_input(
        &refit,
        |p| p.p2p_message_overhead_us.is_some(),
        // Fitted there on its links rather than these.
        "p2p_message_overhead_us and p2p_rounds_at_once",
        "the sweep has no push-pull rows",
    ) {
        described = format!("{described}; {note}");
    }
    // A sweep that timed fp16 allreduces beside fp32 ones gives the cost of float16 sums.
    let halves = named(fp16_sum_fit::OP)?;
    if !halves.is_empty() && matches!(refit.library, Library::Gloo(_)) {
        let fp32 = named(Op::Allreduce.name())?;
        let sums = fp16_sum_fit::fit(&refit, &halves, &fp32, &path.display().to_string())?;
        refit = fp16_sum_fit::apply(&refit, &sums);
        described = format!("{described}; {}", fp16_sum_fit::describe(&sums));
        eprintln!(
            "fitted {:.2} ns per summed float16 element from {} fp16 allreduce rows",
            sums.ns_per_element,
            sums.rows.len()
        );
    } else if let Some(note) = kept_from_input(
        &refit,
        |p| p.fp16_sum_ns_per_element.is_some(),
        "fp16_sum_ns_per_element",
        "the sweep has no allreduce-fp16 rows",
    ) {
        described = format!("{described}; {note}");
    }
    if let Some(note) = kept_from_input(
        &refit,
        |p| p.queue_behind_bytes.is_some(),
        // Measured beside a second stream (`lab up`).
        "queue_behind_bytes",
        "a sweep times one stream at a time",
    ) {
        described = format!("{described}; {note}");
    }
    let library = args
        .library
        .map_or_else(String::new, |l| format!(" --library {l:?}").to_lowercase());
    let method = format!(
        "refitted by `syncopate collective --cluster {}{library} --compare {} --fit-out {}`: {described}",
        args.cluster.cluster,
        path.display(),
        out.display(),
    );
    if let Some(params) = refit.library.tcp_mut() {
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
        "{REFIT_NOTE}: library.provenance says how (host_gbps {}, call_overhead_us {:.2}, message_overhead_us {:.2}).",
        fitted
            .host_gbps
            .map_or_else(|| "none".to_string(), |cap| format!("{cap:.4}")),
        fitted.call_overhead_us,
        fitted.message_overhead_us
    );
    file["source"] = format!("{source}{refitted}").into();
    if let Some((slowdown, busy)) = beside {
        set_collective_slowdown(&mut file, slowdown, (path, busy), args)?;
    }
    super::write_json(out, &file)?;
    eprintln!(
        "fitted the {} host cap and overheads (mean |error| {:.1} %); wrote {}",
        refit.library.label(),
        fitted.mean_error_pct,
        out.display()
    );
    Ok(refit)
}

/// The refit's note on `fields` of `cluster`'s TCP library, which `has` says the input file
/// states and the sweep cannot refit (`why`); None where the file has none.
fn kept_from_input(
    cluster: &Cluster,
    has: impl Fn(&TcpParams) -> bool,
    fields: &str,
    why: &str,
) -> Option<String> {
    cluster
        .library
        .tcp()
        .is_some_and(has)
        .then(|| format!("{fields} kept from the input file, not refitted: {why}"))
}

/// What a measured slowdown beside compute appends to the contention's provenance.
const BESIDE_COMPUTE_NOTE: &str = " Since measured with the library's own sweeps";

/// Writes the slowdown and delays of collectives beside compute, measured by the sweeps
/// `alone` and `busy`, into the cluster file's `contention`, and compute slowed by collectives
/// where `busy` measured it; its other figures (compute slowed by compression, the shared
/// cores) stay as measured before.
fn set_collective_slowdown(
    file: &mut serde_json::Value,
    slowdown: &beside_compute::SweepFit,
    (alone, busy): (&std::path::Path, &std::path::Path),
    args: &CollectiveArgs,
) -> anyhow::Result<()> {
    let Some(contention) = file.get_mut("contention").filter(|c| c.is_object()) else {
        return Err(SimError::bad_value(
            "--beside-compute",
            busy.display(),
            format!(
                "`{}` has no `contention` section to refine (a lab's cluster file has one: `syncopate lab up --cluster-out` with the mpi feature)",
                args.cluster.cluster
            ),
        )
        .into());
    };
    let fit = &slowdown.fit;
    // The file was loaded as a cluster already, so its contention parses.
    let mut parsed: ClusterContention = serde_json::from_value(contention.clone())?;
    slowdown.apply_to(&mut parsed);
    *contention = serde_json::to_value(parsed)?;
    let method = contention["provenance"]["method"]
        .as_str()
        .unwrap_or_default()
        .split(BESIDE_COMPUTE_NOTE)
        .next()
        .unwrap_or_default()
        .to_string();
    contention["provenance"]["method"] = format!(
        "{method}{BESIDE_COMPUTE_NOTE} (`--compare {} --beside-compute {}`): {}",
        alone.display(),
        busy.display(),
        beside_compute::describe(slowdown)
    )
    .into();
    eprintln!(
        "measured collectives beside compute {:.3}x slower and {:.1} µs later (allgathers {}), through {} sizes",
        fit.line.factor,
        fit.line.delay_us,
        fit.allgather_delay_us
            .map_or("not timed".into(), |d| format!("{d:.1} µs later")),
        slowdown.pairs.len()
    );
    if let Some(compute) = &slowdown.compute {
        eprintln!(
            "measured compute beside allreduces {:.3}x slower (the median over {} sizes)",
            compute.factor,
            compute.sizes.len()
        );
    }
    Ok(())
}

/// `rows` of `op` from `path`, unless there are none: an error naming the size range.
fn some_rows(
    rows: Vec<Measurement>,
    op: Op,
    path: &std::path::Path,
    args: &CollectiveArgs,
) -> anyhow::Result<Vec<Measurement>> {
    let (min, max) = (parse_bytes(&args.min_bytes)?, parse_bytes(&args.max_bytes)?);
    anyhow::ensure!(
        !rows.is_empty(),
        "{}: no {op} measurements between {} and {} bytes",
        path.display(),
        format_bytes(min),
        format_bytes(max)
    );
    Ok(rows)
}

/// The rows of `path` for `op` between --min-bytes and --max-bytes that the filters accept (in a
/// file with an `op` column, only `op`'s rows), perhaps none.
fn rows_of(
    cluster: &Cluster,
    op: Op,
    path: &std::path::Path,
    args: &CollectiveArgs,
    filters: &[RowFilter],
) -> anyhow::Result<Vec<Measurement>> {
    let (min, max) = (parse_bytes(&args.min_bytes)?, parse_bytes(&args.max_bytes)?);
    Ok(calibrate::read_measurements(
        path,
        op,
        args.column.as_deref(),
        cluster.world_size(),
        filters,
    )?
    .into_iter()
    .filter(|m| (min..=max).contains(&m.bytes))
    .collect())
}

/// The collectives whose rows a refit keeps in the cluster's `measured` without fitting to
/// them: an MPI sweep's allgathers (`lab up` times the MPI backend's own) and any sweep's
/// reduce-scatters (`python -m syncopate.torch.sweep --ops reduce-scatter` times FSDP2's), which
/// stand in for the model where a plan runs that collective.
fn kept_ops(library: &Library) -> &'static [Op] {
    match library {
        Library::Mpi(_) => &[Op::Allgather, Op::ReduceScatter],
        _ => &[Op::ReduceScatter],
    }
}

/// The rows of the [`kept_ops`] not held out.
fn kept_set(
    cluster: &Cluster,
    path: &std::path::Path,
    args: &CollectiveArgs,
    filters: &[RowFilter],
    held_out: &[u32],
) -> anyhow::Result<Vec<Timed>> {
    if !calibrate::has_op_column(path)? {
        return Ok(Vec::new());
    }
    let mut kept = Vec::new();
    for &op in kept_ops(&cluster.library) {
        // A sweep that did not time the collective has nothing to keep of it.
        if calibrate::read_named(path, op.name(), cluster.world_size())?.is_empty() {
            continue;
        }
        let rows = rows_of(cluster, op, path, args, filters)?;
        kept.extend(
            calibrate::fit_set(&rows, held_out)
                .into_iter()
                .map(|measured| Timed { op, measured }),
        );
    }
    Ok(kept)
}

/// The TCP fit's measurements: every fitted collective's rows not held out.
fn tcp_fit_set(
    cluster: &Cluster,
    op: Op,
    path: &std::path::Path,
    args: &CollectiveArgs,
    filters: &[RowFilter],
    held_out: &[u32],
) -> anyhow::Result<Vec<Timed>> {
    let ops = fitted_ops(&cluster.library);
    if ops.len() == 1 && op != ops[0] {
        return Err(SimError::bad_value(
            "--op",
            op,
            format!(
                "an MPI cluster is fitted to {} times: pass --op {}",
                ops[0], ops[0]
            ),
        )
        .into());
    }
    if ops.len() > 1 && !calibrate::has_op_column(path)? {
        return Err(SimError::bad_value(
            "--compare",
            path.display(),
            "a gloo fit needs allreduce and allgather rows named in an `op` column (as `python -m syncopate.torch.sweep` writes them)",
        )
        .into());
    }
    let mut timed = Vec::new();
    for &fitted in ops {
        let rows = some_rows(
            rows_of(cluster, fitted, path, args, filters)?,
            fitted,
            path,
            args,
        )?;
        timed.extend(
            calibrate::fit_set(&rows, held_out)
                .into_iter()
                .map(|measured| Timed {
                    op: fitted,
                    measured,
                }),
        );
    }
    Ok(timed)
}

fn compare(
    cluster: &Cluster,
    op: Op,
    path: &std::path::Path,
    args: &CollectiveArgs,
) -> anyhow::Result<()> {
    let (min, max) = (parse_bytes(&args.min_bytes)?, parse_bytes(&args.max_bytes)?);
    let filters = args
        .where_
        .iter()
        .map(|f| f.parse())
        .collect::<Result<Vec<RowFilter>, _>>()?;
    let measurements = some_rows(rows_of(cluster, op, path, args, &filters)?, op, path, args)?;
    // A fit reports its error on data it did not use: by default the largest scale is kept out.
    let holdout: Holdout = match (&args.holdout_gpus, &args.fit_out) {
        (Some(text), _) => text.parse()?,
        (None, Some(_)) => Holdout::LargestScale,
        (None, None) => Holdout::Nothing,
    };
    let held_out = holdout.gpus(&measurements);
    // The sweep beside compute (with --fit-out only) refines a TCP library's contention.
    let beside = match &args.beside_compute {
        None => None,
        Some(busy) if cluster.library.tcp().is_none() => {
            return Err(SimError::bad_value(
                "--beside-compute",
                busy.display(),
                format!(
                    "`{}` runs NCCL, whose collectives do not run on the cores compute uses; only a TCP cluster (MPI or gloo) is slowed that way",
                    cluster.name
                ),
            )
            .into())
        }
        Some(busy) => {
            let alone = tcp_fit_set(cluster, op, path, args, &filters, &[])?;
            let beside = tcp_fit_set(cluster, op, busy, args, &filters, &[])?;
            let mut fit = beside_compute::fit(&alone, &beside)?;
            fit.compute = beside_compute::compute_slowdown(busy, cluster.world_size())?;
            Some((fit, busy.as_path()))
        }
    };
    let cluster = match &args.fit_out {
        None => cluster.clone(),
        Some(out) if cluster.library.tcp().is_some() => {
            let fit_set = tcp_fit_set(cluster, op, path, args, &filters, &held_out)?;
            let kept = kept_set(cluster, path, args, &filters, &held_out)?;
            refit_tcp(cluster, &fit_set, &kept, path, args, out, beside.as_ref())?
        }
        Some(out) => {
            let fit_set = calibrate::fit_set(&measurements, &held_out);
            let report = calibrate::fit_report(cluster, op, &fit_set, args.fit_only.as_deref())?;
            super::write_json(out, &report.cluster)?;
            print_fit_report(&report, &held_out, out);
            report.cluster
        }
    };
    // The cost model's error: a sweep the file carries would score itself.
    let comparison =
        compare::compare(&tcp_fit::parametric(&cluster), op, &measurements, &held_out)?;
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
                let mark = if held_out.contains(&r.gpus) {
                    "  held out"
                } else {
                    ""
                };
                println!(
                    "{:>6} {:>7} {:>14.1} {:>13.1}{mark}",
                    r.gpus, r.points, r.mean_abs_pct, r.max_abs_pct
                );
            }
            let label = if held_out.is_empty() {
                "all"
            } else {
                "fitted on"
            };
            for (what, summary) in [
                (label, &comparison.fit_error),
                ("held out", &comparison.held_out_error),
            ] {
                if let Some(s) = summary {
                    println!(
                        "# {what} (GPUs {}): {} points, mean |err| {:.1} %, max {:.1} %",
                        join(&s.gpus),
                        s.points,
                        s.mean_abs_pct,
                        s.max_abs_pct
                    );
                }
            }
            Ok(())
        }
    }
}

fn join(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the fit determined, what it could not, and which parameters ended on a bound.
fn print_fit_report(report: &FitReport, held_out: &[u32], out: &std::path::Path) {
    let kept_out = if held_out.is_empty() {
        "nothing held out".to_string()
    } else {
        format!("GPUs {} held out", join(held_out))
    };
    eprintln!(
        "fitted {} (objective {:.2}, {kept_out}); wrote {}",
        report.fitted.join(", "),
        report.objective,
        out.display()
    );
    for kept in &report.kept {
        eprintln!("kept {}: {}", kept.name, kept.reason);
    }
    for hit in &report.at_bounds {
        eprintln!(
            "warning: {} = {} is on its bound {}: the model's structure, not the data's noise, limits the fit",
            hit.name, hit.value, hit.bound
        );
    }
}
