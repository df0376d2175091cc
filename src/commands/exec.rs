//! `syncopate exec`: runs a plan for real on a backend and writes the measured trace.
//!
//! It optionally checks the aggregated gradients.

use super::shared::execute::{
    choose_backend, execute, host_ranks, measured_trace, options, Chosen,
};
use super::shared::plan_file::{load_plan_to_run, plan_cluster};
use crate::cli::{ExecArgs, Format, RunArgs, RunClusterArgs};
use anyhow::Context;
use syncopate_exec::runtime::{Job, Measured, MeasuredSummary};
use syncopate_exec::ExecError;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::Cluster;
use syncopate_sim::plan::Plan;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::predict::simulate::schedule;
use syncopate_sim::SimError;

pub fn run(args: &ExecArgs) -> anyhow::Result<()> {
    let (plan, model) = load_plan_to_run(&args.run)?;
    let backend = choose_backend(args.run.backend)?;
    let cluster = run_cluster(&args.run, &args.cluster, &plan, backend)?;
    let scenario = Scenario::new(model, cluster)?;
    let schedule = schedule(&scenario, &plan)?;
    let options = options(&args.run, args.check)?;
    // On an MPI job only rank 0 reports.
    let Some((job, measured)) = execute(backend, &args.run, &scenario, &schedule, &options)? else {
        return Ok(());
    };
    let summary = measured.summary(&job.run_info(backend.name()));
    if let Some(path) = &args.trace {
        write_trace(path, &scenario.model, &job, &measured, &summary)?;
    }
    match args.format {
        Format::Json => super::print_json(&summary)?,
        Format::Text => print_summary(&summary),
    }
    let failed: Vec<String> = summary
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| {
            format!(
                "group {} ({}): error vs reference {:.3e} (tolerance {:.1e}), vs exact sum {:.3e}{}",
                c.group,
                c.compressor,
                c.max_error_vs_reference,
                c.tolerance_vs_reference,
                c.max_error_vs_sum,
                c.tolerance_vs_sum
                    .map(|t| format!(" (tolerance {t:.1e})"))
                    .unwrap_or_default()
            )
        })
        .collect();
    if !failed.is_empty() {
        return Err(ExecError::Check {
            group: summary.checks.iter().find(|c| !c.ok).map_or(0, |c| c.group),
            message: format!("--check failed:\n  {}", failed.join("\n  ")),
        }
        .into());
    }
    Ok(())
}

/// The cluster a run lowers the plan for (see [`plan_cluster`]). On the host backend
/// `--ranks N` means one node of N ranks.
fn run_cluster(
    run: &RunArgs,
    args: &RunClusterArgs,
    plan: &Plan,
    backend: Chosen,
) -> anyhow::Result<Cluster> {
    let (name, mut overrides) = plan_cluster(args, plan)?;
    if let (Some(ranks), Chosen::Host) = (run.ranks, backend) {
        // Other backends take their ranks from the machine or the launcher.
        let ranks = host_ranks(ranks)?;
        match (args.nodes, args.gpus_per_node) {
            (None, None) => {
                overrides.nodes = Some(1);
                overrides.gpus_per_node = Some(ranks);
            }
            (nodes, gpus) => {
                let world = u64::from(nodes.unwrap_or(1)) * u64::from(gpus.unwrap_or(1));
                if world != u64::from(ranks) {
                    return Err(SimError::bad_value(
                        "--ranks",
                        ranks,
                        format!("contradicts --nodes/--gpus-per-node, which make {world} ranks"),
                    )
                    .into());
                }
            }
        }
    }
    let cluster = Cluster::load(&name, overrides)?;
    if let Some(t) = &plan.target {
        if (t.nodes, t.gpus_per_node) != (cluster.nodes, cluster.gpus_per_node) {
            eprintln!(
                "note: the plan was made for {} × {}; running it on {} × {}",
                t.nodes, t.gpus_per_node, cluster.nodes, cluster.gpus_per_node
            );
        }
    }
    Ok(cluster)
}

fn write_trace(
    path: &std::path::Path,
    model: &ModelProfile,
    job: &Job,
    measured: &Measured,
    summary: &MeasuredSummary,
) -> anyhow::Result<()> {
    let trace = measured_trace(model, job, measured, summary)?;
    super::write_atomically(path, &serde_json::to_string(&trace)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

fn print_summary(s: &MeasuredSummary) {
    println!(
        "{} ({}) on the {} backend, {} ranks: measured",
        s.model, s.strategy, s.backend, s.world_size
    );
    println!(
        "  iteration time      {:>12.3} ms   (mean of {})",
        s.iteration_time_ms, s.measured_iterations
    );
    println!(
        "  compute             {:>12.3} ms   (scale {:.4})",
        s.compute_ms, s.compute_scale
    );
    println!("  compression         {:>12.3} ms", s.compression_ms);
    println!("  communication       {:>12.3} ms", s.comm_ms);
    for c in &s.checks {
        // A sharded plan's gathers are checked too: every rank holds every shard as sent.
        let gathers = match c.gathers_checked {
            0 => String::new(),
            n => format!(", {n} parameter gathers identical on every rank"),
        };
        println!(
            "  check group {:<3} {:<14} {}  vs reference {:.2e}, vs exact sum {:.2e}{gathers}",
            c.group,
            c.compressor,
            if c.ok { "ok  " } else { "FAIL" },
            c.max_error_vs_reference,
            c.max_error_vs_sum
        );
    }
}
