//! DeepSpeed's settings without ZeRO (stage 0): the data type its gradient allreduce sends.
//!
//! At stage 0 DeepSpeed reduces after backward in buckets of 5e8 elements that no key changes
//! (`strategy deepspeed`); `communication_data_type` casts each bucket before its allreduce
//! and back after. Stages 1-3 partition the optimizer, gradients and parameters (ZeRO), which
//! Syncopate does not model yet.

use crate::base::error::Result;
use crate::compress::{Compressor, Memory};
use crate::inputs::model::ModelProfile;
use crate::plan::Plan;
use crate::predict::scenario::Scenario;
use crate::search::Choice;
use crate::strategy::{deepspeed_buckets, Strategy, StrategyOptions};

/// The keys of a DeepSpeed config an export writes (see profiles/native/deepspeed.json).
#[derive(Clone, Debug, PartialEq)]
pub struct DeepSpeedSettings {
    /// `communication_data_type`: none (fp32), fp16 or bf16.
    pub communication: Compressor,
}

impl DeepSpeedSettings {
    pub(super) fn compression(&self) -> Choice {
        (self.communication, Memory::None)
    }

    pub(super) fn plan(&self, scenario: &Scenario) -> Result<Plan> {
        let options = StrategyOptions {
            compressor: self.communication,
            ..StrategyOptions::default()
        };
        Strategy::DeepSpeed.plan(scenario, &options)
    }

    fn type_name(&self) -> &'static str {
        match self.communication {
            Compressor::Fp16 => "fp16",
            Compressor::Bf16 => "bf16",
            _ => "fp32",
        }
    }

    pub(super) fn describe(&self) -> String {
        format!("stage 0, communication {}", self.type_name())
    }

    pub(super) fn simulate_flags(&self) -> Vec<String> {
        let mut flags = ["--strategy", "deepspeed", "--framework", "deepspeed"]
            .map(str::to_string)
            .to_vec();
        if self.communication != Compressor::None {
            flags.extend(["--compressor".to_string(), self.communication.to_string()]);
        }
        flags
    }

    /// A Python module with the config's keys, to merge into the user's DeepSpeed config.
    pub(super) fn render(&self) -> String {
        format!(
            "# Merge these keys into your DeepSpeed config (a dict passed as\n# deepspeed.initialize(..., config=...), or the JSON file it reads).\n\nDS_CONFIG = {{\n    \"zero_optimization\": {{\"stage\": 0}},\n    \"communication_data_type\": \"{}\",\n}}\n",
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
    let buckets = deepspeed_buckets(model);
    let groups: Vec<Vec<usize>> = plan.groups.iter().map(|g| g.tensors.clone()).collect();
    if groups != buckets {
        notes.push(format!(
            "the plan's {} groups and their overlap with backward: DeepSpeed at stage 0 reduces after backward in {} buckets of 5e8 elements, which no key changes",
            groups.len(),
            buckets.len()
        ));
    }
    DeepSpeedSettings { communication }
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

/// The settings `tune --framework deepspeed` tries: fp32, and the casts `choices` name.
pub(super) fn candidates(choices: &[Choice]) -> Vec<DeepSpeedSettings> {
    [Compressor::None, Compressor::Fp16, Compressor::Bf16]
        .into_iter()
        .filter(|&c| c == Compressor::None || choices.contains(&(c, Memory::None)))
        .map(|communication| DeepSpeedSettings { communication })
        .collect()
}
