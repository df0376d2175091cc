//! `syncopate exec`: runs a plan for real on a backend, optionally checks the aggregated gradients, and writes the measured trace.

use crate::cli::{ExecArgs, ExecBackend, Format, RunArgs};
use anyhow::Context;
use std::time::Duration;
use syncopate_exec::runtime::{self, Backend, ExecOptions, Measured, MeasuredSummary};
use syncopate_exec::ExecError;
use syncopate_sim::graph::TaskGraph;
use syncopate_sim::model::ModelProfile;
use syncopate_sim::plan::Plan;
use syncopate_sim::scenario::Scenario;
use syncopate_sim::topology::Cluster;
use syncopate_sim::trace::Trace;
use syncopate_sim::SimError;

/// The host backend keeps an iteration's compute under this by default.
const HOST_COMPUTE_BUDGET_US: f64 = 100_000.0;

pub fn run(args: &ExecArgs) -> anyhow::Result<()> {
    let cluster = Cluster::load(&args.cluster.cluster, args.cluster.overrides())?;
    let scenario = scenario(&args.run, cluster)?;
    let (options, backend) = options(&args.run, args.check)?;
    let (graph, measured) = runtime::execute(backend, &scenario, &options)?;
    let summary = measured.summary(&scenario, &graph, &options, backend_name(args.run.backend));
    if let Some(path) = &args.trace {
        write_trace(path, &scenario, &graph, &measured, &summary)?;
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

pub fn backend_name(backend: ExecBackend) -> &'static str {
    match backend {
        ExecBackend::Cuda => "cuda",
        ExecBackend::Host => "host",
    }
}

/// The scenario a run executes. On the host the cluster is resized to the thread ranks, and
/// compute follows the model profile times the host compute scale.
pub fn scenario(run: &RunArgs, mut cluster: Cluster) -> anyhow::Result<Scenario> {
    let model = ModelProfile::load(&run.model)?;
    let label = run.plan.to_string_lossy().into_owned();
    let plan = Plan::load(&label)?;
    if run.backend == ExecBackend::Host {
        if run.ranks == 0 {
            return Err(SimError::bad_value("--ranks", 0, "needs at least one rank").into());
        }
        if cluster.world_size() != run.ranks {
            cluster.nodes = 1;
            cluster.gpus_per_node = run.ranks;
        }
    }
    let mut scenario = Scenario::new(model, cluster, plan, &label)?;
    if run.backend == ExecBackend::Host {
        scenario.compute_scale = host_compute_scale(run, &scenario.model)?;
    }
    Ok(scenario)
}

fn host_compute_scale(run: &RunArgs, model: &ModelProfile) -> anyhow::Result<f64> {
    match run.compute_scale {
        Some(scale) if scale.is_finite() && scale >= 0.0 => Ok(scale),
        Some(scale) => {
            Err(SimError::bad_value("--compute-scale", scale, "must be zero or positive").into())
        }
        None => {
            let total_us =
                (model.forward_time() + model.backward_time()).as_us() + model.optimizer_us;
            Ok(if total_us > HOST_COMPUTE_BUDGET_US {
                HOST_COMPUTE_BUDGET_US / total_us
            } else {
                1.0
            })
        }
    }
}

pub fn options(run: &RunArgs, check: bool) -> anyhow::Result<(ExecOptions, Backend)> {
    if !(run.timeout_s.is_finite() && run.timeout_s > 0.0) {
        return Err(SimError::bad_value("--timeout-s", run.timeout_s, "must be positive").into());
    }
    let options = ExecOptions {
        warmup: run.warmup,
        iterations: run.iterations,
        check,
        seed: run.seed,
        timeout: Duration::from_secs_f64(run.timeout_s),
    };
    let backend = match run.backend {
        ExecBackend::Host => Backend::Host { ranks: run.ranks },
        ExecBackend::Cuda => Backend::Cuda,
    };
    Ok((options, backend))
}

pub fn write_trace(
    path: &std::path::Path,
    scenario: &Scenario,
    graph: &TaskGraph,
    measured: &Measured,
    summary: &MeasuredSummary,
) -> anyhow::Result<()> {
    let trace = Trace::from_records(
        scenario,
        graph,
        &measured.records,
        serde_json::to_value(summary)?,
    );
    std::fs::write(path, serde_json::to_string(&trace)?)
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
        println!(
            "  check group {:<3} {:<14} {}  vs reference {:.2e}, vs exact sum {:.2e}",
            c.group,
            c.compressor,
            if c.ok { "ok  " } else { "FAIL" },
            c.max_error_vs_reference,
            c.max_error_vs_sum
        );
    }
}
