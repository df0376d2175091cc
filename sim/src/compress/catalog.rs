//! The compressor catalog: every compressor's variant, spec string, table row and wire bytes.
//!
//! The table row holds aggregation, exec family, cost-fallback work and tune defaults.
//!
//! Adding a compressor means: a variant of [`Compressor`], one row of `CATALOG`, and the arms
//! of the per-variant `match`es below (`key`, `Display`, `wire_bytes`, `rounding_error` when it
//! is a precision cast). Everything else derives from the row: what `profile` measures (the
//! examples), what `tune --compressor auto` considers and with which memory, how `exec` builds
//! its codec (the family) and what the simulator charges on a device profile without its cost
//! curve (the rule is on the `CATALOG` table).

use super::memory::Memory;
use super::{powersgd_layout, Aggregation};
use crate::base::error::SimError;
use std::fmt;
use std::str::FromStr;

/// The two 8-bit float layouts of the OCP FP8 specification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 4 exponent bits, 3 mantissa bits, bias 7, max 448, no infinities.
    E4m3,
    /// 5 exponent bits, 2 mantissa bits, bias 15, max 57344.
    E5m2,
}

/// One gradient compressor with its parameters, written as a spec string such as `topk:0.01`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compressor {
    /// fp32 as is.
    None,
    /// IEEE half precision, round to nearest even, saturating.
    Fp16,
    /// bfloat16, round to nearest even, saturating.
    Bf16,
    /// 8-bit float in the given layout, with a per-tensor scale.
    Fp8(Fp8Format),
    /// Symmetric int8 with one f32 scale per block of `block` elements (ZeRO++'s block-based
    /// quantization of the weights it gathers).
    Int8 {
        /// Elements per scale, 1..=[`INT_MAX_BLOCK`].
        block: u32,
    },
    /// Symmetric int4, two codes a byte, with one f32 scale per block of `block` elements
    /// (ZeRO++'s quantized gradients).
    Int4 {
        /// Elements per scale, 1..=[`INT_MAX_BLOCK`].
        block: u32,
    },
    /// The k = max(1, ceil(ratio·n)) largest magnitudes, as indices and values.
    TopK {
        /// Fraction of the elements kept, in (0, 1].
        ratio: f64,
    },
    /// k random coordinates from a seed shared by all workers, scaled n/k (unbiased).
    RandomK {
        /// Fraction of the elements kept, in (0, 1].
        ratio: f64,
    },
    /// k random coordinates each worker draws for itself, sent unscaled with their indices in
    /// top-k's wire format (MergeComp's random-k: `torch.randperm` per worker).
    RandomKIndexed {
        /// Fraction of the elements kept, in (0, 1].
        ratio: f64,
    },
    /// Deep Gradient Compression: a threshold from a 1% sample, adapted to ±20% of k.
    Dgc {
        /// Target fraction of the elements kept, in (0, 1].
        ratio: f64,
    },
    /// Every element with |x| ≥ `value` (data-dependent size).
    Threshold {
        /// The magnitude threshold, finite and > 0.
        value: f64,
    },
    /// QSGD: stochastic, norm-scaled levels in [-levels, levels], unbiased.
    Qsgd {
        /// Levels on each side of zero, 1..=32767.
        levels: u32,
    },
    /// TernGrad: stochastic ternary scaled by max |x|, unbiased.
    TernGrad,
    /// Natural compression: stochastic rounding to powers of two, unbiased.
    Natural,
    /// One bit per element: the sign.
    SignSgd,
    /// The sign scaled by mean |x| (used with the `efsignsgd` memory).
    EfSignSgd,
    /// The sign of the momentum.
    Signum {
        /// Momentum coefficient, in [0, 1).
        momentum: f64,
    },
    /// 1-bit SGD: the sign with the means of the positive and of the negative elements.
    OneBit,
    /// HiPress/Strom two-bit quantization: +τ, −τ or 0 per element.
    Tbq {
        /// The threshold τ, finite and > 0.
        threshold: f64,
    },
    /// Aji & Heafield gradient dropping: the top `ratio` by a sampled threshold.
    GradDrop {
        /// Fraction of the elements kept, in (0, 1].
        ratio: f64,
    },
    /// PowerSGD: rank-`rank` P then Q allreduces, with a warm-started Q.
    PowerSgd {
        /// Rank of the approximation, at least 1.
        rank: u32,
    },
}

/// The `exec` codec family implementing a compressor: one file of `exec/src/compress/` (and of
/// `exec/src/runtime/cuda/codec/` for the GPU), whose constructor handles its members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Element-wise precision casts (`cast.rs`).
    Cast,
    /// Exact-count or exact-threshold sparsifiers (`sparse.rs`).
    Sparse,
    /// Sparsifiers with a threshold estimated from a sample (`sampled.rs`).
    Sampled,
    /// Stochastic and fixed quantizers (`quantize.rs`).
    Quantize,
    /// One bit per element, with or without scales (`sign.rs`).
    Sign,
    /// Low-rank approximation in two allreduce rounds (`powersgd.rs`).
    PowerSgd,
}

/// The element type in which summable payloads are added by an allreduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Element {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl Element {
    /// Bytes of one element of this type.
    pub fn bytes(self) -> usize {
        match self {
            Element::F32 => 4,
            Element::F16 | Element::Bf16 => 2,
        }
    }

    /// Relative error of one rounding to this type (round to nearest): 2^-(mantissa bits + 1).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Element::F32 => 2f64.powi(-24),
            Element::F16 => 2f64.powi(-11),
            Element::Bf16 => 2f64.powi(-8),
        }
    }
}

/// How an implementation lays element codes narrower than a byte (a sign bit, a ternary or
/// QSGD level) on the wire. The catalog's formats (`exec/WIRE_FORMAT.md`), and so `exec`'s
/// codecs, pack them; a plan that describes another framework's implementation may say that it
/// sends each code in whole bytes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Wire {
    /// Codes packed into consecutive bits.
    #[default]
    Packed,
    /// Each code in a byte of its own (a 9- to 16-bit code in two), as GRACE's TensorFlow
    /// compressors send `tf.bool`, `int8` and `uint8` tensors (sands-lab/grace,
    /// grace_dl/tensorflow/compressor/signsgd.py, onebit.py, terngrad.py, qsgd.py).
    Bytes,
}

impl Wire {
    /// The wire as plans spell it.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Packed => "packed",
            Wire::Bytes => "bytes",
        }
    }
}

/// Memory traffic and kernel launches of one encode or decode, per fp32 element of the tensor
/// and, for a sparsifier, per element it keeps: what the simulator charges on a device profile
/// that has no cost curve for the compressor (the rule is on the `CATALOG` table).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    /// Bytes read and written per fp32 element of the tensor.
    pub bytes_per_element: f64,
    /// Bytes read and written per element a sparsifier keeps.
    pub bytes_per_kept_element: f64,
    /// Kernel launches.
    pub kernels: u32,
}

const fn work(bytes_per_element: f64, kernels: u32) -> Work {
    sparse_work(bytes_per_element, 0.0, kernels)
}

const fn sparse_work(bytes_per_element: f64, bytes_per_kept_element: f64, kernels: u32) -> Work {
    Work {
        bytes_per_element,
        bytes_per_kept_element,
        kernels,
    }
}

/// One compressor of the catalog: everything about it besides its wire bytes.
#[derive(Clone, Copy, Debug)]
pub struct CatalogEntry {
    /// The name before `:`, and the key of its cost curves in device profiles.
    pub key: &'static str,
    /// The spec form of `syncopate list compressors` and of parse errors.
    pub form: &'static str,
    /// A one-line summary, as `syncopate list compressors` shows it.
    pub description: &'static str,
    /// The representative spec: what `syncopate profile` measures for `key` and what the
    /// catalog-wide tests run.
    pub example: &'static str,
    /// Every aggregation rule it supports, the default (cheapest natural) first.
    pub aggregations: &'static [Aggregation],
    /// The element type an allreduce sums its payloads in; `None` when not summable.
    pub summed_as: Option<Element>,
    /// Whether every worker's codec must draw from one seed (random-k's indices, PowerSGD's
    /// initial Q) for the payloads to be summable.
    pub shared_seed: bool,
    /// The `exec` family implementing it.
    pub family: Family,
    /// Whether `exec` has CUDA kernels for it; the CUDA backend refuses the others by name.
    pub gpu: bool,
    /// Encode and decode work for the cost fallback (see [`Work`]).
    pub encode: Work,
    /// Decode work for the cost fallback.
    pub decode: Work,
    /// The error-feedback memory `tune` uses with it unless `--memory` says otherwise: error
    /// feedback for the biased ones (their authors' setups), none for unbiased or near-lossless ones.
    pub default_memory: Memory,
    /// Its position in `tune --compressor auto`'s list (1 first: the compressing baselines use
    /// the first); `None`: auto does not consider it.
    pub auto: Option<u8>,
    /// Builds the compressor from its spec's parameter.
    parse: fn(&Parts) -> Result<Compressor, SimError>,
}

/// Summable payloads allreduce; a parameter server can always decode, sum and re-encode.
const SUMMABLE: &[Aggregation] = &[Aggregation::Allreduce, Aggregation::ParameterServer];
/// Payloads with per-worker scales or indices are gathered or decoded by a server.
const GATHERED: &[Aggregation] = &[Aggregation::Allgather, Aggregation::ParameterServer];
/// PowerSGD only works as two allreduces.
const ALLREDUCE_ONLY: &[Aggregation] = &[Aggregation::Allreduce];

const RESIDUAL: Memory = Memory::Residual;
const NO_MEMORY: Memory = Memory::None;

/// Every compressor, in the order of `syncopate list compressors`.
///
/// Cost fallback: encode and decode follow the device profile's `compression.<key>` curves; a
/// profile without them gets the row's [`Work`] priced by the memory-bandwidth estimate the
/// shipped GPU profiles' provenance describes:
///
/// `ns_per_element = bytes_per_element / (memory_bandwidth_gbytes_per_s × efficiency)` and
/// `floor_us = launch_us × kernels`, with efficiency 0.7 and 5 µs per kernel launch on a `gpu`
/// profile, and efficiency 0.5 and no floor on a `cpu` profile. The CPU numbers come from
/// `profiles/devices/host-2core.json`, measured by `syncopate profile --backend host`: its
/// least-squares floors are 0 for 28 of its 34 curves (a CPU kernel is a function call, not a
/// launch), and the median over those curves of (the row's bytes / the profile's memcpy
/// bandwidth) / the measured ns per element is 0.49 (range 0.12 to 17: quantizers and sign
/// unpacking are compute-bound, sparse decodes touch only the kept entries). Bytes follow the
/// provenance's convention: passes reading the fp32 tensor (4 B each), the payload written
/// (encode) or read (decode), and a decode writing a dense fp32 result (4 B); kernel counts are
/// those the shipped GPU profiles' floors assume. For the rows those profiles estimate from
/// bandwidth this gives back their curves; it is optimistic for codecs that are not
/// memory-bound (the calibrated sparsifier and sign curves are 2 to 33 times above it).
const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        key: "none",
        form: "none",
        description: "fp32 as is; allreduce",
        example: "none",
        aggregations: SUMMABLE,
        summed_as: Some(Element::F32),
        shared_seed: false,
        family: Family::Cast,
        gpu: true,
        // No kernels: the gradient is sent as it is.
        encode: work(0.0, 0),
        decode: work(0.0, 0),
        default_memory: NO_MEMORY,
        auto: None,
        parse: |p| p.bare(Compressor::None),
    },
    CatalogEntry {
        key: "fp16",
        form: "fp16",
        description: "IEEE half, round to nearest even, saturating; allreduce",
        example: "fp16",
        aggregations: SUMMABLE,
        summed_as: Some(Element::F16),
        shared_seed: false,
        family: Family::Cast,
        gpu: true,
        // Reads 4 B, writes 2 B; decode reads 2 B, writes 4 B.
        encode: work(6.0, 1),
        decode: work(6.0, 1),
        default_memory: NO_MEMORY,
        auto: Some(1),
        parse: |p| p.bare(Compressor::Fp16),
    },
    CatalogEntry {
        key: "bf16",
        form: "bf16",
        description: "bfloat16, round to nearest even, saturating; allreduce",
        example: "bf16",
        aggregations: SUMMABLE,
        summed_as: Some(Element::Bf16),
        shared_seed: false,
        family: Family::Cast,
        gpu: true,
        encode: work(6.0, 1),
        decode: work(6.0, 1),
        default_memory: NO_MEMORY,
        auto: None,
        parse: |p| p.bare(Compressor::Bf16),
    },
    CatalogEntry {
        key: "fp8",
        form: "fp8:e4m3|e5m2",
        description: "8-bit float with a per-tensor scale max|x|/max-representable; allgather",
        example: "fp8:e4m3",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Cast,
        gpu: true,
        // Max-abs pass reads 4 B, scale and cast read 4 B and write 1 B; decode 1 B in, 4 B out.
        encode: work(9.0, 2),
        decode: work(5.0, 1),
        default_memory: NO_MEMORY,
        auto: None,
        parse: |p| match p.arg()? {
            "e4m3" => Ok(Compressor::Fp8(Fp8Format::E4m3)),
            "e5m2" => Ok(Compressor::Fp8(Fp8Format::E5m2)),
            other => Err(p.bad(format!("unknown fp8 format `{other}`"))),
        },
    },
    CatalogEntry {
        key: "int8",
        form: "int8:BLOCK",
        description: "symmetric int8 with an f32 scale max|x|/127 per block of BLOCK elements (ZeRO++'s quantized weights); allgather",
        example: "int8:8000",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Cast,
        gpu: false,
        // As fp8: a max-abs pass reads 4 B, scale and round read 4 B and write 1 B; decode
        // reads 1 B and writes 4 B (the scales are 4 B a block, negligible).
        encode: work(9.0, 2),
        decode: work(5.0, 1),
        default_memory: NO_MEMORY,
        auto: None,
        parse: |p| {
            Ok(Compressor::Int8 {
                block: p.count(INT_MAX_BLOCK)?,
            })
        },
    },
    CatalogEntry {
        key: "int4",
        form: "int4:BLOCK",
        description: "symmetric int4 (two codes a byte) with an f32 scale max|x|/7 per block of BLOCK elements (ZeRO++'s quantized gradients); allgather",
        example: "int4:2048",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Cast,
        gpu: false,
        // As int8, writing half a byte an element; decode reads half a byte, writes 4 B.
        encode: work(8.5, 2),
        decode: work(4.5, 1),
        default_memory: NO_MEMORY,
        auto: None,
        parse: |p| {
            Ok(Compressor::Int4 {
                block: p.count(INT_MAX_BLOCK)?,
            })
        },
    },
    CatalogEntry {
        key: "topk",
        form: "topk:RATIO",
        description: "k = max(1, ceil(RATIO·n)) largest magnitudes, u32 indices + f32 values; allgather",
        example: "topk:0.01",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Sparse,
        gpu: true,
        // Finiteness, three radix-histogram, count and emit passes read 4 B each; 8 B written
        // per kept element; the decode reads them.
        encode: sparse_work(24.0, 8.0, 6),
        decode: sparse_work(4.0, 8.0, 1),
        default_memory: RESIDUAL,
        auto: Some(4),
        parse: |p| {
            Ok(Compressor::TopK {
                ratio: p.ratio()?,
            })
        },
    },
    CatalogEntry {
        key: "randomk",
        form: "randomk:RATIO",
        description: "k random coordinates from a seed shared by all workers, scaled n/k (unbiased); allreduce",
        example: "randomk:0.01",
        aggregations: SUMMABLE,
        summed_as: Some(Element::F32),
        shared_seed: true,
        family: Family::Sparse,
        gpu: true,
        // Finiteness pass reads 4 B; the gather reads and writes the kept values (8 B each),
        // which the decode reads back.
        encode: sparse_work(4.0, 8.0, 2),
        decode: sparse_work(4.0, 4.0, 1),
        default_memory: NO_MEMORY,
        auto: None,
        parse: |p| {
            Ok(Compressor::RandomK {
                ratio: p.ratio()?,
            })
        },
    },
    CatalogEntry {
        key: "randomk-indexed",
        form: "randomk-indexed:RATIO",
        description: "k = max(1, ceil(RATIO·n)) random coordinates each worker draws for itself, u32 indices + f32 values unscaled, as MergeComp's random-k sends them; allgather",
        example: "randomk-indexed:0.01",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Sparse,
        gpu: true,
        // Finiteness reads 4 B; the indices and the gathered values, 8 B per kept element, are
        // written and the decode reads them.
        encode: sparse_work(4.0, 8.0, 2),
        decode: sparse_work(4.0, 8.0, 1),
        default_memory: RESIDUAL,
        auto: None,
        parse: |p| {
            Ok(Compressor::RandomKIndexed {
                ratio: p.ratio()?,
            })
        },
    },
    CatalogEntry {
        key: "dgc",
        form: "dgc:RATIO",
        description: "Deep Gradient Compression: threshold from a 1% strided sample, adapted to ±20% of k; allgather",
        example: "dgc:0.01",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Sampled,
        gpu: true,
        // 1% sample, count and compaction passes over the tensor, 8 B written per kept element;
        // the decode reads them.
        encode: sparse_work(8.04, 8.0, 5),
        decode: sparse_work(4.0, 8.0, 1),
        default_memory: Memory::Dgc {
            momentum: 0.9,
            warmup_epochs: 5,
        },
        auto: Some(3),
        parse: |p| {
            Ok(Compressor::Dgc {
                ratio: p.ratio()?,
            })
        },
    },
    CatalogEntry {
        key: "threshold",
        form: "threshold:VALUE",
        description: "every element with |x| ≥ VALUE (data-dependent size); allgather",
        // About 1% of the standard normal data `profile` uses lies beyond 2.576, like the 1%
        // sparsifiers.
        example: "threshold:2.576",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Sparse,
        gpu: true,
        // Count pass reads 4 B, compaction reads 4 B, ~4 B budget for the scan and kept entries;
        // decode zero-fills and scatters.
        encode: work(12.0, 3),
        decode: work(8.0, 1),
        default_memory: RESIDUAL,
        auto: None,
        parse: |p| {
            Ok(Compressor::Threshold {
                value: p.positive()?,
            })
        },
    },
    CatalogEntry {
        key: "qsgd",
        form: "qsgd:LEVELS",
        description: "QSGD: stochastic, norm-scaled levels in [-LEVELS, LEVELS] (1..=32767), unbiased; allgather",
        example: "qsgd:256",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Quantize,
        gpu: true,
        // Norm pass reads 4 B, quantization reads 4 B and writes ~1 B (9.125 B in the shipped
        // profiles).
        encode: work(9.125, 2),
        decode: work(5.0, 1),
        default_memory: NO_MEMORY,
        auto: Some(7),
        parse: |p| {
            Ok(Compressor::Qsgd {
                levels: p.count(QSGD_MAX_LEVELS)?,
            })
        },
    },
    CatalogEntry {
        key: "terngrad",
        form: "terngrad",
        description: "TernGrad: stochastic ternary scaled by max|x|, unbiased; allgather",
        example: "terngrad",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Quantize,
        gpu: true,
        // Max-abs pass reads 4 B, ternarization reads 4 B and writes 2 bits.
        encode: work(8.25, 2),
        decode: work(4.25, 1),
        default_memory: NO_MEMORY,
        auto: None,
        parse: |p| p.bare(Compressor::TernGrad),
    },
    CatalogEntry {
        key: "natural",
        form: "natural",
        description: "natural compression: stochastic rounding to powers of two, unbiased; allgather",
        example: "natural",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Quantize,
        gpu: true,
        encode: work(5.0, 1),
        decode: work(5.0, 1),
        default_memory: NO_MEMORY,
        auto: None,
        parse: |p| p.bare(Compressor::Natural),
    },
    CatalogEntry {
        key: "signsgd",
        form: "signsgd",
        description: "1 bit per element (sign); allgather or server majority vote",
        example: "signsgd",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Sign,
        gpu: true,
        // Sign packing reads 4 B, writes 1 bit; decode reads 1 bit, writes 4 B.
        encode: work(4.125, 2),
        decode: work(4.125, 1),
        default_memory: RESIDUAL,
        auto: None,
        parse: |p| p.bare(Compressor::SignSgd),
    },
    CatalogEntry {
        key: "efsignsgd",
        form: "efsignsgd",
        description: "sign scaled by mean |x| (use with memory efsignsgd); allgather",
        example: "efsignsgd",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Sign,
        gpu: true,
        // Mean |x| pass reads 4 B, then sign packing.
        encode: work(8.125, 2),
        decode: work(4.125, 1),
        default_memory: Memory::EfSignSgd { lr: 0.1 },
        auto: Some(5),
        parse: |p| p.bare(Compressor::EfSignSgd),
    },
    CatalogEntry {
        key: "signum",
        form: "signum:MOMENTUM",
        description: "sign of the momentum, MOMENTUM in [0, 1); allgather or server majority vote",
        example: "signum:0.9",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Sign,
        gpu: true,
        // Reads the gradient and the momentum, writes the momentum (12 B), packs its signs.
        encode: work(12.125, 2),
        decode: work(4.125, 1),
        default_memory: RESIDUAL,
        auto: None,
        parse: |p| {
            Ok(Compressor::Signum {
                momentum: p.momentum()?,
            })
        },
    },
    CatalogEntry {
        key: "onebit",
        form: "onebit",
        description: "1-bit SGD: sign with the mean of the positive and of the negative elements; allgather",
        example: "onebit",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Sign,
        gpu: true,
        // One pass for both means, then sign packing.
        encode: work(8.125, 3),
        decode: work(4.125, 1),
        default_memory: RESIDUAL,
        auto: Some(6),
        parse: |p| p.bare(Compressor::OneBit),
    },
    CatalogEntry {
        key: "tbq",
        form: "tbq:THRESHOLD",
        description: "HiPress/Strom two-bit: +τ, −τ or 0 per element, τ = THRESHOLD; allgather",
        // As threshold's: about 1% of standard normal data is beyond ±2.576.
        example: "tbq:2.576",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Quantize,
        gpu: true,
        // Reads 4 B, writes 2 bits; decode reads 2 bits, writes 4 B.
        encode: work(4.25, 2),
        decode: work(4.25, 1),
        default_memory: RESIDUAL,
        auto: None,
        parse: |p| {
            Ok(Compressor::Tbq {
                threshold: p.positive()?,
            })
        },
    },
    CatalogEntry {
        key: "graddrop",
        form: "graddrop:RATIO",
        description: "Aji & Heafield gradient dropping: keep the top RATIO by a sampled threshold; allgather",
        example: "graddrop:0.01",
        aggregations: GATHERED,
        summed_as: None,
        shared_seed: false,
        family: Family::Sampled,
        gpu: true,
        // 0.1% sample, count and compaction passes over the tensor, 8 B written per kept
        // element; the decode reads them.
        encode: sparse_work(8.0, 8.0, 5),
        decode: sparse_work(4.0, 8.0, 1),
        default_memory: RESIDUAL,
        auto: None,
        parse: |p| {
            Ok(Compressor::GradDrop {
                ratio: p.ratio()?,
            })
        },
    },
    CatalogEntry {
        key: "powersgd",
        form: "powersgd:RANK",
        description: "PowerSGD rank-RANK P then Q allreduce, warm-started Q, 1-D tensors raw; allreduce ×2",
        example: "powersgd:4",
        aggregations: ALLREDUCE_ONLY,
        summed_as: Some(Element::F32),
        shared_seed: true,
        family: Family::PowerSgd,
        gpu: true,
        // Rank 4: error-feedback add (12 B), P = MQ (4 B), Q = MᵀP (4 B), ~12 kernels with the
        // Gram–Schmidt; decode M' = PQᵀ (4 B) and the residual (8 B).
        encode: work(20.0, 12),
        decode: work(12.0, 2),
        default_memory: RESIDUAL,
        auto: Some(2),
        parse: |p| {
            Ok(Compressor::PowerSgd {
                rank: p.count(u32::MAX)?,
            })
        },
    },
];

/// The compressors, one row each, in the order of `syncopate list compressors`.
pub fn catalog() -> &'static [CatalogEntry] {
    CATALOG
}

/// The keys of the compressors that keep a share of the elements
/// ([`Compressor::kept_fraction`]): the only ones whose cost curves may have a per-kept slope.
pub fn sparsifier_keys() -> Vec<&'static str> {
    CATALOG
        .iter()
        .filter(|e| {
            e.example
                .parse::<Compressor>()
                .is_ok_and(|c| c.kept_fraction().is_some())
        })
        .map(|e| e.key)
        .collect()
}

/// Why a cost per kept element cannot belong to `key`'s curves, if it cannot: the one reason
/// that device profiles and GRACE's implementations give.
pub fn why_no_kept_cost(key: &str) -> Option<String> {
    let sparsifiers = sparsifier_keys();
    (!sparsifiers.contains(&key)).then(|| {
        format!(
            "only a sparsifier keeps a share of the elements; `{key}` is not one (sparsifiers: {})",
            sparsifiers.join(", ")
        )
    })
}

/// The specs `tune --compressor auto` considers, in its order.
pub fn auto_specs() -> Vec<&'static str> {
    let mut auto: Vec<(u8, &str)> = CATALOG
        .iter()
        .filter_map(|e| e.auto.map(|rank| (rank, e.example)))
        .collect();
    auto.sort_unstable();
    auto.into_iter().map(|(_, spec)| spec).collect()
}

/// Largest block of `int8` and `int4`: 2^24 elements, beyond which a block's scale would have
/// to cover more than an f32 counts exactly.
const INT_MAX_BLOCK: u32 = 1 << 24;

/// Largest QSGD level count: keeps a signed level within 16 bits on the wire.
pub const QSGD_MAX_LEVELS: u32 = 32_767;

/// Header of sampled-threshold sparsifiers (dgc, graddrop, threshold): a u32 count of valid entries.
const COUNT_HEADER: u64 = 4;
/// One f32 scale (fp8, int8 and int4 per block, qsgd norm, terngrad max, efsignsgd mean, natural exponent).
const SCALE_HEADER: u64 = 4;

impl Compressor {
    /// The key of this compressor's catalog row and of its cost curves in a device profile.
    pub fn key(&self) -> &'static str {
        match self {
            Compressor::None => "none",
            Compressor::Fp16 => "fp16",
            Compressor::Bf16 => "bf16",
            Compressor::Fp8(_) => "fp8",
            Compressor::Int8 { .. } => "int8",
            Compressor::Int4 { .. } => "int4",
            Compressor::TopK { .. } => "topk",
            Compressor::RandomK { .. } => "randomk",
            Compressor::RandomKIndexed { .. } => "randomk-indexed",
            Compressor::Dgc { .. } => "dgc",
            Compressor::Threshold { .. } => "threshold",
            Compressor::Qsgd { .. } => "qsgd",
            Compressor::TernGrad => "terngrad",
            Compressor::Natural => "natural",
            Compressor::SignSgd => "signsgd",
            Compressor::EfSignSgd => "efsignsgd",
            Compressor::Signum { .. } => "signum",
            Compressor::OneBit => "onebit",
            Compressor::Tbq { .. } => "tbq",
            Compressor::GradDrop { .. } => "graddrop",
            Compressor::PowerSgd { .. } => "powersgd",
        }
    }

    /// The share of the elements a sparsifier keeps (its ratio); `None` for a compressor that
    /// encodes every element, or whose selected count depends on the data (`threshold`).
    pub fn kept_fraction(&self) -> Option<f64> {
        match *self {
            Compressor::TopK { ratio }
            | Compressor::RandomK { ratio }
            | Compressor::RandomKIndexed { ratio }
            | Compressor::Dgc { ratio }
            | Compressor::GradDrop { ratio } => Some(ratio),
            _ => None,
        }
    }

    /// Elements a sparsifier keeps of `numel`, as its payload carries them
    /// ([`sparse_count`]); 0 for every other compressor.
    pub fn kept_elements(&self, numel: u64) -> u64 {
        self.kept_fraction()
            .map_or(0, |ratio| sparse_count(numel, ratio))
    }

    /// The same sparsifier keeping `ratio` of the elements instead; `None` for a compressor
    /// without a kept fraction.
    pub fn with_kept_fraction(&self, ratio: f64) -> Option<Compressor> {
        match *self {
            Compressor::TopK { .. } => Some(Compressor::TopK { ratio }),
            Compressor::RandomK { .. } => Some(Compressor::RandomK { ratio }),
            Compressor::RandomKIndexed { .. } => Some(Compressor::RandomKIndexed { ratio }),
            Compressor::Dgc { .. } => Some(Compressor::Dgc { ratio }),
            Compressor::GradDrop { .. } => Some(Compressor::GradDrop { ratio }),
            _ => None,
        }
    }

    /// This compressor's catalog row.
    pub fn entry(&self) -> &'static CatalogEntry {
        let key = self.key();
        CATALOG
            .iter()
            .find(|e| e.key == key)
            .expect("every key() has a catalog row (catalog tests)")
    }

    /// The `exec` codec family implementing it.
    pub fn family(&self) -> Family {
        self.entry().family
    }

    /// The default (cheapest natural) aggregation rule: the first of `allowed_aggregations`.
    pub fn aggregation(&self) -> Aggregation {
        self.allowed_aggregations()[0]
    }

    /// Every aggregation rule this compressor supports, the default first.
    pub fn allowed_aggregations(&self) -> &'static [Aggregation] {
        self.entry().aggregations
    }

    /// The element type an allreduce sums its payloads in; `None` when not summable.
    pub fn summed_as(&self) -> Option<Element> {
        self.entry().summed_as
    }

    /// Whether all workers' codecs must share one seed for their payloads to be summable.
    pub fn shared_seed(&self) -> bool {
        self.entry().shared_seed
    }

    /// The memory `tune` uses with it unless told otherwise.
    pub fn default_memory(&self) -> Memory {
        self.entry().default_memory
    }

    /// Exact bytes of one worker's payload for a flat fp32 buffer of `numel` elements, in the
    /// catalog's packed format ([`Wire::Packed`]).
    ///
    /// `threshold` is the one data-dependent format (a count header plus one index and value per
    /// element above the threshold); for it this is the upper bound, every element selected.
    /// A flat buffer is 1-D, so `powersgd` sends it uncompressed, as PyTorch's hook does.
    pub fn wire_bytes(&self, numel: u64) -> u64 {
        self.wire_bytes_as(numel, Wire::Packed)
    }

    /// Whether a buffer can be compressed in a codec call per tensor, the calls' payloads one
    /// after another: a single-round codec whose payload of `numel` elements is exactly
    /// [`Compressor::wire_bytes`] long. Not PowerSGD (two rounds, already matrix by matrix)
    /// nor `threshold` (its length depends on the data; its bytes are an upper bound).
    pub fn splits_into_calls(&self) -> bool {
        self.why_one_call().is_none()
    }

    /// Why this compressor cannot be split into a codec call per tensor, if it cannot: the one
    /// reason that plans, schedules and the tuner give.
    pub fn why_one_call(&self) -> Option<String> {
        if self.allreduce_rounds() > 1 {
            Some(format!(
                "`{self}` already compresses each matrix of its group on its own"
            ))
        } else if !self.fixed_length() {
            Some(format!(
                "`{self}`'s payloads have data-dependent lengths, which cannot be laid one after another without a length of their own"
            ))
        } else {
            None
        }
    }

    /// Whether a payload's length follows from its element count alone (exactly
    /// [`Compressor::wire_bytes`]): all but `threshold`'s.
    pub fn fixed_length(&self) -> bool {
        !matches!(self, Compressor::Threshold { .. })
    }

    /// Why HiPress's CaSync-Ring cannot re-encode this compressor's running sums hop by hop, if
    /// it cannot: a hop decodes what another rank's codec encoded and encodes a sum of other
    /// ranks' gradients, so a payload must describe itself and an encode keep no state.
    pub fn why_no_ring_hops(&self) -> Option<String> {
        if self.shared_seed() {
            Some(format!(
                "`{self}`'s payloads are read with a seed the ranks draw in step, which hops that re-encode other ranks' sums break"
            ))
        } else if matches!(self, Compressor::Signum { .. }) {
            Some(format!(
                "`{self}` keeps a momentum of what it encodes, which at a hop is other ranks' sum"
            ))
        } else {
            None
        }
    }

    /// Bytes of one worker's payload of `numel` elements when the implementation lays its
    /// element codes out as `wire` says (the headers are the same either way).
    pub fn wire_bytes_as(&self, numel: u64, wire: Wire) -> u64 {
        let n = numel;
        let codes = |bits: u32| match wire {
            Wire::Packed => (n * u64::from(bits)).div_ceil(8),
            Wire::Bytes => n * u64::from(bits.div_ceil(8)),
        };
        match *self {
            Compressor::None | Compressor::PowerSgd { .. } => 4 * n,
            Compressor::Fp16 | Compressor::Bf16 => 2 * n,
            Compressor::Fp8(_) => SCALE_HEADER + n,
            Compressor::Int8 { block } => SCALE_HEADER * n.div_ceil(u64::from(block)) + n,
            Compressor::Int4 { block } => SCALE_HEADER * n.div_ceil(u64::from(block)) + codes(4),
            Compressor::TopK { ratio } | Compressor::RandomKIndexed { ratio } => {
                8 * sparse_count(n, ratio)
            }
            Compressor::RandomK { ratio } => 4 * sparse_count(n, ratio),
            Compressor::Dgc { ratio } | Compressor::GradDrop { ratio } => {
                COUNT_HEADER + 8 * sparse_count(n, ratio)
            }
            Compressor::Threshold { .. } => COUNT_HEADER + 8 * n,
            Compressor::Qsgd { levels } => SCALE_HEADER + codes(qsgd_bits(levels)),
            Compressor::TernGrad => SCALE_HEADER + codes(2),
            Compressor::Tbq { .. } => codes(2),
            Compressor::Natural => SCALE_HEADER + n,
            Compressor::SignSgd | Compressor::Signum { .. } => codes(1),
            Compressor::EfSignSgd => SCALE_HEADER + codes(1),
            Compressor::OneBit => 2 * SCALE_HEADER + codes(1),
        }
    }

    /// Whether `wire` changes this compressor's payload: its element codes are narrower than a
    /// byte, or between whole bytes (a 9- to 15-bit QSGD level).
    pub fn depends_on_wire(&self) -> bool {
        // Two elements tell every format apart: packed codes share bytes, byte codes do not.
        self.wire_bytes_as(2, Wire::Packed) != self.wire_bytes_as(2, Wire::Bytes)
    }

    /// Bytes one worker sends for a fused group of tensors (all rounds together). Only PowerSGD
    /// looks at the shapes: each tensor of two or more dimensions is a rows × cols matrix sent as
    /// P (rows × r) then Q (cols × r) when that saves at least half the bytes; others go raw.
    pub fn group_wire_bytes(&self, shapes: &[&[u64]]) -> u64 {
        match *self {
            Compressor::PowerSgd { rank } => powersgd_layout(shapes, rank)
                .iter()
                .map(|m| m.p_bytes() + m.q_bytes())
                .sum(),
            _ => self.wire_bytes(shapes.iter().map(|s| s.iter().product::<u64>()).sum()),
        }
    }

    /// Allreduce rounds per step: PowerSGD reduces P, orthogonalizes it, then reduces Q.
    pub fn allreduce_rounds(&self) -> u32 {
        match self {
            Compressor::PowerSgd { .. } => 2,
            _ => 1,
        }
    }

    /// Whether decode(encode(g)) == g bit for bit.
    pub fn is_exact(&self) -> bool {
        matches!(self, Compressor::None)
    }

    /// For the precision casts, the relative error u of decode(encode(x)) (|error| ≤ u·|x|);
    /// `None` for compressors that drop information by design.
    pub fn rounding_error(&self) -> Option<f64> {
        match self {
            Compressor::None => Some(Element::F32.unit_roundoff()),
            Compressor::Fp16 => Some(Element::F16.unit_roundoff()),
            Compressor::Bf16 => Some(Element::Bf16.unit_roundoff()),
            Compressor::Fp8(Fp8Format::E4m3) => Some(2f64.powi(-4)),
            Compressor::Fp8(Fp8Format::E5m2) => Some(2f64.powi(-3)),
            _ => None,
        }
    }
}

/// Entries a ratio-based sparsifier sends: `max(1, ceil(ratio·n))`, at most n (0 for n = 0).
pub fn sparse_count(numel: u64, ratio: f64) -> u64 {
    if numel == 0 {
        return 0;
    }
    let k = (ratio * numel as f64).ceil();
    // `as` saturates, and the ratio is validated to (0, 1], so this is within [1, numel].
    (k as u64).clamp(1, numel)
}

/// Bits per element of QSGD: a level in [-s, s] stored offset as 0..=2s.
pub fn qsgd_bits(levels: u32) -> u32 {
    u32::BITS - (2 * levels.clamp(1, QSGD_MAX_LEVELS)).leading_zeros()
}

/// A spec split at its first `:`, with the row's form for error messages.
struct Parts<'a> {
    spec: &'a str,
    name: &'a str,
    arg: Option<&'a str>,
    form: &'static str,
}

fn valid_forms() -> String {
    CATALOG
        .iter()
        .map(|e| e.form)
        .collect::<Vec<_>>()
        .join(", ")
}

fn bad(spec: &str, message: impl Into<String>) -> SimError {
    SimError::bad_value(
        "compressor",
        spec,
        format!("{}; valid forms: {}", message.into(), valid_forms()),
    )
}

impl Parts<'_> {
    fn bad(&self, message: impl Into<String>) -> SimError {
        bad(self.spec, message)
    }

    /// A compressor without a parameter.
    fn bare(&self, c: Compressor) -> Result<Compressor, SimError> {
        match self.arg {
            Some(_) => Err(self.bad(format!("`{}` takes no parameter", self.name))),
            None => Ok(c),
        }
    }

    fn arg(&self) -> Result<&str, SimError> {
        self.arg
            .ok_or_else(|| self.bad(format!("`{}` needs a parameter: {}", self.name, self.form)))
    }

    fn number(&self) -> Result<f64, SimError> {
        let text = self.arg()?;
        text.parse()
            .map_err(|_| self.bad(format!("`{text}` is not a number")))
    }

    /// A ratio in (0, 1].
    fn ratio(&self) -> Result<f64, SimError> {
        let r = self.number()?;
        if r > 0.0 && r <= 1.0 {
            Ok(r)
        } else {
            Err(self.bad(format!("a ratio is in (0, 1], got {}", self.arg()?)))
        }
    }

    /// A finite value > 0.
    fn positive(&self) -> Result<f64, SimError> {
        let v = self.number()?;
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(self.bad(format!("expected a finite value > 0, got {}", self.arg()?)))
        }
    }

    /// A momentum in [0, 1).
    fn momentum(&self) -> Result<f64, SimError> {
        let m = self.number()?;
        if (0.0..1.0).contains(&m) {
            Ok(m)
        } else {
            Err(self.bad(format!("a momentum is in [0, 1), got {}", self.arg()?)))
        }
    }

    /// An integer in 1..=max.
    fn count(&self, max: u32) -> Result<u32, SimError> {
        let text = self.arg()?;
        match text.parse::<u32>() {
            Ok(v) if (1..=max).contains(&v) => Ok(v),
            _ => Err(self.bad(format!("expected an integer in 1..={max}, got `{text}`"))),
        }
    }
}

impl FromStr for Compressor {
    type Err = SimError;

    fn from_str(spec: &str) -> Result<Self, SimError> {
        let (name, arg) = match spec.split_once(':') {
            Some((name, arg)) => (name, Some(arg)),
            None => (spec, None),
        };
        let entry = CATALOG
            .iter()
            .find(|e| e.key == name)
            .ok_or_else(|| bad(spec, format!("unknown compressor `{name}`")))?;
        (entry.parse)(&Parts {
            spec,
            name,
            arg,
            form: entry.form,
        })
    }
}

impl fmt::Display for Compressor {
    /// The canonical spec: `f64`'s Display is the shortest string that parses back exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.key();
        match self {
            Compressor::Fp8(Fp8Format::E4m3) => write!(f, "fp8:e4m3"),
            Compressor::Fp8(Fp8Format::E5m2) => write!(f, "fp8:e5m2"),
            Compressor::TopK { ratio }
            | Compressor::RandomK { ratio }
            | Compressor::RandomKIndexed { ratio }
            | Compressor::Dgc { ratio }
            | Compressor::GradDrop { ratio } => write!(f, "{key}:{ratio}"),
            Compressor::Threshold { value: v } | Compressor::Tbq { threshold: v } => {
                write!(f, "{key}:{v}")
            }
            Compressor::Signum { momentum } => write!(f, "{key}:{momentum}"),
            Compressor::Qsgd { levels: n }
            | Compressor::PowerSgd { rank: n }
            | Compressor::Int8 { block: n }
            | Compressor::Int4 { block: n } => {
                write!(f, "{key}:{n}")
            }
            _ => write!(f, "{key}"),
        }
    }
}

spec_string_serde!(Compressor);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn example(e: &CatalogEntry) -> Compressor {
        e.example.parse().unwrap()
    }

    #[test]
    fn every_row_is_its_examples_row() {
        let mut keys = BTreeSet::new();
        for e in catalog() {
            assert!(keys.insert(e.key), "{} twice", e.key);
            let c = example(e);
            assert_eq!(c.key(), e.key);
            assert_eq!(c.entry().key, e.key);
            assert!(e.form.starts_with(e.key), "{}", e.form);
            assert!(!e.description.is_empty());
        }
    }

    #[test]
    fn examples_and_other_specs_round_trip() {
        let examples = catalog().iter().map(|e| e.example);
        for spec in examples.chain(["fp8:e5m2", "randomk:0.5", "dgc:0.001", "threshold:0.25"]) {
            let c: Compressor = spec.parse().unwrap();
            assert_eq!(c.to_string(), spec);
            assert_eq!(c.to_string().parse::<Compressor>().unwrap(), c);
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{spec}\""));
            assert_eq!(serde_json::from_str::<Compressor>(&json).unwrap(), c);
        }
    }

    #[test]
    fn rows_are_consistent() {
        for e in catalog() {
            let summable = e.aggregations.contains(&Aggregation::Allreduce);
            assert_eq!(e.summed_as.is_some(), summable, "{}", e.key);
            assert!(!e.shared_seed || summable, "{}", e.key);
            let kept = example(e).kept_fraction();
            // A sparsifier, and only one, can be asked for another ratio.
            let other = example(e).with_kept_fraction(0.5);
            assert_eq!(other.map(|c| c.kept_fraction()), kept.map(|_| Some(0.5)));
            for w in [e.encode, e.decode] {
                assert!(w.bytes_per_element.is_finite() && w.bytes_per_element >= 0.0);
                // Only a sparsifier has work per kept element.
                assert_eq!(w.bytes_per_kept_element > 0.0, kept.is_some(), "{}", e.key);
            }
            // Precision casts are summable or carry a scale; the loss bound is theirs only.
            if example(e).rounding_error().is_some() {
                assert_eq!(e.family, Family::Cast, "{}", e.key);
            }
        }
    }

    #[test]
    fn auto_ranks_are_one_to_n_and_keep_tunes_order() {
        let mut ranks: Vec<u8> = catalog().iter().filter_map(|e| e.auto).collect();
        ranks.sort_unstable();
        assert_eq!(ranks, (1..=ranks.len() as u8).collect::<Vec<_>>());
        assert_eq!(
            auto_specs(),
            [
                "fp16",
                "powersgd:4",
                "dgc:0.01",
                "topk:0.01",
                "efsignsgd",
                "onebit",
                "qsgd:256"
            ]
        );
    }

    #[test]
    fn default_memories_are_the_authors() {
        let memory = |spec: &str| spec.parse::<Compressor>().unwrap().default_memory();
        assert_eq!(memory("fp16"), Memory::None);
        assert_eq!(memory("qsgd:4"), Memory::None);
        assert_eq!(memory("randomk:0.1"), Memory::None);
        assert_eq!(memory("efsignsgd"), Memory::EfSignSgd { lr: 0.1 });
        assert_eq!(
            memory("dgc:0.01"),
            Memory::Dgc {
                momentum: 0.9,
                warmup_epochs: 5
            }
        );
        assert_eq!(memory("topk:0.01"), Memory::Residual);
        assert_eq!(memory("powersgd:1"), Memory::Residual);
    }

    #[test]
    fn bad_specs_list_the_valid_forms() {
        for (spec, why) in [
            ("topk:0", "a ratio is in (0, 1], got 0"),
            ("topk:1.5", "a ratio is in (0, 1]"),
            ("topk:NaN", "a ratio is in (0, 1]"),
            ("topk", "`topk` needs a parameter: topk:RATIO"),
            ("topk:x", "`x` is not a number"),
            ("qsgd:0", "expected an integer in 1..=32767, got `0`"),
            ("powersgd:0", "expected an integer in 1..="),
            ("fp8:e3m4", "unknown fp8 format `e3m4`"),
            ("int8:0", "expected an integer in 1..=16777216, got `0`"),
            ("zip", "unknown compressor `zip`"),
            ("signum:1", "a momentum is in [0, 1), got 1"),
            ("threshold:-1", "expected a finite value > 0, got -1"),
            ("threshold:inf", "expected a finite value > 0"),
            ("fp16:2", "`fp16` takes no parameter"),
            ("", "unknown compressor ``"),
        ] {
            let message = spec.parse::<Compressor>().unwrap_err().to_string();
            assert!(
                message.contains(why) && message.contains("valid forms: none, fp16"),
                "{spec}: {message}"
            );
        }
        assert!(serde_json::from_str::<Compressor>("\"topk:2\"").is_err());
    }

    #[test]
    fn sparse_count_rounds_up_and_keeps_one() {
        assert_eq!(sparse_count(0, 0.01), 0);
        assert_eq!(sparse_count(1, 0.01), 1);
        assert_eq!(sparse_count(1000, 0.01), 10);
        assert_eq!(sparse_count(1001, 0.01), 11);
        assert_eq!(sparse_count(7, 1.0), 7);
    }

    #[test]
    fn qsgd_bits_hold_the_offset_level() {
        assert_eq!(qsgd_bits(1), 2);
        assert_eq!(qsgd_bits(127), 8);
        assert_eq!(qsgd_bits(128), 9);
        assert_eq!(qsgd_bits(256), 10);
    }

    #[test]
    fn wire_bytes_by_hand() {
        assert_eq!(Compressor::None.wire_bytes(1000), 4000);
        assert_eq!(Compressor::Fp16.wire_bytes(1000), 2000);
        assert_eq!(Compressor::Fp8(Fp8Format::E4m3).wire_bytes(1000), 1004);
        // A scale per block, the last one short.
        assert_eq!(
            Compressor::Int8 { block: 8000 }.wire_bytes(16_001),
            12 + 16_001
        );
        assert_eq!(Compressor::TopK { ratio: 0.01 }.wire_bytes(1000), 80);
        assert_eq!(Compressor::Dgc { ratio: 0.01 }.wire_bytes(1000), 84);
        assert_eq!(Compressor::SignSgd.wire_bytes(1001), 126);
        assert_eq!(Compressor::OneBit.wire_bytes(8), 9);
        assert_eq!(Compressor::TernGrad.wire_bytes(5), 6);
        assert_eq!(Compressor::Qsgd { levels: 256 }.wire_bytes(4), 9);
    }

    #[test]
    fn byte_codes_take_a_byte_each_and_keep_the_headers() {
        let n = 1001;
        assert_eq!(Compressor::SignSgd.wire_bytes_as(n, Wire::Bytes), 1001);
        assert_eq!(Compressor::EfSignSgd.wire_bytes_as(n, Wire::Bytes), 1005);
        assert_eq!(Compressor::OneBit.wire_bytes_as(n, Wire::Bytes), 1009);
        assert_eq!(Compressor::TernGrad.wire_bytes_as(n, Wire::Bytes), 1005);
        assert_eq!(
            Compressor::Tbq { threshold: 0.1 }.wire_bytes_as(n, Wire::Bytes),
            1001
        );
        // 8-bit QSGD and natural are whole bytes already; 9 bits take two.
        let q8 = Compressor::Qsgd { levels: 127 };
        assert_eq!(q8.wire_bytes_as(n, Wire::Bytes), q8.wire_bytes(n));
        assert!(!q8.depends_on_wire() && !Compressor::Natural.depends_on_wire());
        let q9 = Compressor::Qsgd { levels: 255 };
        assert_eq!(q9.wire_bytes_as(n, Wire::Bytes), 4 + 2002);
        assert!(q9.depends_on_wire());
        // Formats without sub-byte codes are the same either way.
        for c in [
            "none",
            "fp16",
            "topk:0.01",
            "dgc:0.01",
            "randomk:0.01",
            "natural",
        ] {
            let c: Compressor = c.parse().unwrap();
            assert_eq!(c.wire_bytes_as(n, Wire::Bytes), c.wire_bytes(n), "{c}");
            assert!(!c.depends_on_wire(), "{c}");
        }
        for c in [
            "signsgd",
            "signum:0.9",
            "efsignsgd",
            "onebit",
            "terngrad",
            "tbq:0.1",
        ] {
            assert!(c.parse::<Compressor>().unwrap().depends_on_wire(), "{c}");
        }
    }

    #[test]
    fn aggregation_rules() {
        assert_eq!(Compressor::Fp16.aggregation(), Aggregation::Allreduce);
        assert_eq!(
            Compressor::RandomK { ratio: 0.1 }.aggregation(),
            Aggregation::Allreduce
        );
        assert_eq!(
            Compressor::TopK { ratio: 0.1 }.aggregation(),
            Aggregation::Allgather
        );
        assert!(Compressor::SignSgd
            .allowed_aggregations()
            .contains(&Aggregation::ParameterServer));
        assert_eq!(
            Compressor::PowerSgd { rank: 1 }.allowed_aggregations(),
            &[Aggregation::Allreduce]
        );
    }
}
