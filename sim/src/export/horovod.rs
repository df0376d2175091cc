//! Horovod's settings: fusion threshold, cycle time, fp16 compression and explicit groups.
//!
//! The explicit groups are those of `hvd.DistributedOptimizer`.

use crate::base::error::Result;
use crate::compress::Compressor;
use crate::inputs::model::ModelProfile;
use crate::plan::{CodecCalls, Plan};
use crate::predict::scenario::Scenario;
use crate::search::Choice;
use crate::strategy::{
    explicit_groups_plan, horovod_groups, Strategy, StrategyOptions, HOROVOD_CYCLE_US,
    HOROVOD_FUSION_BYTES,
};

const MIB: u64 = 1 << 20;

/// The fusion thresholds `tune --framework horovod` tries, in MiB.
const THRESHOLD_GRID_MIB: [u64; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

/// The cycle times it tries, in ms.
const CYCLE_GRID_MS: [f64; 6] = [0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The settings of Horovod's PyTorch binding an export writes.
#[derive(Clone, Debug, PartialEq)]
pub struct HorovodSettings {
    /// HOROVOD_FUSION_THRESHOLD in bytes.
    pub fusion_threshold_bytes: u64,
    /// HOROVOD_CYCLE_TIME in ms.
    pub cycle_time_ms: f64,
    /// `compression=hvd.Compression.fp16`: each gradient cast to half before its allreduce.
    pub fp16: bool,
    /// `groups=` of `hvd.DistributedOptimizer`: tensors (the model's indices) allreduced
    /// together, each group by itself (HOROVOD_DISABLE_GROUP_FUSION), none: Horovod's fusion.
    pub groups: Option<Vec<Vec<usize>>>,
}

impl HorovodSettings {
    /// Horovod's own fp16 cast (`profiles/codecs/horovod.json`) when compressing.
    pub(super) fn codecs(&self) -> Option<&'static str> {
        self.fp16.then_some("horovod")
    }

    /// The compressor (with its memory) on every tensor: fp16 or none.
    pub(super) fn compression(&self) -> Choice {
        super::fp16_choice(self.fp16)
    }

    fn options(&self) -> StrategyOptions {
        let (compressor, memory) = self.compression();
        StrategyOptions {
            fusion_bytes: self.fusion_threshold_bytes,
            cycle_us: self.cycle_time_ms * 1e3,
            compressor,
            memory,
            ..StrategyOptions::default()
        }
    }

    pub(super) fn has_default_fusion(&self) -> bool {
        // Horovod's own defaults: HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME as v0.21.0
        // set them (horovod/common/operations.cc; see profiles/native/horovod.json).
        self.fusion_threshold_bytes == HOROVOD_FUSION_BYTES
            && self.cycle_time_ms == HOROVOD_CYCLE_US / 1e3
            && self.groups.is_none()
    }

    pub(super) fn plan(&self, scenario: &Scenario) -> Result<Plan> {
        let options = self.options();
        let mut plan = match &self.groups {
            None => Strategy::Horovod.plan(scenario, &options)?,
            Some(groups) => explicit_groups_plan(scenario, groups.clone(), &options),
        };
        // hvd.Compression compresses each gradient before its allreduce_async_.
        if self.fp16 {
            plan.codec_calls = CodecCalls::Tensor;
        }
        Ok(plan)
    }

    pub(super) fn describe(&self) -> String {
        let groups = match &self.groups {
            Some(groups) => format!(", {} explicit groups", groups.len()),
            None => String::new(),
        };
        format!(
            "fusion threshold {} MiB, cycle {} ms{groups}, compression {}",
            super::ddp::mib(self.fusion_threshold_bytes),
            self.cycle_time_ms,
            if self.fp16 { "fp16" } else { "none" }
        )
    }

    pub(super) fn simulate_flags(&self) -> Option<Vec<String>> {
        if self.groups.is_some() {
            return None;
        }
        let mut flags = vec![
            "--strategy".to_string(),
            "horovod".to_string(),
            "--fusion-mb".to_string(),
            super::ddp::mib(self.fusion_threshold_bytes),
            "--cycle-ms".to_string(),
            self.cycle_time_ms.to_string(),
            "--framework".to_string(),
            "horovod".to_string(),
        ];
        if self.fp16 {
            flags.extend(
                [
                    "--compressor",
                    "fp16",
                    "--codecs",
                    "horovod",
                    "--codec-calls",
                    "tensor",
                ]
                .map(str::to_string),
            );
        }
        Some(flags)
    }

    /// Python that sets Horovod's environment (before `hvd.init()`) and builds its optimizer.
    pub(super) fn render(&self, model: &ModelProfile) -> String {
        let mut env = vec![
            (
                "HOROVOD_FUSION_THRESHOLD",
                self.fusion_threshold_bytes.to_string(),
                "",
            ),
            ("HOROVOD_CYCLE_TIME", self.cycle_time_ms.to_string(), ""),
        ];
        let mut plugin = super::Plugin {
            name: "Horovod",
            alias: "hvd",
            module: "horovod.torch",
            definitions: String::new(),
            setup: "",
            arguments: Vec::new(),
        };
        if self.fp16 {
            plugin
                .arguments
                .push("compression=hvd.Compression.fp16".to_string());
        }
        if let Some(groups) = &self.groups {
            env.push(("HOROVOD_DISABLE_GROUP_FUSION", "1".to_string(), ""));
            plugin.definitions = "\n# Parameters allreduced together, one list per group, in backward order.\nGROUPS = [\n".to_string();
            for group in groups {
                let names: Vec<String> = group
                    .iter()
                    .map(|&t| format!("{:?}", model.tensors[t].name))
                    .collect();
                plugin.definitions += &format!("    [{}],\n", names.join(", "));
            }
            plugin.definitions += "]\n";
            plugin.setup = "    params = dict(model.named_parameters())\n";
            plugin
                .arguments
                .push("groups=[[params[name] for name in group] for group in GROUPS]".to_string());
        }
        plugin.render(&env)
    }
}

/// The Horovod settings nearest to `plan`; what they cannot express goes to `notes`. Horovod's
/// own fusion when it forms the plan's groups (at the default threshold and the plan's cycle),
/// else the plan's groups given explicitly, each fused whole.
pub(super) fn nearest(
    plan: &Plan,
    model: &ModelProfile,
    notes: &mut Vec<String>,
) -> HorovodSettings {
    let (compressor, _) =
        super::uniform_choice(plan, model, "hvd.Compression", notes, super::none_or_fp16);
    let cycle_time_ms = if plan.policy.cycle_time_us > 0.0 {
        plan.policy.cycle_time_us / 1e3
    } else {
        notes.push(format!(
            "collectives launched as soon as ready: Horovod launches at its cycle, exported as the shortest tuned cycle of {} ms",
            CYCLE_GRID_MS[0]
        ));
        CYCLE_GRID_MS[0]
    };
    let groups: Vec<Vec<usize>> = plan.groups.iter().map(|g| g.tensors.clone()).collect();
    let own = horovod_groups(
        model,
        &StrategyOptions {
            cycle_us: cycle_time_ms * 1e3,
            compressor,
            ..StrategyOptions::default()
        },
    );
    let (fusion_threshold_bytes, groups) = if own == groups {
        (HOROVOD_FUSION_BYTES, None)
    } else {
        // Every group whole in one response: the threshold at least the largest group.
        let largest = groups.iter().map(|g| model.bytes_of(g)).max().unwrap_or(0);
        (HOROVOD_FUSION_BYTES.max(largest), Some(groups))
    };
    HorovodSettings {
        fusion_threshold_bytes,
        cycle_time_ms,
        fp16: compressor == Compressor::Fp16,
        groups,
    }
}

/// The settings `tune --framework horovod` tries: every threshold and cycle of the grids,
/// with fp16 compression when `choices` name it.
pub(super) fn candidates(choices: &[Choice]) -> Vec<HorovodSettings> {
    let mut out = Vec::new();
    for threshold in THRESHOLD_GRID_MIB {
        for cycle_time_ms in CYCLE_GRID_MS {
            for fp16 in super::fp16_or_not(choices) {
                out.push(HorovodSettings {
                    fusion_threshold_bytes: threshold * MIB,
                    cycle_time_ms,
                    fp16,
                    groups: None,
                });
            }
        }
    }
    out
}
