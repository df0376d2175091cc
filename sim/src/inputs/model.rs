//! Model profiles: parameter tensors in gradient-ready order with measured (or estimated) timings.

use crate::base::data::{self, DataKind};
use crate::base::error::{Result, SimError};
use crate::base::limits;
use crate::base::time::SimTime;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// Bound on a tensor's `uses_per_sample` (a 2^20 × 2^20 output or 2^40 tokens), so that every
/// multiply-add count stays exact in integers.
pub const MAX_USES_PER_SAMPLE: u64 = 1 << 40;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Element type of a gradient tensor as the framework holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE half float.
    F16,
    /// bfloat16: 8 exponent bits, 7 mantissa bits.
    Bf16,
}

impl DType {
    /// Size of one element, in bytes.
    pub fn bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }
}

/// Whether a number was measured or estimated, and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// Whether it was measured, estimated or calibrated.
    pub status: Status,
    /// How it was obtained: the source, tool or formula, in prose.
    pub method: String,
}

/// How a number in a data file was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Measured on real hardware.
    Measured,
    /// Estimated rather than measured (datasheets, scaling, published figures).
    Estimated,
    /// Fitted so that predictions match measured results.
    Calibrated,
}

/// How each kind of timing in a model profile was obtained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimingProvenance {
    /// How the tensors' `backward_us` were obtained.
    pub backward: Provenance,
    /// How the tensors' `forward_us` were obtained.
    pub forward: Provenance,
    /// How `optimizer_us` was obtained.
    pub optimizer: Provenance,
    /// How the first tensor's `backward_us`, the time from the start of backward to the first
    /// ready gradient, was obtained: a gradient-ready trace cannot see it, so it may be estimated
    /// from the FLOPs of the layers whose backward runs first (a language-model head: tens of ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_gradient: Option<Provenance>,
    /// Where `batch_size_per_gpu`, the batch the timings were measured at, comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<Provenance>,
}

/// The CPU threads the framework computed with while a profile's timings were taken: CPU timings
/// scale with them, so a profile recorded with 2 threads describes a 2-thread run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Threads {
    /// Threads one operator may use (PyTorch's `torch.get_num_threads()`).
    pub intra_op: u32,
    /// Threads that run independent operators at once (`torch.get_num_interop_threads()`).
    pub inter_op: u32,
    /// How the counts were obtained.
    pub provenance: Provenance,
}

/// How much one rank's compute per iteration differs from the mean of the ranks' same iteration,
/// measured with `ranks` ranks computing at once, started together (CPU ranks time-sharing a
/// host's cores: which rank the scheduler holds back changes every iteration).
/// Ranks meet at every collective, so the slowest rank of an iteration sets its pace; a
/// symmetric simulation of the mean rank cannot see that.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankSkew {
    /// Coefficient of variation of a rank's iteration compute around the iteration's mean.
    pub cv: f64,
    /// Ranks that computed at once while it was measured.
    pub ranks: u32,
    /// How the skew was obtained.
    pub provenance: Provenance,
}

/// Number format the timed kernels computed in; it picks the device peak a profile's implied
/// FLOP/s is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// FP32 on CUDA cores (`peak_fp32_tflops`).
    Fp32,
    /// FP32 tensors through TF32 tensor cores (`peak_tf32_tflops`; Ampere and later).
    Tf32,
    /// Mixed precision on FP16 tensor cores (`peak_fp16_tflops`).
    Fp16,
}

/// What a profile's compute amounts to, beyond its tensors' `uses_per_sample`: enough for the
/// `flops` module to count its training FLOPs and check its timings against the device's peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arithmetic {
    /// The number format the timed kernels computed in.
    pub precision: Precision,
    /// Forward multiply-adds per sample that involve no parameter tensor (attention's Q Kᵀ and
    /// P V); the tensors' `uses_per_sample` give the rest.
    pub parameter_free_macs_per_sample: u64,
    /// Tensors whose layers' backward runs before the first gradient is ready (a classifier, a
    /// tied language-model head): their FLOPs are what the time before the first gradient holds.
    pub head_tensors: Vec<String>,
    /// How the counts were derived (input size, tokens per sample, runs per iteration).
    pub method: String,
    /// Why the timings may legitimately imply more than the device's peak (e.g. Winograd
    /// convolutions do fewer multiplications than the direct count); absent when they do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above_peak_reason: Option<String>,
}

/// One parameter tensor, listed in the order its gradient becomes ready during backward.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tensor {
    /// The parameter's name in the framework (`layer1.0.conv1.weight`).
    pub name: String,
    /// Dimensions of the tensor.
    pub shape: Vec<u64>,
    /// Number of elements: the product of `shape`.
    pub numel: u64,
    /// Forward multiply-adds each element takes part in per sample: a conv weight's output height
    /// × width, a linear weight's tokens per sample; 0 (the default) for lookups, norms and biases.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub uses_per_sample: u64,
    /// Element type of the gradient.
    pub dtype: DType,
    /// Index in the framework's `named_parameters()`; forward runs in this order.
    pub registration_index: usize,
    /// Backward compute between the previous tensor's gradient becoming ready (or the start of
    /// backward, for the first tensor) and this one's.
    pub backward_us: f64,
    /// Forward compute of the layer that owns this tensor, split among the layer's tensors.
    pub forward_us: f64,
    /// The class of the module that registers the tensor, as the profiler found it (`Linear`
    /// for `torch.nn.Linear` and its subclasses, else the class's name: `Conv1D`, `Embedding`,
    /// `LayerNorm`); none when not recorded. It says which weights torchao's float8 training
    /// can convert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

impl Tensor {
    /// Whether the tensor is a weight that torchao's `convert_to_float8_training` turns into a
    /// float8 linear's and FSDP2 can then gather in float8: an `nn.Linear`'s 2-D weight whose
    /// dimensions are multiples of 16, which float8 matrix products require (torchao 0.18,
    /// `float8/float8_linear_utils.py`, `_auto_filter_for_tensorwise`: "All dims must be
    /// divisible by 16 due to float8 hardware requirements").
    pub fn is_float8_linear_weight(&self) -> bool {
        self.module.as_deref() == Some("Linear")
            && self.name.ends_with(".weight")
            && self.shape.len() == 2
            && self.shape.iter().all(|d| d % 16 == 0)
    }

    /// The gradient's size in bytes.
    pub fn bytes(&self) -> u64 {
        self.numel * self.dtype.bytes()
    }
}

/// Most bytes of optimizer state per parameter element (far above any optimizer's).
const MAX_OPTIMIZER_STATE_BYTES: f64 = 1024.0;
/// Most activation bytes a profile may state: 1 PiB, beyond any device's memory.
const MAX_ACTIVATION_BYTES: u64 = 1 << 50;

/// A model's per-tensor profile on one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelProfile {
    /// Version of the data file format; this build reads only its own.
    pub format_version: u32,
    /// Short name of the profile, as given on the command line (`resnet50`).
    pub name: String,
    /// The model and its input, in prose (`AlexNet (torchvision), ImageNet 224x224`).
    pub description: String,
    /// Where the sizes and timings come from.
    pub source: String,
    /// Device profile name the timings belong to (e.g. `v100-sxm2-32gb`).
    pub device: String,
    /// The framework and version the timings were taken with (`PyTorch 1.8`).
    pub framework: String,
    /// Samples per GPU per iteration the timings were measured at.
    pub batch_size_per_gpu: u32,
    /// What one sample is (images, sequences, ...), for throughput output.
    pub sample_unit: String,
    /// Host threads during the measurement; absent when the source does not say (every profile
    /// built from published traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<Threads>,
    /// The spread of compute between ranks computing at once; absent when not measured (the
    /// simulator then treats ranks as identical).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_skew: Option<RankSkew>,
    /// How the forward, backward and optimizer timings were obtained.
    pub timing: TimingProvenance,
    /// FLOP description for the FLOP/s check; profiles without it are not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arithmetic: Option<Arithmetic>,
    /// Optimizer step after all gradients are reduced.
    pub optimizer_us: f64,
    /// Bytes of optimizer state the profiled optimizer keeps per parameter element (Adam's two
    /// fp32 moments: 8; SGD's momentum: 4; plain SGD: 0); absent when the source does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_state_bytes_per_element: Option<f64>,
    /// Bytes autograd keeps from forward for backward at `batch_size_per_gpu`: the tensors
    /// saved for backward, each storage once, parameters excluded (`syncopate.torch`'s
    /// `model_profile` records it); absent when the source does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_bytes: Option<u64>,
    /// The parameter tensors, in the order their gradients become ready during backward.
    pub tensors: Vec<Tensor>,
}

impl ModelProfile {
    /// Loads a shipped model by name or a model profile from a path, and validates it.
    pub fn load(name_or_path: &str) -> Result<ModelProfile> {
        data::load(DataKind::Model, name_or_path, ModelProfile::validate)
    }

    /// Checks internal consistency: sizes match shapes, timings are finite and non-negative,
    /// names are unique and registration indices are a permutation.
    pub fn validate(&self, label: &str) -> Result<()> {
        data::check_format_version(label, self.format_version)?;
        if self.tensors.is_empty() {
            return Err(SimError::invalid(
                label,
                "tensors",
                "a model needs at least one tensor",
            ));
        }
        if !(1..=limits::MAX_BATCH).contains(&self.batch_size_per_gpu) {
            return Err(SimError::invalid(
                label,
                "batch_size_per_gpu",
                format!(
                    "{} is not from 1 to {}",
                    self.batch_size_per_gpu,
                    limits::MAX_BATCH
                ),
            ));
        }
        if let Some(threads) = &self.threads {
            validate_threads(label, threads)?;
        }
        if let Some(skew) = &self.rank_skew {
            validate_rank_skew(label, skew)?;
        }
        limits::check_duration_us(label, "optimizer_us", self.optimizer_us)?;
        if let Some(bytes) = self.optimizer_state_bytes_per_element {
            if !(0.0..=MAX_OPTIMIZER_STATE_BYTES).contains(&bytes) {
                return Err(SimError::invalid(
                    label,
                    "optimizer_state_bytes_per_element",
                    format!("is 0 to {MAX_OPTIMIZER_STATE_BYTES}, got {bytes}"),
                ));
            }
        }
        if let Some(bytes) = self.activation_bytes.filter(|&b| b > MAX_ACTIVATION_BYTES) {
            return Err(SimError::invalid(
                label,
                "activation_bytes",
                format!("is at most {MAX_ACTIVATION_BYTES} (1 PiB), got {bytes}"),
            ));
        }
        if self.tensors.len() > limits::MAX_TENSORS {
            return Err(SimError::invalid(
                label,
                "tensors",
                format!(
                    "{} tensors; at most {} are supported",
                    self.tensors.len(),
                    limits::MAX_TENSORS
                ),
            ));
        }
        let mut total = 0u64;
        let mut names = HashSet::new();
        let mut seen_registration = vec![false; self.tensors.len()];
        for (i, tensor) in self.tensors.iter().enumerate() {
            let at = |field: &str| format!("tensors[{i}] ({}).{field}", tensor.name);
            if !names.insert(tensor.name.as_str()) {
                return Err(SimError::invalid(
                    label,
                    at("name"),
                    "duplicate tensor name",
                ));
            }
            let product = tensor
                .shape
                .iter()
                .try_fold(1u64, |p, &d| p.checked_mul(d))
                .filter(|&p| p <= limits::MAX_TENSOR_ELEMENTS)
                .ok_or_else(|| {
                    SimError::invalid(
                        label,
                        at("shape"),
                        format!(
                            "{:?} has more than {} elements",
                            tensor.shape,
                            limits::MAX_TENSOR_ELEMENTS
                        ),
                    )
                })?;
            if tensor.numel == 0 || product != tensor.numel {
                return Err(SimError::invalid(
                    label,
                    at("numel"),
                    format!(
                        "numel {} does not match shape {:?}",
                        tensor.numel, tensor.shape
                    ),
                ));
            }
            if tensor.uses_per_sample > MAX_USES_PER_SAMPLE {
                return Err(SimError::invalid(
                    label,
                    at("uses_per_sample"),
                    format!(
                        "{} is more than {MAX_USES_PER_SAMPLE}",
                        tensor.uses_per_sample
                    ),
                ));
            }
            limits::check_duration_us(label, &at("backward_us"), tensor.backward_us)?;
            limits::check_duration_us(label, &at("forward_us"), tensor.forward_us)?;
            if tensor
                .module
                .as_deref()
                .is_some_and(|m| m.trim().is_empty())
            {
                return Err(SimError::invalid(
                    label,
                    at("module"),
                    "an empty class name: leave the field out when it is not recorded",
                ));
            }
            total += tensor.numel;
            if total > limits::MAX_MODEL_ELEMENTS {
                return Err(SimError::invalid(
                    label,
                    "tensors",
                    format!("more than {} elements in all", limits::MAX_MODEL_ELEMENTS),
                ));
            }
            match seen_registration.get_mut(tensor.registration_index) {
                Some(seen @ false) => *seen = true,
                _ => {
                    return Err(SimError::invalid(
                        label,
                        at("registration_index"),
                        format!(
                            "{} is repeated or out of range 0..{}",
                            tensor.registration_index,
                            self.tensors.len()
                        ),
                    ))
                }
            }
        }
        if let Some(arithmetic) = &self.arithmetic {
            validate_arithmetic(label, arithmetic, &names)?;
        }
        Ok(())
    }

    /// The profile at `batch` samples per GPU, checked as a loaded one (`label` names the
    /// batch's source): every forward and backward time scaled in proportion to the batch, as
    /// each kernel's work is, and the optimizer's kept, as it touches parameters, not samples.
    /// Kernels that do not fill the device at the profile's batch gain from a larger one, so a
    /// larger batch's times are an upper bound and a smaller one's a lower bound.
    pub fn at_batch(&self, batch: u32, label: &str) -> Result<ModelProfile> {
        // `validate` refuses a batch out of 1..=MAX_BATCH, naming the field.
        let k = f64::from(batch) / f64::from(self.batch_size_per_gpu);
        let mut scaled = self.clone();
        for tensor in &mut scaled.tensors {
            tensor.backward_us *= k;
            tensor.forward_us *= k;
        }
        scaled.batch_size_per_gpu = batch;
        scaled.validate(label)?;
        Ok(scaled)
    }

    /// Whether `other` profiles the same model at the same batch: the same tensors by name and
    /// size, in any order (autocast makes some gradients ready in another order), whatever the
    /// device or the timings.
    pub fn same_model(&self, other: &ModelProfile) -> bool {
        fn tensors(m: &ModelProfile) -> Vec<(&str, u64)> {
            let mut all: Vec<_> = m
                .tensors
                .iter()
                .map(|t| (t.name.as_str(), t.numel))
                .collect();
            all.sort_unstable();
            all
        }
        self.batch_size_per_gpu == other.batch_size_per_gpu && tensors(self) == tensors(other)
    }

    /// Number of parameter tensors.
    pub fn num_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// Elements over all parameter tensors.
    pub fn total_numel(&self) -> u64 {
        self.tensors.iter().map(|t| t.numel).sum()
    }

    /// Gradient bytes of one iteration, over all tensors.
    pub fn total_gradient_bytes(&self) -> u64 {
        self.tensors.iter().map(Tensor::bytes).sum()
    }

    /// The gradient bytes of the tensors at these indices.
    pub fn bytes_of(&self, tensors: &[usize]) -> u64 {
        tensors.iter().map(|&t| self.tensors[t].bytes()).sum()
    }

    /// Backward compute of one iteration: the sum of the tensors' `backward_us`.
    pub fn backward_time(&self) -> SimTime {
        self.tensors
            .iter()
            .map(|t| SimTime::from_us(t.backward_us))
            .sum()
    }

    /// Backward compute from its start to the first ready gradient: the first tensor's gap.
    pub fn first_gradient_time(&self) -> SimTime {
        self.tensors
            .first()
            .map_or(SimTime::ZERO, |t| SimTime::from_us(t.backward_us))
    }

    /// Forward compute of one iteration: the sum of the tensors' `forward_us`.
    pub fn forward_time(&self) -> SimTime {
        self.tensors
            .iter()
            .map(|t| SimTime::from_us(t.forward_us))
            .sum()
    }

    /// Tensor indices (into `tensors`) in forward (registration) order.
    pub fn forward_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.tensors.len()).collect();
        // Registration indices are distinct, so an unstable sort gives the one order.
        order.sort_unstable_by_key(|&i| self.tensors[i].registration_index);
        order
    }
}

/// Each thread count is at least one and at most a host's cores.
fn validate_threads(label: &str, threads: &Threads) -> Result<()> {
    for (field, count) in [
        ("threads.intra_op", threads.intra_op),
        ("threads.inter_op", threads.inter_op),
    ] {
        if count == 0 || count > limits::MAX_CORES {
            return Err(SimError::invalid(
                label,
                field,
                format!("{count} threads; a count is 1 to {}", limits::MAX_CORES),
            ));
        }
    }
    Ok(())
}

/// A skew is a finite coefficient of variation measured with at least two ranks.
fn validate_rank_skew(label: &str, skew: &RankSkew) -> Result<()> {
    if !limits::is_cv(skew.cv) {
        return Err(SimError::invalid(
            label,
            "rank_skew.cv",
            format!(
                "{}; a coefficient of variation is 0 to {}",
                limits::num(skew.cv),
                limits::MAX_JITTER_CV
            ),
        ));
    }
    if skew.ranks < 2 || u64::from(skew.ranks) > limits::MAX_RANKS {
        return Err(SimError::invalid(
            label,
            "rank_skew.ranks",
            format!(
                "{}; a skew between ranks is measured with 2 to {} ranks",
                skew.ranks,
                limits::MAX_RANKS
            ),
        ));
    }
    Ok(())
}

/// The FLOP description names tensors of this profile and says how it was derived.
fn validate_arithmetic(label: &str, arithmetic: &Arithmetic, names: &HashSet<&str>) -> Result<()> {
    for (i, name) in arithmetic.head_tensors.iter().enumerate() {
        if !names.contains(name.as_str()) {
            return Err(SimError::invalid(
                label,
                format!("arithmetic.head_tensors[{i}]"),
                format!("`{name}` is not a tensor of this profile"),
            ));
        }
    }
    if arithmetic.method.trim().is_empty() {
        return Err(SimError::invalid(
            label,
            "arithmetic.method",
            "say how the counts were derived",
        ));
    }
    if arithmetic
        .above_peak_reason
        .as_ref()
        .is_some_and(|reason| reason.trim().is_empty())
    {
        return Err(SimError::invalid(
            label,
            "arithmetic.above_peak_reason",
            "is empty: say why the timings may beat the peak, or leave the field out",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_in_another_order_is_the_same_model_another_batch_or_tensor_is_not() {
        let v100 = ModelProfile::load("resnet50").unwrap();
        let amp = ModelProfile::load("resnet50-h200-amp").unwrap();
        assert_ne!(v100.tensors[0].name, amp.tensors[0].name);
        assert!(amp.same_model(&v100) && v100.same_model(&amp));
        let mut batch = amp.clone();
        batch.batch_size_per_gpu *= 2;
        let mut fewer = amp.clone();
        fewer.tensors.pop();
        assert!(!batch.same_model(&v100) && !fewer.same_model(&v100));
        assert!(!ModelProfile::load("gpt2").unwrap().same_model(&v100));
    }

    #[test]
    fn another_batch_scales_compute_but_not_the_optimizer_and_refuses_nonsense() {
        let base = ModelProfile::load("resnet50").unwrap();
        let double = base.at_batch(64, "spec.json").unwrap();
        assert_eq!(double.batch_size_per_gpu, 64);
        assert_eq!(double.optimizer_us, base.optimizer_us);
        for (d, b) in double.tensors.iter().zip(&base.tensors) {
            assert_eq!(
                (d.backward_us, d.forward_us),
                (2.0 * b.backward_us, 2.0 * b.forward_us)
            );
            assert_eq!(d.numel, b.numel);
        }
        for nonsense in [0, limits::MAX_BATCH + 1, u32::MAX] {
            let err = base
                .at_batch(nonsense, "spec.json")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("spec.json") && err.contains("batch_size_per_gpu"),
                "{nonsense}: {err}"
            );
        }
    }

    /// A one-tensor profile with `extra` fields at its top level.
    fn profile_text(extra: &str) -> String {
        format!(
            r#"{{"format_version": 1, "name": "one", "description": "d", "source": "s",
            "device": "host-2core", "framework": "PyTorch", "batch_size_per_gpu": 8,
            "sample_unit": "samples", {extra}
            "timing": {{"backward": {{"status": "measured", "method": "m"}},
                        "forward": {{"status": "measured", "method": "m"}},
                        "optimizer": {{"status": "measured", "method": "m"}}}},
            "optimizer_us": 1.0,
            "tensors": [{{"name": "w", "shape": [2, 3], "numel": 6, "dtype": "f32",
                          "registration_index": 0, "backward_us": 2.0, "forward_us": 1.0}}]}}"#
        )
    }

    fn parse(extra: &str) -> Result<ModelProfile> {
        let model: ModelProfile = data::parse_json("one.json", &profile_text(extra))?;
        model.validate("one.json")?;
        Ok(model)
    }

    const THREADS: &str = r#""threads": {"intra_op": 2, "inter_op": 1,
        "provenance": {"status": "measured", "method": "torch.get_num_threads()"}},"#;

    #[test]
    fn a_profile_loads_with_and_without_its_thread_counts() {
        assert_eq!(parse("").unwrap().threads, None);
        let threads = parse(THREADS).unwrap().threads.unwrap();
        assert_eq!((threads.intra_op, threads.inter_op), (2, 1));
        assert_eq!(threads.provenance.status, Status::Measured);
    }

    const SKEW: &str = r#""rank_skew": {"cv": 0.15, "ranks": 4,
        "provenance": {"status": "measured", "method": "4 ranks at once"}},"#;

    #[test]
    fn a_rank_skew_loads_and_bad_ones_are_rejected_naming_the_field() {
        assert_eq!(parse("").unwrap().rank_skew, None);
        let skew = parse(SKEW).unwrap().rank_skew.unwrap();
        assert_eq!((skew.cv, skew.ranks), (0.15, 4));
        for (bad, field) in [
            (SKEW.replace("0.15", "-0.1"), "rank_skew.cv"),
            (SKEW.replace("0.15", "11"), "rank_skew.cv"),
            (
                SKEW.replace(r#""ranks": 4"#, r#""ranks": 1"#),
                "rank_skew.ranks",
            ),
        ] {
            let err = parse(&bad).unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    /// Only an nn.Linear's 2-D weight with dimensions of multiples of 16 is torchao's; an empty
    /// class name is refused by field.
    #[test]
    fn the_recorded_module_says_which_weights_are_float8s() {
        let mut tensor = parse("").unwrap().tensors[0].clone();
        assert_eq!(tensor.module, None);
        (tensor.name, tensor.shape) = ("fc.weight".into(), vec![32, 48]);
        assert!(!tensor.is_float8_linear_weight(), "not recorded");
        tensor.module = Some("Linear".into());
        assert!(tensor.is_float8_linear_weight());
        for (name, shape, module) in [
            ("fc.bias", vec![32, 48], "Linear"),
            ("fc.weight", vec![32, 40], "Linear"),
            ("fc.weight", vec![32 * 48], "Linear"),
            ("fc.weight", vec![32, 48], "Conv1D"),
        ] {
            let t = Tensor {
                name: name.into(),
                shape,
                module: Some(module.into()),
                ..tensor.clone()
            };
            assert!(
                !t.is_float8_linear_weight(),
                "{name} {:?} {module}",
                t.shape
            );
        }
        let text = profile_text("").replace(
            r#""forward_us": 1.0}"#,
            r#""forward_us": 1.0, "module": " "}"#,
        );
        let model: ModelProfile = data::parse_json("one.json", &text).unwrap();
        let err = model.validate("one.json").unwrap_err().to_string();
        assert!(err.contains("tensors[0] (w).module"), "{err}");
    }

    #[test]
    fn a_profile_without_thread_counts_serializes_without_the_field() {
        let text = serde_json::to_string(&parse("").unwrap()).unwrap();
        assert!(!text.contains("threads"), "{text}");
    }

    #[test]
    fn zero_or_too_many_threads_are_rejected_naming_the_field() {
        let zero = parse(&THREADS.replace(r#""inter_op": 1"#, r#""inter_op": 0"#)).unwrap_err();
        assert!(zero.to_string().contains("threads.inter_op"), "{zero}");
        let many = THREADS.replace(r#""intra_op": 2"#, r#""intra_op": 65537"#);
        let many = parse(&many).unwrap_err();
        assert!(many.to_string().contains("threads.intra_op"), "{many}");
    }

    #[test]
    fn thread_counts_without_their_provenance_are_rejected() {
        let bare = r#""threads": {"intra_op": 2, "inter_op": 1},"#;
        assert!(parse(bare).unwrap_err().to_string().contains("threads"));
    }
}
