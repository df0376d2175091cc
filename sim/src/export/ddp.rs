//! PyTorch DDP's settings: bucket caps, bucket views and a comm hook.
//!
//! Bucket caps are its default pair, one cap, or one per bucket.

use crate::codec::CodecSet;
use crate::compress::{Compressor, Memory};
use crate::inputs::model::ModelProfile;
use crate::plan::Plan;
use crate::predict::scenario::Scenario;
use crate::search::Choice;
use crate::strategy::{ddp_plan, StrategyOptions};

const MIB: u64 = 1 << 20;
/// DDP's own comm hooks as a codec set (`profiles/codecs/pytorch-ddp.json`).
const PYTORCH_DDP_CODECS: &str = "pytorch-ddp";

/// DDP's defaults (torch/nn/parallel/distributed.py): `bucket_cap_mb` 25 MiB and, only when it
/// is left unset, a first bucket of `dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB).
const DEFAULT_CAP: u64 = 25 * MIB;
const DEFAULT_FIRST: u64 = MIB;

/// The uniform caps `tune --framework ddp` tries, in MiB.
const CAP_GRID_MIB: [u64; 12] = [1, 2, 5, 10, 15, 25, 40, 50, 75, 100, 150, 200];

/// PowerSGD's `start_powerSGD_iter` default (torch/distributed/algorithms/ddp_comm_hooks/
/// powerSGD_hook.py): plain allreduce for the first 1,000 iterations, for accuracy; the
/// predicted time is the one after it.
const POWERSGD_START_ITER: u32 = 1000;

/// How DDP caps its buckets.
#[derive(Clone, Debug, PartialEq)]
pub enum DdpCaps {
    /// `bucket_cap_mb` unset: 25 MiB buckets after a 1 MiB first one.
    Default,
    /// `bucket_cap_mb`: every bucket, the first too (PyTorch 2.x), at this many bytes.
    Uniform(u64),
    /// `bucket_cap_mb_list`: bucket i at the i-th cap, the last cap for the rest.
    PerBucket(Vec<u64>),
}

impl DdpCaps {
    /// The size limits the reducer applies, bucket by bucket.
    fn limits(&self) -> Vec<u64> {
        match self {
            DdpCaps::Default => vec![DEFAULT_FIRST, DEFAULT_CAP],
            DdpCaps::Uniform(cap) => vec![*cap],
            DdpCaps::PerBucket(caps) => caps.clone(),
        }
    }
}

/// The settings of `DistributedDataParallel` an export writes.
#[derive(Clone, Debug, PartialEq)]
pub struct DdpSettings {
    /// How the reducer caps its buckets.
    pub caps: DdpCaps,
    /// `gradient_as_bucket_view`: gradients live in their buckets, nothing is copied in or out.
    pub gradient_as_bucket_view: bool,
    /// The comm hook: none, fp16, bf16 or PowerSGD (with error feedback as its memory).
    pub hook: Choice,
}

impl DdpSettings {
    /// `pytorch-ddp`, or its variant without the copies when gradients are bucket views.
    pub(super) fn framework(&self) -> &'static str {
        if self.gradient_as_bucket_view {
            "pytorch-ddp-bucket-view"
        } else {
            "pytorch-ddp"
        }
    }

    pub(super) fn has_default_fusion(&self) -> bool {
        self.caps == DdpCaps::Default && !self.gradient_as_bucket_view
    }

    pub(super) fn plan(&self, scenario: &Scenario) -> Plan {
        let (compressor, memory) = self.hook;
        let options = StrategyOptions {
            compressor,
            memory,
            ..StrategyOptions::default()
        };
        ddp_plan(scenario, &self.caps.limits(), &options)
    }

    pub(super) fn describe(&self) -> String {
        let caps = match &self.caps {
            DdpCaps::Default => "default buckets (1 MiB, then 25 MiB)".to_string(),
            DdpCaps::Uniform(cap) => format!("bucket_cap_mb {}", mib(*cap)),
            DdpCaps::PerBucket(caps) => format!("bucket_cap_mb_list of {}", caps.len()),
        };
        let view = if self.gradient_as_bucket_view {
            ", bucket views"
        } else {
            ""
        };
        format!("{caps}{view}, hook {}", hook_name(self.hook.0))
    }

    /// DDP's own hooks (`profiles/codecs/pytorch-ddp.json`) when one compresses and the set
    /// writes it with the hook's memory (PowerSGD's with error feedback); else the device's
    /// curves.
    pub(super) fn codecs(&self) -> Option<&'static str> {
        let (compressor, memory) = self.hook;
        let written = compressor != Compressor::None
            && CodecSet::load(PYTORCH_DDP_CODECS).is_ok_and(|set| set.writes(&compressor, &memory));
        written.then_some(PYTORCH_DDP_CODECS)
    }

    pub(super) fn simulate_flags(&self) -> Option<Vec<String>> {
        let (first, cap) = match &self.caps {
            DdpCaps::Default => (DEFAULT_FIRST, DEFAULT_CAP),
            DdpCaps::Uniform(cap) => (*cap, *cap),
            DdpCaps::PerBucket(_) => return None,
        };
        let mut flags = vec![
            "--strategy".to_string(),
            "ddp".to_string(),
            "--bucket-mb".to_string(),
            mib(cap),
            "--first-bucket-mb".to_string(),
            mib(first),
            "--framework".to_string(),
            self.framework().to_string(),
        ];
        let (compressor, memory) = self.hook;
        if compressor != Compressor::None {
            flags.extend(["--compressor".to_string(), compressor.to_string()]);
        }
        if memory != Memory::None {
            flags.extend(["--memory".to_string(), memory.to_string()]);
        }
        if let Some(codecs) = self.codecs() {
            flags.extend(["--codecs".to_string(), codecs.to_string()]);
        }
        Some(flags)
    }

    /// A Python function that wraps the user's model in DDP with these settings.
    pub(super) fn render(&self) -> String {
        let mut args = vec![
            "module".to_string(),
            "device_ids=device_ids".to_string(),
            "process_group=process_group".to_string(),
        ];
        match &self.caps {
            DdpCaps::Default => {}
            DdpCaps::Uniform(cap) => args.push(format!("bucket_cap_mb={}", mib(*cap))),
            DdpCaps::PerBucket(caps) => {
                let list: Vec<String> = caps.iter().map(|&c| mib(c)).collect();
                args.push(format!("bucket_cap_mb_list=[{}]", list.join(", ")));
            }
        }
        args.push(format!(
            "gradient_as_bucket_view={}",
            python_bool(self.gradient_as_bucket_view)
        ));
        let mut text = String::from("from torch.nn.parallel import DistributedDataParallel\n");
        let hook = match self.hook {
            (Compressor::Fp16 | Compressor::Bf16, _) => {
                text += "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n";
                format!(
                    "    ddp.register_comm_hook(process_group, default_hooks.{}_compress_hook)\n",
                    hook_name(self.hook.0)
                )
            }
            (Compressor::PowerSgd { rank }, memory) => {
                text += "from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook\n";
                format!(
                    "    # min_compression_rate=0: every matrix is compressed, as the prediction assumes.\n    state = powerSGD_hook.PowerSGDState(\n        process_group=process_group,\n        matrix_approximation_rank={rank},\n        start_powerSGD_iter={POWERSGD_START_ITER},\n        min_compression_rate=0,\n        use_error_feedback={},\n        warm_start=True,\n    )\n    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)\n",
                    python_bool(memory == Memory::Residual)
                )
            }
            _ => String::new(),
        };
        // An older PyTorch would fail on the unknown argument with a TypeError that does not say
        // what to do; the wrap says it before building DDP.
        let mut check = "";
        if let DdpCaps::PerBucket(_) = self.caps {
            text = format!("import inspect\n\n{text}");
            text += "\n# bucket_cap_mb_list: one cap per bucket in MiB, in the order gradients become ready\n# (PyTorch releases that have DistributedDataParallel(bucket_cap_mb_list=...)).\n";
            check = "    if \"bucket_cap_mb_list\" not in inspect.signature(DistributedDataParallel).parameters:\n        raise TypeError(\n            \"these settings give DDP one cap per bucket (bucket_cap_mb_list), which this PyTorch's \"\n            \"DistributedDataParallel does not take (2.15 does): use a PyTorch that has it, or export \"\n            \"a plan whose buckets one bucket_cap_mb forms (simulate --strategy ddp --bucket-mb N --save-plan)\"\n        )\n";
        }
        text += &format!(
            "\n\ndef wrap(module, device_ids=None, process_group=None):\n    \"\"\"`module` in DistributedDataParallel with the exported settings (after init_process_group).\"\"\"\n{check}    ddp = DistributedDataParallel(\n        {},\n    )\n{hook}    return ddp\n",
            args.join(",\n        ")
        );
        text
    }
}

/// The DDP settings nearest to `plan`; what they cannot express goes to `notes`.
pub(super) fn nearest(plan: &Plan, model: &ModelProfile, notes: &mut Vec<String>) -> DdpSettings {
    let order: Vec<usize> = plan.groups.iter().flat_map(|g| g.tensors.clone()).collect();
    let caps = if order.iter().copied().eq(0..model.num_tensors()) {
        let groups: Vec<Vec<u64>> = plan
            .groups
            .iter()
            .map(|g| {
                g.tensors
                    .iter()
                    .map(|&t| model.tensors[t].bytes())
                    .collect()
            })
            .collect();
        caps_for(&groups)
    } else {
        let total = model.total_gradient_bytes();
        let mean = (total / plan.groups.len().max(1) as u64).max(1);
        notes.push(format!(
            "groups that are not runs of the backward order, DDP's bucket order: exported as one cap of {} MiB, the plan's mean group",
            mib(mean)
        ));
        DdpCaps::Uniform(mean)
    };
    let hook = super::uniform_choice(plan, model, "DDP's comm hook", notes, expressible);
    DdpSettings {
        caps,
        gradient_as_bucket_view: true,
        hook,
    }
}

/// Caps that close DDP's buckets exactly at these groups (each a list of tensor sizes in
/// bucket order). A bucket closes with the tensor that takes it to its cap, so group i's cap
/// lies in (its bytes without its last tensor, its bytes]; the last group's has no upper end.
/// DDP's default pair or one cap when one fits every group, else a cap per bucket; a whole
/// MiB where the range holds one.
fn caps_for(groups: &[Vec<u64>]) -> DdpCaps {
    let ranges: Vec<(u64, u64)> = groups
        .iter()
        .enumerate()
        .map(|(i, sizes)| {
            let total: u64 = sizes.iter().sum();
            let last = sizes.last().copied().unwrap_or(0);
            let high = if i + 1 == groups.len() {
                u64::MAX
            } else {
                total
            };
            (total - last, high)
        })
        .collect();
    let fits = |cap: u64, (low, high): (u64, u64)| low < cap && cap <= high;
    if let Some((first, rest)) = ranges.split_first() {
        if fits(DEFAULT_FIRST, *first) && rest.iter().all(|&r| fits(DEFAULT_CAP, r)) {
            return DdpCaps::Default;
        }
    }
    let low = ranges.iter().map(|r| r.0).max().unwrap_or(0);
    let high = ranges.iter().map(|r| r.1).min().unwrap_or(u64::MAX);
    if low < high {
        return DdpCaps::Uniform(pick(low, high));
    }
    DdpCaps::PerBucket(ranges.iter().map(|&(low, high)| pick(low, high)).collect())
}

/// A cap in (low, high], the roundest there: the smallest multiple of a MiB, else of half a
/// MiB, a quarter, ... down to a byte, above `low`. Halvings of a MiB print exactly in decimal,
/// and PyTorch truncates `cap_mb * 2**20` back to the same bytes.
fn pick(low: u64, high: u64) -> u64 {
    let mut step = MIB;
    loop {
        let cap = (low / step + 1).saturating_mul(step);
        if cap <= high || step == 1 {
            return cap.min(high);
        }
        step /= 2;
    }
}

/// The settings `tune --framework ddp` tries: DDP's defaults and every cap of the grid, with
/// and without bucket views, under each hook among `choices` (and none).
pub(super) fn candidates(choices: &[Choice]) -> Vec<DdpSettings> {
    let mut hooks = vec![(Compressor::None, Memory::None)];
    hooks.extend(
        choices
            .iter()
            .copied()
            .filter(|&c| c.0 != Compressor::None && expressible(c) == Some(c)),
    );
    let caps = std::iter::once(DdpCaps::Default)
        .chain(CAP_GRID_MIB.iter().map(|&m| DdpCaps::Uniform(m * MIB)));
    let mut out = Vec::new();
    for caps in caps {
        for &hook in &hooks {
            for gradient_as_bucket_view in [false, true] {
                out.push(DdpSettings {
                    caps: caps.clone(),
                    gradient_as_bucket_view,
                    hook,
                });
            }
        }
    }
    out
}

/// The hook that runs `choice`: DDP's built-in fp16, bf16 and PowerSGD hooks (error feedback
/// as residual memory), or none; `None` when DDP has no hook for it.
pub(super) fn expressible(choice: Choice) -> Option<Choice> {
    match choice {
        (Compressor::None, _) => Some((Compressor::None, Memory::None)),
        (c @ (Compressor::Fp16 | Compressor::Bf16), Memory::None) => Some((c, Memory::None)),
        (c @ Compressor::PowerSgd { .. }, m @ (Memory::None | Memory::Residual)) => Some((c, m)),
        _ => None,
    }
}

fn hook_name(compressor: Compressor) -> &'static str {
    match compressor {
        Compressor::Fp16 => "fp16",
        Compressor::Bf16 => "bf16",
        Compressor::PowerSgd { .. } => "powerSGD",
        _ => "none",
    }
}

fn python_bool(value: bool) -> &'static str {
    if value {
        "True"
    } else {
        "False"
    }
}

/// Bytes in MiB as the shortest decimal that truncates back to them (`bucket_cap_mb` and the
/// CLI's `--bucket-mb` both multiply by 2**20 and truncate).
pub(super) fn mib(bytes: u64) -> String {
    (bytes as f64 / MIB as f64).to_string()
}
