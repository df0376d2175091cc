//! Error-feedback memories: spec strings, DGC's warm-up and update cost.
//!
//! The memories are `none`, `residual`, `dgc` and `efsignsgd`.

use crate::base::error::SimError;
use std::fmt;
use std::str::FromStr;

/// What a worker keeps between steps to feed the compression error back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Memory {
    /// No error feedback.
    None,
    /// e ← (g + e) − decode(encode(g + e)).
    Residual,
    /// DGC momentum correction and local accumulation, with transmitted coordinates masked.
    Dgc {
        /// DGC's momentum coefficient (default 0.9).
        momentum: f64,
        /// Epochs over which the compression ratio warms up (default 5).
        warmup_epochs: u32,
    },
    /// EF-SignSGD: p = e + lr·g is compressed, e ← p − decode(encode(p)).
    EfSignSgd {
        /// Learning rate scaling the gradient; the aggregate is divided by it again (default 0.1).
        lr: f64,
    },
}

/// One line of `syncopate list memories`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryCatalogEntry {
    /// The spec form, e.g. `dgc[:MOMENTUM[:WARMUP_EPOCHS]]`.
    pub form: &'static str,
    /// What the memory does, with its defaults.
    pub description: &'static str,
}

const MEMORY_CATALOG: &[MemoryCatalogEntry] = &[
    MemoryCatalogEntry {
        form: "none",
        description: "no error feedback",
    },
    MemoryCatalogEntry {
        form: "residual",
        description: "error feedback: the compression error is added to the next gradient",
    },
    MemoryCatalogEntry {
        form: "dgc[:MOMENTUM[:WARMUP_EPOCHS]]",
        description: "DGC momentum correction + accumulation (defaults 0.9, 5 warm-up epochs of ratios 0.25, 0.063, 0.015, 0.004, 0.001)",
    },
    MemoryCatalogEntry {
        form: "efsignsgd[:LR]",
        description: "EF-SignSGD learning-rate-scaled residual (default lr 0.1); the aggregate is divided by LR again",
    },
];

/// DGC's warm-up compression ratios, one per fifth of the warm-up (the `wm5` configuration).
pub(super) const DGC_WARMUP_RATIOS: [f64; 5] = [0.25, 0.063, 0.015, 0.004, 0.001];

impl Memory {
    /// Every memory, one row each, in the order of `syncopate list memories`.
    pub fn memory_catalog() -> &'static [MemoryCatalogEntry] {
        MEMORY_CATALOG
    }

    /// The sparsification ratio DGC uses in `epoch` (from 0) when the target ratio is `target`:
    /// during warm-up the schedule is stretched over the warm-up epochs, never below the target.
    pub fn compression_ratio(&self, epoch: u32, target: f64) -> f64 {
        match *self {
            Memory::Dgc { warmup_epochs, .. } if epoch < warmup_epochs => {
                let stage = (epoch as usize * DGC_WARMUP_RATIOS.len()) / warmup_epochs as usize;
                DGC_WARMUP_RATIOS[stage].max(target)
            }
            _ => target,
        }
    }

    /// The memory's kind as its spec names it, without parameters (`dgc` for `dgc:0.2`).
    pub fn name(&self) -> &'static str {
        match self {
            Memory::None => "none",
            Memory::Residual => "residual",
            Memory::Dgc { .. } => "dgc",
            Memory::EfSignSgd { .. } => "efsignsgd",
        }
    }

    /// Bytes of fp32 gradient and state one element's compensation reads and writes.
    pub fn compensate_bytes(&self) -> f64 {
        match self {
            // Read g, write p (a copy).
            Memory::None => 8.0,
            // Read g, e; write p.
            Memory::Residual | Memory::EfSignSgd { .. } => 12.0,
            // Read g, m, v; write m, v, p.
            Memory::Dgc { .. } => 24.0,
        }
    }

    /// Bytes one element's update (keeping what was not transmitted) reads and writes.
    pub fn update_bytes(&self) -> f64 {
        match self {
            Memory::None => 0.0,
            // Read p and the transmitted part; write e.
            Memory::Residual | Memory::EfSignSgd { .. } => 12.0,
            // Read the transmitted mask; read and write m and v.
            Memory::Dgc { .. } => 20.0,
        }
    }
}

fn bad(spec: &str, message: impl Into<String>) -> SimError {
    let forms: Vec<_> = MEMORY_CATALOG.iter().map(|e| e.form).collect();
    SimError::bad_value(
        "memory",
        spec,
        format!("{}; valid forms: {}", message.into(), forms.join(", ")),
    )
}

fn number(spec: &str, text: &str, ok: impl Fn(f64) -> bool, rule: &str) -> Result<f64, SimError> {
    match text.parse::<f64>() {
        Ok(v) if ok(v) => Ok(v),
        _ => Err(bad(spec, format!("{rule}, got `{text}`"))),
    }
}

impl FromStr for Memory {
    type Err = SimError;

    fn from_str(spec: &str) -> Result<Self, SimError> {
        let mut parts = spec.split(':');
        let name = parts.next().unwrap_or_default();
        let args: Vec<&str> = parts.collect();
        let too_many = |max: usize| {
            if args.len() > max {
                Err(bad(
                    spec,
                    format!("`{name}` takes at most {max} parameters"),
                ))
            } else {
                Ok(())
            }
        };
        match name {
            "none" => too_many(0).map(|_| Memory::None),
            "residual" => too_many(0).map(|_| Memory::Residual),
            "dgc" => {
                too_many(2)?;
                let momentum = match args.first() {
                    Some(t) => number(
                        spec,
                        t,
                        |m| (0.0..1.0).contains(&m),
                        "a momentum is in [0, 1)",
                    )?,
                    None => 0.9,
                };
                let warmup_epochs = match args.get(1) {
                    Some(t) => t.parse().map_err(|_| {
                        bad(
                            spec,
                            format!("warm-up epochs are an integer ≥ 0, got `{t}`"),
                        )
                    })?,
                    None => 5,
                };
                Ok(Memory::Dgc {
                    momentum,
                    warmup_epochs,
                })
            }
            "efsignsgd" => {
                too_many(1)?;
                let lr = match args.first() {
                    Some(t) => number(
                        spec,
                        t,
                        |v| v.is_finite() && v > 0.0,
                        "a learning rate is finite and > 0",
                    )?,
                    None => 0.1,
                };
                Ok(Memory::EfSignSgd { lr })
            }
            _ => Err(bad(spec, format!("unknown memory `{name}`"))),
        }
    }
}

impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Memory::None => write!(f, "none"),
            Memory::Residual => write!(f, "residual"),
            Memory::Dgc {
                momentum,
                warmup_epochs,
            } => write!(f, "dgc:{momentum}:{warmup_epochs}"),
            Memory::EfSignSgd { lr } => write!(f, "efsignsgd:{lr}"),
        }
    }
}

spec_string_serde!(Memory);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_and_default() {
        assert_eq!(
            "dgc".parse::<Memory>().unwrap(),
            Memory::Dgc {
                momentum: 0.9,
                warmup_epochs: 5
            }
        );
        for spec in [
            "none",
            "residual",
            "dgc:0.9:5",
            "dgc:0.5:0",
            "efsignsgd:0.01",
        ] {
            let m: Memory = spec.parse().unwrap();
            assert_eq!(m.to_string(), spec);
            assert_eq!(
                serde_json::from_str::<Memory>(&serde_json::to_string(&m).unwrap()).unwrap(),
                m
            );
        }
        for spec in ["dgc:1.0", "efsignsgd:0", "residual:1", "ef", "dgc:0.9:x"] {
            let message = spec.parse::<Memory>().unwrap_err().to_string();
            assert!(message.contains("valid forms: none, residual"), "{message}");
        }
    }

    #[test]
    fn dgc_warmup_schedule() {
        let m = Memory::Dgc {
            momentum: 0.9,
            warmup_epochs: 5,
        };
        let ratios: Vec<f64> = (0..6).map(|e| m.compression_ratio(e, 0.001)).collect();
        assert_eq!(ratios, [0.25, 0.063, 0.015, 0.004, 0.001, 0.001]);
        let long = Memory::Dgc {
            momentum: 0.9,
            warmup_epochs: 10,
        };
        assert_eq!(long.compression_ratio(1, 0.001), 0.25);
        assert_eq!(long.compression_ratio(2, 0.001), 0.063);
        assert_eq!(Memory::Residual.compression_ratio(0, 0.01), 0.01);
    }
}
