//! Each GRACE model's compute speed, from the calibration rows, and the model profiles scaled to run at it.

use super::calibration::Calibration;
use super::measured::Measurement;
use super::{GraceSpec, MethodSpec};
use crate::error::{Result, SimError};
use crate::model::ModelProfile;
use std::collections::BTreeMap;

/// Where one model's compute speed comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ComputeTarget {
    /// Its own consistent 1-worker `none` row: one worker runs at that row's images/s.
    Row(Measurement),
    /// Its 1-worker row is excluded as inconsistent: its profile takes the network model's
    /// factor (GRACE's TensorFlow against our profiles' timings, both on a V100), so our
    /// profiles' relative compute carries it over.
    Borrowed { from: String, excluded: Measurement },
}

/// Each model's compute target, from the 1-worker `none` rows of `calibration`.
pub fn targets(
    spec: &GraceSpec,
    calibration: &[Measurement],
) -> Result<BTreeMap<String, ComputeTarget>> {
    let one = |name: &str| {
        calibration
            .iter()
            .find(|m| m.model == name && m.workers == 1 && m.method == "none")
            .ok_or_else(|| {
                SimError::invalid(
                    &spec.data,
                    "rows",
                    format!("no 1-worker `none` row for {name}"),
                )
            })
    };
    let network = one(&spec.network_model)?;
    if network.excluded.is_some() {
        return Err(SimError::invalid(
            "spec.json",
            "network_model",
            format!(
                "{}'s 1-worker `none` row is excluded as inconsistent; name a model whose row is consistent",
                spec.network_model
            ),
        ));
    }
    spec.models
        .iter()
        .map(|model| {
            let row = one(&model.grace)?;
            let target = match row.excluded {
                None => ComputeTarget::Row(row.clone()),
                Some(_) => ComputeTarget::Borrowed {
                    from: spec.network_model.clone(),
                    excluded: row.clone(),
                },
            };
            Ok((model.grace.clone(), target))
        })
        .collect()
}

/// Scales each model's profile so that one worker runs at its target: by its own factor, or
/// by the network model's for a borrowed target. Returns the calibration and each factor.
pub fn with_compute(
    spec: &GraceSpec,
    base: &Calibration,
    targets: &BTreeMap<String, ComputeTarget>,
) -> Result<(Calibration, BTreeMap<String, f64>)> {
    let none = MethodSpec::dense();
    let mut factors = BTreeMap::new();
    for (name, profile) in &base.models {
        if let Some(ComputeTarget::Row(one)) = targets.get(name) {
            let mut k = 1.0;
            // Two passes: the first from the profile's own time, the second corrects what the
            // simulated single iteration adds beyond compute (the one-rank local copy).
            for _ in 0..2 {
                let trial = Calibration {
                    models: BTreeMap::from([(name.clone(), scaled(spec, profile, k))]),
                    ..base.clone()
                };
                k *= trial.predict(spec, one, &none)? / one.throughput;
            }
            factors.insert(name.clone(), k);
        }
    }
    let mut models = BTreeMap::new();
    for (name, profile) in &base.models {
        let k = match targets.get(name) {
            Some(ComputeTarget::Row(_)) => factors[name],
            Some(ComputeTarget::Borrowed { from, .. }) => *factors.get(from).ok_or_else(|| {
                SimError::invalid(
                    "spec.json",
                    "network_model",
                    format!("`{from}` is not one of the models"),
                )
            })?,
            None => {
                return Err(SimError::invalid(
                    "spec.json",
                    "models",
                    format!("no compute target for {name}"),
                ))
            }
        };
        factors.insert(name.clone(), k);
        models.insert(name.clone(), scaled(spec, profile, k));
    }
    Ok((
        Calibration {
            models,
            ..base.clone()
        },
        factors,
    ))
}

/// The profile with every compute time multiplied by `k` and GRACE's batch.
fn scaled(spec: &GraceSpec, profile: &ModelProfile, k: f64) -> ModelProfile {
    let mut m = profile.clone();
    for t in &mut m.tensors {
        t.backward_us *= k;
        t.forward_us *= k;
    }
    m.optimizer_us *= k;
    m.batch_size_per_gpu = spec.batch_size_per_gpu;
    m
}
