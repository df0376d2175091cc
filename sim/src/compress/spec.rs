//! Spec strings of compressors (`topk:0.01`, `fp8:e4m3`): parsing, canonical display, serde and the catalog.

use super::{Compressor, Fp8Format, QSGD_MAX_LEVELS};
use crate::error::SimError;
use std::fmt;
use std::str::FromStr;

/// One line of `syncopate list compressors`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatalogEntry {
    pub form: &'static str,
    pub description: &'static str,
}

const CATALOG: &[CatalogEntry] = &[
    CatalogEntry { form: "none", description: "fp32 as is; allreduce" },
    CatalogEntry { form: "fp16", description: "IEEE half, round to nearest even, saturating; allreduce" },
    CatalogEntry { form: "bf16", description: "bfloat16, round to nearest even, saturating; allreduce" },
    CatalogEntry { form: "fp8:e4m3|e5m2", description: "8-bit float with a per-tensor scale max|x|/max-representable; allgather" },
    CatalogEntry { form: "topk:RATIO", description: "k = max(1, ceil(RATIO·n)) largest magnitudes, u32 indices + f32 values; allgather" },
    CatalogEntry { form: "randomk:RATIO", description: "k random coordinates from a seed shared by all workers, scaled n/k (unbiased); allreduce" },
    CatalogEntry { form: "dgc:RATIO", description: "Deep Gradient Compression: threshold from a 1% strided sample, adapted to ±20% of k; allgather" },
    CatalogEntry { form: "threshold:VALUE", description: "every element with |x| ≥ VALUE (data-dependent size); allgather" },
    CatalogEntry { form: "qsgd:LEVELS", description: "QSGD: stochastic, norm-scaled levels in [-LEVELS, LEVELS] (1..=32767), unbiased; allgather" },
    CatalogEntry { form: "terngrad", description: "TernGrad: stochastic ternary scaled by max|x|, unbiased; allgather" },
    CatalogEntry { form: "natural", description: "natural compression: stochastic rounding to powers of two, unbiased; allgather" },
    CatalogEntry { form: "signsgd", description: "1 bit per element (sign); allgather or server majority vote" },
    CatalogEntry { form: "efsignsgd", description: "sign scaled by mean |x| (use with memory efsignsgd); allgather" },
    CatalogEntry { form: "signum:MOMENTUM", description: "sign of the momentum, MOMENTUM in [0, 1); allgather or server majority vote" },
    CatalogEntry { form: "onebit", description: "1-bit SGD: sign with the mean of the positive and of the negative elements; allgather" },
    CatalogEntry { form: "tbq:THRESHOLD", description: "HiPress/Strom two-bit: +τ, −τ or 0 per element, τ = THRESHOLD; allgather" },
    CatalogEntry { form: "graddrop:RATIO", description: "Aji & Heafield gradient dropping: keep the top RATIO by a sampled threshold; allgather" },
    CatalogEntry { form: "powersgd:RANK", description: "PowerSGD rank-RANK P then Q allreduce, warm-started Q, 1-D tensors raw; allreduce ×2" },
];

/// The compressors, one line each, with their spec forms.
pub fn catalog() -> &'static [CatalogEntry] {
    CATALOG
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

fn ratio(spec: &str, text: &str) -> Result<f64, SimError> {
    let r: f64 = text
        .parse()
        .map_err(|_| bad(spec, format!("`{text}` is not a number")))?;
    if r > 0.0 && r <= 1.0 {
        Ok(r)
    } else {
        Err(bad(spec, format!("a ratio is in (0, 1], got {text}")))
    }
}

fn positive(spec: &str, text: &str) -> Result<f64, SimError> {
    let v: f64 = text
        .parse()
        .map_err(|_| bad(spec, format!("`{text}` is not a number")))?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(bad(
            spec,
            format!("expected a finite value > 0, got {text}"),
        ))
    }
}

fn count(spec: &str, text: &str, max: u32) -> Result<u32, SimError> {
    match text.parse::<u32>() {
        Ok(v) if (1..=max).contains(&v) => Ok(v),
        _ => Err(bad(
            spec,
            format!("expected an integer in 1..={max}, got `{text}`"),
        )),
    }
}

impl FromStr for Compressor {
    type Err = SimError;

    fn from_str(spec: &str) -> Result<Self, SimError> {
        let (name, arg) = match spec.split_once(':') {
            Some((name, arg)) => (name, Some(arg)),
            None => (spec, None),
        };
        let need = |form: &str| {
            arg.ok_or_else(|| bad(spec, format!("`{name}` needs a parameter: {form}")))
        };
        let compressor = match name {
            "none" => Compressor::None,
            "fp16" => Compressor::Fp16,
            "bf16" => Compressor::Bf16,
            "terngrad" => Compressor::TernGrad,
            "natural" => Compressor::Natural,
            "signsgd" => Compressor::SignSgd,
            "efsignsgd" => Compressor::EfSignSgd,
            "onebit" => Compressor::OneBit,
            "fp8" => match need("fp8:e4m3 or fp8:e5m2")? {
                "e4m3" => Compressor::Fp8(Fp8Format::E4m3),
                "e5m2" => Compressor::Fp8(Fp8Format::E5m2),
                other => return Err(bad(spec, format!("unknown fp8 format `{other}`"))),
            },
            "topk" => Compressor::TopK {
                ratio: ratio(spec, need("topk:RATIO")?)?,
            },
            "randomk" => Compressor::RandomK {
                ratio: ratio(spec, need("randomk:RATIO")?)?,
            },
            "dgc" => Compressor::Dgc {
                ratio: ratio(spec, need("dgc:RATIO")?)?,
            },
            "graddrop" => Compressor::GradDrop {
                ratio: ratio(spec, need("graddrop:RATIO")?)?,
            },
            "threshold" => Compressor::Threshold {
                value: positive(spec, need("threshold:VALUE")?)?,
            },
            "tbq" => Compressor::Tbq {
                threshold: positive(spec, need("tbq:THRESHOLD")?)?,
            },
            "qsgd" => Compressor::Qsgd {
                levels: count(spec, need("qsgd:LEVELS")?, QSGD_MAX_LEVELS)?,
            },
            "powersgd" => Compressor::PowerSgd {
                rank: count(spec, need("powersgd:RANK")?, u32::MAX)?,
            },
            "signum" => {
                let text = need("signum:MOMENTUM")?;
                let m: f64 = text
                    .parse()
                    .map_err(|_| bad(spec, format!("`{text}` is not a number")))?;
                if !(0.0..1.0).contains(&m) {
                    return Err(bad(spec, format!("a momentum is in [0, 1), got {text}")));
                }
                Compressor::Signum { momentum: m }
            }
            _ => return Err(bad(spec, format!("unknown compressor `{name}`"))),
        };
        let takes_arg = matches!(
            compressor,
            Compressor::Fp8(_)
                | Compressor::TopK { .. }
                | Compressor::RandomK { .. }
                | Compressor::Dgc { .. }
                | Compressor::GradDrop { .. }
                | Compressor::Threshold { .. }
                | Compressor::Tbq { .. }
                | Compressor::Qsgd { .. }
                | Compressor::PowerSgd { .. }
                | Compressor::Signum { .. }
        );
        if arg.is_some() && !takes_arg {
            return Err(bad(spec, format!("`{name}` takes no parameter")));
        }
        Ok(compressor)
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
            | Compressor::Dgc { ratio }
            | Compressor::GradDrop { ratio } => write!(f, "{key}:{ratio}"),
            Compressor::Threshold { value: v } | Compressor::Tbq { threshold: v } => {
                write!(f, "{key}:{v}")
            }
            Compressor::Signum { momentum } => write!(f, "{key}:{momentum}"),
            Compressor::Qsgd { levels: n } | Compressor::PowerSgd { rank: n } => {
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

    #[test]
    fn every_catalog_example_round_trips() {
        for spec in [
            "none",
            "fp16",
            "bf16",
            "fp8:e4m3",
            "fp8:e5m2",
            "topk:0.01",
            "randomk:0.5",
            "dgc:0.001",
            "threshold:0.25",
            "qsgd:256",
            "terngrad",
            "natural",
            "signsgd",
            "efsignsgd",
            "signum:0.9",
            "onebit",
            "tbq:0.5",
            "graddrop:0.01",
            "powersgd:4",
        ] {
            let c: Compressor = spec.parse().unwrap();
            assert_eq!(c.to_string(), spec);
            assert_eq!(c.to_string().parse::<Compressor>().unwrap(), c);
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{spec}\""));
            assert_eq!(serde_json::from_str::<Compressor>(&json).unwrap(), c);
        }
    }

    #[test]
    fn bad_specs_list_the_valid_forms() {
        for spec in [
            "topk:0",
            "topk:1.5",
            "topk:NaN",
            "topk",
            "qsgd:0",
            "powersgd:0",
            "fp8:e3m4",
            "zip",
            "signum:1",
            "threshold:-1",
            "threshold:inf",
            "fp16:2",
            "",
        ] {
            let message = spec.parse::<Compressor>().unwrap_err().to_string();
            assert!(
                message.contains("valid forms: none, fp16"),
                "{spec}: {message}"
            );
        }
        assert!(serde_json::from_str::<Compressor>("\"topk:2\"").is_err());
    }

    #[test]
    fn catalog_has_one_entry_per_key() {
        assert_eq!(catalog().len(), 18);
    }
}
