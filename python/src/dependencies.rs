//! Which steps wait for which, iteration by iteration, as the simulator unrolls them.
//!
//! `syncopate.torch` counts its steps' unmet dependencies with these lists instead of reading
//! the Schedule's `after`, `after_previous` and `from_iteration` fields by rules of its own.

use crate::rank::parse_schedule;
use pyo3::prelude::*;
use syncopate_sim::schedule::Schedule;

/// A Schedule's dependency rules (`Schedule::runs_in`, `waits_for`, `waits_for_previous`).
#[pyclass(module = "syncopate._syncopate")]
pub struct Dependencies {
    schedule: Schedule,
}

#[pymethods]
impl Dependencies {
    #[new]
    fn new(schedule: &str) -> PyResult<Dependencies> {
        Ok(Dependencies {
            schedule: parse_schedule(schedule)?,
        })
    }

    /// Per step, how many steps of the same iteration it waits for in `iteration`, or None when
    /// it does not run then.
    fn waiting(&self, iteration: u32) -> Vec<Option<usize>> {
        (0..self.steps())
            .map(|s| {
                self.schedule
                    .runs_in(s, iteration)
                    .then(|| self.schedule.waits_for(s, iteration).count())
            })
            .collect()
    }

    /// Per step, the steps of the same iteration that wait for it in `iteration`.
    fn successors(&self, iteration: u32) -> Vec<Vec<u32>> {
        let mut successors = vec![Vec::new(); self.steps() as usize];
        for s in (0..self.steps()).filter(|&s| self.schedule.runs_in(s, iteration)) {
            for dep in self.schedule.waits_for(s, iteration) {
                successors[dep as usize].push(s);
            }
        }
        successors
    }

    /// The steps of the previous iteration that step `step` waits for in `iteration`.
    fn waits_for_previous(&self, step: u32, iteration: u32) -> Vec<u32> {
        match step < self.steps() {
            true => self.schedule.waits_for_previous(step, iteration).collect(),
            false => Vec::new(),
        }
    }

    /// The steps of the same iteration that step `step` waits for in `iteration`.
    fn waits_for(&self, step: u32, iteration: u32) -> Vec<u32> {
        match step < self.steps() {
            true => self.schedule.waits_for(step, iteration).collect(),
            false => Vec::new(),
        }
    }
}

impl Dependencies {
    fn steps(&self) -> u32 {
        self.schedule.steps.len() as u32
    }
}
