//! PyTorch FSDP2's settings: `fully_shard` per unit of blocks, prefetch, resharding, precision.
//!
//! From torch/distributed/fsdp/_fully_shard/_fully_shard.py (PyTorch 2.15.0): `fully_shard` on
//! a module or a list of modules makes one unit of their parameters not already in a unit; the
//! call on the model takes the rest (the root), which keeps its parameters after forward when
//! `reshard_after_forward=False`; `MixedPrecisionPolicy(param_dtype, reduce_dtype)`, whose
//! `reduce_dtype` defaults to `param_dtype`; one unit is prefetched in forward and in backward
//! without being asked, and `set_modules_to_forward_prefetch` /
//! `set_modules_to_backward_prefetch` prefetch more. FSDP2 cannot prefetch none. Float8
//! gathers are torchao 0.18's (`torchao.float8`): `convert_to_float8_training` with
//! `Float8LinearConfig(enable_fsdp_float8_all_gather=True)` before `fully_shard`, and
//! `precompute_float8_dynamic_scale_for_fsdp` after each optimizer step.

use crate::compress::{Compressor, Fp8Format, Memory};
use crate::inputs::model::{ModelProfile, Precision};
use crate::plan::Plan;
use crate::predict::scenario::Scenario;
use crate::search::Choice;
use crate::sharding::{block_of, ParamDtype, Stage};
use crate::strategy::{fsdp_units_plan, merged_blocks, with_root, ShardOptions, StrategyOptions};

/// The blocks per unit `tune --framework fsdp` tries.
const BLOCKS_GRID: [u32; 8] = [1, 2, 3, 4, 6, 8, 12, 16];
/// The prefetch depths it tries (FSDP2's default is one unit).
const PREFETCH_GRID: [u32; 3] = [1, 2, 4];

/// How the model's parameters are grouped into units.
#[derive(Clone, Debug, PartialEq)]
pub enum FsdpUnits {
    /// `fully_shard` on every run of this many consecutive blocks (FSDP's usual wrapping: 1).
    Blocks(u32),
    /// The tensors of each unit but the root, in the plan's order: whole modules each.
    Explicit(Vec<Vec<usize>>),
}

/// The FSDP2 settings an export writes.
#[derive(Clone, Debug, PartialEq)]
pub struct FsdpSettings {
    /// The units.
    pub units: FsdpUnits,
    /// Units gathered ahead of the one computing, in forward and in backward (at least one).
    pub prefetch: u32,
    /// `reshard_after_forward` of every unit but the root.
    pub reshard_after_forward: bool,
    /// `MixedPrecisionPolicy.param_dtype`.
    pub param_dtype: ParamDtype,
    /// `MixedPrecisionPolicy.reduce_dtype`: none (fp32) or bf16.
    pub reduce: Compressor,
    /// Hybrid sharding (HSDP): a 2-D mesh, sharded over each node's ranks, replicated across
    /// nodes.
    pub hybrid: bool,
    /// torchao's float8 linears, their weights gathered in float8.
    pub float8_all_gather: bool,
}

impl FsdpSettings {
    /// FSDP's defaults: a unit per block, one unit prefetched, resharded after forward, fp32.
    pub fn defaults() -> FsdpSettings {
        FsdpSettings {
            units: FsdpUnits::Blocks(1),
            prefetch: 1,
            reshard_after_forward: true,
            param_dtype: ParamDtype::Fp32,
            reduce: Compressor::None,
            hybrid: false,
            float8_all_gather: false,
        }
    }

    pub(super) fn compression(&self) -> Choice {
        (self.reduce, Memory::None)
    }

    /// The precision the settings trade for speed: float8 when they gather weights in it, bf16
    /// when they gather or reduce in it.
    pub(super) fn precision(&self) -> Choice {
        if self.float8_all_gather {
            FLOAT8_GATHERS
        } else if self.param_dtype == ParamDtype::Bf16 {
            (Compressor::Bf16, Memory::None)
        } else {
            self.compression()
        }
    }

    pub(super) fn has_default_fusion(&self) -> bool {
        self.units == FsdpUnits::Blocks(1)
            && self.prefetch == 1
            && self.reshard_after_forward
            && !self.hybrid
    }

    fn options(&self, blocks_per_unit: u32) -> StrategyOptions {
        StrategyOptions {
            compressor: self.reduce,
            sharding: ShardOptions {
                prefetch: self.prefetch,
                reshard_after_forward: self.reshard_after_forward,
                param_dtype: self.param_dtype,
                blocks_per_unit,
                float8_all_gather: self.float8_all_gather,
                ..ShardOptions::default()
            },
            ..StrategyOptions::default()
        }
    }

    /// The units but the root, as `fully_shard` is called on them.
    fn inner_units(&self, model: &ModelProfile) -> Vec<Vec<usize>> {
        match &self.units {
            FsdpUnits::Blocks(k) => {
                let (mut units, root) = merged_blocks(model, *k);
                if let Some(root) = root {
                    units.remove(root);
                }
                units
            }
            FsdpUnits::Explicit(units) => units.clone(),
        }
    }

    pub(super) fn plan(&self, scenario: &Scenario) -> Plan {
        let layout = Layout::of(self.inner_units(&scenario.model), &scenario.model);
        let blocks = match self.units {
            FsdpUnits::Blocks(k) => k,
            FsdpUnits::Explicit(_) => 1,
        };
        fsdp_units_plan(
            "fsdp",
            scenario,
            &self.options(blocks),
            (layout.groups, layout.root),
            self.hybrid,
        )
    }

    pub(super) fn describe(&self) -> String {
        let units = match &self.units {
            FsdpUnits::Blocks(1) => "a unit per block".to_string(),
            FsdpUnits::Blocks(k) => format!("a unit per {k} blocks"),
            FsdpUnits::Explicit(units) => format!("{} units", units.len() + 1),
        };
        let hybrid = if self.hybrid { ", hybrid (HSDP)" } else { "" };
        let float8 = if self.float8_all_gather {
            " (linears float8)"
        } else {
            ""
        };
        format!(
            "{units}{hybrid}, prefetch {}, reshard after forward {}, param {}{float8}, reduce {}",
            self.prefetch,
            self.reshard_after_forward,
            self.param_dtype.name(),
            dtype_name(self.reduce)
        )
    }

    /// What the prediction leaves out: FSDP2 computes in `param_dtype` and torchao's float8
    /// linears in float8; the profile's compute is its own, mixed precision (fp16) at best.
    pub(super) fn caveats(&self, model: &ModelProfile) -> Vec<String> {
        let precision = model.arithmetic.as_ref().map(|a| a.precision);
        let recorded = precision.map_or("precision not recorded", |p| match p {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
        });
        let mut caveats = Vec::new();
        if self.param_dtype == ParamDtype::Bf16 && precision != Some(Precision::Fp16) {
            caveats.push(format!(
                "param_dtype bf16: FSDP2 runs forward and backward in bf16, while the predicted compute is the profile's ({recorded}); the gathers and memory are priced in bf16"
            ));
        }
        if self.float8_all_gather {
            caveats.push(format!(
                "float8 linears: torchao runs their matrix products in float8 (GPUs with float8 tensor cores, compute capability 8.9 or later) and casts their inputs and gradients each iteration, while the predicted compute is the profile's ({recorded}); record the profile under float8 training for it. The gathers and memory are priced in float8"
            ));
        }
        caveats
    }

    /// The flags of `simulate --strategy fsdp` for block units; explicit units need `--plan`.
    pub(super) fn simulate_flags(&self) -> Option<Vec<String>> {
        let FsdpUnits::Blocks(k) = self.units else {
            return None;
        };
        let mut flags: Vec<String> = [
            "--strategy",
            if self.hybrid { "hsdp" } else { "fsdp" },
            "--framework",
            "pytorch-fsdp",
            "--blocks-per-unit",
        ]
        .map(str::to_string)
        .to_vec();
        flags.extend([
            k.to_string(),
            "--prefetch".to_string(),
            self.prefetch.to_string(),
            "--reshard-after-forward".to_string(),
            self.reshard_after_forward.to_string(),
            "--param-dtype".to_string(),
            self.param_dtype.name().to_string(),
        ]);
        if self.float8_all_gather {
            flags.push("--float8-all-gather".to_string());
        }
        if self.reduce != Compressor::None {
            flags.extend(["--compressor".to_string(), self.reduce.to_string()]);
        }
        Some(flags)
    }

    /// A Python module whose `shard(model, mesh)` applies `fully_shard` with these settings.
    pub(super) fn render(&self, model: &ModelProfile) -> String {
        let modules = Layout::of(self.inner_units(model), model).modules;
        let listed: Vec<String> = modules
            .iter()
            .map(|names| {
                let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
                format!("    [{}],\n", quoted.join(", "))
            })
            .collect();
        let prefetch = if self.prefetch > 1 {
            "    # More than FSDP2's one unit ahead: each unit issues the next units' all-gathers.\n    for i, unit in enumerate(units):\n        unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + PREFETCH])\n        unit.set_modules_to_backward_prefetch(units[max(0, i - PREFETCH):i][::-1])\n"
        } else {
            ""
        };
        // HSDP is FSDP2 on a 2-D mesh: replicate across nodes, shard inside each.
        let (mesh_doc, mesh_code) = match self.hybrid {
            true => (
                "`mesh`: a 2-D DeviceMesh whose dimensions are the nodes (replicated) and each node's ranks (sharded); by default\n    the one `hybrid_mesh()` builds.",
                "    if mesh is None:\n        mesh = hybrid_mesh()\n",
            ),
            false => ("`mesh`: FSDP2's (the default, every rank).", ""),
        };
        let hybrid_mesh = match self.hybrid {
            true => "\n\ndef hybrid_mesh(device_type=\"cuda\"):\n    \"\"\"HSDP's mesh: each node's ranks (torchrun's LOCAL_WORLD_SIZE) shard, the nodes replicate.\"\"\"\n    import os\n\n    import torch.distributed as dist\n    from torch.distributed.device_mesh import init_device_mesh\n\n    per_node = int(os.environ[\"LOCAL_WORLD_SIZE\"])\n    return init_device_mesh(device_type, (dist.get_world_size() // per_node, per_node),\n                            mesh_dim_names=(\"replicate\", \"shard\"))\n",
            false => "",
        };
        let float8 = self.float8_code(model);
        format!(
            "# FSDP2 (torch.distributed.fsdp.fully_shard, PyTorch 2.6 or later).\nimport torch\nfrom torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n{}\n# The units in forward order, each the submodules one fully_shard call groups; the rest of\n# the model is the root unit.\nUNITS = [\n{}]\nPREFETCH = {}\n{}\n\ndef shard(model, mesh=None):\n    \"\"\"Shards `model` in place with the exported units and settings and returns it;\n    {mesh_doc}\"\"\"\n{mesh_code}{}    policy = MixedPrecisionPolicy(param_dtype={}, reduce_dtype={})\n    units = []\n    for names in UNITS:\n        modules = [model.get_submodule(name) for name in names]\n        fully_shard(modules, mesh=mesh, reshard_after_forward={}, mp_policy=policy)\n        units.append(modules[0])\n    # The root keeps its parameters after forward: backward needs them first.\n    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=policy)\n{}    return model\n{}{hybrid_mesh}",
            float8.import,
            listed.concat(),
            self.prefetch,
            float8.linears,
            float8.convert,
            torch_dtype(self.param_dtype == ParamDtype::Bf16),
            torch_dtype(self.reduce == Compressor::Bf16),
            python_bool(self.reshard_after_forward),
            prefetch,
            float8.after_step,
        )
    }

    /// The lines torchao's float8 gathers add to the module (all empty without them).
    fn float8_code(&self, model: &ModelProfile) -> Float8Code {
        if !self.float8_all_gather {
            return Float8Code::default();
        }
        let mut weights: Vec<_> = model
            .tensors
            .iter()
            .filter(|t| t.is_float8_linear_weight())
            .collect();
        weights.sort_by_key(|t| t.registration_index);
        let linears: Vec<String> = weights
            .into_iter()
            .filter_map(|t| t.name.strip_suffix(".weight"))
            .map(|module| format!("    \"{module}\",\n"))
            .collect();
        Float8Code {
            import: "from torchao.float8 import (Float8LinearConfig, convert_to_float8_training,\n                            precompute_float8_dynamic_scale_for_fsdp)\n",
            linears: format!("# The nn.Linear modules torchao makes float8 linears (their dimensions are multiples of 16):\n# FSDP2 gathers their weights in float8.\nFLOAT8_LINEARS = {{\n{}}}\n", linears.concat()),
            convert: "    # Before fully_shard, as torchao asks.\n    convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True),\n                               module_filter_fn=lambda module, name: name in FLOAT8_LINEARS)\n",
            after_step: "\n\ndef after_step(model):\n    \"\"\"Call once before the first forward and after every optimizer.step(): one all-reduce agrees\n    on each float8 weight's scale, which the gathers until the next step cast with (without it,\n    each gather all-reduces its own weights' maxima).\"\"\"\n    precompute_float8_dynamic_scale_for_fsdp(model)\n",
        }
    }
}

/// torchao's lines in an exported module.
#[derive(Default)]
struct Float8Code {
    import: &'static str,
    linears: String,
    convert: &'static str,
    after_step: &'static str,
}

fn python_bool(value: bool) -> &'static str {
    if value {
        "True"
    } else {
        "False"
    }
}

fn torch_dtype(bf16: bool) -> &'static str {
    if bf16 {
        "torch.bfloat16"
    } else {
        "torch.float32"
    }
}

fn dtype_name(reduce: Compressor) -> &'static str {
    if reduce == Compressor::Bf16 {
        "bf16"
    } else {
        "fp32"
    }
}

/// Units as FSDP2 forms them: the plan's groups, the root's index among them, and the modules
/// of each unit but the root in forward order.
struct Layout {
    groups: Vec<Vec<usize>>,
    root: Option<usize>,
    modules: Vec<Vec<String>>,
    /// Tensors moved to the root: their module holds parameters of another unit.
    strays: usize,
}

impl Layout {
    /// The layout of `inner` units (the root is every other tensor).
    fn of(inner: Vec<Vec<usize>>, model: &ModelProfile) -> Layout {
        let mut strays = 0;
        let mut units: Vec<(Vec<usize>, Vec<String>)> = Vec::new();
        for mut unit in inner {
            let modules = match module_cover(&unit, model) {
                Ok(modules) => modules,
                Err(left) => {
                    // Without them every other tensor keeps the module that covered it.
                    strays += left.len();
                    unit.retain(|t| !left.contains(t));
                    module_cover(&unit, model).unwrap_or_default()
                }
            };
            if !unit.is_empty() {
                units.push((unit, modules));
            }
        }
        let mut taken = vec![false; model.num_tensors()];
        for &t in units.iter().flat_map(|(unit, _)| unit) {
            taken[t] = true;
        }
        let rest: Vec<usize> = (0..model.num_tensors()).filter(|&t| !taken[t]).collect();
        // Forward order: the reverse of the order the units' gradients are ready in.
        units.sort_by_key(|(unit, _)| std::cmp::Reverse(unit.iter().max().copied()));
        let (units, modules): (Vec<Vec<usize>>, Vec<Vec<String>>) = units.into_iter().unzip();
        let (groups, root) = with_root(units, (!rest.is_empty()).then_some(rest));
        Layout {
            groups,
            root,
            modules,
            strays,
        }
    }
}

/// The fewest modules whose parameters are exactly `unit`'s tensors (names up to a dot), in
/// forward order, or the
/// tensors whose own module holds parameters outside the unit: those no `fully_shard` call can
/// put in it.
fn module_cover(
    unit: &[usize],
    model: &ModelProfile,
) -> std::result::Result<Vec<String>, Vec<usize>> {
    let inside = |prefix: &str| {
        let dotted = format!("{prefix}.");
        model
            .tensors
            .iter()
            .enumerate()
            .all(|(t, tensor)| !tensor.name.starts_with(&dotted) || unit.contains(&t))
    };
    let mut modules: Vec<String> = Vec::new();
    let mut strays = Vec::new();
    // Tensors are in backward order: the modules come out in forward order.
    for &t in unit.iter().rev() {
        let name = &model.tensors[t].name;
        // The shortest prefix of whole components whose module lies inside the unit, and no
        // shorter than the tensor's block: what holds the blocks (GPT-2's `h`, a ModuleList) is
        // iterated, not called, and FSDP2's hooks on a module that is never called never run.
        // (A parameter that is itself numbered, `params.0`, has only its container.)
        let shortest = block_of(name)
            .map_or(0, |block| block.trim_end_matches('.').len())
            .min(name.rfind('.').unwrap_or(0));
        let cover = name
            .match_indices('.')
            .map(|(end, _)| &name[..end])
            .filter(|prefix| prefix.len() >= shortest)
            .find(|prefix| inside(prefix));
        match cover {
            Some(prefix) if !modules.iter().any(|m| m == prefix) => {
                modules.push(prefix.to_string())
            }
            Some(_) => {}
            None => strays.push(t),
        }
    }
    if strays.is_empty() {
        Ok(modules)
    } else {
        Err(strays)
    }
}

/// The FSDP2 settings nearest to `plan`; what they cannot express goes to `notes`.
pub(super) fn nearest(plan: &Plan, model: &ModelProfile, notes: &mut Vec<String>) -> FsdpSettings {
    let Some(sharding) = &plan.sharding else {
        notes.push(
            "a replicated plan: FSDP shards parameters, gradients and optimizer states; exported with FSDP's defaults (a unit per block)"
                .to_string(),
        );
        return FsdpSettings::defaults();
    };
    if sharding.stage != Stage::Zero3 {
        notes.push(format!(
            "sharding stage {}: FSDP shards parameters too (stage zero3); export to deepspeed for ZeRO-1 and 2",
            sharding.stage.name()
        ));
    }
    let (reduce, _) = super::uniform_choice(plan, model, "reduce_dtype", notes, expressible);
    let root = sharding.resident.first().copied();
    if sharding.resident.len() > 1 {
        notes.push(format!(
            "{} units kept gathered after forward: FSDP2 keeps the root's, and reshards the others as reshard_after_forward says",
            sharding.resident.len()
        ));
    }
    let inner: Vec<Vec<usize>> = plan
        .groups
        .iter()
        .enumerate()
        .filter(|&(g, _)| Some(g) != root)
        .map(|(_, group)| group.tensors.clone())
        .collect();
    let layout = Layout::of(inner, model);
    if layout.strays > 0 {
        notes.push(format!(
            "{} tensors whose module has parameters in another unit: fully_shard takes whole modules, so they join the root unit",
            layout.strays
        ));
    }
    let groups = u32::try_from(layout.groups.len()).unwrap_or(u32::MAX);
    let blocks =
        (1..=groups).find(|&k| merged_blocks(model, k) == (layout.groups.clone(), layout.root));
    let units = match blocks {
        Some(k) => FsdpUnits::Blocks(k),
        None => FsdpUnits::Explicit(
            layout
                .groups
                .iter()
                .enumerate()
                .filter(|&(g, _)| Some(g) != layout.root)
                .map(|(_, unit)| unit.clone())
                .collect(),
        ),
    };
    if sharding.prefetch == 0 {
        notes.push(
            "no prefetch: FSDP2 always gathers the next unit ahead; exported with one".to_string(),
        );
    }
    if sharding.secondary_within_node {
        notes.push(
            "hpZ (a second shard of each unit inside the node for backward's gathers): FSDP2 has none; exported without"
                .to_string(),
        );
    }
    let param_dtype = match sharding.param_dtype {
        ParamDtype::Int8 => {
            notes.push(
                "parameters gathered in int8 (ZeRO++'s quantized weights): FSDP2 gathers floats; exported in fp32"
                    .to_string(),
            );
            ParamDtype::Fp32
        }
        dtype => dtype,
    };
    FsdpSettings {
        units,
        prefetch: sharding.prefetch.max(1),
        reshard_after_forward: sharding.reshard_after_forward,
        param_dtype,
        reduce,
        hybrid: sharding.within_node,
        float8_all_gather: sharding.float8_all_gather,
    }
}

/// The `reduce_dtype` that runs `choice`: fp32 (none) or bf16, without error feedback.
pub(super) fn expressible(choice: Choice) -> Option<Choice> {
    match choice {
        (c @ (Compressor::None | Compressor::Bf16), Memory::None) => Some((c, Memory::None)),
        _ => None,
    }
}

/// The choice that names torchao's float8 gathers among `tune`'s.
pub(super) const FLOAT8_GATHERS: Choice = (Compressor::Fp8(Fp8Format::E4m3), Memory::None);

/// The settings `tune --framework fsdp` tries: units of 1 to 16 blocks, prefetch 1 to 4,
/// resharding or not, bf16 gathers and reductions when `choices` name bf16, and torchao's
/// float8 gathers when they name `fp8:e4m3`.
pub(super) fn candidates(choices: &[Choice]) -> Vec<FsdpSettings> {
    let bf16 = choices.contains(&(Compressor::Bf16, Memory::None));
    let float8 = choices.contains(&FLOAT8_GATHERS);
    let precisions: Vec<(ParamDtype, Compressor)> = [
        (ParamDtype::Fp32, Compressor::None),
        (ParamDtype::Bf16, Compressor::None),
        (ParamDtype::Bf16, Compressor::Bf16),
        (ParamDtype::Fp32, Compressor::Bf16),
    ]
    .into_iter()
    .filter(|&(param, reduce)| bf16 || (param == ParamDtype::Fp32 && reduce == Compressor::None))
    .collect();
    let mut all = Vec::new();
    for k in BLOCKS_GRID {
        for prefetch in PREFETCH_GRID {
            for reshard_after_forward in [true, false] {
                for &(param_dtype, reduce) in &precisions {
                    for (hybrid, float8_all_gather) in
                        [(false, false), (true, false), (false, true), (true, true)]
                    {
                        if float8_all_gather && !float8 {
                            continue;
                        }
                        all.push(FsdpSettings {
                            units: FsdpUnits::Blocks(k),
                            prefetch,
                            reshard_after_forward,
                            param_dtype,
                            reduce,
                            hybrid,
                            float8_all_gather,
                        });
                    }
                }
            }
        }
    }
    all
}
