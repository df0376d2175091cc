//! `syncopate exec`: runs a plan for real on a backend and writes the measured trace.
//!
//! It optionally checks the aggregated gradients.

use crate::cli::{ExecArgs, ExecBackend, Format, RunArgs, RunClusterArgs};
use anyhow::Context;
use std::time::Duration;
use syncopate_exec::runtime::{self, cuda, Backend, ExecOptions, Job, Measured, MeasuredSummary};
use syncopate_exec::ExecError;
use syncopate_sim::model::ModelProfile;
use syncopate_sim::plan::Plan;
use syncopate_sim::scenario::Scenario;
use syncopate_sim::schedule::Schedule;
use syncopate_sim::simulate::schedule;
use syncopate_sim::topology::{Cluster, ClusterOverrides};
use syncopate_sim::trace::Trace;
use syncopate_sim::{limits, SimError};

/// The host backend keeps an iteration's compute under this by default.
const HOST_COMPUTE_BUDGET_US: f64 = 100_000.0;

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

/// The plan and the model it was made for: `--model`, else the model the plan records.
pub fn load_plan(
    path: &std::path::Path,
    model: Option<&str>,
) -> anyhow::Result<(Plan, ModelProfile)> {
    let label = path.to_string_lossy().into_owned();
    let plan = Plan::load(&label)?;
    let model = ModelProfile::load(&plan_model(&plan, model))?;
    plan.validate(&label, &model)?;
    Ok((plan, model))
}

/// The plan of `--plan` and its model, for a run by the executors: a plan that names another
/// runtime's framework or codecs is said to run without them.
pub fn load_plan_to_run(run: &RunArgs) -> anyhow::Result<(Plan, ModelProfile)> {
    let loaded = load_plan(&run.plan, run.model.as_deref())?;
    if let Some(note) = runtime::other_runtime_note(&loaded.0) {
        eprintln!("{note}");
    }
    Ok(loaded)
}

/// The model a plan runs with: `--model`, else the one the plan records, else its name.
pub fn plan_model(plan: &Plan, model: Option<&str>) -> String {
    model
        .map(str::to_string)
        .or_else(|| plan.target.as_ref().map(|t| t.model.clone()))
        .unwrap_or_else(|| plan.model.clone())
}

/// The cluster a plan runs on: `--cluster` and the overrides, else what the plan records.
pub fn plan_cluster(
    args: &RunClusterArgs,
    plan: &Plan,
) -> anyhow::Result<(String, ClusterOverrides)> {
    let target = plan.target.as_ref();
    let name = args
        .cluster
        .clone()
        .or_else(|| target.map(|t| t.cluster.clone()))
        .ok_or_else(|| {
            SimError::bad_value(
                "--cluster",
                "(none)",
                "the plan does not record the cluster it was made for (an older plan): name one",
            )
        })?;
    let overrides = ClusterOverrides {
        nodes: args.nodes.or(target.map(|t| t.nodes)),
        gpus_per_node: args.gpus_per_node.or(target.map(|t| t.gpus_per_node)),
        inter_gbps: args.inter_gbps.or(target.and_then(|t| t.inter_gbps)),
    };
    Ok((name, overrides))
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

pub fn host_ranks(ranks: i64) -> anyhow::Result<u32> {
    /// More thread-ranks than this would only oversubscribe any machine's cores.
    const MAX_HOST_RANKS: i64 = 256;
    if (1..=MAX_HOST_RANKS).contains(&ranks) {
        Ok(ranks as u32)
    } else {
        Err(SimError::bad_value(
            "--ranks",
            ranks,
            format!("the host backend runs 1 to {MAX_HOST_RANKS} thread-ranks"),
        )
        .into())
    }
}

/// The backend a run uses once `auto` is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chosen {
    Host,
    Cuda,
    Mpi,
}

impl Chosen {
    pub fn name(self) -> &'static str {
        match self {
            Chosen::Cuda => "cuda",
            Chosen::Host => "host",
            Chosen::Mpi => "mpi",
        }
    }
}

/// `auto` takes the GPUs when the CUDA libraries load and see a device, else the host, and
/// says which it took.
pub fn choose_backend(asked: ExecBackend) -> anyhow::Result<Chosen> {
    Ok(match asked {
        ExecBackend::Cuda => Chosen::Cuda,
        ExecBackend::Host => Chosen::Host,
        ExecBackend::Mpi => Chosen::Mpi,
        ExecBackend::Auto => match cuda::probe::probe() {
            Ok(gpus) => {
                eprintln!("backend: cuda ({gpus} GPU(s) visible)");
                Chosen::Cuda
            }
            Err(err) => {
                eprintln!("backend: host ({err})");
                Chosen::Host
            }
        },
    })
}

/// Runs the schedule on the chosen backend: `None` on the ranks of an MPI job other than 0,
/// which reports. The CPU backends scale compute down to their budget (`--compute-scale`);
/// the host backend runs the schedule's world as thread-ranks.
pub fn execute<'a>(
    backend: Chosen,
    run: &RunArgs,
    scenario: &Scenario,
    schedule: &'a Schedule,
    options: &'a ExecOptions,
) -> anyhow::Result<Option<(Job<'a>, Measured)>> {
    if options.check {
        eprintln!(
            "note: --check computes a reference beside the run; its timings are not representative"
        );
    }
    let ranks = schedule.world.ranks();
    match backend {
        Chosen::Host => {
            let job = Job::new(
                schedule,
                host_compute_scale(run, &scenario.model)?,
                options,
                ranks,
            )?;
            let measured = runtime::execute(Backend::Host { ranks }, &job)?;
            Ok(Some((job, measured)))
        }
        Chosen::Cuda => {
            let job = Job::new(schedule, scenario.compute_scale, options, ranks)?;
            let measured = runtime::execute(Backend::Cuda, &job)?;
            Ok(Some((job, measured)))
        }
        Chosen::Mpi => {
            let job = Job::new(
                schedule,
                host_compute_scale(run, &scenario.model)?,
                options,
                1,
            )?;
            let measured = mpi_execute(&job)?;
            Ok(measured.map(|m| (job, m)))
        }
    }
}

#[cfg(feature = "mpi")]
fn mpi_execute(job: &Job) -> anyhow::Result<Option<Measured>> {
    super::as_mpi_rank(|world| syncopate_exec::mpi::backend::execute(world, job))
}

#[cfg(not(feature = "mpi"))]
fn mpi_execute(_: &Job) -> anyhow::Result<Option<Measured>> {
    Err(super::without_mpi())
}

fn host_compute_scale(run: &RunArgs, model: &ModelProfile) -> anyhow::Result<f64> {
    match run.compute_scale {
        Some(scale) if (0.0..=1e6).contains(&scale) => Ok(scale),
        Some(scale) => Err(SimError::bad_value(
            "--compute-scale",
            limits::num(scale),
            "must be a number from 0 to 1e6",
        )
        .into()),
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

/// The longest `--timeout-s` accepted: a day.
const MAX_TIMEOUT_S: f64 = 86_400.0;

pub fn options(run: &RunArgs, check: bool) -> anyhow::Result<ExecOptions> {
    if !(run.timeout_s.is_finite() && run.timeout_s > 0.0 && run.timeout_s <= MAX_TIMEOUT_S) {
        return Err(SimError::bad_value(
            "--timeout-s",
            limits::num(run.timeout_s),
            format!("must be more than 0 and at most {MAX_TIMEOUT_S} seconds"),
        )
        .into());
    }
    Ok(ExecOptions {
        warmup: run.warmup,
        iterations: run.iterations,
        check,
        seed: run.seed,
        timeout: Duration::from_secs_f64(run.timeout_s),
    })
}

pub fn measured_trace(
    model: &ModelProfile,
    job: &Job,
    measured: &Measured,
    summary: &MeasuredSummary,
) -> anyhow::Result<Trace> {
    Ok(Trace::from_records(
        model,
        job.schedule,
        &job.program,
        &measured.records,
        |_| None,
        serde_json::to_value(summary)?,
    ))
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
