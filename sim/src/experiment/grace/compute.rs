//! Each GRACE model's measured compute speed, and the model profiles scaled to run at it.

use super::calibration::Calibration;
use super::measured::Measurement;
use super::{GraceSpec, MethodSpec};
use crate::error::{Result, SimError};
use crate::model::ModelProfile;
use std::collections::BTreeMap;

/// The measured compute speed one model is scaled to: images/s of one worker, and where it comes from.
#[derive(Clone, Debug)]
pub struct ComputeTarget {
    pub images_per_s: f64,
    pub source: String,
    /// The row it comes from.
    pub row: Measurement,
}

/// Each model's compute target: its own 1-worker `none` row; where the consistency rules flag
/// that row, its fastest remaining multi-worker row per worker (communication only slows a
/// worker down, so this is a lower bound on its compute speed).
pub fn targets(spec: &GraceSpec, data: &[Measurement]) -> Result<BTreeMap<String, ComputeTarget>> {
    let mut targets = BTreeMap::new();
    for model in &spec.models {
        let name = &model.grace;
        let one = data
            .iter()
            .find(|m| &m.model == name && m.workers == 1 && m.method == "none")
            .ok_or_else(|| {
                SimError::invalid(
                    &spec.data,
                    "rows",
                    format!("no 1-worker `none` row for {name}"),
                )
            })?;
        let target = if one.excluded.is_none() {
            ComputeTarget {
                images_per_s: one.throughput,
                source: format!("its 1-worker `none` row ({:.2} img/s)", one.throughput),
                row: one.clone(),
            }
        } else {
            let fastest = data
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
                        format!("{name}: 1-worker row excluded and no other row left"),
                    )
                })?;
            let per_worker = fastest.throughput / f64::from(fastest.workers);
            ComputeTarget {
                images_per_s: per_worker,
                source: format!(
                    "its fastest consistent row per worker, `{}` at {} workers ({:.1} img/s = {:.2} per worker; its 1-worker row, {:.2} img/s, is excluded as inconsistent)",
                    fastest.method, fastest.workers, fastest.throughput, per_worker, one.throughput
                ),
                row: fastest.clone(),
            }
        };
        targets.insert(name.clone(), target);
    }
    Ok(targets)
}

/// Scales each model, with its own factor, so that one worker runs at its compute target
/// (GRACE's TensorFlow on its V100 against our profiles' PyTorch timings).
pub fn with_compute(
    spec: &GraceSpec,
    base: &Calibration,
    targets: &BTreeMap<String, ComputeTarget>,
    batch: u32,
) -> Result<Calibration> {
    let none = MethodSpec::dense();
    let mut models = BTreeMap::new();
    for (name, profile) in &base.models {
        let target = targets.get(name).ok_or_else(|| {
            SimError::invalid(
                "spec.json",
                "models",
                format!("no compute target for {name}"),
            )
        })?;
        let one = Measurement {
            model: name.clone(),
            workers: 1,
            method: "none".to_string(),
            ratio: "n/a".to_string(),
            memory: "n/a".to_string(),
            comm_method: "allreduce".to_string(),
            throughput: target.images_per_s,
            runs: 1,
            excluded: None,
        };
        let mut k = 1.0;
        // Two passes: the first from the profile's own time, the second corrects what the
        // simulated single iteration adds beyond compute (the one-rank local copy).
        for _ in 0..2 {
            let trial = Calibration {
                models: BTreeMap::from([(name.clone(), scaled(profile, k, batch))]),
                ..base.clone()
            };
            k *= trial.predict(spec, &one, &none)? / one.throughput;
        }
        models.insert(name.clone(), scaled(profile, k, batch));
    }
    Ok(Calibration {
        models,
        ..base.clone()
    })
}

/// The profile with every compute time multiplied by `k` and GRACE's batch.
fn scaled(profile: &ModelProfile, k: f64, batch: u32) -> ModelProfile {
    let mut m = profile.clone();
    for t in &mut m.tensors {
        t.backward_us *= k;
        t.forward_us *= k;
    }
    m.optimizer_us *= k;
    m.batch_size_per_gpu = batch;
    m
}
