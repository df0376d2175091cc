//! A GPU's `compute_speed_vs_v100` from model profiles captured on it against the shipped ones.
//!
//! A GEMM written for the profiler reaches a fraction of a GPU's peak, so its rate says little
//! about how fast a framework trains on it. A model captured on the GPU (`python -m
//! syncopate.capture --tf32 off) against the shipped profile of the same model and
//! batch measured on a V100 says it directly: the ratio of their backward passes, the part both
//! measured (a shipped profile's forward and optimizer are estimates), times the shipped
//! device's own speed. Several models give a median.

use crate::error::{ExecError, Result};
use syncopate_sim::base::data::DataKind;
use syncopate_sim::base::error::SimError;
use syncopate_sim::base::stats::median;
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::model::{ModelProfile, Precision, Provenance, Status};

/// One captured model's ratio to its shipped reference.
#[derive(Clone, Debug, PartialEq)]
struct Ratio {
    model: String,
    reference: String,
    speed: f64,
}

/// What `syncopate.capture` writes into a profile's source, and into its description when
/// neither fp32 matrix products nor convolutions could use TF32.
const CAPTURE_SOURCE: &str = "recorded by python -m syncopate.capture";
const TF32_OFF: &str = "TF32 for fp32 matrix products off, for convolutions off";

/// `compute_speed_vs_v100` and its provenance from profiles captured on `device` in fp32, each
/// compared with the shipped profile that has its tensors and batch.
pub fn compute_speed(
    device: &str,
    captured: &[(String, ModelProfile)],
) -> Result<(f64, Provenance)> {
    let shipped: Vec<ModelProfile> = DataKind::Model
        .shipped_names()
        .into_iter()
        .map(ModelProfile::load)
        .collect::<std::result::Result<_, _>>()?;
    let ratios = captured
        .iter()
        .map(|(file, model)| ratio(device, file, model, &shipped))
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
        "median over model profiles captured on this GPU in fp32 with TF32 off (python -m syncopate.capture --tf32 off) of the shipped profile's measured backward time (same model and batch) divided by the capture's, times the shipped device's compute_speed_vs_v100: {each}"
    );
    Ok((
        speed,
        Provenance {
            status: Status::Measured,
            method,
        },
    ))
}

fn ratio(
    device: &str,
    file: &str,
    captured: &ModelProfile,
    shipped: &[ModelProfile],
) -> Result<Ratio> {
    if !captured.source.starts_with(CAPTURE_SOURCE) || captured.device != device {
        return Err(bad(
            file,
            &format!(
                "not a capture on this GPU: its source must be `{CAPTURE_SOURCE} …` and its device `{device}` (the profile's --name), not `{}`",
                captured.device
            ),
        ));
    }
    if captured.timing.backward.method.contains("autocast")
        || !captured.description.contains(TF32_OFF)
    {
        return Err(bad(
            file,
            "only an fp32 capture without TF32 measures fp32 speed: capture with --tf32 off and without --amp",
        ));
    }
    let fp32 = |m: &ModelProfile| {
        m.arithmetic
            .as_ref()
            .is_some_and(|a| a.precision == Precision::Fp32)
    };
    // A profile shipped from an earlier capture on this GPU would only measure it against itself.
    let reference = shipped
        .iter()
        .find(|s| {
            s.same_model(captured)
                && s.timing.backward.status == Status::Measured
                && s.device != device
                && fp32(s)
        })
        .ok_or_else(|| {
            bad(
                file,
                &format!(
                    "no shipped fp32 model profile measured on another device has its {} tensors at batch {}: capture a shipped model at its shipped batch",
                    captured.num_tensors(),
                    captured.batch_size_per_gpu
                ),
            )
        })?;
    let reference_device = DeviceProfile::load(&reference.device)?;
    let backward = |m: &ModelProfile| m.backward_time().as_us();
    Ok(Ratio {
        model: captured.name.clone(),
        reference: reference.name.clone(),
        speed: backward(reference) / backward(captured) * reference_device.compute_speed_vs_v100,
    })
}

/// An error naming the flag and the captured file it is about.
fn bad(file: &str, message: &str) -> ExecError {
    SimError::bad_value("--compute-from", file, message).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: &str = "h200-sxm-141gb";

    /// The shipped resnet50 as `syncopate.capture --tf32 off` would record it on `GPU`, `by`
    /// times faster.
    fn resnet50_faster(by: f64) -> (String, ModelProfile) {
        let mut m = ModelProfile::load("resnet50").unwrap();
        for t in &mut m.tensors {
            t.forward_us /= by;
            t.backward_us /= by;
        }
        m.optimizer_us /= by;
        m.name = "resnet50-captured".into();
        m.device = GPU.into();
        m.source = format!("{CAPTURE_SOURCE} --torchvision resnet50 --tf32 off");
        m.description.push_str(&format!("; {TF32_OFF}"));
        ("resnet50-captured.json".into(), m)
    }

    /// A capture twice as fast as the shipped V100 profile is twice its device's speed; the
    /// median of several is the middle one, and the provenance names each.
    #[test]
    fn the_speed_is_the_shipped_time_over_the_captured() {
        let v100 = DeviceProfile::load(&ModelProfile::load("resnet50").unwrap().device).unwrap();
        let (speed, provenance) = compute_speed(GPU, &[resnet50_faster(2.0)]).unwrap();
        assert!(
            (speed - 2.0 * v100.compute_speed_vs_v100).abs() < 1e-5,
            "{speed}"
        );
        assert_eq!(provenance.status, Status::Measured);
        let (speed, provenance) = compute_speed(
            GPU,
            &[
                resnet50_faster(2.0),
                resnet50_faster(3.0),
                resnet50_faster(10.0),
            ],
        )
        .unwrap();
        assert!(
            (speed - 3.0 * v100.compute_speed_vs_v100).abs() < 1e-5,
            "{speed}"
        );
        assert!(provenance
            .method
            .contains("resnet50-captured against resnet50"));
    }

    /// A capture shipped from this GPU is measured against the V100 profile, not against itself
    /// or an autocast capture of the same model: the H200's resnet50 comes out 2.147 as when
    /// `gpu/check.sh` measured it.
    #[test]
    fn a_shipped_capture_is_measured_against_another_device() {
        let captured = ModelProfile::load("resnet50-h200-fp32").unwrap();
        let (speed, provenance) =
            compute_speed(GPU, &[("resnet50-h200-fp32.json".into(), captured)]).unwrap();
        assert!((speed - 2.147).abs() < 5e-4, "{speed}");
        assert!(
            provenance
                .method
                .ends_with("resnet50-h200-fp32 against resnet50 2.147"),
            "{}",
            provenance.method
        );
    }

    /// A shipped profile, a capture on another GPU, an autocast or TF32 capture, another batch
    /// or an unknown model is refused, naming the file.
    #[test]
    fn a_capture_that_cannot_be_compared_is_refused_by_name() {
        let (file, mut amp) = resnet50_faster(2.0);
        amp.timing.backward.method.push_str(", autocast fp16");
        let (_, mut tf32) = resnet50_faster(2.0);
        tf32.description = tf32
            .description
            .replace(TF32_OFF, "TF32 for convolutions on");
        let (_, mut batch) = resnet50_faster(2.0);
        batch.batch_size_per_gpu *= 2;
        let (_, mut other) = resnet50_faster(2.0);
        other.tensors.pop();
        let (_, mut elsewhere) = resnet50_faster(2.0);
        elsewhere.device = "a100-sxm4-80gb".into();
        let shipped = ModelProfile::load("resnet50").unwrap();
        for (model, says) in [
            (amp, "without TF32"),
            (tf32, "without TF32"),
            (batch, "at batch 64"),
            (other, "160 tensors"),
            (elsewhere, "not a capture on this GPU"),
            (shipped, "not a capture on this GPU"),
        ] {
            let err = compute_speed(GPU, &[(file.clone(), model)])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--compute-from") && err.contains(&file) && err.contains(says),
                "{err}"
            );
        }
        assert!(compute_speed(GPU, &[]).is_err());
    }
}
