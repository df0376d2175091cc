//! DeepSpeed's settings: the ZeRO stage (0 to 3), its bucket sizes, the reduction's data type
//! and ZeRO++'s quantized weights and gradients.
//!
//! At stage 0 DeepSpeed reduces after backward in buckets of 5e8 elements that no key changes
//! (`strategy deepspeed`). Stages 1 and 2 (deepspeed/runtime/zero/stage_1_and_2.py, 0.19.8)
//! shard the optimizer states, and at stage 2 the gradients, reducing buckets of
//! `reduce_bucket_size` elements (`strategy zero1`, `zero2`); stage 2 is priced with
//! `overlap_comm` on, which the export writes (DeepSpeed's default is off below stage 3).
//! `communication_data_type` casts each bucket before its reduction and back after.
//!
//! Stage 3 (deepspeed/runtime/zero/stage3.py, partition_parameters.py) shards the parameters
//! too, is priced as the plan's units (`strategy fsdp`, a unit per block) and written with
//! buckets of about a unit: `reduce_bucket_size` the largest unit's elements (a bucket is
//! reduced once the next gradient would overflow it) and `stage3_prefetch_bucket_size` the
//! elements of the plan's prefetched units. DeepSpeed itself fetches module by module within
//! those sizes, and keeps parameters under `stage3_param_persistence_threshold` (1e5 elements)
//! gathered: the export says so. ZeRO++'s switches: `zero_quantized_weights` (qwZ, the plan's
//! `int8` gathers) and `zero_quantized_gradients` (qgZ, its `int4` all-to-all reduction).

use crate::base::error::Result;
use crate::compress::{Compressor, Memory};
use crate::inputs::model::ModelProfile;
use crate::plan::Plan;
use crate::predict::scenario::Scenario;
use crate::search::Choice;
use crate::sharding::{ParamDtype, Stage};
use crate::strategy::{
    deepspeed_buckets, merged_blocks, zero_buckets, ShardOptions, Strategy, StrategyOptions,
};

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
    /// `zero_optimization.stage`: 0 to 3.
    pub stage: u8,
    /// `zero_optimization.reduce_bucket_size` in elements (stages 1 to 3).
    pub bucket_elements: u64,
    /// `communication_data_type`: none (fp32), fp16 or bf16; at stage 3, an `int4` here is
    /// ZeRO++'s `zero_quantized_gradients`.
    pub communication: Compressor,
    /// Stage 3: units gathered ahead of the one computing (`stage3_prefetch_bucket_size`, that
    /// many of the largest units' elements).
    pub prefetch: u32,
    /// Stage 3: ZeRO++'s `zero_quantized_weights`, int8 gathers.
    pub quantized_weights: bool,
    /// Stage 3: ZeRO++'s `zero_hpz_partition_size`, the ranks of a node that hold a second
    /// shard of each unit for backward's gathers (1: none).
    pub hpz_partition_size: u32,
}

impl DeepSpeedSettings {
    /// Stage 0 reducing in `communication`.
    fn stage0(communication: Compressor) -> DeepSpeedSettings {
        DeepSpeedSettings {
            stage: 0,
            bucket_elements: DEFAULT_BUCKET_ELEMENTS,
            communication,
            prefetch: 1,
            quantized_weights: false,
            hpz_partition_size: 1,
        }
    }

    /// Stage 1 or 2 with buckets of `bucket_elements`, reducing in `communication`.
    fn sharded(stage: u8, bucket_elements: u64, communication: Compressor) -> DeepSpeedSettings {
        DeepSpeedSettings {
            stage,
            bucket_elements,
            ..DeepSpeedSettings::stage0(communication)
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
            2 => Strategy::Zero2,
            _ => Strategy::Fsdp,
        }
    }

    fn param_dtype(&self) -> ParamDtype {
        match self.quantized_weights {
            true => ParamDtype::Int8,
            false => ParamDtype::Fp32,
        }
    }

    /// Whether ZeRO++'s quantized gradients reduce the units.
    fn quantized_gradients(&self) -> bool {
        matches!(self.communication, Compressor::Int4 { .. })
    }

    pub(super) fn plan(&self, scenario: &Scenario) -> Result<Plan> {
        let hpz = self.hpz_partition_size > 1;
        let node = scenario.world().ranks_per_node;
        if hpz && self.hpz_partition_size != node {
            return Err(crate::base::error::SimError::bad_value(
                "zero_hpz_partition_size",
                self.hpz_partition_size.to_string(),
                format!("hpZ is priced with a node's ranks as its partition, {node} here"),
            ));
        }
        let options = StrategyOptions {
            compressor: self.communication,
            sharding: ShardOptions {
                bucket_elements: self.bucket_elements,
                prefetch: self.prefetch,
                param_dtype: self.param_dtype(),
                secondary_within_node: hpz,
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
            3 => format!(
                "stage 3, prefetch {}{}, gathers {}, reduction {}",
                self.prefetch,
                match self.hpz_partition_size {
                    1 => String::new(),
                    n => format!(", hpZ over {n} ranks"),
                },
                match self.quantized_weights {
                    true => "int8 (qwZ)".to_string(),
                    false => "fp32".to_string(),
                },
                match self.quantized_gradients() {
                    true => format!("{} (qgZ)", self.communication),
                    false => self.type_name().to_string(),
                }
            ),
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
        match self.stage {
            0 => {}
            3 => {
                flags.extend([
                    "--prefetch".to_string(),
                    self.prefetch.to_string(),
                    "--param-dtype".to_string(),
                    self.param_dtype().name().to_string(),
                ]);
                if self.hpz_partition_size > 1 {
                    flags.push("--hpz".to_string());
                }
            }
            _ => flags.extend([
                "--reduce-bucket-size".to_string(),
                self.bucket_elements.to_string(),
            ]),
        }
        if self.communication != Compressor::None {
            flags.extend(["--compressor".to_string(), self.communication.to_string()]);
        }
        flags
    }

    /// A Python module with the config's keys for `model`, to merge into the user's DeepSpeed
    /// config.
    pub(super) fn render(&self, model: &ModelProfile) -> String {
        let zero = match self.stage {
            0 => "{\"stage\": 0}".to_string(),
            1 => format!(
                "{{\"stage\": 1, \"reduce_bucket_size\": {}}}",
                self.bucket_elements
            ),
            // Priced with the buckets reduced from the hooks on DeepSpeed's reduction stream.
            2 => format!(
                "{{\"stage\": 2, \"reduce_bucket_size\": {}, \"overlap_comm\": True}}",
                self.bucket_elements
            ),
            _ => {
                let unit = largest_block_unit(model);
                let prefetch = unit.saturating_mul(u64::from(self.prefetch));
                let python = |on: bool| if on { "True" } else { "False" };
                format!(
                    "{{\n        \"stage\": 3,\n        \"reduce_bucket_size\": {unit},\n        \"stage3_prefetch_bucket_size\": {prefetch},\n        \"overlap_comm\": True,\n        \"zero_quantized_weights\": {},\n        \"zero_quantized_gradients\": {},\n        \"zero_hpz_partition_size\": {},\n    }}",
                    python(self.quantized_weights),
                    python(self.quantized_gradients()),
                    self.hpz_partition_size
                )
            }
        };
        format!(
            "# Merge these keys into your DeepSpeed config (a dict passed as\n# deepspeed.initialize(..., config=...), or the JSON file it reads).\n\nDS_CONFIG = {{\n    \"zero_optimization\": {zero},\n    \"communication_data_type\": \"{}\",\n}}\n",
            self.type_name()
        )
    }
}

/// Elements of the model's largest block (FSDP's wrapping, `merged_blocks`, the root with
/// the embeddings aside): the bucket stage 3 is written with.
fn largest_block_unit(model: &ModelProfile) -> u64 {
    let (units, root) = merged_blocks(model, 1);
    let elements = |unit: &Vec<usize>| unit.iter().map(|&t| model.tensors[t].numel).sum();
    let blocks = units.iter().enumerate().filter(|&(u, _)| Some(u) != root);
    blocks.map(|(_, unit)| elements(unit)).max().unwrap_or(1)
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
    let groups: Vec<Vec<usize>> = plan.groups.iter().map(|g| g.tensors.clone()).collect();
    let Some(sharding) = &plan.sharding else {
        let (communication, _) =
            super::uniform_choice(plan, model, "communication_data_type", notes, cast);
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
        Stage::Zero1 => 1,
        Stage::Zero2 => 2,
        Stage::Zero3 => return stage3(plan, model, &groups, notes),
    };
    let (communication, _) =
        super::uniform_choice(plan, model, "communication_data_type", notes, cast);
    if sharding.param_dtype != ParamDtype::Fp32 {
        notes.push(format!(
            "parameters gathered in {}: DeepSpeed gathers them in their training dtype (fp32 here)",
            sharding.param_dtype.name()
        ));
    }
    let zero = if stage == 1 {
        Stage::Zero1
    } else {
        Stage::Zero2
    };
    let bucket_elements = bucket_limit(&groups, model, zero).unwrap_or_else(|| {
        notes.push(format!(
            "the plan's {} groups: DeepSpeed fills its buckets in the order gradients reach it, each up to reduce_bucket_size elements; exported with its default, 5e8",
            groups.len()
        ));
        DEFAULT_BUCKET_ELEMENTS
    });
    DeepSpeedSettings::sharded(stage, bucket_elements, communication)
}

/// The stage 3 settings nearest to a ZeRO-3 `plan` of units `groups`.
fn stage3(
    plan: &Plan,
    model: &ModelProfile,
    groups: &[Vec<usize>],
    notes: &mut Vec<String>,
) -> DeepSpeedSettings {
    let what = "communication_data_type or zero_quantized_gradients";
    let (communication, _) = super::uniform_choice(plan, model, what, notes, expressible);
    let sharding = plan.sharding.as_ref().expect("a sharded plan");
    let (blocks, _) = merged_blocks(model, 1);
    if groups != blocks {
        notes.push(format!(
            "the plan's {} units: DeepSpeed's stage 3 has no units; written with buckets of one block and priced with a unit per block",
            groups.len()
        ));
    }
    notes.push(
        "DeepSpeed fetches parameters module by module within stage3_prefetch_bucket_size, and keeps those of at most stage3_param_persistence_threshold (1e5) elements gathered; priced as whole units"
            .to_string(),
    );
    if sharding.float8_all_gather {
        notes.push(
            "float8 gathers of the linears' weights (torchao under FSDP2): DeepSpeed gathers them in their training dtype; exported without (zero_quantized_weights is ZeRO++'s int8)"
                .to_string(),
        );
    }
    if sharding.within_node {
        notes.push(
            "hybrid sharding (within_node): DeepSpeed's stage 3 shards over every rank (zero_hpz_partition_size keeps a second shard inside the node instead); exported over every rank"
                .to_string(),
        );
    }
    let hpz_partition_size = match (sharding.secondary_within_node, &plan.target) {
        (false, _) => 1,
        (true, Some(target)) => target.gpus_per_node,
        (true, None) => {
            notes.push(
                "hpZ without the plan's cluster: zero_hpz_partition_size is the ranks of a node; exported without"
                    .to_string(),
            );
            1
        }
    };
    if !sharding.reshard_after_forward {
        notes.push(
            "parameters kept from forward to backward: DeepSpeed releases each module's after use unless it is used again within stage3_max_reuse_distance; exported as released"
                .to_string(),
        );
    }
    if sharding.param_dtype == ParamDtype::Bf16 {
        notes.push(
            "parameters gathered in bf16: DeepSpeed gathers them in their training dtype (fp32 here), or int8 with zero_quantized_weights"
                .to_string(),
        );
    }
    if let Compressor::Int4 { block } = communication {
        notes.push(format!(
            "int4:{block}: DeepSpeed's qgZ quantizes each 2-D gradient with max(rows, cols, ranks) scales and reduce-scatters 1-D ones (biases, norms) unquantized (deepspeed/runtime/comm/coalesced_collectives.py); priced as int4:{block} over each unit"
        ));
    }
    DeepSpeedSettings {
        stage: 3,
        bucket_elements: largest_block_unit(model),
        communication,
        prefetch: sharding.prefetch.max(1),
        quantized_weights: sharding.param_dtype == ParamDtype::Int8,
        hpz_partition_size,
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
fn cast(choice: Choice) -> Option<Choice> {
    match choice {
        (c @ (Compressor::None | Compressor::Fp16 | Compressor::Bf16), Memory::None) => {
            Some((c, Memory::None))
        }
        _ => None,
    }
}

/// What some stage of DeepSpeed reduces `choice` with: a cast, or ZeRO++'s quantized
/// gradients (`int4`, stage 3), without error feedback; `None` when it has nothing for it.
pub(super) fn expressible(choice: Choice) -> Option<Choice> {
    match choice {
        (c @ Compressor::Int4 { .. }, Memory::None) => Some((c, Memory::None)),
        _ => cast(choice),
    }
}

/// The settings `tune --framework deepspeed` tries: stage 0, stages 1 and 2 with bucket sizes
/// of 5e6 to 1e9 elements, each in fp32 and the casts `choices` name, and stage 3 prefetching
/// one or two units in those; and when `choices` name an `int4` (ZeRO++), stage 3 with its
/// quantized gradients, with or without its quantized weights and, on nodes of several ranks,
/// with or without hpZ over a node's `ranks_per_node`.
pub(super) fn candidates(choices: &[Choice], ranks_per_node: u32) -> Vec<DeepSpeedSettings> {
    let types: Vec<Compressor> = [Compressor::None, Compressor::Fp16, Compressor::Bf16]
        .into_iter()
        .filter(|&c| c == Compressor::None || choices.contains(&(c, Memory::None)))
        .collect();
    let sharded = [1, 2].into_iter().flat_map(|stage| {
        BUCKET_GRID
            .into_iter()
            .map(move |elements| (stage, elements))
    });
    let mut all: Vec<DeepSpeedSettings> = std::iter::once((0, DEFAULT_BUCKET_ELEMENTS))
        .chain(sharded)
        .flat_map(|(stage, bucket_elements)| {
            types
                .iter()
                .map(move |&c| DeepSpeedSettings::sharded(stage, bucket_elements, c))
        })
        .collect();
    let zero_plus_plus = choices.iter().find_map(|&(c, memory)| {
        (matches!(c, Compressor::Int4 { .. }) && memory == Memory::None).then_some(c)
    });
    // hpZ's second shards over a node's ranks, where a node has several.
    let hpz: &[u32] = match ranks_per_node {
        0 | 1 => &[1],
        _ => &[1, ranks_per_node],
    };
    let mut stage3: Vec<(Compressor, bool, u32)> = types.iter().map(|&c| (c, false, 1)).collect();
    if let Some(c) = zero_plus_plus {
        for weights in [false, true] {
            stage3.extend(hpz.iter().map(|&n| (c, weights, n)));
        }
    }
    for prefetch in [1, 2] {
        for &(communication, quantized_weights, hpz_partition_size) in &stage3 {
            all.push(DeepSpeedSettings {
                stage: 3,
                prefetch,
                quantized_weights,
                hpz_partition_size,
                ..DeepSpeedSettings::stage0(communication)
            });
        }
    }
    all
}
