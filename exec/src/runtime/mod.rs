//! Real execution of a plan: the backends, what they share, and the measured run they return.
//!
//! The backends are host threads, MPI processes and CUDA/NCCL.
//!
//! Every backend runs the plan's lowered `Schedule` (`syncopate_sim::schedule`), unrolled
//! into the same `Program` the simulator prices, task by task, and times every task, so a
//! measured trace has the same task names as a predicted one. No cost model is consulted: a
//! compute step runs for its profiled time (times the run's compute scale), everything else
//! does the real work.

pub mod alltoall;
mod backend;
mod board;
pub mod check;
pub mod check_report;
pub mod compressed_ring;
mod control;
mod cpu;
pub mod cuda;
mod driver;
pub mod float8;
pub mod gather_check;
pub mod host;
pub mod launch;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod params;
pub mod piece_state;
pub mod pieces;
pub mod push_pull;
pub mod rendezvous;
pub mod ring;
mod sched;
mod sequence;
#[cfg(test)]
mod test_plans;
pub mod wait;

use crate::error::{ExecError, Result};
use check::GroupCheck;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use syncopate_sim::base::stats::round6;
use syncopate_sim::base::time::SimTime;
use syncopate_sim::compress::Wire;
use syncopate_sim::inputs::real_run;
use syncopate_sim::plan::Plan;
use syncopate_sim::predict::engine::TaskRecord;
use syncopate_sim::schedule::{Program, Schedule, Servers, Slot, Step, Stream};

/// Where a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// CPU threads on this machine with the CPU kernels and in-process channels.
    Host {
        /// Ranks to run, as threads of this process.
        ranks: u32,
    },
    /// The visible GPUs (or this process's one rank of a multi-process launch), NCCL.
    Cuda,
}

/// How to run.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Warm-up iterations, run before the measured ones and not measured.
    pub warmup: u32,
    /// Measured iterations.
    pub iterations: u32,
    /// Verify every rank's aggregated gradients (see [`check`]).
    pub check: bool,
    /// Seed of the synthetic gradients and of the stochastic codecs.
    pub seed: u64,
    /// Longest any rank waits for another before giving up with an error naming it.
    pub timeout: Duration,
}

/// What a backend runs: the schedule, K iterations of it, and the run's options.
pub struct Job<'a> {
    /// The lowered plan every rank runs.
    pub schedule: &'a Schedule,
    /// The schedule unrolled over every iteration the run executes.
    pub program: Program,
    /// Each tensor's group and its slot in the group's buffer.
    pub slots: Vec<(u32, Slot)>,
    /// A sharded plan's units, whose parameter shards its gathers move (none for a replicated
    /// plan).
    pub units: Vec<params::Unit>,
    /// Multiplier on every compute step's profiled time.
    pub compute_scale: f64,
    /// How to run: iterations, checking, seed and timeout.
    pub options: &'a ExecOptions,
}

impl Job<'_> {
    /// The schedule step task `task` runs.
    pub fn step(&self, task: u32) -> &Step {
        self.schedule.step(self.program.task(task).step)
    }

    /// How long compute task `task` keeps its stream busy, in ns.
    pub fn compute_ns(&self, task: u32) -> u64 {
        let us = self.step(task).profiled_us.unwrap_or(0.0) * self.compute_scale;
        SimTime::from_us(us).as_ns()
    }
}

/// A measured run: every task's time on every rank.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Rank-local tasks of every rank; collectives once, as rank 0 saw them.
    pub records: Vec<TaskRecord>,
    /// Per finished iteration: when the last rank finished its closing step
    /// (`Schedule::iteration_end`).
    pub iteration_end: Vec<SimTime>,
    /// Ranks that ran.
    pub ranks: u32,
    /// What `--check` found, group by group (empty when not checking).
    pub checks: Vec<GroupCheck>,
}

/// What `exec --format json` prints and a measured trace carries as `otherData`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MeasuredSummary {
    /// The model's name, as the schedule records it.
    pub model: String,
    /// The strategy that produced the plan.
    pub strategy: String,
    /// The backend that ran it (`host`, `mpi` or `cuda`).
    pub backend: String,
    /// Ranks that ran.
    pub world_size: u32,
    /// Warm-up iterations, left out of the measured times.
    pub warmup_iterations: u32,
    /// Iterations whose time was measured.
    pub measured_iterations: u32,
    /// Mean time of the measured iterations, ms.
    pub iteration_time_ms: f64,
    /// Each measured iteration's time, ms.
    pub iteration_times_ms: Vec<f64>,
    /// Busy time of rank 0's compute stream per measured iteration.
    pub compute_ms: f64,
    /// Time rank 0's compression or CPU stream was busy per measured iteration.
    pub compression_ms: f64,
    /// Time some collective was running per measured iteration (rank 0's view).
    pub comm_ms: f64,
    /// Factor applied to the model profile's compute times.
    pub compute_scale: f64,
    /// Seed of the synthetic gradients and of the stochastic codecs.
    pub seed: u64,
    /// What `--check` found, group by group (absent when not checking).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<GroupCheck>,
}

impl Measured {
    /// The run's records; an iteration ends when the last rank finishes the schedule's
    /// iteration-closing step, as in the simulator. Iterations end up to the first one without
    /// such a record (a trace may hold steps of an iteration it did not finish: the per-group
    /// updates a `flush()` runs before the next forward).
    pub fn from_records(
        program: &Program,
        records: Vec<TaskRecord>,
        ranks: u32,
        checks: Vec<GroupCheck>,
    ) -> Measured {
        let mut ends: Vec<Option<SimTime>> = vec![None; program.iterations as usize];
        for record in &records {
            let task = program.task(record.task);
            if program.iteration_end[task.iteration as usize] == record.task {
                let end = &mut ends[task.iteration as usize];
                *end = Some(end.map_or(record.end, |e| e.max(record.end)));
            }
        }
        let iteration_end = ends.into_iter().map_while(|end| end).collect();
        Measured {
            records,
            iteration_end,
            ranks,
            checks,
        }
    }

    /// Rank 0's busy time on `streams` per measured iteration (`measured` of them), in ms: the
    /// time some task counted on those streams ([`counted_on`]) ran (concurrent collectives on
    /// several streams count once).
    fn busy_ms(&self, run: &RunInfo, measured: usize, streams: &[Stream]) -> f64 {
        let (program, warmup) = (run.program, run.warmup);
        let spans = self
            .records
            .iter()
            .filter(|r| {
                let task = program.task(r.task);
                r.rank == 0
                    && real_run::is_measured(task.iteration, warmup)
                    && (task.iteration as usize) < self.iteration_end.len()
                    && streams.contains(&counted_on(run.schedule.step(task.step)))
            })
            .map(|r| (r.start, r.end))
            .collect();
        real_run::covered_ns(spans) as f64 / measured.max(1) as f64 / 1e6
    }

    /// The run's summary: its measured iterations (`syncopate_sim::inputs::real_run`) and rank 0's
    /// busy streams.
    pub fn summary(&self, run: &RunInfo) -> MeasuredSummary {
        let times: Vec<f64> = real_run::measured_times(&self.iteration_end, run.warmup)
            .iter()
            .map(|t| round6(t.as_ms()))
            .collect();
        let measured = times.len();
        let mean = times.iter().sum::<f64>() / measured.max(1) as f64;
        let busy = |streams: &[Stream]| round6(self.busy_ms(run, measured, streams));
        MeasuredSummary {
            model: run.schedule.model.clone(),
            strategy: run.schedule.strategy.clone(),
            backend: run.backend.to_string(),
            world_size: self.ranks,
            warmup_iterations: run.warmup,
            measured_iterations: measured as u32,
            iteration_time_ms: round6(mean),
            iteration_times_ms: times,
            compute_ms: busy(&[Stream::Compute]),
            compression_ms: busy(&[Stream::Codec, Stream::Cpu]),
            comm_ms: busy(&[Stream::Comm]),
            compute_scale: run.compute_scale,
            seed: run.seed,
            checks: self.checks.clone(),
        }
    }
}

/// The stream a step's busy time counts on: its own, but a codec in line on the compute stream
/// counts as compression, as the simulator's summary counts it.
fn counted_on(step: &Step) -> Stream {
    match step.stream {
        Stream::Compute if step.kind.is_codec() => Stream::Codec,
        stream => stream,
    }
}

/// What a measured run's summary says about how it ran.
pub struct RunInfo<'a> {
    /// The schedule that ran.
    pub schedule: &'a Schedule,
    /// The schedule unrolled as the run executed it.
    pub program: &'a Program,
    /// Warm-up iterations, left out of the measured times.
    pub warmup: u32,
    /// Seed of the synthetic gradients and of the stochastic codecs.
    pub seed: u64,
    /// Multiplier on every compute step's profiled time.
    pub compute_scale: f64,
    /// Name of the backend that ran it, as the summary reports it.
    pub backend: &'a str,
}

impl Job<'_> {
    /// How this job ran, for its measured summary, on `backend`.
    pub fn run_info<'a>(&'a self, backend: &'a str) -> RunInfo<'a> {
        RunInfo {
            schedule: self.schedule,
            program: &self.program,
            warmup: self.options.warmup,
            seed: self.options.seed,
            compute_scale: self.compute_scale,
            backend,
        }
    }
}

/// The most bytes of buffers (gradients, fusion buffers, codec state: about 24 bytes per
/// element) the CPU backends allocate in one process.
pub const MAX_HOST_BYTES: u64 = 8 << 30;

impl<'a> Job<'a> {
    /// The schedule unrolled for warm-up, measured iterations and the one between them
    /// (`syncopate_sim::inputs::real_run`), checked for what a run of
    /// `local_ranks` ranks in this process can hold.
    pub fn new(
        schedule: &'a Schedule,
        compute_scale: f64,
        options: &'a ExecOptions,
        local_ranks: u32,
    ) -> Result<Job<'a>> {
        let bad = |what: &str, value: String, message: String| {
            ExecError::Sim(syncopate_sim::SimError::bad_value(what, value, message))
        };
        if options.warmup == 0 || options.iterations == 0 {
            return Err(bad(
                "--warmup/--iterations",
                format!("{}/{}", options.warmup, options.iterations),
                "at least one warm-up and one measured iteration are needed".into(),
            ));
        }
        let iterations = real_run::iterations_to_run(options.warmup, options.iterations)
            .ok_or_else(|| {
                bad(
                    "--warmup/--iterations",
                    format!("{}/{}", options.warmup, options.iterations),
                    "their sum plus one exceeds 4294967295".into(),
                )
            })?;
        let elements: u64 = schedule.buffers.iter().map(|b| b.numel).sum();
        let bytes = u128::from(elements) * u128::from(local_ranks) * 24;
        if bytes > u128::from(MAX_HOST_BYTES) {
            return Err(bad(
                "--plan",
                format!("{elements} elements × {local_ranks} ranks"),
                format!(
                    "a run in one process holds about 24 bytes per element per rank, more than {} GiB: run fewer ranks per process, or a smaller model",
                    MAX_HOST_BYTES >> 30
                ),
            ));
        }
        refuse_on_every_backend(schedule)?;
        Ok(Job {
            schedule,
            program: Program::unroll(schedule, iterations)?,
            slots: schedule.tensor_slots(),
            units: params::units(schedule)?,
            compute_scale,
            options,
        })
    }
}

/// Refuses a schedule that `syncopate.torch` cannot run as the simulator predicts it: a sharded
/// plan ([`refuse_sharded`]) and what no backend runs ([`Job::new`]'s refusals). It checks them
/// before running.
pub fn refuse_unrunnable(schedule: &Schedule) -> Result<()> {
    refuse_sharded(schedule, "syncopate.torch")?;
    refuse_on_every_backend(schedule)
}

/// Refuses a sharded plan (ZeRO, FSDP) on `runtime`, which keeps whole gradient buffers and no
/// parameters, so it can neither run the plan's parameter gathers nor keep a rank's shard of a
/// reduced gradient: the CUDA backend and `syncopate.torch`. The host and MPI backends run them.
pub fn refuse_sharded(schedule: &Schedule, runtime: &str) -> Result<()> {
    match schedule.param_shards.is_empty() {
        true => Ok(()),
        false => Err(ExecError::Sim(syncopate_sim::SimError::bad_value(
            "--plan",
            "sharding",
            format!(
                "the plan shards parameters and gradients (ZeRO, FSDP), which {runtime} does not run yet: run it with `syncopate exec --backend host` or `--backend mpi`, or predict it with `syncopate simulate`"
            ),
        ))),
    }
}

/// Refuses a schedule that no backend runs as the simulator predicts it:
/// - a plan that sends element codes in whole bytes where the catalog packs them (a plan
///   describing another framework's implementation, e.g. GRACE's): every backend's codecs write
///   the packed formats;
/// - parameter servers on machines of their own: the backends run servers on the workers.
fn refuse_on_every_backend(schedule: &Schedule) -> Result<()> {
    if let Servers::Dedicated(servers) = schedule.servers {
        return Err(ExecError::Sim(syncopate_sim::SimError::bad_value(
            "--plan",
            format!("policy.ps_servers {servers}"),
            "the plan's parameter servers run on machines of their own, which the executors do not have: make the plan with the `byteps` strategy (servers on the workers) to run it",
        )));
    }
    match schedule
        .pieces
        .iter()
        .enumerate()
        .find(|(_, p)| p.wire != Wire::Packed && p.compressor.depends_on_wire())
    {
        Some((index, piece)) => Err(ExecError::Sim(syncopate_sim::SimError::bad_value(
            "--plan",
            format!("wire `{}`", piece.wire.name()),
            format!(
                "pieces[{index}] (group {}, `{}`) sends each element code in a byte of its own; the executors run the catalog's packed wire formats only (exec/WIRE_FORMAT.md): set the plan's `wire` to `packed` to run it",
                piece.group, piece.compressor
            ),
        ))),
        None => Ok(()),
    }
}

/// What a plan priced as another runtime runs it (its `framework` or `codecs`) means here: the
/// executors run the Schedule's steps with their own threads and kernels, without that
/// runtime's costs, and `validate` predicts the run so.
pub fn other_runtime_note(plan: &Plan) -> Option<String> {
    let other: Vec<String> = [
        ("framework", plan.framework.as_deref()),
        ("codecs", plan.codecs.as_deref()),
    ]
    .into_iter()
    .filter_map(|(field, name)| Some(format!("{field} `{}`", name?)))
    .collect();
    (!other.is_empty()).then(|| {
        format!(
            "note: the plan names {}; the executors run its steps with their own threads and kernels, without that runtime's costs (`validate` predicts the run so, `simulate` the plan as that runtime runs it)",
            other.join(" and ")
        )
    })
}

/// Runs the job on `backend` (the host's thread-ranks or this process's GPUs).
pub fn execute(backend: Backend, job: &Job) -> Result<Measured> {
    match backend {
        Backend::Host { ranks } => {
            let busy = host::busy::BusyWork::calibrate(ranks, Duration::from_millis(60));
            host::execute(job, ranks, busy)
        }
        Backend::Cuda => cuda::execute(job),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate_sim::compress::Memory;
    use syncopate_sim::plan::Scheme;
    use syncopate_sim::sharding::ParamDtype;

    /// The CPU backends take a sharded plan; the CUDA backend (before it looks for a GPU) and
    /// `syncopate.torch` refuse it, naming `sharding` and themselves.
    #[test]
    fn only_the_cpu_backends_take_a_sharded_plan() {
        let schedule = test_plans::small_sharded("fsdp", "none", ParamDtype::Fp32, (1, 3));
        let options = ExecOptions {
            warmup: 1,
            iterations: 1,
            check: false,
            seed: 1,
            timeout: Duration::from_secs(5),
        };
        let job = Job::new(&schedule, 0.0, &options, 3).unwrap();
        assert_eq!(job.units.len(), schedule.param_shards.len());
        let err = execute(Backend::Cuda, &job).unwrap_err().to_string();
        assert!(
            err.contains("sharding") && err.contains("cuda backend"),
            "{err}"
        );
        let err = refuse_unrunnable(&schedule).unwrap_err().to_string();
        assert!(
            err.contains("sharding") && err.contains("syncopate.torch"),
            "{err}"
        );
        let all = (0..161).collect();
        let fp16 = test_plans::group(all, "fp16", Memory::None, Scheme::Allreduce, 1);
        refuse_unrunnable(&test_plans::lowered(vec![fp16], 2)).unwrap();
    }
}
