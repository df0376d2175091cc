//! Running a plan for real: the backend, the run's options, the run and its measured trace.

use crate::cli::{ExecBackend, RunArgs};
use std::time::Duration;
use syncopate_exec::runtime::{self, cuda, Backend, ExecOptions, Job, Measured, MeasuredSummary};
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::predict::trace::Trace;
use syncopate_sim::schedule::Schedule;
use syncopate_sim::{base::limits, SimError};

/// The host backend keeps an iteration's compute under this by default.
const HOST_COMPUTE_BUDGET_US: f64 = 100_000.0;

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
    crate::commands::as_mpi_rank(|world| syncopate_exec::mpi::backend::execute(world, job))
}

#[cfg(not(feature = "mpi"))]
fn mpi_execute(_: &Job) -> anyhow::Result<Option<Measured>> {
    Err(crate::commands::without_mpi())
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
