//! Gradient compression in the simulator.
//!
//! It covers the compressor catalog, error-feedback memories, aggregation rules and PowerSGD's
//! layout; what a codec costs on a device is `codec`'s.
//!
//! [`catalog`] is the one list of compressors; `exec` builds its codecs from it, and its tests
//! check that every real encoder writes exactly `wire_bytes` bytes, so the simulator and the
//! runner cannot drift. The byte layouts themselves are documented in `exec/WIRE_FORMAT.md`.

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

mod catalog;
mod memory;

pub use catalog::{
    auto_specs, catalog, qsgd_bits, sparse_count, sparsifier_keys, why_no_kept_cost, CatalogEntry,
    Compressor, Element, Family, Fp8Format, Wire, Work, QSGD_MAX_LEVELS,
};
pub use memory::{Memory, MemoryCatalogEntry};

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

/// How PowerSGD treats one tensor of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerSgdTensor {
    /// Sent uncompressed in the first round (1-D, or too small to gain 2×).
    Raw {
        /// Elements of the tensor.
        numel: u64,
    },
    /// A rows × cols matrix approximated with the given rank.
    LowRank {
        /// Rows of the matrix.
        rows: u64,
        /// Columns of the matrix.
        cols: u64,
        /// Rank of the approximation.
        rank: u64,
    },
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

/// Allreduce rounds of a PowerSGD group of `layout`: P with the raw tensors, then Q when some
/// tensor is low-rank. A group without a low-rank tensor sends no Q round: its decode reads the
/// reduced first round.
pub fn powersgd_rounds(layout: &[PowerSgdTensor]) -> u32 {
    let has_q = layout
        .iter()
        .any(|t| matches!(t, PowerSgdTensor::LowRank { .. }));
    1 + u32::from(has_q)
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
}
