//! `check`: every rank's aggregated gradients against exec's reference aggregation.
//!
//! The reference aggregates all ranks' compression inputs.

use crate::rank::parse_schedule;
use crate::{exec_error, views, SyncopateError};
use pyo3::prelude::*;
use syncopate_exec::runtime::check;

/// Collects every rank's inputs and results (gathered by the caller) and checks them.
#[pyclass(module = "syncopate._syncopate")]
pub struct Checker {
    checker: check::Checker,
}

#[pymethods]
impl Checker {
    /// A checker of `schedule` (JSON) whose reference codecs draw from `seed`, as the ranks' do.
    #[new]
    fn new(schedule: &str, seed: u64) -> PyResult<Checker> {
        Ok(Checker {
            checker: check::Checker::new(&parse_schedule(schedule)?, seed),
        })
    }

    /// Rank `rank`'s compression input of piece `piece` in iteration `iteration` (float32).
    fn input(
        &self,
        piece: usize,
        rank: u32,
        iteration: u32,
        values: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        views::read(values, "check input", |v: &[f32]| {
            self.checker.input(piece, rank, iteration, v)
        })
    }

    /// Rank `rank`'s result of piece `piece`; the last rank's report runs the comparison.
    fn result(
        &self,
        piece: usize,
        rank: u32,
        iteration: u32,
        values: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        views::read(values, "check result", |v: &[f32]| {
            self.checker.result(piece, rank, iteration, v)
        })?
        .map_err(exec_error)
    }

    /// Every group's findings as JSON (`exec --check`'s `checks`).
    fn report(&self) -> PyResult<String> {
        serde_json::to_string(&self.checker.report())
            .map_err(|err| SyncopateError::new_err(format!("check report: {err}")))
    }
}
