//! Carries a model profile's compute to another GPU step by step.
//!
//! Each step's arithmetic scales at the ratio of the rates its class of operation reaches on the
//! two devices at the profile's precision (`achieved`), the rest at the ratio of their memory
//! bandwidths.

use crate::base::error::{Result, SimError};
use crate::inputs::achieved::{fraction, AchievedFractions, Operation};
use crate::inputs::device::{DeviceKind, DeviceProfile};
use crate::inputs::flops::{forward_macs_per_sample, peak_tflops, tensor_macs_per_sample};
use crate::inputs::model::{ModelProfile, Precision, Tensor};

/// FLOPs per multiply-add.
const FLOPS_PER_MAC: f64 = 2.0;

/// The FLOPs per µs each class of operation reaches on a device at one precision: its peak
/// times the fraction `achieved` states for the class, or `achieved::DEFAULT_FRACTION`.
#[derive(Clone, Copy)]
struct Rates<'a> {
    peak_flops_per_us: f64,
    precision: Precision,
    achieved: Option<&'a AchievedFractions>,
}

impl Rates<'_> {
    fn get(&self, operation: Operation) -> f64 {
        self.peak_flops_per_us * fraction(self.achieved, self.precision, operation)
    }
}

/// How a profile's steps split into arithmetic and the rest on the device it computes on.
struct Split<'a> {
    /// What each class of operation reaches there.
    rates: Rates<'a>,
    /// Multiply-adds per tensor multiply-add: attention's parameter-free products run beside
    /// the tensors' own and are shared out in proportion.
    share: f64,
    batch: f64,
}

impl<'a> Split<'a> {
    /// `model`'s steps on a device whose classes reach `rates`; `None` for a profile without
    /// FLOP counts.
    fn of(model: &ModelProfile, rates: Rates<'a>) -> Option<Split<'a>> {
        let total_macs = forward_macs_per_sample(model)?;
        let tensor_macs = tensor_macs_per_sample(model);
        let share = if tensor_macs == 0 {
            0.0
        } else {
            total_macs as f64 / tensor_macs as f64
        };
        Some(Split {
            rates,
            share,
            batch: f64::from(model.batch_size_per_gpu),
        })
    }

    /// The fraction of a step of `measured_us` that its FLOPs take: `passes` times its tensor's
    /// forward multiply-adds (`macs`), at the rate its class of operation reaches.
    fn arithmetic(&self, step: &Step) -> f64 {
        if step.measured_us <= 0.0 {
            return 0.0;
        }
        let us = FLOPS_PER_MAC * step.passes * step.macs * self.share * self.batch
            / self.rates.get(step.operation);
        (us / step.measured_us).min(1.0)
    }
}

/// One forward or backward step of a tensor.
struct Step {
    measured_us: f64,
    /// Its tensor's forward multiply-adds per sample.
    macs: f64,
    /// Passes over them: 1 forward, 2 backward (the input's and the weight's gradients).
    passes: f64,
    operation: Operation,
}

/// Passes over a tensor's multiply-adds in its forward step, and in its backward step, which
/// computes the input's and the weight's gradients: twice the forward.
const FORWARD_PASSES: f64 = 1.0;
const BACKWARD_PASSES: f64 = 2.0;

/// A tensor's forward and backward steps.
fn steps(t: &Tensor) -> [Step; 2] {
    let (macs, operation) = (
        (t.numel as f64) * (t.uses_per_sample as f64),
        Operation::of(t),
    );
    [
        Step {
            measured_us: t.forward_us,
            macs,
            passes: FORWARD_PASSES,
            operation,
        },
        Step {
            measured_us: t.backward_us,
            macs,
            passes: BACKWARD_PASSES,
            operation,
        },
    ]
}

/// The profile's steps as they would run on `to`, with the fraction of the measured compute time
/// they take there; `None` where the split cannot be made (a profile without FLOP counts, or a
/// CPU on either side), and the caller falls back on the devices' `compute_speed_vs_v100`.
pub fn carry<'a>(
    model: &ModelProfile,
    from: &'a DeviceProfile,
    to: &'a DeviceProfile,
) -> Result<Option<(ModelProfile, f64)>> {
    if from.kind != DeviceKind::Gpu || to.kind != DeviceKind::Gpu {
        return Ok(None);
    }
    let Some(arithmetic) = &model.arithmetic else {
        return Ok(None);
    };
    // Both devices have a peak at the profile's precision, or the error names the one without.
    let rates = |device: &'a DeviceProfile| {
        let peak = peak_tflops(device, arithmetic.precision).ok_or_else(|| {
            SimError::invalid(
                &device.name,
                "peak_tf32_tflops",
                format!(
                    "model `{}` was measured in TF32, which this device does not have",
                    model.name
                ),
            )
        })?;
        Ok::<_, SimError>(Rates {
            peak_flops_per_us: peak * 1e6,
            precision: arithmetic.precision,
            achieved: device.achieved_fraction_of_peak.as_ref(),
        })
    };
    let (source, target) = (rates(from)?, rates(to)?);
    let Some(split) = Split::of(model, source) else {
        return Ok(None);
    };
    let memory_ratio = from.memory_bandwidth_gbytes_per_s / to.memory_bandwidth_gbytes_per_s;
    let carried_us = |step: &Step| {
        let bound = split.arithmetic(step);
        let arithmetic_ratio = split.rates.get(step.operation) / target.get(step.operation);
        step.measured_us * (bound * arithmetic_ratio + (1.0 - bound) * memory_ratio)
    };
    let mut carried = model.clone();
    for tensor in &mut carried.tensors {
        let [forward, backward] = steps(tensor);
        tensor.forward_us = carried_us(&forward);
        tensor.backward_us = carried_us(&backward);
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

/// The share of a profile's forward and backward time on `device` that its FLOPs would take at
/// the default fraction of the peak, weighted by time; `None` where the split cannot be made.
/// Not at a fraction the device measured: what a step takes beyond the ideal rate is memory
/// traffic or stalls, and slows beside other memory traffic as such (the H200's fp32
/// convolution, at 44 % of the peak alone, slowed 1.78x beside a copy loop; taking it as all
/// arithmetic would price it at 1.00x).
pub fn arithmetic_fraction(model: &ModelProfile, device: &DeviceProfile) -> Option<f64> {
    let precision = model.arithmetic.as_ref()?.precision;
    let ideal = Rates {
        peak_flops_per_us: peak_tflops(device, precision)? * 1e6,
        precision,
        achieved: None,
    };
    let split = Split::of(model, ideal)?;
    let (arithmetic, total) =
        model
            .tensors
            .iter()
            .flat_map(steps)
            .fold((0.0, 0.0), |(a, t), step| {
                (
                    a + step.measured_us * split.arithmetic(&step),
                    t + step.measured_us,
                )
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
    use crate::inputs::achieved::DEFAULT_FRACTION;

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
    fn a_device_s_measured_fractions_carry_each_class_of_operation_at_its_own_rate() {
        let model = ModelProfile::load("resnet50").unwrap();
        let v100 = device("v100-sxm2-32gb");
        let h200 = device("h200-sxm-141gb");
        let achieved = h200.achieved_fraction_of_peak.clone().unwrap();
        let mut unmeasured = h200.clone();
        unmeasured.achieved_fraction_of_peak = None;
        let (with, _) = carry(&model, &v100, &h200).unwrap().unwrap();
        let (without, _) = carry(&model, &v100, &unmeasured).unwrap().unwrap();
        let fp32 = achieved.fp32.unwrap();
        // ResNet-50's 3x3 convolutions on the V100 (cuDNN's Winograd) are all arithmetic: their
        // carried time scales by the fraction the H200 measured for convolutions.
        let conv = model
            .tensors
            .iter()
            .position(|t| t.name == "layer3.1.conv2.weight")
            .unwrap();
        let expected = DEFAULT_FRACTION / fp32.convolution.unwrap();
        let r = with.tensors[conv].backward_us / without.tensors[conv].backward_us;
        assert!((r - expected).abs() < 1e-9, "{r} vs {expected}");
        // The classifier is a matrix product; a norm does no multiply-adds and is carried by
        // memory bandwidth alone, whatever the fractions.
        let fc = model
            .tensors
            .iter()
            .position(|t| t.name == "fc.weight")
            .unwrap();
        assert_eq!(Operation::of(&model.tensors[fc]), Operation::Matmul);
        assert!(with.tensors[fc].backward_us > without.tensors[fc].backward_us);
        let bn = model
            .tensors
            .iter()
            .position(|t| t.uses_per_sample == 0 && t.backward_us > 0.0)
            .unwrap();
        assert_eq!(
            with.tensors[bn].backward_us,
            without.tensors[bn].backward_us
        );
    }

    #[test]
    fn the_arithmetic_share_contention_weighs_is_at_the_default_fraction() {
        let model = ModelProfile::load("resnet50-h200-fp32").unwrap();
        let h200 = device("h200-sxm-141gb");
        let mut unmeasured = h200.clone();
        unmeasured.achieved_fraction_of_peak = None;
        let share = arithmetic_fraction(&model, &h200).unwrap();
        assert_eq!(share, arithmetic_fraction(&model, &unmeasured).unwrap());
        assert!(share > 0.3 && share < 0.4, "{share}");
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
