//! Lowering a plan for a PyTorch run's ranks, and the codec catalog as Python sees it.

use crate::{exec_error, sim_error, views, PlanMismatch, SyncopateError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use syncopate_exec::runtime::pieces::piece_codec;
use syncopate_exec::runtime::refuse_unrunnable;
use syncopate_sim::compress::{catalog, Compressor};
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::plan::Plan;
use syncopate_sim::schedule::{self, World};

/// Lowers the plan in file `plan` for `world_size` CPU ranks and returns (schedule JSON, model
/// profile JSON). The model is `model` (a shipped name or a profile file), else the one the
/// plan records. A plan that records its cluster is lowered for that cluster's ranks, and a
/// different world size is refused.
#[pyfunction]
#[pyo3(signature = (plan, world_size, model=None))]
pub fn lower(plan: &str, world_size: u32, model: Option<&str>) -> PyResult<(String, String)> {
    let loaded = Plan::load(plan).map_err(sim_error)?;
    let model_name = model
        .map(str::to_string)
        .or_else(|| loaded.target.as_ref().map(|t| t.model.clone()))
        .unwrap_or_else(|| loaded.model.clone());
    let profile = ModelProfile::load(&model_name).map_err(sim_error)?;
    let world = match &loaded.target {
        Some(target) => World {
            nodes: target.nodes,
            ranks_per_node: target.gpus_per_node,
        },
        None => World {
            nodes: 1,
            ranks_per_node: world_size,
        },
    };
    let planned = u64::from(world.nodes) * u64::from(world.ranks_per_node);
    if planned != u64::from(world_size) {
        return Err(PlanMismatch::new_err(format!(
            "{plan}: the plan was made for {planned} ranks ({} nodes × {}), this run has world size {world_size}",
            world.nodes, world.ranks_per_node
        )));
    }
    let lowered = schedule::lower(&profile, world, true, &loaded, plan).map_err(sim_error)?;
    refuse_unrunnable(&lowered).map_err(exec_error)?;
    let json = |value: serde_json::Result<String>| {
        value.map_err(|err| SyncopateError::new_err(format!("{plan}: {err}")))
    };
    Ok((
        json(serde_json::to_string(&lowered))?,
        json(serde_json::to_string(&profile))?,
    ))
}

/// Every compressor of the catalog, as its example spec.
#[pyfunction]
pub fn compressors() -> Vec<&'static str> {
    catalog().iter().map(|entry| entry.example).collect()
}

/// The payload the Rust codec of a piece of `spec` encodes from a copy of `values` (tensors of
/// `shapes` laid out one after another; a call per element count of `calls` when the piece
/// has them) with `seed`: the reference the zero-copy path is tested against.
#[pyfunction]
#[pyo3(signature = (spec, values, shapes, seed, calls=Vec::new()))]
pub fn encode_reference<'py>(
    py: Python<'py>,
    spec: &str,
    values: &Bound<'py, PyAny>,
    shapes: Vec<Vec<u64>>,
    seed: u64,
    calls: Vec<u64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let compressor: Compressor = spec.parse().map_err(sim_error)?;
    let copied: Vec<f32> = views::read(values, "values", <[f32]>::to_vec)?;
    let shapes: Vec<&[u64]> = shapes.iter().map(Vec::as_slice).collect();
    let covered = calls.iter().try_fold(0u64, |sum, &n| sum.checked_add(n));
    if !calls.is_empty() && covered != Some(copied.len() as u64) {
        return Err(SyncopateError::new_err(format!(
            "calls: {} element counts that do not add up to the {} values",
            calls.len(),
            copied.len()
        )));
    }
    let mut payload = Vec::new();
    piece_codec(compressor, &shapes, &calls, seed)
        .encode(&copied, &mut payload)
        .map_err(exec_error)?;
    Ok(PyBytes::new(py, &payload))
}
