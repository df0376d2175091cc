//! Memory per rank: what a lowered plan keeps on each device, against the device's capacity.
//!
//! Training in fp32, one rank holds its parameters (whole, or its shard under ZeRO-3), its
//! gradients (each group's fusion buffer, as the schedule lays them; under ZeRO-2 and 3 its
//! shard plus the unsharded gradients of the two largest units, one being reduce-scattered
//! while the next fills, as DeepSpeed's double-buffered buckets and FSDP's unit-by-unit reduction
//! hold them), the optimizer's state per element (whole, or its shard from ZeRO-1 on), the
//! units gathered at once under ZeRO-3 (`prefetch` + 1 units in a pass, the resident ones
//! throughout, every unit when nothing is freed after forward), a compute copy of the
//! parameters when ZeRO-1 or 2 gathers them in a lower precision, and error-feedback memory.
//! Activations are not in the model profiles: they are reported as missing, and a plan that
//! fits is one whose model states fit.

use crate::base::error::{Result, SimError};
use crate::inputs::device::DeviceProfile;
use crate::inputs::model::ModelProfile;
use crate::plan::Plan;
use crate::predict::scenario::Scenario;
use crate::schedule::{lower, Buffer, Schedule};
use crate::sharding::{shard_numel, Sharding};
use serde::Serialize;

/// Bytes of an fp32 element.
const FP32: u64 = 4;

/// One rank's memory for a plan, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemoryUse {
    /// Parameters kept between iterations (whole, or the rank's shard).
    pub parameters_bytes: u64,
    /// Gradients at their peak.
    pub gradients_bytes: u64,
    /// Optimizer state (whole, or the rank's shard); absent when the profile does not say
    /// what the optimizer keeps.
    pub optimizer_bytes: Option<u64>,
    /// Parameters gathered at once beyond the rank's own (ZeRO-3's units and hpZ's second
    /// shards, ZeRO-1/2's compute copy in a lower precision).
    pub gathered_bytes: u64,
    /// Error-feedback memory of compressed groups.
    pub compression_bytes: u64,
    /// The sum of the above: the model states, activations not included.
    pub model_states_bytes: u64,
    /// What autograd keeps from forward for backward at the profile's batch per GPU (whatever
    /// the plan), if the profile states it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activation_bytes: Option<u64>,
    /// The device's memory, if its profile states it.
    pub capacity_bytes: Option<u64>,
}

impl MemoryUse {
    /// The model states and, when the profile states them, the activations.
    pub fn total_bytes(&self) -> u64 {
        self.model_states_bytes
            .saturating_add(self.activation_bytes.unwrap_or(0))
    }

    /// Whether the model states and the activations the profile states fit the device (true
    /// when its capacity is unknown).
    pub fn fits(&self) -> bool {
        self.capacity_bytes
            .is_none_or(|capacity| self.total_bytes() <= capacity)
    }

    /// An error naming the plan when the model states (and activations) do not fit the device.
    pub fn check_fits(&self, label: &str, device: &DeviceProfile) -> Result<()> {
        let (what, counted) = match self.activation_bytes {
            Some(_) => (
                "model states and activations",
                "activations at the profile's batch",
            ),
            None => ("model states", "activations not in the profile"),
        };
        match self.capacity_bytes {
            Some(capacity) if !self.fits() => Err(SimError::bad_value(
                label,
                format!("{:.1} GiB of {what} per rank", gib(self.total_bytes())),
                format!(
                    "does not fit the {:.0} GiB of a {} ({counted}): shard it (simulate --strategy zero1, zero2 or fsdp; tune --framework fsdp), or use more ranks",
                    gib(capacity),
                    device.name
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// An error naming `label` when `plan`'s model states per rank do not fit the scenario's device.
pub fn check_plan_fits(scenario: &Scenario, plan: &Plan, label: &str) -> Result<()> {
    // Memory does not depend on the stream a codec set runs on: lowered as the plan says.
    let schedule = lower(
        &scenario.model,
        scenario.world(),
        scenario.cpu_ranks(),
        plan,
        &format!("strategy {}", plan.strategy),
    )?;
    memory_use(&scenario.model, plan, &schedule, &scenario.device)
        .check_fits(label, &scenario.device)
}

/// Bytes in GiB, for messages.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// One rank's memory when `schedule` (lowered from `plan` for `model`) runs on `device`.
pub fn memory_use(
    model: &ModelProfile,
    plan: &Plan,
    schedule: &Schedule,
    device: &DeviceProfile,
) -> MemoryUse {
    let numel: u64 = model.tensors.iter().map(|t| t.numel).sum();
    // The ranks a unit is split over: every rank, or each node's under hybrid sharding.
    let ranks = plan.sharding.as_ref().map_or(schedule.world.ranks(), |s| {
        s.shard_ranks(schedule.world.ranks(), schedule.world.ranks_per_node)
    });
    let units: Vec<u64> = schedule.buffers.iter().map(|b| b.numel).collect();
    let sharding = plan.sharding.as_ref().filter(|_| ranks > 1);
    let own = |shards: bool| match shards {
        true => shard_numel(numel, ranks),
        false => numel,
    };
    let stage = sharding.map(|s| s.stage);
    let parameters = own(stage.is_some_and(|s| s.shards_parameters())) * FP32;
    let gradients = match stage {
        Some(stage) if stage.shards_gradients() => {
            let mut largest = units.clone();
            largest.sort_unstable_by(|a, b| b.cmp(a));
            (shard_numel(numel, ranks) + largest.iter().take(2).sum::<u64>()) * FP32
        }
        _ => numel * FP32,
    };
    let optimizer = model.optimizer_state_bytes_per_element.map(|bytes| {
        let elements = own(stage.is_some());
        (bytes * elements as f64).ceil() as u64
    });
    let node_ranks = schedule.world.ranks_per_node;
    let gathered = sharding.map_or(0, |s| {
        gathered_bytes(model, plan, (s, node_ranks), &schedule.buffers, numel)
    });
    let compression: u64 = plan
        .groups
        .iter()
        .zip(&units)
        .filter(|(g, _)| g.memory != crate::compress::Memory::None)
        .map(|(_, &n)| n * FP32)
        .sum();
    let model_states = parameters + gradients + optimizer.unwrap_or(0) + gathered + compression;
    MemoryUse {
        parameters_bytes: parameters,
        gradients_bytes: gradients,
        optimizer_bytes: optimizer,
        gathered_bytes: gathered,
        compression_bytes: compression,
        model_states_bytes: model_states,
        activation_bytes: model.activation_bytes,
        capacity_bytes: device
            .memory_gib
            .map(|gib| (gib * f64::from(1u32 << 30)) as u64),
    }
}

/// Parameters gathered at once beyond the rank's shard: ZeRO-3's units at their peak (and a
/// quantized gather's payload; float8 weights stay float8, a byte each, as torchao computes
/// with them), or ZeRO-1/2's compute copy when the gather's precision is not the stored fp32.
fn gathered_bytes(
    model: &ModelProfile,
    plan: &Plan,
    (sharding, node_ranks): (&Sharding, u32),
    buffers: &[Buffer],
    numel: u64,
) -> u64 {
    let bytes = sharding.param_dtype.gathered_element_bytes();
    if !sharding.stage.shards_parameters() {
        return match bytes == FP32 {
            true => 0,
            false => numel * bytes,
        };
    }
    let units: Vec<u64> = buffers
        .iter()
        .map(|b| b.float8_numel() + (b.numel - b.float8_numel()) * bytes)
        .collect();
    if !sharding.reshard_after_forward {
        return units.iter().sum();
    }
    let resident: u64 = sharding.resident.iter().map(|&g| units[g]).sum();
    // The forward order of the units that are freed; any `prefetch` + 1 in a row are gathered
    // at once (in backward the same units run in the reverse order).
    let order: Vec<usize> = plan
        .forward_order(model)
        .into_iter()
        .filter(|g| !sharding.resident.contains(g))
        .collect();
    let window = sharding.prefetch as usize + 1;
    let peak = order
        .windows(window.min(order.len()).max(1))
        .map(|w| w.iter().map(|&g| units[g]).sum::<u64>())
        .max()
        .unwrap_or(0);
    // A quantized gather's payload lives until it is dequantized: the largest unit's at most.
    let payload = match sharding.param_dtype.quantizer() {
        Some(codec) => buffers
            .iter()
            .map(|b| codec.wire_bytes(b.numel))
            .max()
            .unwrap_or(0),
        None => 0,
    };
    // hpZ keeps every unit's second shard, over the node's ranks, from forward to backward.
    let secondary: u64 = match sharding.secondary_within_node {
        true => buffers
            .iter()
            .map(|b| shard_numel(b.numel, node_ranks))
            .sum(),
        false => 0,
    };
    resident + peak + secondary * bytes + payload
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::topology::{Cluster, ClusterOverrides};
    use crate::predict::scenario::Scenario;
    use crate::predict::simulate::schedule;
    use crate::strategy::{Strategy, StrategyOptions};

    fn memory(strategy: Strategy, nodes: u32) -> (MemoryUse, u64) {
        let overrides = ClusterOverrides {
            nodes: Some(nodes),
            ..ClusterOverrides::default()
        };
        let model = ModelProfile::load("gpt2-xl").unwrap();
        let numel = model.tensors.iter().map(|t| t.numel).sum();
        let scenario = Scenario::new(model, Cluster::load("dgx-h100", overrides).unwrap()).unwrap();
        let plan = strategy
            .plan(&scenario, &StrategyOptions::default())
            .unwrap();
        let schedule = schedule(&scenario, &plan).unwrap();
        (
            memory_use(&scenario.model, &plan, &schedule, &scenario.device),
            numel,
        )
    }

    #[test]
    fn each_stage_shards_what_zero_says_it_does() {
        let (ddp, p) = memory(Strategy::Ddp, 1);
        // Adam in fp32: 4 B of parameters, 4 of gradients and 8 of moments per element.
        assert_eq!(ddp.parameters_bytes, 4 * p);
        assert_eq!(ddp.gradients_bytes, 4 * p);
        assert_eq!(ddp.optimizer_bytes, Some(8 * p));
        assert_eq!(ddp.model_states_bytes, 16 * p);
        let shard = p.div_ceil(8);
        let (zero1, _) = memory(Strategy::Zero1, 1);
        assert_eq!(zero1.optimizer_bytes, Some(8 * shard));
        assert_eq!(zero1.gradients_bytes, 4 * p);
        let (zero2, _) = memory(Strategy::Zero2, 1);
        assert!(zero2.gradients_bytes < zero1.gradients_bytes);
        assert!(zero2.gradients_bytes > 4 * shard);
        let (fsdp, _) = memory(Strategy::Fsdp, 1);
        assert_eq!(fsdp.parameters_bytes, 4 * shard);
        assert!(fsdp.gathered_bytes > 0 && fsdp.gathered_bytes < 4 * p / 4);
        assert!(fsdp.model_states_bytes < zero2.model_states_bytes);
        // More ranks, smaller shards.
        let (wider, _) = memory(Strategy::Fsdp, 4);
        assert!(wider.model_states_bytes < fsdp.model_states_bytes);
    }

    #[test]
    fn a_plan_that_does_not_fit_is_refused_naming_the_device() {
        let (mut ddp, _) = memory(Strategy::Ddp, 1);
        let device = DeviceProfile::load("h100-sxm5-80gb").unwrap();
        assert!(ddp.fits());
        ddp.check_fits("tune", &device).unwrap();
        ddp.capacity_bytes = Some(1 << 30);
        assert!(!ddp.fits());
        let err = ddp.check_fits("tune", &device).unwrap_err().to_string();
        assert!(
            err.contains("h100-sxm5-80gb") && err.contains("fsdp"),
            "{err}"
        );
        ddp.capacity_bytes = None;
        assert!(ddp.fits());
    }

    #[test]
    fn activations_the_profile_states_count_against_the_device() {
        let (mut ddp, _) = memory(Strategy::Ddp, 1);
        let device = DeviceProfile::load("h100-sxm5-80gb").unwrap();
        let capacity = ddp.capacity_bytes.unwrap();
        assert_eq!(ddp.total_bytes(), ddp.model_states_bytes);
        // States that fit, with activations that fill the rest and one byte more.
        ddp.activation_bytes = Some(capacity - ddp.model_states_bytes + 1);
        assert!(!ddp.fits());
        let err = ddp.check_fits("tune", &device).unwrap_err().to_string();
        assert!(err.contains("model states and activations"), "{err}");
        // A profile stating more than any device holds is refused by field.
        let mut model = ModelProfile::load("gpt2-xl").unwrap();
        model.activation_bytes = Some(u64::MAX);
        let err = model.validate("p").unwrap_err().to_string();
        assert!(err.contains("activation_bytes"), "{err}");
    }
}
