//! The compressor catalog: the one specification of every gradient compressor (wire bytes, aggregation rule, cost).
//!
//! `exec` builds its CPU kernels from these values, and its tests check that every real
//! encoder writes exactly `wire_bytes` bytes, so the simulator and the runner cannot drift.
//! The byte layouts themselves are documented in `exec/WIRE_FORMAT.md`.

/// Serializes a type as its spec string (`Display`) and parses it back (`FromStr`), so that
/// JSON files carry `"topk:0.01"` and a bad spec is reported with the parser's message.
macro_rules! spec_string_serde {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(
                &self,
                serializer: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(
                deserializer: D,
            ) -> std::result::Result<Self, D::Error> {
                let spec = <String as serde::Deserialize>::deserialize(deserializer)?;
                spec.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

mod memory;
mod spec;

pub use memory::{Memory, MemoryCatalogEntry};
pub use spec::{catalog, CatalogEntry};

use crate::device::DeviceProfile;
use crate::error::Result;
use crate::time::SimTime;

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
    None,
    Fp16,
    Bf16,
    Fp8(Fp8Format),
    TopK { ratio: f64 },
    RandomK { ratio: f64 },
    Dgc { ratio: f64 },
    Threshold { value: f64 },
    Qsgd { levels: u32 },
    TernGrad,
    Natural,
    SignSgd,
    EfSignSgd,
    Signum { momentum: f64 },
    OneBit,
    Tbq { threshold: f64 },
    GradDrop { ratio: f64 },
    PowerSgd { rank: u32 },
}

/// How the payloads of p workers are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregation {
    /// Payloads are summable element-wise in their wire type: one allreduce of the payload.
    Allreduce,
    /// Every worker receives all p payloads and decodes each one.
    Allgather,
    /// Workers push payloads to a server that decodes, aggregates and re-encodes one result
    /// (HiPress CaSync-PS; majority vote for the sign family).
    ParameterServer,
}

impl Aggregation {
    /// The rule as messages name it.
    pub fn name(self) -> &'static str {
        match self {
            Aggregation::Allreduce => "allreduce",
            Aggregation::Allgather => "allgather",
            Aggregation::ParameterServer => "parameter server",
        }
    }
}

const SUMMABLE: &[Aggregation] = &[Aggregation::Allreduce, Aggregation::ParameterServer];
const GATHERED: &[Aggregation] = &[Aggregation::Allgather, Aggregation::ParameterServer];
const ALLREDUCE_ONLY: &[Aggregation] = &[Aggregation::Allreduce];

/// Largest QSGD level count: keeps a signed level within 16 bits on the wire.
pub const QSGD_MAX_LEVELS: u32 = 32_767;

/// Header of sampled-threshold sparsifiers (dgc, graddrop, threshold): a u32 count of valid entries.
const COUNT_HEADER: u64 = 4;
/// One f32 scale (fp8, qsgd norm, terngrad max, efsignsgd mean, natural exponent).
const SCALE_HEADER: u64 = 4;

impl Compressor {
    /// The key of this compressor's cost curves in a device profile.
    pub fn key(&self) -> &'static str {
        match self {
            Compressor::None => "none",
            Compressor::Fp16 => "fp16",
            Compressor::Bf16 => "bf16",
            Compressor::Fp8(_) => "fp8",
            Compressor::TopK { .. } => "topk",
            Compressor::RandomK { .. } => "randomk",
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

    /// The default (cheapest natural) aggregation rule: the first of `allowed_aggregations`.
    pub fn aggregation(&self) -> Aggregation {
        self.allowed_aggregations()[0]
    }

    /// Every aggregation rule this compressor supports. Summable payloads (fp32, fp16, bf16,
    /// shared-seed random-k) allreduce; payloads with per-worker scales or indices are gathered
    /// or decoded and re-encoded by a server; PowerSGD only works as two allreduces.
    pub fn allowed_aggregations(&self) -> &'static [Aggregation] {
        match self {
            Compressor::None | Compressor::Fp16 | Compressor::Bf16 | Compressor::RandomK { .. } => {
                SUMMABLE
            }
            Compressor::PowerSgd { .. } => ALLREDUCE_ONLY,
            _ => GATHERED,
        }
    }

    /// Exact bytes of one worker's payload for a flat fp32 buffer of `numel` elements.
    ///
    /// `threshold` is the one data-dependent format (a count header plus one index and value per
    /// element above the threshold); for it this is the upper bound, every element selected.
    /// A flat buffer is 1-D, so `powersgd` sends it uncompressed, as PyTorch's hook does.
    pub fn wire_bytes(&self, numel: u64) -> u64 {
        let n = numel;
        match *self {
            Compressor::None | Compressor::PowerSgd { .. } => 4 * n,
            Compressor::Fp16 | Compressor::Bf16 => 2 * n,
            Compressor::Fp8(_) => SCALE_HEADER + n,
            Compressor::TopK { ratio } => 8 * sparse_count(n, ratio),
            Compressor::RandomK { ratio } => 4 * sparse_count(n, ratio),
            Compressor::Dgc { ratio } | Compressor::GradDrop { ratio } => {
                COUNT_HEADER + 8 * sparse_count(n, ratio)
            }
            Compressor::Threshold { .. } => COUNT_HEADER + 8 * n,
            Compressor::Qsgd { levels } => {
                SCALE_HEADER + (n * u64::from(qsgd_bits(levels))).div_ceil(8)
            }
            Compressor::TernGrad => SCALE_HEADER + n.div_ceil(4),
            Compressor::Tbq { .. } => n.div_ceil(4),
            Compressor::Natural => SCALE_HEADER + n,
            Compressor::SignSgd | Compressor::Signum { .. } => n.div_ceil(8),
            Compressor::EfSignSgd => SCALE_HEADER + n.div_ceil(8),
            Compressor::OneBit => 2 * SCALE_HEADER + n.div_ceil(8),
        }
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

    pub fn encode_time(&self, device: &DeviceProfile, numel: u64) -> Result<SimTime> {
        Ok(device.codec_cost(self.key())?.encode.time(numel))
    }

    pub fn decode_time(&self, device: &DeviceProfile, numel: u64) -> Result<SimTime> {
        Ok(device.codec_cost(self.key())?.decode.time(numel))
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

/// How PowerSGD treats one tensor of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerSgdTensor {
    /// Sent uncompressed in the first round (1-D, or too small to gain 2×).
    Raw { numel: u64 },
    /// A rows × cols matrix approximated with the given rank.
    LowRank { rows: u64, cols: u64, rank: u64 },
}

impl PowerSgdTensor {
    /// First-round bytes: P for a low-rank matrix, the raw values otherwise.
    pub fn p_bytes(&self) -> u64 {
        match *self {
            PowerSgdTensor::Raw { numel } => 4 * numel,
            PowerSgdTensor::LowRank { rows, rank, .. } => 4 * rows * rank,
        }
    }

    /// Second-round bytes: Q for a low-rank matrix, nothing otherwise.
    pub fn q_bytes(&self) -> u64 {
        match *self {
            PowerSgdTensor::Raw { .. } => 0,
            PowerSgdTensor::LowRank { cols, rank, .. } => 4 * cols * rank,
        }
    }
}

/// PyTorch's PowerSGD hook rule: a tensor of ≥ 2 dimensions becomes a shape[0] × rest matrix
/// with rank min(r, rows, cols), compressed only if (rows + cols)·rank·2 < rows·cols.
pub fn powersgd_layout(shapes: &[&[u64]], rank: u32) -> Vec<PowerSgdTensor> {
    shapes
        .iter()
        .map(|shape| {
            let numel: u64 = shape.iter().product();
            if shape.len() < 2 || numel == 0 {
                return PowerSgdTensor::Raw { numel };
            }
            let rows = shape[0];
            let cols = numel / rows;
            let r = u64::from(rank).min(rows).min(cols);
            if (rows + cols) * r * 2 < rows * cols {
                PowerSgdTensor::LowRank {
                    rows,
                    cols,
                    rank: r,
                }
            } else {
                PowerSgdTensor::Raw { numel }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(Compressor::TopK { ratio: 0.01 }.wire_bytes(1000), 80);
        assert_eq!(Compressor::Dgc { ratio: 0.01 }.wire_bytes(1000), 84);
        assert_eq!(Compressor::SignSgd.wire_bytes(1001), 126);
        assert_eq!(Compressor::OneBit.wire_bytes(8), 9);
        assert_eq!(Compressor::TernGrad.wire_bytes(5), 6);
        assert_eq!(Compressor::Qsgd { levels: 256 }.wire_bytes(4), 9);
    }

    #[test]
    fn powersgd_group_bytes_follow_the_hook_rule() {
        let c = Compressor::PowerSgd { rank: 4 };
        // 256×(3·3·64): (256 + 576)·4·2 < 256·576, so P = 256·4, Q = 576·4 floats.
        let conv: &[u64] = &[256, 64, 3, 3];
        let bias: &[u64] = &[256];
        let tiny: &[u64] = &[4, 4];
        assert_eq!(
            c.group_wire_bytes(&[conv, bias, tiny]),
            4 * (256 * 4 + 576 * 4) + 4 * 256 + 4 * 16
        );
        assert_eq!(c.wire_bytes(1000), 4000);
        assert_eq!(
            Compressor::TopK { ratio: 0.1 }.group_wire_bytes(&[conv, bias]),
            Compressor::TopK { ratio: 0.1 }.wire_bytes(256 * 576 + 256)
        );
        assert_eq!(c.allreduce_rounds(), 2);
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
