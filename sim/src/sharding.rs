//! Sharded data parallelism in a plan: which ZeRO stage, how far parameters are gathered ahead,
//! the precision they travel in, and where they are split (each node, hpZ's second shards).
//!
//! A sharded plan's groups are its units (FSDP's `fully_shard` modules, ZeRO's buckets): each
//! group's gradients are reduce-scattered (FSDP; inside each node then across nodes for HSDP)
//! or allreduced whole (DeepSpeed's ZeRO-1 and 2) so that every rank keeps the sum of its
//! shard (`Plan::validate` checks the schemes), the optimizer updates only that shard, and the
//! parameters are gathered
//! back: after the step for ZeRO stages 1 and 2 (DeepSpeed's `all_gather` of the updated
//! partitions), before each unit's forward and again before its backward for stage 3 (FSDP),
//! which frees them in between. `lower` turns this into the schedule's gather steps.

use crate::compress::Compressor;
use crate::inputs::model::ModelProfile;
use serde::{Deserialize, Serialize};

/// Most units a gather may run ahead of the one computing.
pub const MAX_PREFETCH: u32 = 64;

/// What each rank keeps only its shard of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// ZeRO-1: optimizer states.
    Zero1,
    /// ZeRO-2: optimizer states and gradients.
    Zero2,
    /// ZeRO-3 (FSDP's `FULL_SHARD`, FSDP2's `fully_shard`): optimizer states, gradients and
    /// parameters.
    Zero3,
}

impl Stage {
    /// As plans spell it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Zero1 => "zero1",
            Stage::Zero2 => "zero2",
            Stage::Zero3 => "zero3",
        }
    }

    /// Whether gradients live only as shards between their reduction and the step.
    pub fn shards_gradients(self) -> bool {
        self >= Stage::Zero2
    }

    /// Whether parameters live only as shards outside a unit's forward and backward.
    pub fn shards_parameters(self) -> bool {
        self == Stage::Zero3
    }
}

/// The precision parameters are gathered in (FSDP's `MixedPrecisionPolicy.param_dtype`;
/// DeepSpeed's `zero_quantized_weights`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamDtype {
    /// As they are stored: 4 bytes per element.
    #[default]
    Fp32,
    /// Cast to bfloat16 as they are copied into the gather buffer: 2 bytes.
    Bf16,
    /// ZeRO++'s quantized weights (qwZ, Wang et al. 2023, arXiv:2306.10209 §3.1): each rank's
    /// shard quantized to int8 with a scale per block before the gather and dequantized after
    /// it, ZeRO-3 only. DeepSpeed (deepspeed/runtime/zero/partition_parameters.py,
    /// `CUDAQuantizer`) sizes its groups near `target_group_size` = 8000 elements (between
    /// 8000 and 16000 when the shard's size allows) and gathers the scales in a second
    /// all-gather; priced and executed as `int8:8000`, codes and scales in one payload.
    Int8,
}

/// Elements per scale of ZeRO++'s quantized gathers: DeepSpeed's `target_group_size`.
const QWZ_BLOCK: u32 = 8000;

impl ParamDtype {
    /// The codec a shard of this precision is written with, and its wire format
    /// (`exec/WIRE_FORMAT.md`).
    pub fn codec(self) -> Compressor {
        match self {
            ParamDtype::Fp32 => Compressor::None,
            ParamDtype::Bf16 => Compressor::Bf16,
            ParamDtype::Int8 => Compressor::Int8 { block: QWZ_BLOCK },
        }
    }

    /// The quantizer a gather runs before and after its collective, priced on the gather (a
    /// cast is the framework's copy into the gather buffer, which runs beside the compute:
    /// see the framework files); `None` for a cast.
    pub fn quantizer(self) -> Option<Compressor> {
        match self {
            ParamDtype::Int8 => Some(self.codec()),
            ParamDtype::Fp32 | ParamDtype::Bf16 => None,
        }
    }

    /// Exact bytes of a shard of `numel` elements on the wire; `None` when they overflow.
    pub fn wire_bytes(self, numel: u64) -> Option<u64> {
        // The codec's format, in checked arithmetic.
        match self {
            ParamDtype::Fp32 => numel.checked_mul(4),
            ParamDtype::Bf16 => numel.checked_mul(2),
            ParamDtype::Int8 => numel
                .div_ceil(u64::from(QWZ_BLOCK))
                .checked_mul(4)?
                .checked_add(numel),
        }
    }

    /// Bytes per element of a gathered unit as forward and backward use it: int8 is
    /// dequantized into the fp32 the model trains in.
    pub fn gathered_element_bytes(self) -> u64 {
        match self {
            ParamDtype::Fp32 | ParamDtype::Int8 => 4,
            ParamDtype::Bf16 => 2,
        }
    }

    /// As plans spell it.
    pub fn name(self) -> &'static str {
        match self {
            ParamDtype::Fp32 => "fp32",
            ParamDtype::Bf16 => "bf16",
            ParamDtype::Int8 => "int8",
        }
    }
}

/// How a plan shards the model's state over the ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sharding {
    /// What each rank keeps only its shard of.
    pub stage: Stage,
    /// Units whose gather may run ahead of the unit computing: 0 gathers each unit only once
    /// the one before it has finished, 1 overlaps it with that unit (FSDP's default backward
    /// prefetch and its limit of two all-gathers in flight).
    pub prefetch: u32,
    /// Stage 3: free each unit's gathered parameters after its forward and gather them again
    /// before its backward (FSDP's `reshard_after_forward`, true by default).
    pub reshard_after_forward: bool,
    /// Stage 3: the units (plan group indices) that stay gathered from their forward to their
    /// backward whatever `reshard_after_forward` says (FSDP2 keeps the root module's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resident: Vec<usize>,
    /// The precision parameters are gathered in.
    #[serde(default, skip_serializing_if = "is_default")]
    pub param_dtype: ParamDtype,
    /// Shard over the ranks of each node and replicate across nodes (hybrid sharding, FSDP's
    /// HSDP): units are gathered inside the node and reduced by `hybrid-reduce-scatter`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub within_node: bool,
    /// Stage 3: ZeRO++'s hierarchical partitioning (hpZ, DeepSpeed's `zero_hpz_partition_size`
    /// at the ranks of a node): when a unit is freed after its forward, each rank keeps a
    /// second shard of it, split over its node's ranks, and the unit is gathered again for
    /// backward from those, inside the node (Wang et al. 2023, arXiv:2306.10209 §3.2).
    #[serde(default, skip_serializing_if = "is_default")]
    pub secondary_within_node: bool,
    /// Stage 3: torchao's float8 all-gather (`Float8LinearConfig(enable_fsdp_float8_all_gather
    /// =True)` under FSDP2): every float8 linear's weight ([`Tensor::is_float8_linear_weight`])
    /// is cast to float8 e4m3 before its gather with one scale per weight, 448 / the weight's
    /// largest magnitude, which one all-reduce of every weight's shard maxima agrees on after
    /// each step (`precompute_float8_dynamic_scale_for_fsdp`); no scale travels with a gather,
    /// and the gathered weight stays float8 for the float8 matrix products. The unit's other
    /// tensors travel in `param_dtype`.
    ///
    /// [`Tensor::is_float8_linear_weight`]: crate::inputs::model::Tensor::is_float8_linear_weight
    #[serde(default, skip_serializing_if = "is_default")]
    pub float8_all_gather: bool,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl Sharding {
    /// The ranks a unit is sharded over: each node's (`within_node`) or all of them.
    pub fn shard_ranks(&self, ranks: u32, ranks_per_node: u32) -> u32 {
        split_ranks(self.within_node, ranks, ranks_per_node)
    }

    /// Whether group `g` is gathered again before its backward.
    pub fn regathers(&self, g: usize) -> bool {
        self.stage.shards_parameters() && self.reshard_after_forward && !self.resident.contains(&g)
    }
}

/// The ranks a unit is split over, of `ranks` in nodes of `ranks_per_node`: each node's when it
/// is sharded `within_node` (hybrid sharding), else all of them.
pub fn split_ranks(within_node: bool, ranks: u32, ranks_per_node: u32) -> u32 {
    match within_node {
        true => ranks_per_node,
        false => ranks,
    }
}

/// Elements of one rank's shard of `numel` elements over `ranks` (the last shards padded, as
/// FSDP and ZeRO pad the flat parameter to a multiple of the ranks).
pub fn shard_numel(numel: u64, ranks: u32) -> u64 {
    numel.div_ceil(u64::from(ranks.max(1)))
}

/// How a unit of `numel` elements, `float8` of them float8 weights, is cut into one rank's shard
/// of `ranks`: the float8 weights (one after another) and the rest are each split as one flat
/// parameter, padded at its end, each shard the float8 part, then the rest in its precision.
/// FSDP2 splits and pads every parameter on its first dimension instead; the bytes differ by
/// that padding only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardCut {
    /// Elements of the shard's float8 part: one byte each.
    pub float8: u64,
    /// Elements of the rest.
    pub rest: u64,
}

impl ShardCut {
    /// The cut of one rank's shard of `numel` elements, `float8` of them float8 weights.
    pub fn of(numel: u64, float8: u64, ranks: u32) -> ShardCut {
        ShardCut {
            float8: shard_numel(float8, ranks),
            rest: shard_numel(numel.saturating_sub(float8), ranks),
        }
    }

    /// Exact bytes of the shard on the wire, the rest in `dtype`; `None` when they overflow.
    pub fn wire_bytes(self, dtype: ParamDtype) -> Option<u64> {
        dtype.wire_bytes(self.rest)?.checked_add(self.float8)
    }
}

/// FSDP's default units for `model`: one per repeated block (tensors whose names share the
/// prefix up to their first numeric component, `transformer.h.12.`) and the rest of the model
/// (embeddings, final norm, head) as the root unit, in the order their gradients are complete
/// in backward (the order their reduce-scatters are ready; the root, which holds both the
/// last layers and the embeddings, comes last). The root is returned with its index, to stay
/// gathered as FSDP2 keeps it.
pub fn block_units(model: &ModelProfile) -> (Vec<Vec<usize>>, Option<usize>) {
    let mut units: Vec<(Option<String>, Vec<usize>)> = Vec::new();
    for (t, tensor) in model.tensors.iter().enumerate() {
        let block = block_of(&tensor.name);
        match units.iter_mut().find(|(name, _)| *name == block) {
            Some((_, tensors)) => tensors.push(t),
            None => units.push((block, vec![t])),
        }
    }
    units.sort_by_key(|(_, tensors)| tensors.iter().max().copied());
    let root = units.iter().position(|(name, _)| name.is_none());
    (units.into_iter().map(|(_, t)| t).collect(), root)
}

/// The block a tensor belongs to: its name up to and including its first all-digit component
/// and the dot after it (`transformer.h.12.`).
pub fn block_of(name: &str) -> Option<String> {
    let mut end = 0;
    for part in name.split('.') {
        end += part.len() + 1;
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return Some(name[..end.min(name.len())].to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Scheme;

    #[test]
    fn gpt2_xl_has_one_unit_per_block_and_a_root() {
        let model = ModelProfile::load("gpt2-xl").unwrap();
        let (units, root) = block_units(&model);
        assert_eq!(units.len(), 48 + 1);
        let root = root.expect("embeddings and the final norm");
        let names: Vec<&str> = units[root]
            .iter()
            .map(|&t| model.tensors[t].name.as_str())
            .collect();
        assert!(names.contains(&"transformer.wte.weight"), "{names:?}");
        assert!(names.iter().all(|n| !n.contains(".h.")), "{names:?}");
        let every: usize = units.iter().map(Vec::len).sum();
        assert_eq!(every, model.num_tensors());
        // Each block's 12 tensors (2 norms, attention and MLP weights and biases).
        assert!(units
            .iter()
            .enumerate()
            .all(|(u, t)| u == root || t.len() == 12));
    }

    #[test]
    fn a_sharding_that_does_not_match_its_groups_is_refused_by_field() {
        use crate::strategy::per_tensor_plan;
        let model = ModelProfile::load("resnet50").unwrap();
        let mut plan = per_tensor_plan(&model);
        let refused = |plan: &crate::plan::Plan, field: &str| {
            let err = plan.validate("p", &model).unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        };
        plan.groups[2].scheme = Scheme::ReduceScatter;
        refused(&plan, "groups[2].scheme");
        plan.set_scheme(Scheme::ReduceScatter);
        plan.sharding = Some(Sharding {
            stage: Stage::Zero3,
            prefetch: 1,
            reshard_after_forward: true,
            resident: vec![0],
            param_dtype: ParamDtype::Bf16,
            within_node: false,
            secondary_within_node: false,
            float8_all_gather: false,
        });
        plan.validate("p", &model).unwrap();
        // Hybrid sharding reduces by its own scheme, and only it does.
        let mut hybrid = plan.clone();
        hybrid.sharding.as_mut().unwrap().within_node = true;
        refused(&hybrid, "groups[0].scheme");
        hybrid.set_scheme(Scheme::HybridReduceScatter);
        hybrid.validate("p", &model).unwrap();
        hybrid.sharding = None;
        refused(&hybrid, "groups[0].scheme");
        // A unit may be allreduced whole (DeepSpeed's ZeRO-1 and 2), not sent to servers.
        let mut mixed = plan.clone();
        mixed.groups[5].scheme = Scheme::Allreduce;
        mixed.validate("p", &model).unwrap();
        mixed.groups[5].scheme = Scheme::Ps;
        refused(&mixed, "groups[5].scheme");
        // Payloads that do not sum go by an all-to-all, each rank's chunk a codec call of its
        // own: a fixed-length codec, compressed by group, in a sharded plan.
        let mut alltoall = plan.clone();
        alltoall.set_scheme(Scheme::AlltoallReduceScatter);
        alltoall.groups[1].compressor = "int8:64".parse().unwrap();
        refused(&alltoall, "groups[0].scheme");
        for group in &mut alltoall.groups {
            group.compressor = "topk:0.1".parse().unwrap();
        }
        alltoall.validate("p", &model).unwrap();
        let mut tensorwise = alltoall.clone();
        tensorwise.codec_calls = crate::plan::CodecCalls::Tensor;
        refused(&tensorwise, "codec_calls");
        alltoall.groups[4].compressor = "threshold:0.5".parse().unwrap();
        refused(&alltoall, "groups[4].scheme");
        alltoall.groups[4].compressor = "topk:0.1".parse().unwrap();
        alltoall.sharding = None;
        refused(&alltoall, "groups[0].scheme");
        // hpZ: a second shard inside the node, for a plan that regathers over every rank.
        let mut hpz = plan.clone();
        hpz.sharding.as_mut().unwrap().secondary_within_node = true;
        hpz.validate("p", &model).unwrap();
        hpz.sharding.as_mut().unwrap().reshard_after_forward = false;
        refused(&hpz, "sharding.secondary_within_node");
        let mut far = plan.clone();
        far.sharding.as_mut().unwrap().prefetch = MAX_PREFETCH + 1;
        refused(&far, "sharding.prefetch");
        let mut missing = plan.clone();
        missing.sharding.as_mut().unwrap().resident = vec![plan.groups.len()];
        refused(&missing, "sharding.resident");
        let mut zero2 = plan.clone();
        zero2.sharding.as_mut().unwrap().stage = Stage::Zero2;
        refused(&zero2, "sharding.reshard_after_forward");
        let mut quantized = plan.clone();
        quantized.sharding.as_mut().unwrap().param_dtype = ParamDtype::Int8;
        quantized.validate("p", &model).unwrap();
        let sharding = quantized.sharding.as_mut().unwrap();
        (sharding.stage, sharding.reshard_after_forward) = (Stage::Zero2, false);
        sharding.resident.clear();
        refused(&quantized, "sharding.param_dtype");
        let mut split = plan.clone();
        split.groups[0].partitions = 2;
        refused(&split, "groups[0].partitions");
    }

    #[test]
    fn a_shards_wire_bytes_are_its_codecs() {
        for dtype in [ParamDtype::Fp32, ParamDtype::Bf16, ParamDtype::Int8] {
            for numel in [1, 7999, 8000, 8001, 1 << 30] {
                let bytes = dtype.wire_bytes(numel).unwrap();
                assert_eq!(bytes, dtype.codec().wire_bytes(numel), "{dtype:?} {numel}");
            }
            assert_eq!(dtype.wire_bytes(u64::MAX), None, "{dtype:?}");
        }
        // Codes and a scale per 8000 elements: 1.0005 bytes an element.
        assert_eq!(ParamDtype::Int8.wire_bytes(16_000), Some(16_008));
    }

    #[test]
    fn shards_round_up() {
        assert_eq!(shard_numel(10, 4), 3);
        assert_eq!(shard_numel(8, 4), 2);
        assert_eq!(shard_numel(8, 0), 8);
        assert_eq!(
            block_of("transformer.h.12.attn.c_attn.weight").as_deref(),
            Some("transformer.h.12.")
        );
        assert_eq!(block_of("transformer.wte.weight"), None);
    }
}
