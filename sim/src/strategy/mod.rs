//! Named strategies of the frameworks and papers we cover: each turns a scenario into a Plan.

mod bytescheduler;
mod ddp;
mod deepspeed;
mod espresso;
mod fixed_groups;
mod hipress;
mod horovod;
mod mergecomp;
mod mgwfbp;
mod ps;
mod sharded;

pub use fixed_groups::{groups as fixed_groups, GroupingRule};
pub use horovod::{
    HorovodFusion, CYCLE_US as HOROVOD_CYCLE_US, FUSION_BYTES as HOROVOD_FUSION_BYTES,
};
pub use sharded::{fsdp_units_plan, merged_blocks, with_root, zero_buckets, ShardOptions};

use crate::base::error::{Result, SimError};
use crate::compress::{Compressor, Memory};
use crate::inputs::model::ModelProfile;
use crate::plan::{CodecCalls, CompressOn, Group, Launch, Plan, Policy, Scheme};
use crate::predict::scenario::Scenario;
use crate::sharding::Stage;
use std::fmt;
use std::str::FromStr;

/// Which synchronization topology HiPress's CaSync runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaSyncTopology {
    /// CaSync-PS: every gradient pushed to and pulled from parameter servers.
    Ps,
    /// CaSync-Ring: compressed gradients passed around a ring, the others allreduced.
    Ring,
}

/// A named strategy with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// Wait-free backpropagation: one collective per tensor as soon as its gradient is ready.
    Wfbp,
    /// Horovod: tensors ready at each background cycle are fused into buffers of at most the
    /// fusion threshold.
    Horovod,
    /// PyTorch DDP: buckets in the order gradients arrive (as DDP rebuilds them after the first iteration), a small first bucket.
    Ddp,
    /// DeepSpeed without ZeRO (stage 0): after backward, buckets of 5e8 elements in
    /// registration order.
    DeepSpeed,
    /// N contiguous groups in backward order (MergeComp's `--fusion-num`).
    FixedGroups {
        /// Number of groups, N.
        count: usize,
        /// What the groups balance: bytes or tensor count.
        rule: GroupingRule,
    },
    /// ByteScheduler: partitions, front layers first, credit-limited sending, overlap with the
    /// next forward.
    ByteScheduler,
    /// MG-WFBP: merge a gradient into the pending group when waiting costs less than a startup.
    MgWfbp,
    /// DeAR: reduce-scatter during backward, all-gather before the next forward, buckets by
    /// threshold.
    Dear,
    /// MergeComp: the compressor applied per fusion group, the group count searched.
    MergeComp,
    /// HiPress: CaSync synchronization with SeCoPa's per-gradient compress/partition choice.
    HiPress(CaSyncTopology),
    /// BytePS: parameter servers colocated with the workers, intra-node aggregation.
    BytePs,
    /// Parameter servers on dedicated machines, intra-node aggregation.
    Ps,
    /// Espresso: per-tensor compression choice (none, GPU or CPU), greedy, largest first.
    Espresso,
    /// DeepSpeed ZeRO-1: optimizer states sharded, gradients reduce-scattered after backward.
    Zero1,
    /// DeepSpeed ZeRO-2: optimizer states and gradients sharded, reduce-scattered in backward.
    Zero2,
    /// PyTorch FSDP (ZeRO-3): parameters sharded too, gathered around each unit.
    Fsdp,
    /// FSDP's hybrid sharding (HSDP): FSDP inside each node, replicated across nodes.
    Hsdp,
}

impl Strategy {
    /// An error naming `field` when the strategy's plan cannot take `calls`: a strategy that
    /// chooses compression by pricing candidate plans itself (MergeComp's group count,
    /// HiPress's SeCoPa, Espresso's per-tensor choice) prices one codec call per piece, so its
    /// plan describes that implementation only.
    pub fn check_codec_calls(&self, calls: CodecCalls, field: &str) -> Result<()> {
        let prices_its_codecs = matches!(
            self,
            Strategy::MergeComp | Strategy::HiPress(_) | Strategy::Espresso
        );
        if calls == CodecCalls::Tensor && prices_its_codecs {
            return Err(SimError::bad_value(
                field,
                calls.name(),
                format!(
                    "the `{self}` strategy chooses its compression by pricing one codec call per group; use `group`"
                ),
            ));
        }
        Ok(())
    }
}

/// Parameters strategies use, with the frameworks' defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StrategyOptions {
    /// Horovod's fusion buffer (HOROVOD_FUSION_THRESHOLD: 128 MiB since v0.21.0, 64 MiB
    /// before; see [`HorovodFusion`]).
    pub fusion_bytes: u64,
    /// Horovod's cycle time (HOROVOD_CYCLE_TIME: 1 ms since v0.21.0, 5 ms before).
    pub cycle_us: f64,
    /// DDP's bucket cap (bucket_cap_mb, 25 MiB) and its first bucket (1 MiB); DeAR's fusion
    /// threshold (25 MB by default in DeAR's scripts).
    pub bucket_bytes: u64,
    /// DDP's first bucket cap (1 MiB).
    pub first_bucket_bytes: u64,
    /// Partition size of ByteScheduler and BytePS (BytePS: BYTEPS_PARTITION_BYTES = 4,096,000).
    pub partition_bytes: u64,
    /// Partitions in flight at once (ByteScheduler's credit).
    pub credit: u32,
    /// Dedicated parameter servers for `ps` (0: one per node).
    pub ps_servers: u32,
    /// Prefetch, resharding and gather precision of the sharded strategies.
    pub sharding: ShardOptions,
    /// The compressor the strategy applies (`Compressor::None`: no compression).
    pub compressor: Compressor,
    /// Error feedback kept with the compressor.
    pub memory: Memory,
}

impl Default for StrategyOptions {
    fn default() -> Self {
        StrategyOptions {
            fusion_bytes: HOROVOD_FUSION_BYTES,
            cycle_us: HOROVOD_CYCLE_US,
            bucket_bytes: 25 << 20,
            first_bucket_bytes: 1 << 20,
            partition_bytes: 4_096_000,
            credit: 4,
            ps_servers: 0,
            sharding: ShardOptions::default(),
            compressor: Compressor::None,
            memory: Memory::None,
        }
    }
}

/// One line of `syncopate list strategies`.
pub struct StrategyEntry {
    /// The strategy as written on the command line (`fixed-groups:N[:bytes|:count]`).
    pub form: &'static str,
    /// What the strategy does, with its options and their defaults.
    pub description: &'static str,
}

const CATALOG: &[StrategyEntry] = &[
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
        description: "PyTorch DDP: --bucket-mb (25) buckets in the order gradients arrive, 1 MB first bucket, launched in order",
    },
    StrategyEntry {
        form: "deepspeed",
        description: "DeepSpeed without ZeRO (stage 0): after backward, one allreduce per bucket of 5e8 elements in registration order",
    },
    StrategyEntry {
        form: "fixed-groups:N[:bytes|:count]",
        description: "N contiguous groups in backward order, balanced by bytes (default) or tensor count (MergeComp --fusion-num)",
    },
    StrategyEntry {
        form: "bytescheduler",
        description: "ByteScheduler: --partition-mb (4) partitions, front layers first, --credit (4) in flight, overlap with the next forward",
    },
    StrategyEntry {
        form: "mgwfbp",
        description: "MG-WFBP: merge a gradient into the pending group when the wait is shorter than the collective's startup (α–β fit of the cluster)",
    },
    StrategyEntry {
        form: "dear",
        description: "DeAR: reduce-scatter during backward, all-gather before the next forward, --bucket-mb (25) buckets",
    },
    StrategyEntry {
        form: "mergecomp",
        description: "MergeComp: --compressor per fusion group of y contiguous groups, y searched by simulation as MergeComp's scheduler does",
    },
    StrategyEntry {
        form: "hipress[:ring|:ps]",
        description: "HiPress: CaSync-Ring (default) or CaSync-PS with SeCoPa's per-gradient compress and partition choice (--compressor)",
    },
    StrategyEntry {
        form: "byteps",
        description: "BytePS: servers colocated with the workers, intra-node aggregation, --partition-mb partitions each served whole by one server in turn, priority, a partition in flight per server (at least --credit); on one machine NCCL inside it, uncompressed, as BytePS runs a job of one worker machine",
    },
    StrategyEntry {
        form: "ps",
        description: "parameter servers on --ps-servers dedicated machines (default: as many as nodes), intra-node aggregation; simulate only (exec runs servers on the workers)",
    },
    StrategyEntry {
        form: "espresso",
        description: "Espresso: per-tensor choice of no compression, GPU or CPU (--cpu-compression) --compressor, greedy by size from the output side",
    },
    StrategyEntry {
        form: "zero1",
        description: "DeepSpeed ZeRO-1: optimizer states sharded; buckets of --reduce-bucket-size (5e8) elements allreduced (--compressor: their precision) after backward, each rank keeping its partition, the shard updated, parameters all-gathered (--param-dtype) before the next forward",
    },
    StrategyEntry {
        form: "zero2",
        description: "DeepSpeed ZeRO-2: as zero1 with gradients sharded too, each bucket allreduced during backward (overlap_comm)",
    },
    StrategyEntry {
        form: "fsdp",
        description: "PyTorch FSDP (ZeRO-3): a unit per --blocks-per-unit (1) repeated blocks plus the root; each unit's parameters all-gathered (--param-dtype) before its forward and, unless --reshard-after-forward false, its backward, --prefetch (1) units ahead; gradients reduce-scattered per unit; the shard updated",
    },
    StrategyEntry {
        form: "hsdp",
        description: "PyTorch FSDP's hybrid sharding (HSDP, a 2-D mesh): as fsdp with each unit sharded over its node's ranks and replicated across nodes; parameters gathered inside the node; gradients reduce-scattered inside the node, then each shard allreduced across nodes",
    },
];

/// Every strategy with its form and description, in listing order.
pub fn catalog() -> &'static [StrategyEntry] {
    CATALOG
}

impl FromStr for Strategy {
    type Err = SimError;
    fn from_str(text: &str) -> Result<Strategy> {
        let bad = |message: &str| {
            let forms: Vec<&str> = CATALOG.iter().map(|e| e.form).collect();
            SimError::bad_value(
                "strategy",
                text,
                format!("{message}; valid strategies: {}", forms.join(", ")),
            )
        };
        let mut parts = text.split(':');
        let strategy = match (parts.next().unwrap_or(""), parts.next(), parts.next()) {
            ("wfbp", None, _) => Strategy::Wfbp,
            ("horovod", None, _) => Strategy::Horovod,
            ("ddp", None, _) => Strategy::Ddp,
            ("deepspeed", None, _) => Strategy::DeepSpeed,
            ("bytescheduler", None, _) => Strategy::ByteScheduler,
            ("mgwfbp", None, _) => Strategy::MgWfbp,
            ("dear", None, _) => Strategy::Dear,
            ("mergecomp", None, _) => Strategy::MergeComp,
            ("hipress", None | Some("ring"), None) => Strategy::HiPress(CaSyncTopology::Ring),
            ("hipress", Some("ps"), None) => Strategy::HiPress(CaSyncTopology::Ps),
            ("byteps", None, _) => Strategy::BytePs,
            ("ps", None, _) => Strategy::Ps,
            ("espresso", None, _) => Strategy::Espresso,
            ("zero1", None, _) => Strategy::Zero1,
            ("zero2", None, _) => Strategy::Zero2,
            ("fsdp", None, _) => Strategy::Fsdp,
            ("hsdp", None, _) => Strategy::Hsdp,
            ("fixed-groups", Some(count), rule) => {
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
                Strategy::FixedGroups { count, rule }
            }
            _ => return Err(bad("unknown strategy")),
        };
        if parts.next().is_some() {
            return Err(bad("too many `:` parts"));
        }
        Ok(strategy)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::Wfbp => f.write_str("wfbp"),
            Strategy::Horovod => f.write_str("horovod"),
            Strategy::Ddp => f.write_str("ddp"),
            Strategy::DeepSpeed => f.write_str("deepspeed"),
            Strategy::FixedGroups { count, rule } => write!(f, "fixed-groups:{count}:{rule}"),
            Strategy::ByteScheduler => f.write_str("bytescheduler"),
            Strategy::MgWfbp => f.write_str("mgwfbp"),
            Strategy::Dear => f.write_str("dear"),
            Strategy::MergeComp => f.write_str("mergecomp"),
            Strategy::HiPress(CaSyncTopology::Ring) => f.write_str("hipress:ring"),
            Strategy::HiPress(CaSyncTopology::Ps) => f.write_str("hipress:ps"),
            Strategy::BytePs => f.write_str("byteps"),
            Strategy::Ps => f.write_str("ps"),
            Strategy::Espresso => f.write_str("espresso"),
            Strategy::Zero1 => f.write_str("zero1"),
            Strategy::Zero2 => f.write_str("zero2"),
            Strategy::Fsdp => f.write_str("fsdp"),
            Strategy::Hsdp => f.write_str("hsdp"),
        }
    }
}

impl Strategy {
    /// The framework whose runtime the strategy describes (`profiles/frameworks/`), which
    /// runs its plans unless told otherwise.
    pub fn framework(&self) -> Option<&'static str> {
        match self {
            Strategy::Ddp => Some("pytorch-ddp"),
            Strategy::DeepSpeed => Some("deepspeed"),
            Strategy::Horovod => Some("horovod"),
            Strategy::BytePs => Some("byteps"),
            Strategy::Zero1 | Strategy::Zero2 => Some("deepspeed-zero"),
            Strategy::Fsdp | Strategy::Hsdp => Some("pytorch-fsdp"),
            _ => None,
        }
    }

    /// The plan this strategy runs for the scenario's model on its cluster (the scenario's own
    /// plan is ignored; searching strategies evaluate candidates on it).
    pub fn plan(&self, scenario: &Scenario, options: &StrategyOptions) -> Result<Plan> {
        let model = &scenario.model;
        let name = self.to_string();
        let uniform = |groups: Vec<Vec<usize>>, scheme: Scheme, policy: Policy| {
            Plan::new(
                &name,
                model,
                uniform_groups(groups, options, scheme),
                policy,
            )
        };
        let mut plan = match *self {
            Strategy::Wfbp => uniform(per_tensor(model), Scheme::Auto, plan_order(0.0)),
            Strategy::Horovod => uniform(
                horovod::groups(model, options),
                Scheme::Auto,
                plan_order(options.cycle_us),
            ),
            Strategy::Ddp => ddp_plan(
                scenario,
                &[options.first_bucket_bytes, options.bucket_bytes],
                options,
            ),
            Strategy::DeepSpeed => uniform(deepspeed_buckets(model), Scheme::Auto, plan_order(0.0)),
            Strategy::FixedGroups { count, rule } => uniform(
                fixed_groups::groups(model, count, rule)?,
                Scheme::Auto,
                plan_order(0.0),
            ),
            Strategy::MgWfbp => uniform(mgwfbp::groups(scenario)?, Scheme::Auto, plan_order(0.0)),
            Strategy::Dear => uniform(
                // DeAR fuses contiguous layers in backward order until a bucket reaches its
                // threshold (THRESHOLD, 25 MB by default in its scripts): DDP's rule, one cap.
                ddp::buckets_by_caps(model, &[options.bucket_bytes]),
                Scheme::ReduceScatterAllgather,
                Policy {
                    overlap_forward: true,
                    ..plan_order(0.0)
                },
            ),
            Strategy::ByteScheduler => bytescheduler::plan(&name, model, options)?,
            Strategy::BytePs => ps::plan(&name, model, options, scenario.cluster.nodes, 0)?,
            Strategy::Ps => ps::plan(
                &name,
                model,
                options,
                scenario.cluster.nodes,
                options.ps_servers.max(scenario.cluster.nodes),
            )?,
            Strategy::MergeComp => mergecomp::plan(&name, scenario, options)?,
            Strategy::HiPress(topology) => hipress::plan(&name, scenario, options, topology)?,
            Strategy::Espresso => espresso::plan(&name, scenario, options)?,
            Strategy::Zero1 => sharded::zero_plan(&name, scenario, options, Stage::Zero1),
            Strategy::Zero2 => sharded::zero_plan(&name, scenario, options, Stage::Zero2),
            Strategy::Fsdp => sharded::fsdp_plan(&name, scenario, options, false),
            Strategy::Hsdp => sharded::fsdp_plan(&name, scenario, options, true),
        };
        plan.codec_stream = scenario.codec_stream();
        Ok(plan)
    }
}

/// PyTorch DDP's plan: buckets closed at `caps` in backward order (bucket i at
/// `caps[i]`, the last cap for the rest: `[first, cap]` by default, one cap with
/// `bucket_cap_mb`, one per bucket with `bucket_cap_mb_list`), each with the options'
/// compressor (the comm hook), launched in order on the process group's streams.
pub fn ddp_plan(scenario: &Scenario, caps: &[u64], options: &StrategyOptions) -> Plan {
    let policy = Policy {
        comm_streams: ddp::comm_streams(&scenario.cluster),
        ..plan_order(0.0)
    };
    let buckets = ddp::buckets_by_caps(&scenario.model, caps);
    scenario.plan(
        "ddp",
        uniform_groups(buckets, options, Scheme::Auto),
        policy,
    )
}

/// Horovod's plan with its groups given (`groups=` of `hvd.DistributedOptimizer`), each
/// launched whole at the first cycle after all its tensors are ready.
pub fn explicit_groups_plan(
    scenario: &Scenario,
    groups: Vec<Vec<usize>>,
    options: &StrategyOptions,
) -> Plan {
    let groups = uniform_groups(groups, options, Scheme::Auto);
    scenario.plan("horovod", groups, plan_order(options.cycle_us))
}

/// DeepSpeed's buckets at stage 0, in the order it reduces them.
pub fn deepspeed_buckets(model: &ModelProfile) -> Vec<Vec<usize>> {
    deepspeed::buckets(model, deepspeed::BUCKET_ELEMENTS)
}

/// The groups Horovod's fusion forms with these options' threshold and cycle.
pub fn horovod_groups(model: &ModelProfile, options: &StrategyOptions) -> Vec<Vec<usize>> {
    horovod::groups(model, options)
}

/// One uncompressed group per tensor in backward order: the plan of a scenario before a
/// strategy has chosen one.
pub fn per_tensor_plan(model: &ModelProfile) -> Plan {
    let options = StrategyOptions::default();
    Plan::new(
        "wfbp",
        model,
        uniform_groups(per_tensor(model), &options, Scheme::Auto),
        plan_order(0.0),
    )
}

fn per_tensor(model: &ModelProfile) -> Vec<Vec<usize>> {
    (0..model.num_tensors()).map(|t| vec![t]).collect()
}

/// Groups with the options' compressor and memory, one partition, priorities in plan order.
pub(crate) fn uniform_groups(
    groups: Vec<Vec<usize>>,
    options: &StrategyOptions,
    scheme: Scheme,
) -> Vec<Group> {
    groups
        .into_iter()
        .enumerate()
        .map(|(i, tensors)| Group {
            tensors,
            compressor: options.compressor,
            memory: options.memory,
            compress_on: CompressOn::Gpu,
            scheme,
            partitions: 1,
            priority: i as i64,
        })
        .collect()
}

pub(crate) fn plan_order(cycle_time_us: f64) -> Policy {
    Policy {
        launch: Launch::PlanOrder,
        comm_streams: 1,
        cycle_time_us,
        overlap_forward: false,
        ps_servers: 0,
    }
}

/// One group per tensor, each split into partitions of at most `partition_bytes`, front layers
/// (registered first, needed first by the next forward) at the highest priority: the layout of
/// ByteScheduler and BytePS.
fn partitioned_by_layer(
    model: &ModelProfile,
    options: &StrategyOptions,
    scheme: Scheme,
) -> Result<Vec<Group>> {
    let mut groups = uniform_groups(per_tensor(model), options, scheme);
    let mut pieces = 0u64;
    for group in &mut groups {
        let tensor = &model.tensors[group.tensors[0]];
        let bytes = tensor.bytes();
        let parts = bytes.div_ceil(options.partition_bytes.max(1)).max(1);
        pieces += parts;
        if pieces > crate::base::limits::MAX_PIECES {
            return Err(SimError::bad_value(
                "--partition-mb",
                format!("{} bytes", options.partition_bytes),
                format!(
                    "splits the model into more than {} partitions (each a collective per iteration): use larger partitions",
                    crate::base::limits::MAX_PIECES
                ),
            ));
        }
        group.partitions = parts as u32;
        group.priority = tensor.registration_index as i64;
    }
    Ok(groups)
}

/// Compressing strategies need a compressor to apply.
fn require_compressor(strategy: &str, options: &StrategyOptions) -> Result<Compressor> {
    match options.compressor {
        Compressor::None => Err(SimError::bad_value(
            "--compressor",
            "none",
            format!("the `{strategy}` strategy compresses gradients: name a compressor (see `syncopate list compressors`)"),
        )),
        compressor => Ok(compressor),
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
