//! Native settings of the frameworks users train with.
//!
//! For a plan: the nearest settings, the plan that framework runs with them, and the file it reads.
//!
//! A plan says more than any framework can: per-group compressors, priorities, partitions. An
//! export keeps what the framework can express, names what it cannot, and prices the settings
//! as that framework runs them (its strategy's plan under its framework file), so the time it
//! prints is the time the user gets, not the plan's.

mod byteps;
mod ddp;
mod deepspeed;
mod fsdp;
mod horovod;
mod tune;

pub use byteps::BytePsSettings;
pub use ddp::{DdpCaps, DdpSettings};
pub use deepspeed::DeepSpeedSettings;
pub use fsdp::{FsdpSettings, FsdpUnits};
pub use horovod::HorovodSettings;
pub use tune::{tune_settings, NativeTune};

use crate::base::error::{Result, SimError};
use crate::base::time::SimTime;
use crate::codec::CodecSet;
use crate::compress::{Compressor, Memory};
use crate::inputs::framework::Framework;
use crate::inputs::model::ModelProfile;
use crate::plan::{CodecCalls, Launch, Plan, Scheme};
use crate::predict::evaluate::steady_iteration_time;
use crate::predict::scenario::Scenario;
use crate::search::Choice;
use std::str::FromStr;

/// A framework an export writes settings for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// PyTorch DistributedDataParallel: bucket caps, bucket views, a comm hook.
    Ddp,
    /// Horovod: fusion threshold, cycle time, fp16 compression, explicit groups.
    Horovod,
    /// DeepSpeed: the ZeRO stage (0 to 2), its bucket size, the data type its reductions send.
    DeepSpeed,
    /// BytePS's PyTorch plugin: partition size, fp16 compression.
    BytePs,
    /// PyTorch FSDP2: `fully_shard` units, prefetch, resharding, mixed precision.
    Fsdp,
}

impl Target {
    /// As `--to` and `--framework` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Target::Ddp => "ddp",
            Target::Horovod => "horovod",
            Target::DeepSpeed => "deepspeed",
            Target::BytePs => "byteps",
            Target::Fsdp => "fsdp",
        }
    }

    /// Whether the framework can run any contiguous grouping of the gradients, which `tune`'s
    /// refinement moves the boundaries of: DDP by its caps, Horovod by explicit groups;
    /// DeepSpeed's stage 0 has fixed buckets and BytePS pushes each gradient by itself.
    pub fn expresses_groups(self) -> bool {
        matches!(self, Target::Ddp | Target::Horovod)
    }

    /// Whether the framework pushes and pulls through parameter servers rather than
    /// allreducing.
    fn uses_servers(self) -> bool {
        self == Target::BytePs
    }

    /// The target a `tune --framework` value names, if it names one: the export names, and
    /// the framework files whose runtime they are (`pytorch-ddp`, `horovod`).
    pub fn of_framework(name: &str) -> Option<Target> {
        match name {
            "ddp" | "pytorch-ddp" => Some(Target::Ddp),
            "horovod" => Some(Target::Horovod),
            "deepspeed" => Some(Target::DeepSpeed),
            "byteps" => Some(Target::BytePs),
            "fsdp" | "pytorch-fsdp" => Some(Target::Fsdp),
            _ => None,
        }
    }
}

impl FromStr for Target {
    type Err = SimError;
    fn from_str(text: &str) -> Result<Target> {
        match Target::of_framework(text) {
            Some(target) => Ok(target),
            None => Err(SimError::bad_value(
                "--to",
                text,
                "valid: ddp, horovod, deepspeed, byteps, fsdp",
            )),
        }
    }
}

/// One framework's settings.
#[derive(Clone, Debug, PartialEq)]
pub enum Settings {
    /// PyTorch `DistributedDataParallel`'s settings.
    Ddp(DdpSettings),
    /// Horovod's PyTorch binding's settings.
    Horovod(HorovodSettings),
    /// A DeepSpeed config's keys.
    DeepSpeed(DeepSpeedSettings),
    /// BytePS's PyTorch plugin's settings.
    BytePs(BytePsSettings),
    /// PyTorch FSDP2's settings.
    Fsdp(FsdpSettings),
}

impl Settings {
    /// The framework these settings are for.
    pub fn target(&self) -> Target {
        match self {
            Settings::Ddp(_) => Target::Ddp,
            Settings::Horovod(_) => Target::Horovod,
            Settings::DeepSpeed(_) => Target::DeepSpeed,
            Settings::BytePs(_) => Target::BytePs,
            Settings::Fsdp(_) => Target::Fsdp,
        }
    }

    /// The framework file that prices the settings (`profiles/frameworks/`).
    pub fn framework(&self) -> &'static str {
        match self {
            Settings::Ddp(s) => s.framework(),
            Settings::Horovod(_) => "horovod",
            Settings::DeepSpeed(s) => s.framework(),
            Settings::BytePs(_) => "byteps",
            Settings::Fsdp(_) => "pytorch-fsdp",
        }
    }

    /// The codec set that implements the settings' compression, if the framework has its own.
    pub fn codecs(&self) -> Option<&'static str> {
        match self {
            Settings::DeepSpeed(_) | Settings::Fsdp(_) => None,
            Settings::Ddp(s) => s.codecs(),
            Settings::Horovod(s) => s.codecs(),
            Settings::BytePs(s) => s.codecs(),
        }
    }

    /// `base` under the settings' framework and codecs.
    pub fn scenario(&self, base: &Scenario) -> Result<Scenario> {
        let framework = Framework::load(self.framework())?;
        let codecs = self.codecs().map(CodecSet::load).transpose()?;
        base.clone()
            .with_framework(Some(framework))
            .with_codecs(codecs)
    }

    /// The plan the framework runs with these settings, on a scenario from [`Settings::scenario`].
    pub fn plan(&self, scenario: &Scenario) -> Result<Plan> {
        let mut plan = match self {
            Settings::Ddp(s) => s.plan(scenario),
            Settings::Horovod(s) => s.plan(scenario)?,
            Settings::DeepSpeed(s) => s.plan(scenario)?,
            Settings::BytePs(s) => s.plan(scenario)?,
            Settings::Fsdp(s) => s.plan(scenario),
        };
        plan.framework = Some(self.framework().to_string());
        plan.codecs = self.codecs().map(str::to_string);
        Ok(plan)
    }

    /// `base` under the settings' framework, and the plan the framework runs there.
    pub fn scenario_and_plan(&self, base: &Scenario) -> Result<(Scenario, Plan)> {
        let scenario = self.scenario(base)?;
        let plan = self.plan(&scenario)?;
        Ok((scenario, plan))
    }

    /// The steady iteration on `base` as the framework runs these settings.
    pub fn iteration_time(&self, base: &Scenario) -> Result<SimTime> {
        let (scenario, plan) = self.scenario_and_plan(base)?;
        steady_iteration_time(&scenario, &plan)
    }

    /// The framework's own defaults, uncompressed and in full precision.
    pub fn is_default(&self) -> bool {
        self.has_default_fusion() && self.precision().0 == Compressor::None
    }

    /// Fusion (caps, thresholds, cycle, bucket views) left at the framework's defaults.
    pub fn has_default_fusion(&self) -> bool {
        match self {
            Settings::Ddp(s) => s.has_default_fusion(),
            Settings::Horovod(s) => s.has_default_fusion(),
            Settings::DeepSpeed(s) => s.has_default_fusion(),
            Settings::BytePs(s) => s.has_default_fusion(),
            Settings::Fsdp(s) => s.has_default_fusion(),
        }
    }

    /// The compressor (with its memory) the settings apply to every bucket.
    pub fn compression(&self) -> Choice {
        match self {
            Settings::Ddp(s) => s.hook,
            Settings::Horovod(s) => s.compression(),
            Settings::DeepSpeed(s) => s.compression(),
            Settings::BytePs(s) => s.compression(),
            Settings::Fsdp(s) => s.compression(),
        }
    }

    /// What the settings trade in precision for speed: their compression, or bf16 where FSDP
    /// gathers parameters in it.
    pub fn precision(&self) -> Choice {
        match self {
            Settings::Fsdp(s) => s.precision(),
            _ => self.compression(),
        }
    }

    /// The settings in a few words, for tables.
    pub fn describe(&self) -> String {
        match self {
            Settings::Ddp(s) => s.describe(),
            Settings::Horovod(s) => s.describe(),
            Settings::DeepSpeed(s) => s.describe(),
            Settings::BytePs(s) => s.describe(),
            Settings::Fsdp(s) => s.describe(),
        }
    }

    /// The flags of `syncopate simulate` that run these settings, when its strategy flags can
    /// express them (per-bucket caps, explicit groups and BytePS's first-in-first-out queues
    /// need the plan: `--plan`).
    pub fn simulate_flags(&self) -> Option<Vec<String>> {
        match self {
            Settings::Ddp(s) => s.simulate_flags(),
            Settings::Horovod(s) => s.simulate_flags(),
            Settings::DeepSpeed(s) => Some(s.simulate_flags()),
            Settings::BytePs(_) => None,
            Settings::Fsdp(s) => s.simulate_flags(),
        }
    }

    /// The file the framework reads, after `header` as comment lines.
    pub fn render(&self, model: &ModelProfile, header: &[String]) -> String {
        let mut text: String = header.iter().map(|line| format!("# {line}\n")).collect();
        text += &match self {
            Settings::Ddp(s) => s.render(),
            Settings::Horovod(s) => s.render(model),
            Settings::DeepSpeed(s) => s.render(model),
            Settings::BytePs(s) => s.render(),
            Settings::Fsdp(s) => s.render(model),
        };
        text
    }
}

/// Whether `target` can run `choice` as it is, on every bucket.
pub fn expresses(target: Target, choice: Choice) -> bool {
    // `fp8:e4m3` names torchao's float8 gathers, which FSDP runs beside its reduction.
    if target == Target::Fsdp && choice == fsdp::FLOAT8_GATHERS {
        return true;
    }
    let expressible = match target {
        Target::Ddp => ddp::expressible,
        Target::Horovod | Target::BytePs => none_or_fp16,
        Target::DeepSpeed => deepspeed::expressible,
        Target::Fsdp => fsdp::expressible,
    };
    expressible(choice) == Some(choice)
}

/// The plugins' own fp16 cast (Horovod's and BytePS's `Compression.fp16`), without error
/// feedback.
const FP16: Choice = (Compressor::Fp16, Memory::None);

/// The compression a plugin whose only option is a cast to fp16 runs for `choice`: none or
/// fp16, without error feedback; `None` when it has none for it.
fn none_or_fp16(choice: Choice) -> Option<Choice> {
    match choice {
        (c @ (Compressor::None | Compressor::Fp16), Memory::None) => Some((c, Memory::None)),
        _ => None,
    }
}

/// The plugin's compressions `tune` tries with those `choices`: none, and fp16 when named.
fn fp16_or_not(choices: &[Choice]) -> impl Iterator<Item = bool> {
    let named = choices.contains(&FP16);
    [false, true]
        .into_iter()
        .filter(move |&fp16| !fp16 || named)
}

/// The compressor (with its memory) of a plugin's fp16 switch.
fn fp16_choice(fp16: bool) -> Choice {
    if fp16 {
        FP16
    } else {
        (Compressor::None, Memory::None)
    }
}

/// A framework's PyTorch plugin configured by its environment, read at `init()`, and by the
/// arguments of its `DistributedOptimizer` (Horovod, BytePS).
struct Plugin {
    /// The framework's name and the alias and module it is imported as.
    name: &'static str,
    alias: &'static str,
    module: &'static str,
    /// Python the optimizer's arguments refer to, after the import.
    definitions: String,
    /// Lines at the start of `distributed_optimizer`.
    setup: &'static str,
    /// Arguments after `optimizer` and `named_parameters`.
    arguments: Vec<String>,
}

impl Plugin {
    /// The module: `env` as (variable, value, comment above it) set before the import, then a
    /// `distributed_optimizer(optimizer, model)` function.
    fn render(&self, env: &[(&str, String, &str)]) -> String {
        let Plugin { name, alias, .. } = self;
        let mut text = format!(
            "# Import this module before {alias}.init(): {name} reads its environment there.\nimport os\n\n"
        );
        for (variable, value, comment) in env {
            for line in comment.lines() {
                text += &format!("# {line}\n");
            }
            text += &format!("os.environ[\"{variable}\"] = \"{value}\"\n");
        }
        text += &format!("\nimport {} as {alias}\n", self.module);
        text += &self.definitions;
        let mut arguments = vec![
            "optimizer".to_string(),
            "named_parameters=model.named_parameters()".to_string(),
        ];
        arguments.extend(self.arguments.iter().cloned());
        text += &format!(
            "\n\ndef distributed_optimizer(optimizer, model):\n    \"\"\"`optimizer` wrapped by {name} with the exported settings (after {alias}.init()).\"\"\"\n{}    return {alias}.DistributedOptimizer(\n        {},\n    )\n",
            self.setup,
            arguments.join(",\n        ")
        );
        text
    }
}

/// The settings nearest to a plan, and what of the plan they do not express.
#[derive(Clone, Debug)]
pub struct Nearest {
    /// The framework settings nearest to the plan.
    pub settings: Settings,
    /// What the settings leave out of the plan or its prediction, one note each.
    pub unexpressed: Vec<String>,
}

/// What `settings` leave out of their prediction for `model`, whatever the plan.
pub fn caveats(settings: &Settings, model: &ModelProfile) -> Vec<String> {
    // The reducer buckets each dtype apart (compute_bucket_assignment_by_size keys its buckets
    // by dtype); DDP's plans here follow one order across dtypes.
    let dtypes = model
        .tensors
        .iter()
        .any(|t| t.dtype != model.tensors[0].dtype);
    match settings {
        Settings::Ddp(_) if dtypes => vec![
            "parameters of several dtypes: DDP fills a bucket per dtype, which these buckets and their predicted time do not follow".to_string(),
        ],
        Settings::Fsdp(s) => s.caveats(model),
        _ => Vec::new(),
    }
}

/// The `target` settings nearest to `plan`.
pub fn nearest(target: Target, plan: &Plan, model: &ModelProfile) -> Nearest {
    let mut unexpressed = common_unexpressed(target, plan);
    let settings = match target {
        Target::Ddp => Settings::Ddp(ddp::nearest(plan, model, &mut unexpressed)),
        Target::Horovod => Settings::Horovod(horovod::nearest(plan, model, &mut unexpressed)),
        Target::DeepSpeed => Settings::DeepSpeed(deepspeed::nearest(plan, model, &mut unexpressed)),
        Target::BytePs => Settings::BytePs(byteps::nearest(plan, model, &mut unexpressed)),
        Target::Fsdp => Settings::Fsdp(fsdp::nearest(plan, model, &mut unexpressed)),
    };
    unexpressed.extend(caveats(&settings, model));
    Nearest {
        settings,
        unexpressed,
    }
}

/// The settings `tune --framework` searches: every combination of the target's knobs on a
/// grid, with the compressors among `choices` the framework can run.
pub fn candidates(target: Target, choices: &[Choice], ranks_per_node: u32) -> Vec<Settings> {
    match target {
        Target::Ddp => ddp::candidates(choices)
            .into_iter()
            .map(Settings::Ddp)
            .collect(),
        Target::Horovod => horovod::candidates(choices)
            .into_iter()
            .map(Settings::Horovod)
            .collect(),
        Target::DeepSpeed => deepspeed::candidates(choices, ranks_per_node)
            .into_iter()
            .map(Settings::DeepSpeed)
            .collect(),
        Target::BytePs => byteps::candidates(choices)
            .into_iter()
            .map(Settings::BytePs)
            .collect(),
        Target::Fsdp => fsdp::candidates(choices)
            .into_iter()
            .map(Settings::Fsdp)
            .collect(),
    }
}

/// What no framework expresses: per-group choices of partitions, schemes, CPU
/// compression, launch order, streams and overlap with the next forward.
fn common_unexpressed(target: Target, plan: &Plan) -> Vec<String> {
    let mut notes = Vec::new();
    let name = target.name();
    // FSDP and DeepSpeed shard, and reduce-scatter the units they shard.
    let shards = matches!(target, Target::Fsdp | Target::DeepSpeed);
    let count =
        |pred: &dyn Fn(&crate::plan::Group) -> bool| plan.groups.iter().filter(|g| pred(g)).count();
    let partitioned = count(&|g| g.partitions > 1);
    if partitioned > 0 && !target.uses_servers() {
        notes.push(format!(
            "{partitioned} groups split into partitions: {name} sends each bucket whole"
        ));
    }
    if target.uses_servers() {
        let allreduced = count(&|g| g.scheme != Scheme::Ps);
        if allreduced > 0 && plan.target.as_ref().is_none_or(|t| t.nodes > 1) {
            notes.push(format!(
                "{allreduced} groups with another scheme than parameter servers (allreduce, hierarchical, reduce-scatter/all-gather, compressed ring): {name} pushes and pulls through a server on each machine"
            ));
        }
    } else {
        // FSDP reduce-scatters each unit: its own scheme.
        let other_schemes = count(&|g| match g.scheme {
            Scheme::Auto | Scheme::Allreduce => false,
            Scheme::ReduceScatter | Scheme::HybridReduceScatter | Scheme::AlltoallReduceScatter => {
                !shards
            }
            _ => true,
        });
        if other_schemes > 0 {
            notes.push(format!(
                "{other_schemes} groups with another scheme than allreduce (hierarchical, parameter servers, reduce-scatter/all-gather, compressed ring): {name} allreduces"
            ));
        }
    }
    if let Some(sharding) = plan.sharding.as_ref().filter(|_| !shards) {
        notes.push(format!(
            "sharding {}: {name} keeps what the plan shards whole on every rank; export to fsdp (ZeRO-3) or deepspeed (ZeRO-1 to 3)",
            sharding.stage.name()
        ));
    }
    let on_cpu = count(&|g| g.compress_on == crate::plan::CompressOn::Cpu);
    if on_cpu > 0 {
        notes.push(format!(
            "{on_cpu} groups compressed on the CPU: {name} compresses on the device"
        ));
    }
    if plan.policy.launch == Launch::Priority {
        notes.push(format!(
            "launch by priority: {name} launches buckets in the order they fill"
        ));
    }
    if plan.policy.overlap_forward {
        notes.push(format!(
            "each group's update before its next forward: {name} updates after every bucket is synchronized"
        ));
    }
    // Horovod and BytePS compress each gradient in its hook.
    if plan.codec_calls == CodecCalls::Tensor && !matches!(target, Target::Horovod | Target::BytePs)
    {
        notes.push(format!(
            "one codec call per tensor: {name} compresses each bucket in one call"
        ));
    }
    notes
}

/// The one compressor (with its memory) a framework applies to every bucket: the plan's
/// choice that covers the most gradient bytes, as `expressible` maps it; what differs goes to
/// `notes`, naming `what` the framework offers.
fn uniform_choice(
    plan: &Plan,
    model: &ModelProfile,
    what: &str,
    notes: &mut Vec<String>,
    expressible: impl Fn(Choice) -> Option<Choice>,
) -> Choice {
    // Per choice: its gradient bytes and groups, in the plan's order.
    let mut uses: Vec<(Choice, u64, usize)> = Vec::new();
    for group in &plan.groups {
        let size = model.bytes_of(&group.tensors);
        let choice = (group.compressor, group.memory);
        match uses.iter_mut().find(|(c, _, _)| *c == choice) {
            Some((_, bytes, groups)) => {
                *bytes += size;
                *groups += 1;
            }
            None => uses.push((choice, size, 1)),
        }
    }
    // The most bytes first; the sort is stable, so ties keep the plan's order.
    uses.sort_by_key(|&(_, bytes, _)| std::cmp::Reverse(bytes));
    let Some(&(main, _, _)) = uses.first() else {
        return (Compressor::None, Memory::None);
    };
    let chosen = expressible(main).unwrap_or((Compressor::None, Memory::None));
    if chosen != main {
        notes.push(format!(
            "{} with {} memory: {what} has no such option; exported as {}",
            main.0, main.1, chosen.0
        ));
    }
    if uses.len() > 1 {
        let all: Vec<String> = uses
            .iter()
            .map(|((c, m), _, groups)| format!("{c} ({m} memory) on {groups} groups"))
            .collect();
        notes.push(format!(
            "per-group compressors, {}: {what} applies {} to every bucket",
            all.join(", "),
            chosen.0
        ));
    }
    chosen
}

#[cfg(test)]
mod tests;
