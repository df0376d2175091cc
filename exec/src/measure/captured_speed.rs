//! A GPU's `compute_speed_vs_v100` from model profiles captured on it against the shipped ones.
//!
//! A GEMM written for the profiler reaches a fraction of a GPU's peak, so its rate says little
//! about how fast a framework trains on it. A model captured on the GPU (`python -m
//! syncopate.capture`, fp32 with TF32 off) against the shipped profile of the same model and
//! batch measured on a V100 says it directly: the ratio of their compute times (forward,
//! backward and optimizer), times the shipped device's own speed. Several models give a median.

use crate::error::{ExecError, Result};
use syncopate_sim::base::data::DataKind;
use syncopate_sim::base::error::SimError;
use syncopate_sim::base::stats::median;
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::model::{ModelProfile, Provenance, Status};

/// One captured model's ratio to its shipped reference.
#[derive(Clone, Debug, PartialEq)]
struct Ratio {
    model: String,
    reference: String,
    speed: f64,
}

/// `compute_speed_vs_v100` and its provenance from captured fp32 profiles, each compared with
/// the shipped profile that has its tensors and batch.
pub fn compute_speed(captured: &[(String, ModelProfile)]) -> Result<(f64, Provenance)> {
    let shipped: Vec<ModelProfile> = DataKind::Model
        .shipped_names()
        .into_iter()
        .map(ModelProfile::load)
        .collect::<std::result::Result<_, _>>()?;
    let ratios = captured
        .iter()
        .map(|(file, model)| ratio(file, model, &shipped))
        .collect::<Result<Vec<_>>>()?;
    let speeds: Vec<f64> = ratios.iter().map(|r| r.speed).collect();
    let Some(speed) = median(&speeds) else {
        return Err(bad("", "no captured model profile given"));
    };
    let each = ratios
        .iter()
        .map(|r| format!("{} against {} {:.3}", r.model, r.reference, r.speed))
        .collect::<Vec<_>>()
        .join(", ");
    let method = format!(
        "median over captured fp32 model profiles (TF32 off) of the shipped profile's compute time (forward + backward + optimizer, same model and batch) divided by the capture's, times the shipped device's compute_speed_vs_v100: {each}"
    );
    Ok((
        speed,
        Provenance {
            status: Status::Measured,
            method,
        },
    ))
}

fn ratio(file: &str, captured: &ModelProfile, shipped: &[ModelProfile]) -> Result<Ratio> {
    if captured.timing.backward.method.contains("autocast") {
        return Err(bad(
            file,
            "an autocast capture does not measure fp32 speed: capture with --tf32 off and without --amp",
        ));
    }
    let inventory = |m: &ModelProfile| m.tensors.iter().map(|t| t.numel).collect::<Vec<_>>();
    let reference = shipped
        .iter()
        .find(|s| {
            inventory(s) == inventory(captured) && s.batch_size_per_gpu == captured.batch_size_per_gpu
        })
        .ok_or_else(|| {
            bad(
                file,
                &format!(
                    "no shipped model profile has its {} tensors at batch {}: capture a shipped model at its shipped batch",
                    captured.num_tensors(),
                    captured.batch_size_per_gpu
                ),
            )
        })?;
    let device = DeviceProfile::load(&reference.device)?;
    let compute =
        |m: &ModelProfile| (m.forward_time() + m.backward_time()).as_us() + m.optimizer_us;
    Ok(Ratio {
        model: captured.name.clone(),
        reference: reference.name.clone(),
        speed: compute(reference) / compute(captured) * device.compute_speed_vs_v100,
    })
}

/// An error naming the flag and the captured file it is about.
fn bad(file: &str, message: &str) -> ExecError {
    SimError::bad_value("--compute-from", file, message).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resnet50_faster(by: f64) -> (String, ModelProfile) {
        let mut m = ModelProfile::load("resnet50").unwrap();
        for t in &mut m.tensors {
            t.forward_us /= by;
            t.backward_us /= by;
        }
        m.optimizer_us /= by;
        m.name = "resnet50-captured".into();
        ("resnet50-captured.json".into(), m)
    }

    /// A capture twice as fast as the shipped V100 profile is twice its device's speed; the
    /// median of several is the middle one, and the provenance names each.
    #[test]
    fn the_speed_is_the_shipped_time_over_the_captured() {
        let v100 = DeviceProfile::load(&ModelProfile::load("resnet50").unwrap().device).unwrap();
        let (speed, provenance) = compute_speed(&[resnet50_faster(2.0)]).unwrap();
        assert!(
            (speed - 2.0 * v100.compute_speed_vs_v100).abs() < 1e-5,
            "{speed}"
        );
        assert_eq!(provenance.status, Status::Measured);
        let (speed, provenance) = compute_speed(&[
            resnet50_faster(2.0),
            resnet50_faster(3.0),
            resnet50_faster(10.0),
        ])
        .unwrap();
        assert!(
            (speed - 3.0 * v100.compute_speed_vs_v100).abs() < 1e-5,
            "{speed}"
        );
        assert!(provenance
            .method
            .contains("resnet50-captured against resnet50"));
    }

    /// An autocast capture, another batch or an unknown model is refused, naming the file.
    #[test]
    fn a_capture_that_cannot_be_compared_is_refused_by_name() {
        let (file, mut amp) = resnet50_faster(2.0);
        amp.timing.backward.method.push_str(", autocast fp16");
        let (_, mut batch) = resnet50_faster(2.0);
        batch.batch_size_per_gpu *= 2;
        let (_, mut other) = resnet50_faster(2.0);
        other.tensors.pop();
        for (model, says) in [
            (amp, "autocast"),
            (batch, "at batch 64"),
            (other, "160 tensors"),
        ] {
            let err = compute_speed(&[(file.clone(), model)])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--compute-from") && err.contains(&file) && err.contains(says),
                "{err}"
            );
        }
        assert!(compute_speed(&[]).is_err());
    }
}
