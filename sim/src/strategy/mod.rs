//! Named baseline strategies: each turns a model profile into a Plan the engine executes.

mod ddp;
mod fixed_groups;
mod horovod;

pub use fixed_groups::GroupingRule;

use crate::compress::{Compressor, Memory};
use crate::error::{Result, SimError};
use crate::model::ModelProfile;
use crate::plan::{CompressOn, Group, Launch, Plan, Policy, Scheme};
use std::fmt;
use std::str::FromStr;

/// A named strategy with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// Wait-free backpropagation: one collective per tensor as soon as its gradient is ready.
    Wfbp,
    /// Horovod: tensors ready at each background cycle are fused into buffers of at most the
    /// fusion threshold.
    Horovod,
    /// PyTorch DDP: buckets in reverse registration order, a small first bucket.
    Ddp,
    /// N contiguous groups in backward order (MergeComp's `--fusion-num`).
    FixedGroups { count: usize, rule: GroupingRule },
}

/// Parameters every strategy may use, with the frameworks' defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StrategyOptions {
    /// Horovod's fusion buffer (HOROVOD_FUSION_THRESHOLD, 64 MiB).
    pub fusion_bytes: u64,
    /// Horovod's cycle time (HOROVOD_CYCLE_TIME, 5 ms in Horovod's documentation).
    pub cycle_us: f64,
    /// DDP's bucket cap (bucket_cap_mb, 25 MiB) and its first bucket (1 MiB).
    pub bucket_bytes: u64,
    pub first_bucket_bytes: u64,
    pub compressor: Compressor,
    pub memory: Memory,
}

impl Default for StrategyOptions {
    fn default() -> Self {
        StrategyOptions {
            fusion_bytes: 64 << 20,
            cycle_us: 5000.0,
            bucket_bytes: 25 << 20,
            first_bucket_bytes: 1 << 20,
            compressor: Compressor::None,
            memory: Memory::None,
        }
    }
}

/// One line of `syncopate list strategies`.
pub struct StrategyEntry {
    pub form: &'static str,
    pub description: &'static str,
}

pub fn catalog() -> &'static [StrategyEntry] {
    &[
        StrategyEntry {
            form: "wfbp",
            description: "wait-free backpropagation: one collective per tensor as soon as its gradient is ready",
        },
        StrategyEntry {
            form: "horovod",
            description: "Horovod tensor fusion: tensors ready at each cycle (--cycle-ms, 5) fused up to --fusion-mb (64)",
        },
        StrategyEntry {
            form: "ddp",
            description: "PyTorch DDP: --bucket-mb (25) buckets in reverse registration order, 1 MB first bucket, launched in order",
        },
        StrategyEntry {
            form: "fixed-groups:N[:bytes|:count]",
            description: "N contiguous groups in backward order, balanced by bytes (default) or tensor count (MergeComp --fusion-num)",
        },
    ]
}

impl FromStr for Strategy {
    type Err = SimError;
    fn from_str(text: &str) -> Result<Strategy> {
        let bad = |message: &str| {
            let forms: Vec<&str> = catalog().iter().map(|e| e.form).collect();
            SimError::bad_value(
                "strategy",
                text,
                format!("{message}; valid strategies: {}", forms.join(", ")),
            )
        };
        let mut parts = text.split(':');
        match (
            parts.next().unwrap_or(""),
            parts.next(),
            parts.next(),
            parts.next(),
        ) {
            ("wfbp", None, _, _) => Ok(Strategy::Wfbp),
            ("horovod", None, _, _) => Ok(Strategy::Horovod),
            ("ddp", None, _, _) => Ok(Strategy::Ddp),
            ("fixed-groups", Some(count), rule, None) => {
                let count: usize = count
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad("the group count must be a whole number ≥ 1"))?;
                let rule = match rule {
                    None | Some("bytes") => GroupingRule::Bytes,
                    Some("count") => GroupingRule::Count,
                    Some(_) => return Err(bad("the grouping rule is `bytes` or `count`")),
                };
                Ok(Strategy::FixedGroups { count, rule })
            }
            _ => Err(bad("unknown strategy")),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::Wfbp => f.write_str("wfbp"),
            Strategy::Horovod => f.write_str("horovod"),
            Strategy::Ddp => f.write_str("ddp"),
            Strategy::FixedGroups { count, rule } => write!(f, "fixed-groups:{count}:{rule}"),
        }
    }
}

impl Strategy {
    /// The plan this strategy runs for `model`.
    pub fn plan(&self, model: &ModelProfile, options: &StrategyOptions) -> Result<Plan> {
        let (groups, policy) = match *self {
            Strategy::Wfbp => (
                (0..model.num_tensors()).map(|t| vec![t]).collect(),
                plan_order(0.0),
            ),
            Strategy::Horovod => (
                horovod::groups(model, options),
                plan_order(options.cycle_us),
            ),
            Strategy::Ddp => (ddp::buckets(model, options), plan_order(0.0)),
            Strategy::FixedGroups { count, rule } => {
                (fixed_groups::groups(model, count, rule)?, plan_order(0.0))
            }
        };
        let groups = groups
            .into_iter()
            .enumerate()
            .map(|(i, tensors)| Group {
                tensors,
                compressor: options.compressor,
                memory: options.memory,
                compress_on: CompressOn::Gpu,
                scheme: Scheme::Auto,
                partitions: 1,
                priority: i as i64,
            })
            .collect();
        Ok(Plan::new(&self.to_string(), model, groups, policy))
    }
}

fn plan_order(cycle_time_us: f64) -> Policy {
    Policy {
        launch: Launch::PlanOrder,
        comm_streams: 1,
        cycle_time_us,
        overlap_forward: false,
        ps_servers: 0,
    }
}

/// Cumulative gradient-ready time of each tensor (backward order) from the start of backward,
/// as the profile measured it.
pub(crate) fn ready_times_us(model: &ModelProfile) -> Vec<f64> {
    model
        .tensors
        .iter()
        .scan(0.0, |t, tensor| {
            *t += tensor.backward_us;
            Some(*t)
        })
        .collect()
}
