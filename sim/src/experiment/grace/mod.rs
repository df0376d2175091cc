//! The GRACE calibration experiment: fit, the calibrated inputs, every covered GRACE row compared.

mod calibration;
mod compute;
mod consistency;
mod files;
mod fit;
mod measured;
mod report;

use super::Results;
use crate::chart::Chart;
use crate::compress::{Compressor, Memory};
use crate::data;
use crate::error::{Result, SimError};
use calibration::Calibration;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraceSpec {
    format_version: u32,
    title: String,
    /// GRACE's CSV, relative to the experiment directory.
    data: String,
    /// Shipped cluster and device the fit starts from.
    base_cluster: String,
    base_device: String,
    strategy: String,
    /// The GRACE model whose dense multi-worker rows fit the MPI/TCP costs.
    network_model: String,
    /// A `throughput` row below this share of GRACE's `upper-bound` row of the same
    /// configuration is excluded as inconsistent.
    upper_bound_min_ratio: f64,
    fit_workers: u32,
    /// Candidate per-GPU batch sizes (GRACE does not record it).
    batch_sizes: Vec<u32>,
    models: Vec<ModelSpec>,
    methods: Vec<MethodSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSpec {
    grace: String,
    profile: String,
    /// Where the calibrated profile is written, in the experiment directory.
    file: String,
}

/// A GRACE method and our equivalent, or `compressor: null` with the reason in `note`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct MethodSpec {
    grace: String,
    compressor: Option<String>,
    /// Memory spec when GRACE's `memory` column is true (default: residual).
    #[serde(default)]
    memory: Option<String>,
    note: String,
}

impl MethodSpec {
    /// The uncompressed baseline.
    fn dense() -> MethodSpec {
        MethodSpec {
            grace: "none".to_string(),
            compressor: Some("none".to_string()),
            memory: None,
            note: String::new(),
        }
    }

    /// Our compressor and memory for a GRACE row: `{ratio}` in the spec takes the row's ratio;
    /// GRACE's `memory=true` turns on the method's memory (residual unless stated).
    fn resolve(&self, ratio: &str, memory: &str) -> Result<(Compressor, Memory)> {
        let template = self.compressor.as_deref().ok_or_else(|| {
            SimError::bad_value("GRACE method", &self.grace, "is not covered by our catalog")
        })?;
        let compressor: Compressor = template.replace("{ratio}", ratio).parse()?;
        let memory: Memory = if memory == "true" {
            self.memory.as_deref().unwrap_or("residual").parse()?
        } else {
            Memory::None
        };
        Ok((compressor, memory))
    }
}

/// Fits (or, with `reuse_fit`, reads back) the calibration, then predicts every GRACE row of a
/// covered method.
pub fn run(spec: &GraceSpec, label: &str, dir: &Path, reuse_fit: bool) -> Result<Results> {
    data::check_format_version(label, spec.format_version)?;
    let mut rows = measured::load(&dir.join(&spec.data), "throughput")?;
    let upper = measured::load(&dir.join(&spec.data), "upper-bound")?;
    let exclusions = consistency::flag_inconsistent(&mut rows, &upper, spec.upper_bound_min_ratio);
    let targets = compute::targets(spec, &rows)?;
    let methods: BTreeMap<String, MethodSpec> = spec
        .methods
        .iter()
        .map(|m| (m.grace.clone(), m.clone()))
        .collect();
    if methods.get("none").and_then(|m| m.compressor.as_deref()) != Some("none") {
        return Err(SimError::invalid(
            label,
            "methods",
            "needs GRACE's `none` mapped to compressor `none`",
        ));
    }
    let base = Calibration::base(spec)?;
    let (cal, batch, scales, inputs) = if reuse_fit {
        let cal = Calibration::fitted(spec, dir)?;
        let batch = cal.models[&spec.network_model].batch_size_per_gpu;
        let scales = calibration::codec_scales(&cal.device, &base.device, &methods)?;
        (cal, batch, scales, Vec::new())
    } else {
        let (cal, batch, scales) = fit::fit(spec, &base, &rows, &methods)?;
        let inputs = files::inputs(spec, &cal, batch, &scales, &targets)?;
        (cal, batch, scales, inputs)
    };
    let predicted = rows
        .iter()
        .filter_map(|m| {
            methods
                .get(&m.method)
                .filter(|x| x.compressor.is_some())
                .map(|x| (m, x))
        })
        .map(|(m, x)| Ok((m, cal.predict(spec, m, x)?)))
        .collect::<Result<Vec<_>>>()?;
    let report = report::Report {
        spec,
        rows: &predicted,
        targets: &targets,
    };
    Ok(Results {
        inputs,
        csv: report.csv().into_text(),
        charts: vec![Chart {
            file: "grace.svg".to_string(),
            title: spec.title.clone(),
            panels: report.panels(),
            columns: 4,
        }],
        table: report.markdown(&cal, batch, &scales, &methods, &rows, &exclusions),
    })
}
