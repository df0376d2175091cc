//! Carries a model profile's compute to another GPU step by step.
//!
//! Each step's arithmetic scales at the ratio of the two devices' peaks at the profile's precision,
//! the rest at the ratio of their memory bandwidths.

use crate::base::error::{Result, SimError};
use crate::inputs::device::{DeviceKind, DeviceProfile};
use crate::inputs::flops::{forward_macs_per_sample, peak_tflops, tensor_macs_per_sample};
use crate::inputs::model::{ModelProfile, Tensor};

/// The fraction of the datasheet peak a large cuBLAS matmul reaches, which a step's arithmetic
/// is assumed to run at: 86.9 % on A100 and 80.3 % on H100 SXM (BF16, torch.matmul;
/// stas00/ml-engineering compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS").
/// What a step takes beyond its FLOPs at this rate is taken to be bound by memory.
pub const MATMUL_FRACTION_OF_PEAK: f64 = 0.8;

/// FLOPs per multiply-add.
const FLOPS_PER_MAC: f64 = 2.0;

/// How a profile's steps split into arithmetic and the rest on the device it computes on.
struct Split {
    /// FLOPs the device does per µs at `MATMUL_FRACTION_OF_PEAK` of its peak.
    achievable_flops_per_us: f64,
    /// Multiply-adds per tensor multiply-add: attention's parameter-free products run beside
    /// the tensors' own and are shared out in proportion.
    share: f64,
    batch: f64,
}

impl Split {
    /// `None` for a profile without FLOP counts or a device without a peak at its precision.
    fn of(model: &ModelProfile, device: &DeviceProfile) -> Option<Split> {
        let arithmetic = model.arithmetic.as_ref()?;
        let total_macs = forward_macs_per_sample(model)?;
        let tensor_macs = tensor_macs_per_sample(model);
        let share = if tensor_macs == 0 {
            0.0
        } else {
            total_macs as f64 / tensor_macs as f64
        };
        Some(Split {
            achievable_flops_per_us: peak_tflops(device, arithmetic.precision)?
                * 1e6
                * MATMUL_FRACTION_OF_PEAK,
            share,
            batch: f64::from(model.batch_size_per_gpu),
        })
    }

    /// The fraction of a step of `measured_us` that its FLOPs take: `passes` times its tensor's
    /// forward multiply-adds (`macs`), at the achievable rate.
    fn arithmetic(&self, measured_us: f64, macs: f64, passes: f64) -> f64 {
        if measured_us <= 0.0 {
            return 0.0;
        }
        let us =
            FLOPS_PER_MAC * passes * macs * self.share * self.batch / self.achievable_flops_per_us;
        (us / measured_us).min(1.0)
    }

    /// Every forward and backward step: (measured µs, its tensor's multiply-adds, passes).
    fn steps(model: &ModelProfile) -> impl Iterator<Item = (f64, f64, f64)> + '_ {
        model.tensors.iter().flat_map(|t| {
            let macs = tensor_macs(t);
            [
                (t.forward_us, macs, FORWARD_PASSES),
                (t.backward_us, macs, BACKWARD_PASSES),
            ]
        })
    }
}

/// Passes over a tensor's multiply-adds in its forward step, and in its backward step, which
/// computes the input's and the weight's gradients: twice the forward.
const FORWARD_PASSES: f64 = 1.0;
const BACKWARD_PASSES: f64 = 2.0;

/// A tensor's forward multiply-adds per sample.
fn tensor_macs(t: &Tensor) -> f64 {
    (t.numel as f64) * (t.uses_per_sample as f64)
}

/// The profile's steps as they would run on `to`, with the fraction of the measured compute time
/// they take there; `None` where the split cannot be made (a profile without FLOP counts, or a
/// CPU on either side), and the caller falls back on the devices' `compute_speed_vs_v100`.
pub fn carry(
    model: &ModelProfile,
    from: &DeviceProfile,
    to: &DeviceProfile,
) -> Result<Option<(ModelProfile, f64)>> {
    if from.kind != DeviceKind::Gpu || to.kind != DeviceKind::Gpu {
        return Ok(None);
    }
    let Some(arithmetic) = &model.arithmetic else {
        return Ok(None);
    };
    let peak = |device: &DeviceProfile| {
        peak_tflops(device, arithmetic.precision).ok_or_else(|| {
            SimError::invalid(
                &device.name,
                "peak_tf32_tflops",
                format!(
                    "model `{}` was measured in TF32, which this device does not have",
                    model.name
                ),
            )
        })
    };
    let arithmetic_ratio = peak(from)? / peak(to)?;
    let Some(split) = Split::of(model, from) else {
        return Ok(None);
    };
    let memory_ratio = from.memory_bandwidth_gbytes_per_s / to.memory_bandwidth_gbytes_per_s;
    let carried_us = |measured_us: f64, macs: f64, passes: f64| {
        let bound = split.arithmetic(measured_us, macs, passes);
        measured_us * (bound * arithmetic_ratio + (1.0 - bound) * memory_ratio)
    };
    let mut carried = model.clone();
    for tensor in &mut carried.tensors {
        let macs = tensor_macs(tensor);
        tensor.backward_us = carried_us(tensor.backward_us, macs, BACKWARD_PASSES);
        tensor.forward_us = carried_us(tensor.forward_us, macs, FORWARD_PASSES);
    }
    // The optimizer streams parameters, gradients and state: bound by memory.
    carried.optimizer_us = model.optimizer_us * memory_ratio;
    carried.device = to.name.clone();
    let measured = step_total(model);
    let ratio = if measured > 0.0 {
        step_total(&carried) / measured
    } else {
        1.0
    };
    Ok(Some((carried, ratio)))
}

/// The share of a profile's forward and backward time on `device` that is arithmetic, weighted
/// by time; `None` where the split cannot be made.
pub fn arithmetic_fraction(model: &ModelProfile, device: &DeviceProfile) -> Option<f64> {
    let split = Split::of(model, device)?;
    let (arithmetic, total) = Split::steps(model).fold((0.0, 0.0), |(a, t), (us, macs, passes)| {
        (a + us * split.arithmetic(us, macs, passes), t + us)
    });
    (total > 0.0).then(|| arithmetic / total)
}

/// Forward, backward and optimizer time of one iteration, in µs.
fn step_total(model: &ModelProfile) -> f64 {
    let tensors: f64 = model
        .tensors
        .iter()
        .map(|t| t.forward_us + t.backward_us)
        .sum();
    tensors + model.optimizer_us
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str) -> DeviceProfile {
        DeviceProfile::load(name).unwrap()
    }

    #[test]
    fn arithmetic_follows_the_peak_and_the_rest_the_memory_bandwidth() {
        let model = ModelProfile::load("resnet50").unwrap();
        let (v100, h100) = (device("v100-sxm2-32gb"), device("h100-sxm5-80gb"));
        let (carried, ratio) = carry(&model, &v100, &h100).unwrap().unwrap();
        let arithmetic = v100.peak_fp32_tflops / h100.peak_fp32_tflops;
        let memory = v100.memory_bandwidth_gbytes_per_s / h100.memory_bandwidth_gbytes_per_s;
        // Every step lands between its all-arithmetic and all-memory times.
        let (low, high) = (arithmetic.min(memory), arithmetic.max(memory));
        for (before, after) in model.tensors.iter().zip(&carried.tensors) {
            let r = after.backward_us / before.backward_us;
            assert!(
                r >= low - 1e-12 && r <= high + 1e-12,
                "{}: {r}",
                before.name
            );
        }
        assert!(ratio > low && ratio < high, "{ratio}");
        assert_eq!(carried.optimizer_us, model.optimizer_us * memory);
        assert_eq!(carried.device, "h100-sxm5-80gb");
        // A norm's parameters do no multiply-adds: bound by memory alone.
        let bn = model
            .tensors
            .iter()
            .position(|t| t.uses_per_sample == 0 && t.backward_us > 0.0)
            .unwrap();
        let r = carried.tensors[bn].backward_us / model.tensors[bn].backward_us;
        assert!((r - memory).abs() < 1e-12, "{r}");
    }

    #[test]
    fn a_tf32_profile_cannot_be_carried_to_a_gpu_without_tf32() {
        let mut model = ModelProfile::load("resnet50").unwrap();
        model.arithmetic.as_mut().unwrap().precision = crate::inputs::model::Precision::Tf32;
        let (a100, v100) = (device("a100-sxm4-40gb"), device("v100-sxm2-32gb"));
        let err = carry(&model, &a100, &v100).unwrap_err().to_string();
        assert!(
            err.contains("peak_tf32_tflops") && err.contains("v100-sxm2-32gb"),
            "{err}"
        );
        // Between two GPUs with TF32 it carries by their TF32 peaks.
        let (_, ratio) = carry(&model, &a100, &device("h100-sxm5-80gb"))
            .unwrap()
            .unwrap();
        assert!(ratio < 1.0, "{ratio}");
    }

    #[test]
    fn the_same_device_keeps_every_time_and_a_cpu_is_not_split() {
        let model = ModelProfile::load("resnet50").unwrap();
        let v100 = device("v100-sxm2-32gb");
        let (carried, ratio) = carry(&model, &v100, &v100).unwrap().unwrap();
        assert_eq!(carried.tensors, model.tensors);
        assert_eq!(ratio, 1.0);
        assert!(carry(&model, &v100, &device("host-2core"))
            .unwrap()
            .is_none());
        let mut bare = model.clone();
        bare.arithmetic = None;
        assert!(carry(&bare, &v100, &v100).unwrap().is_none());
    }
}
