//! The fraction of a GPU's datasheet peak each class of operation reaches, where it was measured.
//!
//! A device profile may state, per precision, what its convolutions and its matrix products
//! reached in a measurement (`achieved_fraction_of_peak`); a class it does not state reaches
//! `DEFAULT_FRACTION`. The `carry` module takes a step's arithmetic at its class's rate.

use crate::base::error::Result;
use crate::base::limits;
use crate::inputs::model::{Precision, Provenance, Tensor};
use serde::{Deserialize, Serialize};

/// The fraction of the datasheet peak a large cuBLAS matmul reaches, which an operation is
/// assumed to run at where its device states no measurement: 86.9 % on A100 and 80.3 % on H100
/// SXM (BF16, torch.matmul; stas00/ml-engineering compute/accelerator/README.md, "Maximum
/// Achievable Matmul FLOPS").
pub const DEFAULT_FRACTION: f64 = 0.8;

/// The classes of operation a tensor's multiply-adds are done by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A convolution: its weight has three or more dimensions (Conv1d, Conv2d).
    Convolution,
    /// A matrix product: linear layers, a tied head, attention's products.
    Matmul,
}

impl Operation {
    /// The class of `tensor`'s multiply-adds, by the shape of its weight.
    pub fn of(tensor: &Tensor) -> Operation {
        if tensor.shape.len() >= 3 {
            Operation::Convolution
        } else {
            Operation::Matmul
        }
    }
}

/// What each class reached at one precision; a class left out was not measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByOperation {
    /// Convolutions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub convolution: Option<f64>,
    /// Matrix products.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul: Option<f64>,
}

/// A device's measured fractions of its peaks, per precision, with where they come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AchievedFractions {
    /// Of `peak_fp32_tflops`, without TF32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp32: Option<ByOperation>,
    /// Of `peak_tf32_tflops`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tf32: Option<ByOperation>,
    /// Of `peak_fp16_tflops` (FP16 or BF16 on tensor cores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp16: Option<ByOperation>,
    /// The measurements: operations, shapes, how they were timed.
    pub provenance: Provenance,
}

impl AchievedFractions {
    /// The measured fraction of `operation` at `precision`, if this device states one.
    pub fn get(&self, precision: Precision, operation: Operation) -> Option<f64> {
        let by = match precision {
            Precision::Fp32 => &self.fp32,
            Precision::Tf32 => &self.tf32,
            Precision::Fp16 => &self.fp16,
        };
        let by = by.as_ref()?;
        match operation {
            Operation::Convolution => by.convolution,
            Operation::Matmul => by.matmul,
        }
    }

    /// Every stated fraction is in (0, 1]: a measured rate above the peak means a wrong count
    /// or a wrong peak.
    pub fn validate(&self, label: &str) -> Result<()> {
        for (precision, by) in [
            ("fp32", &self.fp32),
            ("tf32", &self.tf32),
            ("fp16", &self.fp16),
        ] {
            let Some(by) = by else { continue };
            for (operation, value) in [("convolution", by.convolution), ("matmul", by.matmul)] {
                if let Some(value) = value {
                    let field = format!("achieved_fraction_of_peak.{precision}.{operation}");
                    limits::check_fraction(label, &field, value)?;
                }
            }
        }
        Ok(())
    }
}

/// The fraction of its peak at `precision` that `operation` reaches on a device stating
/// `achieved` (or none).
pub fn fraction(
    achieved: Option<&AchievedFractions>,
    precision: Precision,
    operation: Operation,
) -> f64 {
    achieved
        .and_then(|a| a.get(precision, operation))
        .unwrap_or(DEFAULT_FRACTION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::device::DeviceProfile;

    #[test]
    fn a_fraction_outside_zero_to_one_is_an_error_naming_its_field() {
        let good = DeviceProfile::load("h200-sxm-141gb").unwrap();
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            let mut device = good.clone();
            let achieved = device.achieved_fraction_of_peak.as_mut().unwrap();
            achieved.fp32.as_mut().unwrap().convolution = Some(bad);
            let err = device.validate("h200").unwrap_err().to_string();
            assert!(
                err.contains("achieved_fraction_of_peak.fp32.convolution"),
                "{err}"
            );
        }
    }

    #[test]
    fn an_unstated_class_or_device_takes_the_default() {
        let h200 = DeviceProfile::load("h200-sxm-141gb").unwrap();
        let achieved = h200.achieved_fraction_of_peak.as_ref();
        let conv = fraction(achieved, Precision::Fp32, Operation::Convolution);
        assert!(conv > 0.3 && conv < 0.6, "{conv}");
        // bf16 convolutions and TF32 were not measured on it; the V100 states nothing.
        for (achieved, precision, operation) in [
            (achieved, Precision::Fp16, Operation::Convolution),
            (achieved, Precision::Tf32, Operation::Matmul),
            (None, Precision::Fp32, Operation::Matmul),
        ] {
            assert_eq!(fraction(achieved, precision, operation), DEFAULT_FRACTION);
        }
    }
}
