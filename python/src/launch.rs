//! The simulator's launch policy as Python drives it, identically on every rank.
//!
//! Collectives are reported ready, and the policy's next launch is returned.

use crate::rank::parse_schedule;
use crate::{sim_error, SyncopateError};
use pyo3::prelude::*;
use syncopate_sim::schedule::launch;
use syncopate_sim::schedule::{LaunchPolicy, Program};

/// One iteration's launch decisions on the caller's clock (a Horovod cycle releases a ready
/// collective at the next tick of it).
#[pyclass(module = "syncopate._syncopate")]
pub struct Launcher {
    policy: LaunchPolicy,
    program: Program,
    launcher: launch::Launcher,
    /// The program task of each schedule step (iteration 0 holds every collective).
    task_of_step: Vec<Option<u32>>,
}

#[pymethods]
impl Launcher {
    #[new]
    fn new(schedule: &str) -> PyResult<Launcher> {
        let schedule = parse_schedule(schedule)?;
        let program = Program::unroll(&schedule, 1).map_err(sim_error)?;
        let mut task_of_step = vec![None; schedule.steps.len()];
        for (t, task) in program.tasks.iter().enumerate() {
            task_of_step[task.step as usize] = Some(t as u32);
        }
        Ok(Launcher {
            launcher: launch::Launcher::new(&schedule.policy, &program, launch::Ticks::FreeRunning),
            policy: schedule.policy,
            program,
            task_of_step,
        })
    }

    /// Starts a new iteration: nothing ready, nothing launched.
    fn reset(&mut self) {
        self.launcher =
            launch::Launcher::new(&self.policy, &self.program, launch::Ticks::FreeRunning);
    }

    /// Collective step `step` has met its dependencies on every rank at `now` (ns on the
    /// caller's clock). Returns when it is released: `now`, or the next cycle tick.
    #[pyo3(signature = (step, now=0))]
    fn ready(&mut self, step: usize, now: u64) -> PyResult<u64> {
        let task = self
            .task_of_step
            .get(step)
            .copied()
            .flatten()
            .ok_or_else(|| {
                SyncopateError::new_err(format!("step {step} is not a collective of the schedule"))
            })?;
        Ok(self.launcher.ready(task, now))
    }

    /// The collective step to launch at `now` on free stream `stream`, if the policy has one
    /// for it.
    #[pyo3(signature = (stream, now=0))]
    fn next(&mut self, stream: u32, now: u64) -> Option<u32> {
        self.launcher
            .next(stream, now)
            .map(|task| self.program.task(task).step)
    }

    /// When the earliest collective waiting for a cycle tick is released, if one is.
    fn next_release(&self) -> Option<u64> {
        self.launcher.next_release()
    }

    /// Whether every rank can decide the launch order alone (plan order: the collectives take
    /// the streams in turn).
    #[getter]
    fn order_is_fixed(&self) -> bool {
        self.policy.order_is_fixed()
    }

    /// How many collectives may run at once.
    #[getter]
    fn comm_streams(&self) -> u32 {
        self.policy.comm_streams
    }
}
