//! DeepSpeed's settings: the ZeRO stage (0 to 2), its bucket size and the reduction's data type.
//!
//! At stage 0 DeepSpeed reduces after backward in buckets of 5e8 elements that no key changes
//! (`strategy deepspeed`). Stages 1 and 2 (deepspeed/runtime/zero/stage_1_and_2.py, 0.19.8)
//! shard the optimizer states, and at stage 2 the gradients, reducing buckets of
//! `reduce_bucket_size` elements (`strategy zero1`, `zero2`); stage 2 is priced with
//! `overlap_comm` on, which the export writes (DeepSpeed's default is off below stage 3).
//! `communication_data_type` casts each bucket before its reduction and back after. Stage 3
//! (parameters sharded too) is exported to FSDP (`--to fsdp`).

use crate::base::error::Result;
use crate::compress::{Compressor, Memory};
use crate::inputs::model::ModelProfile;
use crate::plan::Plan;
use crate::predict::scenario::Scenario;
use crate::search::Choice;
use crate::sharding::Stage;
use crate::strategy::{deepspeed_buckets, zero_buckets, ShardOptions, Strategy, StrategyOptions};

/// DeepSpeed's `reduce_bucket_size` default, in elements (`DeepSpeedZeroConfig`).
const DEFAULT_BUCKET_ELEMENTS: u64 = 500_000_000;
/// The bucket sizes `tune --framework deepspeed` tries at stages 1 and 2, in elements.
const BUCKET_GRID: [u64; 7] = [
    5_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    500_000_000,
    1_000_000_000,
];

/// The keys of a DeepSpeed config an export writes (see profiles/native/deepspeed.json).
#[derive(Clone, Debug, PartialEq)]
pub struct DeepSpeedSettings {
    /// `zero_optimization.stage`: 0, 1 or 2.
    pub stage: u8,
    /// `zero_optimization.reduce_bucket_size` in elements (stages 1 and 2).
    pub bucket_elements: u64,
    /// `communication_data_type`: none (fp32), fp16 or bf16.
    pub communication: Compressor,
}

impl DeepSpeedSettings {
    /// Stage 0 reducing in `communication`.
    fn stage0(communication: Compressor) -> DeepSpeedSettings {
        DeepSpeedSettings {
            stage: 0,
            bucket_elements: DEFAULT_BUCKET_ELEMENTS,
            communication,
        }
    }

    pub(super) fn compression(&self) -> Choice {
        (self.communication, Memory::None)
    }

    pub(super) fn has_default_fusion(&self) -> bool {
        self.stage == 0
    }

    /// The framework file that prices the stage.
    pub(super) fn framework(&self) -> &'static str {
        match self.stage {
            0 => "deepspeed",
            _ => "deepspeed-zero",
        }
    }

    fn strategy(&self) -> Strategy {
        match self.stage {
            0 => Strategy::DeepSpeed,
            1 => Strategy::Zero1,
            _ => Strategy::Zero2,
        }
    }

    pub(super) fn plan(&self, scenario: &Scenario) -> Result<Plan> {
        let options = StrategyOptions {
            compressor: self.communication,
            sharding: ShardOptions {
                bucket_elements: self.bucket_elements,
                ..ShardOptions::default()
            },
            ..StrategyOptions::default()
        };
        self.strategy().plan(scenario, &options)
    }

    fn type_name(&self) -> &'static str {
        match self.communication {
            Compressor::Fp16 => "fp16",
            Compressor::Bf16 => "bf16",
            _ => "fp32",
        }
    }

    pub(super) fn describe(&self) -> String {
        match self.stage {
            0 => format!("stage 0, communication {}", self.type_name()),
            stage => format!(
                "stage {stage}, reduce_bucket_size {:e}, communication {}",
                self.bucket_elements as f64,
                self.type_name()
            ),
        }
    }

    pub(super) fn simulate_flags(&self) -> Vec<String> {
        let strategy = self.strategy().to_string();
        let mut flags = vec![
            "--strategy".to_string(),
            strategy,
            "--framework".to_string(),
            self.framework().to_string(),
        ];
        if self.stage > 0 {
            flags.extend([
                "--reduce-bucket-size".to_string(),
                self.bucket_elements.to_string(),
            ]);
        }
        if self.communication != Compressor::None {
            flags.extend(["--compressor".to_string(), self.communication.to_string()]);
        }
        flags
    }

    /// A Python module with the config's keys, to merge into the user's DeepSpeed config.
    pub(super) fn render(&self) -> String {
        let zero = match self.stage {
            0 => "{\"stage\": 0}".to_string(),
            1 => format!(
                "{{\"stage\": 1, \"reduce_bucket_size\": {}}}",
                self.bucket_elements
            ),
            // Priced with the buckets reduced from the hooks on DeepSpeed's reduction stream.
            _ => format!(
                "{{\"stage\": 2, \"reduce_bucket_size\": {}, \"overlap_comm\": True}}",
                self.bucket_elements
            ),
        };
        format!(
            "# Merge these keys into your DeepSpeed config (a dict passed as\n# deepspeed.initialize(..., config=...), or the JSON file it reads).\n\nDS_CONFIG = {{\n    \"zero_optimization\": {zero},\n    \"communication_data_type\": \"{}\",\n}}\n",
            self.type_name()
        )
    }
}

/// The DeepSpeed settings nearest to `plan`; what they cannot express goes to `notes`.
pub(super) fn nearest(
    plan: &Plan,
    model: &ModelProfile,
    notes: &mut Vec<String>,
) -> DeepSpeedSettings {
    let signs = plan.groups.iter().any(|g| {
        matches!(
            g.compressor,
            Compressor::OneBit | Compressor::EfSignSgd | Compressor::Signum { .. }
        )
    });
    if signs {
        // The 1-bit optimizers (OneBitAdam, OneBitLamb, ZeroOneAdam) compressed momentum to
        // signs; see profiles/native/deepspeed.json for their removal.
        notes.push(
            "compression to signs: DeepSpeed's 1-bit optimizers (OneBitAdam, OneBitLamb, ZeroOneAdam) were removed in 0.19.7 (PR #8490); the current release has none".to_string(),
        );
    }
    let (communication, _) =
        super::uniform_choice(plan, model, "communication_data_type", notes, expressible);
    let groups: Vec<Vec<usize>> = plan.groups.iter().map(|g| g.tensors.clone()).collect();
    let Some(sharding) = &plan.sharding else {
        let buckets = deepspeed_buckets(model);
        if groups != buckets {
            notes.push(format!(
                "the plan's {} groups and their overlap with backward: DeepSpeed at stage 0 reduces after backward in {} buckets of 5e8 elements, which no key changes",
                groups.len(),
                buckets.len()
            ));
        }
        return DeepSpeedSettings::stage0(communication);
    };
    let stage = match sharding.stage {
        Stage::Zero1 => Stage::Zero1,
        Stage::Zero2 => Stage::Zero2,
        Stage::Zero3 => {
            notes.push(
                "sharding zero3: DeepSpeed's stage 3 is not priced here; exported as stage 2 (export to fsdp for sharded parameters)"
                    .to_string(),
            );
            Stage::Zero2
        }
    };
    match sharding.param_dtype {
        crate::sharding::ParamDtype::Fp32 => {}
        crate::sharding::ParamDtype::Int8 => notes.push(
            "parameters gathered in int8: DeepSpeed's zero_quantized_weights quantizes stage 3's gathers, and stage 3 is not exported here"
                .to_string(),
        ),
        dtype => notes.push(format!(
            "parameters gathered in {}: DeepSpeed gathers them in their training dtype (fp32 here)",
            dtype.name()
        )),
    }
    let bucket_elements = bucket_limit(&groups, model, stage).unwrap_or_else(|| {
        notes.push(format!(
            "the plan's {} groups: DeepSpeed fills its buckets in the order gradients reach it, each up to reduce_bucket_size elements; exported with its default, 5e8",
            groups.len()
        ));
        DEFAULT_BUCKET_ELEMENTS
    });
    DeepSpeedSettings {
        stage: if stage == Stage::Zero1 { 1 } else { 2 },
        bucket_elements,
        communication,
    }
}

/// The `reduce_bucket_size` whose buckets are `groups`: DeepSpeed's default if it is one, else
/// the roundest within the range that forms them (every bucket of several gradients within it,
/// every bucket flushed because the next gradient would overflow it); `None` when none does.
fn bucket_limit(groups: &[Vec<usize>], model: &ModelProfile, stage: Stage) -> Option<u64> {
    let elements = |g: &[usize]| g.iter().map(|&t| model.tensors[t].numel).sum::<u64>();
    let lowest = groups
        .iter()
        .filter(|g| g.len() > 1)
        .map(|g| elements(g))
        .max()
        .unwrap_or(1)
        .max(1);
    let above = groups
        .windows(2)
        .filter_map(|pair| Some(elements(&pair[0]) + model.tensors[*pair[1].first()?].numel))
        .min()
        .unwrap_or(u64::MAX);
    let roundest = (0..=18u32)
        .rev()
        .filter_map(|k| lowest.div_ceil(10u64.pow(k)).checked_mul(10u64.pow(k)))
        .find(|&limit| limit < above);
    std::iter::once(DEFAULT_BUCKET_ELEMENTS)
        .chain(roundest)
        .find(|&limit| zero_buckets(model, stage, limit) == groups)
}

/// The `communication_data_type` that runs `choice` (a cast to fp16 or bf16, or none, without
/// error feedback); `None` when DeepSpeed has none for it.
pub(super) fn expressible(choice: Choice) -> Option<Choice> {
    match choice {
        (c @ (Compressor::None | Compressor::Fp16 | Compressor::Bf16), Memory::None) => {
            Some((c, Memory::None))
        }
        _ => None,
    }
}

/// The settings `tune --framework deepspeed` tries: stage 0, and stages 1 and 2 with bucket
/// sizes of 5e6 to 1e9 elements, each in fp32 and the casts `choices` name.
pub(super) fn candidates(choices: &[Choice]) -> Vec<DeepSpeedSettings> {
    let types: Vec<Compressor> = [Compressor::None, Compressor::Fp16, Compressor::Bf16]
        .into_iter()
        .filter(|&c| c == Compressor::None || choices.contains(&(c, Memory::None)))
        .collect();
    let sharded = [1, 2].into_iter().flat_map(|stage| {
        BUCKET_GRID
            .into_iter()
            .map(move |elements| (stage, elements))
    });
    std::iter::once((0, DEFAULT_BUCKET_ELEMENTS))
        .chain(sharded)
        .flat_map(|(stage, bucket_elements)| {
            types.iter().map(move |&communication| DeepSpeedSettings {
                stage,
                bucket_elements,
                communication,
            })
        })
        .collect()
}
