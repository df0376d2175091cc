//! Each GRACE model's compute speed, from the calibration rows.
//!
//! The model profiles are scaled to run at it.

use super::calibration::Calibration;
use super::measured::Measurement;
use super::{GraceSpec, MethodSpec};
use crate::base::error::{Result, SimError};
use crate::inputs::model::ModelProfile;
use std::collections::BTreeMap;

/// Where one model's compute speed comes from.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum ComputeTarget {
    /// Its own consistent 1-worker `none` row: one worker runs at that row's images/s.
    Row(Measurement),
    /// Its 1-worker row is excluded as inconsistent: one worker runs at the per-worker speed of
    /// its fastest consistent calibration row (communication and codecs only slow a worker
    /// down, so this is a lower bound on its compute speed, from its own measurements).
    Fastest {
        row: Measurement,
        excluded: Measurement,
    },
}

impl ComputeTarget {
    /// Images/s of one worker computing alone.
    pub(super) fn images_per_s(&self) -> f64 {
        match self {
            ComputeTarget::Row(row) => row.throughput,
            ComputeTarget::Fastest { row, .. } => row.throughput / f64::from(row.workers),
        }
    }

    /// The row of one worker at that speed, which the factor is fitted to.
    fn one_worker(&self) -> Measurement {
        match self {
            ComputeTarget::Row(row) => row.clone(),
            ComputeTarget::Fastest { excluded, .. } => Measurement {
                throughput: self.images_per_s(),
                excluded: None,
                ..excluded.clone()
            },
        }
    }
}

/// Each model's compute target, from the rows of `calibration`: its 1-worker `none` row, or
/// where that row is excluded, its fastest consistent multi-worker row per worker.
pub(super) fn targets(
    spec: &GraceSpec,
    calibration: &[Measurement],
) -> Result<BTreeMap<String, ComputeTarget>> {
    spec.models
        .iter()
        .map(|model| {
            let name = &model.grace;
            let one = calibration
                .iter()
                .find(|m| &m.model == name && m.workers == 1 && m.method == "none")
                .ok_or_else(|| {
                    SimError::invalid(
                        &spec.data,
                        "rows",
                        format!("no 1-worker `none` row for {name}"),
                    )
                })?;
            if one.excluded.is_none() {
                return Ok((name.clone(), ComputeTarget::Row(one.clone())));
            }
            let fastest = calibration
                .iter()
                .filter(|m| &m.model == name && m.workers > 1 && m.excluded.is_none())
                .max_by(|a, b| {
                    (a.throughput / f64::from(a.workers))
                        .total_cmp(&(b.throughput / f64::from(b.workers)))
                })
                .ok_or_else(|| {
                    SimError::invalid(
                        &spec.data,
                        "rows",
                        format!(
                            "{name}: its 1-worker row is excluded and no consistent row with 2 to {} workers is left",
                            spec.fit_workers
                        ),
                    )
                })?;
            let target = ComputeTarget::Fastest {
                row: fastest.clone(),
                excluded: one.clone(),
            };
            Ok((name.clone(), target))
        })
        .collect()
}

/// Scales each model's profile, with its own factor, so that one worker runs at its target
/// (GRACE's TensorFlow on its V100 against our profiles' timings). Returns the calibration and
/// each factor.
pub(super) fn with_compute(
    spec: &GraceSpec,
    base: &Calibration,
    targets: &BTreeMap<String, ComputeTarget>,
) -> Result<(Calibration, BTreeMap<String, f64>)> {
    let none = MethodSpec::dense();
    let mut factors = BTreeMap::new();
    let mut models = BTreeMap::new();
    for (name, profile) in &base.models {
        let one = targets
            .get(name)
            .ok_or_else(|| {
                SimError::invalid(
                    "spec.json",
                    "models",
                    format!("no compute target for {name}"),
                )
            })?
            .one_worker();
        let mut k = 1.0;
        // Two passes: the first from the profile's own time, the second corrects what the
        // simulated single iteration adds beyond compute (the one-rank local copy).
        for _ in 0..2 {
            let trial = Calibration {
                models: BTreeMap::from([(name.clone(), scaled(spec, profile, k))]),
                ..base.clone()
            };
            k *= trial.predict(spec, &one, &none)? / one.throughput;
        }
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
