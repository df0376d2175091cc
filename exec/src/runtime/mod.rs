//! Real execution of a plan: the backends (host threads, CUDA/NCCL), what they share, and the measured run they return.
//!
//! Both backends execute the simulator's own `TaskGraph` for the scenario, task by task, and
//! time every task, so a measured trace has the same task names as a predicted one.

pub mod check;
mod control;
pub mod cuda;
mod driver;
pub mod host;
pub mod launch;
mod layout;
pub mod rendezvous;
mod sched;

use crate::error::{ExecError, Result};
use check::GroupCheck;
use serde::Serialize;
use std::time::Duration;
use syncopate_sim::builder::build_graph;
use syncopate_sim::engine::TaskRecord;
use syncopate_sim::graph::{TaskGraph, TaskKind};
use syncopate_sim::scenario::Scenario;
use syncopate_sim::time::SimTime;

/// Where a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// CPU threads on this machine with the CPU kernels and in-process channels.
    Host { ranks: u32 },
    /// The visible GPUs (or this process's one rank of a multi-process launch), NCCL.
    Cuda,
}

/// How to run.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    pub warmup: u32,
    pub iterations: u32,
    /// Verify every rank's aggregated gradients (see [`check`]).
    pub check: bool,
    /// Seed of the synthetic gradients and of the stochastic codecs.
    pub seed: u64,
    /// Longest any rank waits for another before giving up with an error naming it.
    pub timeout: Duration,
}

/// A measured run: every task's time on every rank.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Rank-local tasks of every rank; collectives once, as rank 0 saw them.
    pub records: Vec<TaskRecord>,
    /// Per iteration: when the last rank finished its optimizer step.
    pub iteration_end: Vec<SimTime>,
    pub ranks: u32,
    pub checks: Vec<GroupCheck>,
}

/// What `exec --format json` prints and a measured trace carries as `otherData`.
#[derive(Clone, Debug, Serialize)]
pub struct MeasuredSummary {
    pub model: String,
    pub strategy: String,
    pub backend: String,
    pub world_size: u32,
    pub warmup_iterations: u32,
    pub measured_iterations: u32,
    pub iteration_time_ms: f64,
    pub iteration_times_ms: Vec<f64>,
    /// Busy time of rank 0's compute stream per measured iteration.
    pub compute_ms: f64,
    /// Busy time of rank 0's compression stream per measured iteration.
    pub compression_ms: f64,
    /// Time some collective was running per measured iteration (rank 0's view).
    pub comm_ms: f64,
    /// Factor applied to the model profile's compute times.
    pub compute_scale: f64,
    pub seed: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<GroupCheck>,
}

impl Measured {
    pub fn from_records(
        graph: &TaskGraph,
        records: Vec<TaskRecord>,
        ranks: u32,
        checks: Vec<GroupCheck>,
    ) -> Measured {
        let mut iteration_end = vec![SimTime::ZERO; graph.iterations as usize];
        for record in &records {
            let task = graph.task(record.task);
            if task.kind == TaskKind::Optimizer {
                let end = &mut iteration_end[task.iteration as usize];
                *end = (*end).max(record.end);
            }
        }
        Measured {
            records,
            iteration_end,
            ranks,
            checks,
        }
    }

    /// Steady-state iteration times: from one optimizer step's end to the next, after warm-up.
    pub fn steady_iterations(&self, warmup: u32) -> Vec<SimTime> {
        let ends = &self.iteration_end;
        (warmup.max(1) as usize..ends.len())
            .map(|k| ends[k] - ends[k - 1])
            .collect()
    }

    /// Rank 0's busy time on `resources` per measured iteration, in ms.
    fn busy_ms(
        &self,
        graph: &TaskGraph,
        warmup: u32,
        resources: &[syncopate_sim::graph::Resource],
    ) -> f64 {
        let measured = self
            .iteration_end
            .len()
            .saturating_sub(warmup.max(1) as usize)
            .max(1);
        let total: u64 = self
            .records
            .iter()
            .filter(|r| r.rank == 0)
            .filter(|r| {
                let t = graph.task(r.task);
                t.iteration >= warmup.max(1) && resources.contains(&t.resource)
            })
            .map(|r| (r.end - r.start).as_ns())
            .sum();
        total as f64 / measured as f64 / 1e6
    }

    pub fn summary(
        &self,
        scenario: &Scenario,
        graph: &TaskGraph,
        options: &ExecOptions,
        backend: &str,
    ) -> MeasuredSummary {
        use syncopate_sim::graph::Resource;
        let times: Vec<f64> = self
            .steady_iterations(options.warmup)
            .iter()
            .map(|t| round6(t.as_ms()))
            .collect();
        let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
        MeasuredSummary {
            model: scenario.model.name.clone(),
            strategy: scenario.plan.strategy.clone(),
            backend: backend.to_string(),
            world_size: self.ranks,
            warmup_iterations: options.warmup,
            measured_iterations: times.len() as u32,
            iteration_time_ms: round6(mean),
            iteration_times_ms: times,
            compute_ms: round6(self.busy_ms(graph, options.warmup, &[Resource::Compute])),
            compression_ms: round6(self.busy_ms(
                graph,
                options.warmup,
                &[Resource::Codec, Resource::Cpu],
            )),
            comm_ms: round6(self.busy_ms(graph, options.warmup, &[Resource::Comm])),
            compute_scale: scenario.compute_scale,
            seed: options.seed,
            checks: self.checks.clone(),
        }
    }
}

fn round6(value: f64) -> f64 {
    (value * 1e6).round() / 1e6
}

/// Builds the scenario's task graph (warm-up plus measured iterations) and runs it.
pub fn execute(
    backend: Backend,
    scenario: &Scenario,
    options: &ExecOptions,
) -> Result<(TaskGraph, Measured)> {
    if options.warmup == 0 || options.iterations == 0 {
        return Err(ExecError::Sim(syncopate_sim::SimError::bad_value(
            "--warmup/--iterations",
            format!("{}/{}", options.warmup, options.iterations),
            "at least one warm-up and one measured iteration are needed",
        )));
    }
    let graph = build_graph(scenario, options.warmup + options.iterations)?;
    let measured = match backend {
        Backend::Host { ranks } => {
            let busy = host::busy::BusyWork::calibrate(ranks, Duration::from_millis(60));
            host::execute(scenario, &graph, options, ranks, busy)?
        }
        Backend::Cuda => cuda::execute(scenario, &graph, options)?,
    };
    Ok((graph, measured))
}
