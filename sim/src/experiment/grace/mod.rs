//! The GRACE calibration experiment: fit, the calibrated inputs, every covered GRACE row compared.

mod calibration;
mod compute;
mod consistency;
mod files;
mod fit;
mod measured;
mod report;

use super::Results;
use crate::base::chart::Chart;
use crate::base::data;
use crate::base::error::{Result, SimError};
use crate::codec::Implementation;
use crate::compress::{Compressor, Memory, Wire};
use crate::plan::CodecCalls;
use crate::strategy::HorovodFusion;
use calibration::Calibration;
use measured::Measurement;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GraceSpec {
    format_version: u32,
    title: String,
    /// GRACE's CSV, relative to the experiment directory.
    data: String,
    /// Shipped cluster and device the fit starts from.
    base_cluster: String,
    base_device: String,
    strategy: String,
    /// The Horovod release GRACE patches, whose fusion threshold and cycle time the plans use.
    horovod: HorovodFusion,
    /// The GRACE model whose dense calibration row fits the MPI/TCP costs.
    network_model: String,
    /// A `throughput` row below this share of GRACE's `upper-bound` row of the same
    /// configuration is excluded as inconsistent.
    upper_bound_min_ratio: f64,
    /// A configuration whose `upper-bound` run takes more than this factor times the median
    /// time of the other methods' `upper-bound` runs that send as many bytes (same model,
    /// workers and communication method) was disturbed, and its `throughput` row is excluded.
    upper_bound_peer_max_ratio: f64,
    /// The calibration rows have at most this many workers (and are all the fit sees); rows
    /// with more are held out.
    fit_workers: u32,
    /// The per-GPU batch (GRACE does not record it) and where the number comes from.
    batch_size_per_gpu: u32,
    batch_source: String,
    /// How GRACE's compressors lay their codes on the wire, and where that is read.
    wire: Wire,
    wire_source: String,
    /// How many codec calls GRACE's code makes per fused group, and where that is read.
    codec_calls: CodecCalls,
    codec_calls_source: String,
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
    /// What GRACE's TensorFlow code of the method does per tensor (every covered compressing
    /// method has one); the fit prices it.
    #[serde(default)]
    implementation: Option<Implementation>,
    /// The spec's `codec_calls` for this method when it differs (PowerSGD's codec already runs
    /// each matrix on its own, and a plan runs it in one call per group).
    #[serde(default)]
    codec_calls: Option<CodecCalls>,
    note: String,
}

impl MethodSpec {
    /// The uncompressed baseline.
    fn dense() -> MethodSpec {
        MethodSpec {
            grace: "none".to_string(),
            compressor: Some("none".to_string()),
            memory: None,
            implementation: None,
            codec_calls: None,
            note: String::new(),
        }
    }

    /// The key of our compressor's cost curves; `None` for a method we do not cover.
    fn key(&self) -> Result<Option<&'static str>> {
        match self.compressor {
            None => Ok(None),
            Some(_) => Ok(Some(self.resolve("0.01", "false")?.0.key())),
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

/// Fits (or, with `reuse_fit`, reads back) the calibration on the rows with at most
/// `fit_workers` workers, then predicts every GRACE row of a covered method.
pub(super) fn run(spec: &GraceSpec, label: &str, dir: &Path, reuse_fit: bool) -> Result<Results> {
    data::check_format_version(label, spec.format_version)?;
    check_rule_ratios(label, spec)?;
    let mut rows = measured::load(&dir.join(&spec.data), "throughput")?;
    let upper = measured::load(&dir.join(&spec.data), "upper-bound")?;
    let methods: BTreeMap<String, MethodSpec> = spec
        .methods
        .iter()
        .map(|m| (m.grace.clone(), m.clone()))
        .collect();
    check_methods(label, &methods)?;
    // Bytes per 2^24 elements in GRACE's wire layout: the same for every model, so a
    // configuration's kind does not depend on how its model's tensors are split. PowerSGD's
    // bytes depend on the shapes, so it has no kind.
    let volume = |m: &Measurement| {
        let method = methods.get(&m.method)?;
        let (compressor, _) = method.resolve(&m.ratio, &m.memory).ok()?;
        compressor
            .splits_into_calls()
            .then(|| compressor.wire_bytes_as(1 << 24, spec.wire))
    };
    let rules = consistency::Rules {
        min_ratio: spec.upper_bound_min_ratio,
        peer_max_ratio: spec.upper_bound_peer_max_ratio,
        max_workers: spec.fit_workers,
        volume: &volume,
    };
    let exclusions = consistency::flag_inconsistent(&mut rows, &upper, &rules);
    // Everything fitted sees these rows only, so no held-out row can have been fitted.
    let calibration = calibration_rows(spec, &rows);
    let targets = compute::targets(spec, &calibration)?;
    let base = Calibration::base(spec)?;
    let (cal, prices, inputs) = if reuse_fit {
        let cal = Calibration::fitted(spec, dir)?;
        let prices = calibration::codec_prices(&cal.device, &methods)?;
        (cal, prices, Vec::new())
    } else {
        let fit::Fitted {
            calibration: cal,
            factors,
            prices,
        } = fit::fit(spec, &base, &calibration, &methods, &targets)?;
        let inputs = files::inputs(spec, &cal, &factors, &prices, &targets)?;
        (cal, prices, inputs)
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
        comparison: None,
        charts: vec![Chart {
            file: "grace.svg".to_string(),
            title: spec.title.clone(),
            panels: report.panels(),
            columns: 4,
        }],
        table: report.markdown(&cal, &base, &prices, &methods, &rows, &exclusions),
    })
}

/// The consistency rules' thresholds: a share of the upper bound in (0, 1], a factor over the
/// peers' median above 1 (at 1 half of every kind would be excluded).
fn check_rule_ratios(label: &str, spec: &GraceSpec) -> Result<()> {
    let min = spec.upper_bound_min_ratio;
    if !(min > 0.0 && min <= 1.0) {
        return Err(SimError::invalid(
            label,
            "upper_bound_min_ratio",
            format!("{min} is not a share of the upper bound in (0, 1]"),
        ));
    }
    let peer = spec.upper_bound_peer_max_ratio;
    if !(peer.is_finite() && peer > 1.0) {
        return Err(SimError::invalid(
            label,
            "upper_bound_peer_max_ratio",
            format!("{peer} is not a finite factor above 1"),
        ));
    }
    Ok(())
}

/// The rows the fit may use: those with at most `fit_workers` workers.
fn calibration_rows(spec: &GraceSpec, rows: &[Measurement]) -> Vec<Measurement> {
    rows.iter()
        .filter(|m| m.workers <= spec.fit_workers)
        .cloned()
        .collect()
}

/// `none` must be GRACE's dense baseline, and every covered compressing method needs the
/// description of its implementation that the fit prices.
fn check_methods(label: &str, methods: &BTreeMap<String, MethodSpec>) -> Result<()> {
    if methods.get("none").and_then(|m| m.compressor.as_deref()) != Some("none") {
        return Err(SimError::invalid(
            label,
            "methods",
            "needs GRACE's `none` mapped to compressor `none`",
        ));
    }
    if let Some((name, _)) = methods.iter().find(|(name, m)| {
        m.compressor.is_some() && name.as_str() != "none" && m.implementation.is_none()
    }) {
        return Err(SimError::invalid(
            label,
            format!("methods[{name}].implementation"),
            "a covered compressing method needs the ops and bytes of GRACE's implementation",
        ));
    }
    for (name, method) in methods {
        let (Some(implementation), Some(key)) = (&method.implementation, method.key()?) else {
            continue;
        };
        let field = format!("methods[{name}].implementation");
        implementation.check(label, &field, key)?;
        // The calibration prices GRACE's ops and bytes on a GPU, the plan's memory apart.
        if implementation.memory.is_some() || implementation.allocates() {
            return Err(SimError::invalid(
                label,
                field,
                "GRACE's implementations count the codec alone on a GPU: no `memory` and no \
                 `fresh_bytes_per_element`",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `none` and one method whose implementation's encode is `encode` (JSON).
    fn methods(compressor: &str, encode: &str) -> BTreeMap<String, MethodSpec> {
        let method: MethodSpec = serde_json::from_str(&format!(
            r#"{{"grace": "m", "compressor": "{compressor}", "note": "",
                "implementation": {{"encode": {encode},
                    "payload": {{"ops": 1, "bytes_per_element": 4}},
                    "call": {{"ops": 1, "bytes_per_element": 4}}, "source": "test"}}}}"#
        ))
        .unwrap();
        BTreeMap::from([
            ("none".to_string(), MethodSpec::dense()),
            ("m".to_string(), method),
        ])
    }

    #[test]
    fn implementations_have_sound_bytes_and_kept_bytes_only_on_sparsifiers() {
        let ok = r#"{"ops": 2, "bytes_per_element": 8, "bytes_per_kept_element": 12}"#;
        check_methods("spec.json", &methods("topk:{ratio}", ok)).unwrap();
        let err = check_methods("spec.json", &methods("signsgd", ok))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("methods[m].implementation.encode.bytes_per_kept_element")
                && err.contains("sparsifier"),
            "{err}"
        );
        let negative = r#"{"ops": 2, "bytes_per_element": -1}"#;
        let err = check_methods("spec.json", &methods("signsgd", negative))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("methods[m].implementation.encode.bytes_per_element"),
            "{err}"
        );
        // The calibration has nothing to price a memory or fresh pages with.
        let fresh = r#"{"ops": 2, "bytes_per_element": 8, "fresh_bytes_per_element": 4}"#;
        let err = check_methods("spec.json", &methods("signsgd", fresh))
            .unwrap_err()
            .to_string();
        assert!(err.contains("fresh_bytes_per_element"), "{err}");
    }
}
