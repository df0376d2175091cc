//! Training FLOPs of a model profile, and the FLOP/s its timings imply against its device's peak.

use crate::inputs::device::DeviceProfile;
use crate::inputs::model::{ModelProfile, Precision};

/// Above this fraction of the device's peak a whole training iteration is suspicious: possible,
/// but more than measured V100 FP32 training runs reach (about 50–55 % for the Espresso traces of
/// ResNet-101 and GPT-2 at their scripts' batches).
pub const SUSPICIOUS_FRACTION: f64 = 0.70;

/// Forward multiply-adds per sample: every tensor's elements × `uses_per_sample`, plus the
/// profile's parameter-free ones. `None` for a profile without an `arithmetic` section.
pub fn forward_macs_per_sample(model: &ModelProfile) -> Option<u128> {
    let arithmetic = model.arithmetic.as_ref()?;
    Some(tensor_macs_per_sample(model) + u128::from(arithmetic.parameter_free_macs_per_sample))
}

/// Forward multiply-adds per sample that involve a parameter tensor: its elements ×
/// `uses_per_sample`, summed over the tensors.
pub fn tensor_macs_per_sample(model: &ModelProfile) -> u128 {
    model
        .tensors
        .iter()
        .map(|t| u128::from(t.numel) * u128::from(t.uses_per_sample))
        .sum()
}

/// Forward multiply-adds per sample of the head: the layers whose backward runs before the first
/// gradient is ready.
pub fn head_macs_per_sample(model: &ModelProfile) -> Option<u128> {
    let arithmetic = model.arithmetic.as_ref()?;
    Some(
        model
            .tensors
            .iter()
            .filter(|t| arithmetic.head_tensors.contains(&t.name))
            .map(|t| u128::from(t.numel) * u128::from(t.uses_per_sample))
            .sum(),
    )
}

/// FLOPs of one training iteration on one device: 2 per forward multiply-add, and a backward
/// twice the forward (input and weight gradients), times the batch.
pub fn training_flops_per_iteration(model: &ModelProfile) -> Option<f64> {
    let macs = forward_macs_per_sample(model)?;
    Some(6.0 * macs as f64 * f64::from(model.batch_size_per_gpu))
}

/// The device peak, in TFLOP/s, for the precision a profile was measured in; `None` for TF32 on
/// a device without it.
pub fn peak_tflops(device: &DeviceProfile, precision: Precision) -> Option<f64> {
    match precision {
        Precision::Fp32 => Some(device.peak_fp32_tflops),
        Precision::Tf32 => device.peak_tf32_tflops,
        Precision::Fp16 => Some(device.peak_fp16_tflops),
    }
}

/// What the check concludes about a profile's timings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// At most `SUSPICIOUS_FRACTION` of the peak.
    Plausible,
    /// Between `SUSPICIOUS_FRACTION` and the peak.
    Suspicious,
    /// Above the peak, and the profile's `arithmetic.above_peak_reason` says why that can be.
    AbovePeakExplained,
    /// Above the peak with no reason given: the timings, the batch or the counts are wrong.
    Impossible,
}

/// A profile's implied compute rate next to its device's peak.
#[derive(Clone, Debug, PartialEq)]
pub struct RateCheck {
    /// The precision the profile was measured in, which picks the peak.
    pub precision: Precision,
    /// Training FLOPs of one iteration on one device.
    pub flops_per_iteration: f64,
    /// Forward plus backward time of one iteration (the optimizer step is memory-bound and left
    /// out), in seconds.
    pub compute_seconds: f64,
    /// FLOPs per iteration over the compute time, in TFLOP/s.
    pub achieved_tflops: f64,
    /// The device's peak at the profile's precision, in TFLOP/s.
    pub peak_tflops: f64,
    /// `achieved_tflops` / `peak_tflops`.
    pub fraction_of_peak: f64,
    /// What the fraction says about the timings.
    pub verdict: Verdict,
}

/// Checks a profile's forward and backward timings against the peak of `device`, which should be
/// the device they were measured on (`model.device`). `None` when the profile has no FLOP count
/// or its precision has no peak on the device.
pub fn check(model: &ModelProfile, device: &DeviceProfile) -> Option<RateCheck> {
    let arithmetic = model.arithmetic.as_ref()?;
    let flops = training_flops_per_iteration(model)?;
    let seconds = (model.forward_time() + model.backward_time()).as_secs();
    let peak = peak_tflops(device, arithmetic.precision)?;
    let achieved = match (flops > 0.0, seconds > 0.0) {
        (false, _) => 0.0,
        (true, false) => f64::INFINITY,
        (true, true) => flops / seconds / 1e12,
    };
    let fraction = achieved / peak;
    let verdict = if fraction > 1.0 {
        match arithmetic.above_peak_reason {
            Some(_) => Verdict::AbovePeakExplained,
            None => Verdict::Impossible,
        }
    } else if fraction > SUSPICIOUS_FRACTION {
        Verdict::Suspicious
    } else {
        Verdict::Plausible
    };
    Some(RateCheck {
        precision: arithmetic.precision,
        flops_per_iteration: flops,
        compute_seconds: seconds,
        achieved_tflops: achieved,
        peak_tflops: peak,
        fraction_of_peak: fraction,
        verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn macs(name: &str) -> f64 {
        forward_macs_per_sample(&ModelProfile::load(name).unwrap()).unwrap() as f64
    }

    fn assert_within(name: &str, got: f64, published: f64, tolerance: f64) {
        let error = (got / published - 1.0).abs();
        assert!(
            error <= tolerance,
            "{name}: {got:.4e} vs published {published:.4e} ({:.2} %)",
            100.0 * error
        );
    }

    #[test]
    fn cnn_counts_match_torchvision_within_one_percent() {
        // torchvision model docs (pytorch.org/vision/stable/models.html), "GFLOPS" column, which
        // counts multiply-adds per image at 224x224 (Inception-v3: 299x299). ResNet-50 v1.5 is
        // 4.09 G; He et al. (CVPR 2016) give 3.8 G for v1, whose stride sits on the 1x1 conv.
        for (name, published_gmacs) in [
            ("resnet50", 4.09),
            ("resnet101", 7.80),
            ("resnet152", 11.51),
            ("vgg16", 15.47),
            ("vgg19", 19.63),
            ("alexnet", 0.71),
            ("inception-v3", 5.71),
            ("densenet201", 4.29),
        ] {
            assert_within(name, macs(name), published_gmacs * 1e9, 0.01);
        }
    }

    /// Megatron-LM's forward FLOPs per token of a transformer (Narayanan et al., SC'21, from
    /// their 96 B s l h² (1 + s/6h + V/16lh) for training with recomputation, which is 4 passes):
    /// 24 l h² + 4 l s h + 2 h V. Biases, norms and softmax are left out, as here.
    fn megatron_flops_per_token(layers: f64, hidden: f64, seq: f64, vocab: f64) -> f64 {
        24.0 * layers * hidden * hidden + 4.0 * layers * seq * hidden + 2.0 * hidden * vocab
    }

    #[test]
    fn transformer_counts_match_the_megatron_formula() {
        // GPT-2 (Radford et al. 2019): vocabulary 50257, 1024 tokens; the LM head is tied to wte.
        for (name, layers, hidden) in [
            ("gpt2", 12.0, 768.0),
            ("gpt2-medium", 24.0, 1024.0),
            ("gpt2-large", 36.0, 1280.0),
            ("gpt2-xl", 48.0, 1600.0),
        ] {
            let flops = 2.0 * macs(name);
            let formula = 1024.0 * megatron_flops_per_token(layers, hidden, 1024.0, 50257.0);
            assert_within(name, flops, formula, 1e-3);
        }
        // BERT (Devlin et al. 2019) at 384 tokens has no vocabulary projection in SQuAD
        // fine-tuning; its 2-way span head is the only extra.
        for (name, layers, hidden) in [("bert-base", 12.0, 768.0), ("bert-large", 24.0, 1024.0)] {
            let flops = 2.0 * macs(name);
            let formula = 384.0 * megatron_flops_per_token(layers, hidden, 384.0, 0.0);
            assert_within(name, flops, formula, 1e-3);
        }
    }

    #[test]
    fn lstm_count_is_four_gates_per_token_plus_the_tied_decoder() {
        // Per token: 2 layers x 4 gates x 1500 x (1500 + 1500), plus the 1500 x 33278 decoder;
        // 68 tokens per sequence (the mean of the script's random sequence length).
        let per_token = 2.0 * 4.0 * 1500.0 * 3000.0 + 1500.0 * 33278.0;
        assert_within("lstm", macs("lstm"), 68.0 * per_token, 1e-9);
    }

    #[test]
    fn the_head_of_gpt2_is_its_tied_language_model_head() {
        let model = ModelProfile::load("gpt2").unwrap();
        let head = head_macs_per_sample(&model).unwrap() as f64;
        assert_within("gpt2 head", head, 1024.0 * 768.0 * 50257.0, 1e-9);
    }

    fn with_rate(fraction: f64, reason: Option<&str>) -> Verdict {
        let mut model = ModelProfile::load("resnet50").unwrap();
        let device = DeviceProfile::load(&model.device).unwrap();
        let flops = training_flops_per_iteration(&model).unwrap();
        // Spread the time that gives `fraction` of the peak over the tensors' forward and backward.
        let total_us = flops / (fraction * device.peak_fp32_tflops * 1e12) * 1e6;
        let share = total_us / (2 * model.tensors.len()) as f64;
        for t in &mut model.tensors {
            t.backward_us = share;
            t.forward_us = share;
        }
        model.arithmetic.as_mut().unwrap().above_peak_reason = reason.map(str::to_string);
        let check = check(&model, &device).unwrap();
        assert!(
            (check.fraction_of_peak - fraction).abs() < 1e-3,
            "{check:?}"
        );
        check.verdict
    }

    #[test]
    fn verdicts_follow_the_fraction_of_peak_and_the_reason() {
        assert_eq!(with_rate(0.5, None), Verdict::Plausible);
        assert_eq!(with_rate(0.8, None), Verdict::Suspicious);
        assert_eq!(with_rate(1.2, None), Verdict::Impossible);
        assert_eq!(
            with_rate(1.2, Some("Winograd convolutions")),
            Verdict::AbovePeakExplained
        );
    }

    #[test]
    fn profiles_without_counts_are_not_checked_and_zero_time_is_impossible() {
        let mut model = ModelProfile::load("resnet50").unwrap();
        let device = DeviceProfile::load(&model.device).unwrap();
        for t in &mut model.tensors {
            t.backward_us = 0.0;
            t.forward_us = 0.0;
        }
        assert_eq!(check(&model, &device).unwrap().verdict, Verdict::Impossible);
        model.arithmetic = None;
        assert_eq!(check(&model, &device), None);
        assert_eq!(forward_macs_per_sample(&model), None);
    }
}
