//! Writes a PyTorch run's step timings as a measured trace.
//!
//! The schema is the one `simulate --trace` and `exec --trace` write.

use crate::rank::parse_schedule;
use crate::{sim_error, SyncopateError};
use pyo3::prelude::*;
use std::collections::HashMap;
use syncopate_exec::runtime::check::GroupCheck;
use syncopate_exec::runtime::{Measured, RunInfo};
use syncopate_sim::base::time::SimTime;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::predict::engine::TaskRecord;
use syncopate_sim::predict::trace::Trace;
use syncopate_sim::schedule::Program;

/// One timed step: (rank, step, iteration, stream, start ns, end ns).
type Record = (u32, u32, u32, u32, u64, u64);

/// Writes the trace of `records` of a run of `world` ranks to `path` (through a temporary file
/// renamed into place), with its summary as `exec` makes it (`otherData`: the iterations after
/// `warmup` that `syncopate_sim::inputs::real_run` measures, `seed`, and `checks`, the JSON list of
/// the check's reports).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn write_trace(
    path: &str,
    schedule: &str,
    model: &str,
    records: Vec<Record>,
    world: u32,
    warmup: u32,
    seed: u64,
    checks: &str,
) -> PyResult<()> {
    let schedule = parse_schedule(schedule)?;
    let bad = |what: &str, err: String| SyncopateError::new_err(format!("{path}: {what}: {err}"));
    let model: ModelProfile =
        serde_json::from_str(model).map_err(|e| bad("model", e.to_string()))?;
    let checks: Vec<GroupCheck> =
        serde_json::from_str(checks).map_err(|e| bad("checks", e.to_string()))?;
    if warmup == 0 {
        return Err(bad(
            "warmup",
            "0: at least one warm-up iteration (its tail pays first-time costs)".into(),
        ));
    }
    let iterations = records
        .iter()
        .map(|r| r.2.saturating_add(1))
        .max()
        .unwrap_or(1);
    let program = Program::unroll(&schedule, iterations).map_err(sim_error)?;
    let task_of: HashMap<(u32, u32), u32> = program
        .tasks
        .iter()
        .enumerate()
        .map(|(t, task)| ((task.iteration, task.step), t as u32))
        .collect();
    let records = records
        .iter()
        .map(|&(rank, step, iteration, stream, start, end)| {
            let task = task_of.get(&(iteration, step)).copied().ok_or_else(|| {
                bad(
                    "records",
                    format!("step {step} does not run in iteration {iteration}"),
                )
            })?;
            Ok(TaskRecord {
                rank,
                task,
                stream,
                start: SimTime(start),
                end: SimTime(end.max(start)),
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let measured = Measured::from_records(&program, records, world, checks);
    let summary = measured.summary(&RunInfo {
        schedule: &schedule,
        program: &program,
        warmup,
        seed,
        compute_scale: 1.0,
        backend: "torch",
    });
    let other = serde_json::to_value(&summary).map_err(|e| bad("summary", e.to_string()))?;
    let trace = Trace::from_records(
        &model,
        &schedule,
        &program,
        &measured.records,
        |_| None,
        other,
    );
    let text = serde_json::to_string(&trace).map_err(|e| bad("trace", e.to_string()))?;
    let temporary = format!("{path}.tmp");
    std::fs::write(&temporary, text)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| bad("write", e.to_string()))
}
