//! BytePS's settings for its PyTorch plugin: partition size and fp16 compression.
//!
//! BytePS 0.2.5.post15 (the newest release) is what these settings and their price follow
//! (see profiles/native/byteps.json for every fact and where it was read):
//! `byteps.torch.DistributedOptimizer` starts each gradient's push and pull by itself in its
//! hook with priority 0, and its core cuts each into partitions of BYTEPS_PARTITION_BYTES. With
//! BYTEPS_SCHEDULING_CREDIT at its default 0 the core's queues are first in, first out with no
//! cap on what is in flight; a credit orders only the intra-machine reduce queue, by parameter
//! name at equal priority, which no plan here means, so the export leaves it at 0. Compression
//! in the PyTorch plugin is `bps.Compression.fp16` or none: `compression_params` (onebit, topk,
//! ...) is read only by the MXNet trainer in that release.

use crate::base::error::{Result, SimError};
use crate::base::limits;
use crate::compress::Compressor;
use crate::inputs::model::ModelProfile;
use crate::plan::{CodecCalls, Launch, Plan};
use crate::predict::scenario::Scenario;
use crate::search::Choice;
use crate::strategy::{Strategy, StrategyOptions};

/// BYTEPS_PARTITION_BYTES's default (byteps/common/global.cc; docs/env.md: "default and
/// recommended value is 4096000").
const DEFAULT_PARTITION_BYTES: u64 = 4_096_000;

/// The partition sizes `tune --framework byteps` tries: the default halved and doubled three
/// times. Each is a multiple of 8 pages, so the core keeps it as written with 1, 2, 4 or 8 GPUs
/// per machine.
const PARTITION_GRID: [u64; 7] = [
    512_000, 1_024_000, 2_048_000, 4_096_000, 8_192_000, 16_384_000, 32_768_000,
];

/// The page size the core rounds a partition up to a multiple of (sysconf(_SC_PAGESIZE) on
/// x86-64 Linux), times the GPUs of a machine.
const PAGE_BYTES: u64 = 4096;

/// The settings of BytePS's PyTorch plugin an export writes.
#[derive(Clone, Debug, PartialEq)]
pub struct BytePsSettings {
    /// BYTEPS_PARTITION_BYTES as written.
    pub partition_bytes: u64,
    /// `compression=bps.Compression.fp16`: each gradient cast to half before its push.
    pub fp16: bool,
}

impl BytePsSettings {
    /// BytePS's own fp16 cast (`profiles/codecs/byteps.json`) when compressing.
    pub(super) fn codecs(&self) -> Option<&'static str> {
        self.fp16.then_some("byteps")
    }

    /// The compressor (with its memory) on every tensor: fp16 or none.
    pub(super) fn compression(&self) -> Choice {
        super::fp16_choice(self.fp16)
    }

    pub(super) fn has_default_fusion(&self) -> bool {
        self.partition_bytes == DEFAULT_PARTITION_BYTES
    }

    /// The partition the core cuts with `gpus_per_node` local ranks: the setting rounded up to
    /// a multiple of local_size * page size (BytePSGlobal::Init).
    fn core_partition_bytes(&self, gpus_per_node: u32) -> Result<u64> {
        let unit = PAGE_BYTES * u64::from(gpus_per_node.max(1));
        self.partition_bytes
            .checked_next_multiple_of(unit)
            .filter(|&bytes| bytes <= u64::from(u32::MAX))
            .ok_or_else(|| {
                SimError::bad_value(
                    "BYTEPS_PARTITION_BYTES",
                    self.partition_bytes.to_string(),
                    "BytePS stores the rounded partition size as a 32-bit count of bytes",
                )
            })
    }

    pub(super) fn plan(&self, scenario: &Scenario) -> Result<Plan> {
        let (compressor, memory) = self.compression();
        let core_bytes = self.core_partition_bytes(scenario.cluster.gpus_per_node)?;
        // The core cuts the tensor the plugin hands it: after the fp16 cast a partition of
        // `core_bytes` holds twice the gradient's fp32 bytes.
        let gradient_bytes = if self.fp16 {
            2 * core_bytes
        } else {
            core_bytes
        };
        let options = StrategyOptions {
            partition_bytes: gradient_bytes,
            compressor,
            memory,
            ..StrategyOptions::default()
        };
        let mut plan = Strategy::BytePs.plan(scenario, &options)?;
        // Priority 0 for every gradient (byteps/torch/ops.py) and no credit: partitions go in
        // the order their gradients are ready (the plan's, backward order), all of them in
        // flight at once (the unscheduled queue's credit is 32 GiB).
        plan.policy.launch = Launch::PlanOrder;
        plan.policy.comm_streams = limits::MAX_COMM_STREAMS;
        if self.fp16 {
            // The plugin casts in the hook, also on one machine, where the core sends whole
            // tensors over NCCL and the strategy leaves them uncompressed.
            for group in &mut plan.groups {
                group.compressor = compressor;
                group.memory = memory;
            }
            plan.codec_calls = CodecCalls::Tensor;
        }
        Ok(plan)
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "partitions of {} bytes, compression {}",
            self.partition_bytes,
            if self.fp16 { "fp16" } else { "none" }
        )
    }

    /// Python that sets BytePS's environment (before `bps.init()`) and builds its optimizer.
    pub(super) fn render(&self) -> String {
        let env = [
            ("BYTEPS_PARTITION_BYTES", self.partition_bytes.to_string(), ""),
            (
                "BYTEPS_SCHEDULING_CREDIT",
                "0".to_string(),
                "0 (the default) keeps BytePS's queues first in, first out, as priced: a credit\nwould order only the intra-machine reduce queue, by parameter name.",
            ),
        ];
        let arguments = match self.fp16 {
            true => vec!["compression=bps.Compression.fp16".to_string()],
            false => Vec::new(),
        };
        super::Plugin {
            name: "BytePS",
            alias: "bps",
            module: "byteps.torch",
            definitions: String::new(),
            setup: "",
            arguments,
        }
        .render(&env)
    }
}

/// The BytePS settings nearest to `plan`; what they cannot express goes to `notes`.
pub(super) fn nearest(
    plan: &Plan,
    model: &ModelProfile,
    notes: &mut Vec<String>,
) -> BytePsSettings {
    let (compressor, _) =
        super::uniform_choice(plan, model, "bps.Compression", notes, super::none_or_fp16);
    let fused = plan.groups.iter().filter(|g| g.tensors.len() > 1).count();
    if fused > 0 {
        notes.push(format!(
            "{fused} groups of several tensors: BytePS's PyTorch plugin pushes each gradient by itself"
        ));
    }
    if plan.policy.ps_servers > 0 {
        notes.push(format!(
            "{} dedicated servers: priced with a server on each worker machine (DMLC_NUM_SERVER and the servers' launch are the user's)",
            plan.policy.ps_servers
        ));
    }
    // The largest piece the plan cuts a gradient into, as the core would be told it; a plan
    // that sends everything whole keeps BytePS's default.
    let largest_piece = plan
        .groups
        .iter()
        .filter(|g| g.partitions > 1)
        .map(|g| model.bytes_of(&g.tensors).div_ceil(u64::from(g.partitions)))
        .max();
    let partition_bytes = match largest_piece {
        Some(bytes) => {
            let wire = if compressor == Compressor::Fp16 {
                bytes / 2
            } else {
                bytes
            };
            wire.max(1)
        }
        None => DEFAULT_PARTITION_BYTES,
    };
    BytePsSettings {
        partition_bytes,
        fp16: compressor == Compressor::Fp16,
    }
}

/// The settings `tune --framework byteps` tries: every partition size of the grid, with fp16
/// compression when `choices` name it.
pub(super) fn candidates(choices: &[Choice]) -> Vec<BytePsSettings> {
    let mut out = Vec::new();
    for partition_bytes in PARTITION_GRID {
        for fp16 in super::fp16_or_not(choices) {
            out.push(BytePsSettings {
                partition_bytes,
                fp16,
            });
        }
    }
    out
}
