//! A scenario: a model on a cluster with its device profiles resolved and checked; plans run on it.

use crate::device::{DeviceKind, DeviceProfile};
use crate::error::{Result, SimError};
use crate::framework::Framework;
use crate::model::ModelProfile;
use crate::schedule::World;
use crate::topology::Cluster;

/// Everything a simulation needs besides the plan, validated against each other.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub model: ModelProfile,
    pub cluster: Cluster,
    /// The cluster's GPU (or host) profile: compression costs and contention.
    pub device: DeviceProfile,
    /// Run compression kernels on the host CPU with this profile's cost curves (kind `cpu`)
    /// instead of on the GPU.
    pub host_codec: Option<DeviceProfile>,
    /// Multiplier on the model profile's compute times to carry them from the device they were
    /// measured on to the cluster's (1 when they are the same device).
    pub compute_scale: f64,
    /// The framework that runs the plan, whose per-call costs the cost pass adds (none: the
    /// plan's steps alone, as `exec`'s backends run them).
    pub framework: Option<Framework>,
}

impl Scenario {
    /// Resolves the cluster's device and the model's measurement device.
    pub fn new(model: ModelProfile, cluster: Cluster) -> Result<Scenario> {
        let device = DeviceProfile::load(&cluster.device).map_err(|e| {
            SimError::invalid(
                &cluster.name,
                "device",
                format!("`{}`: {e}", cluster.device),
            )
        })?;
        let measured_on = DeviceProfile::load(&model.device).map_err(|e| {
            SimError::invalid(&model.name, "device", format!("`{}`: {e}", model.device))
        })?;
        // A profile's name identifies the hardware: a device re-profiled on this machine (e.g.
        // by `profile --backend cuda --name h100-sxm5-80gb`) runs a model captured on that GPU
        // at its captured times, whatever the two files' speed estimates say.
        let compute_scale = if measured_on.name == device.name {
            1.0
        } else {
            measured_on.compute_speed_vs_v100 / device.compute_speed_vs_v100
        };
        Ok(Scenario {
            model,
            cluster,
            device,
            host_codec: None,
            compute_scale,
            framework: None,
        })
    }

    /// Compress on the host CPU described by `profile` (a `cpu` device profile, e.g. measured by
    /// `syncopate profile --backend host`).
    pub fn with_host_codec(mut self, profile: DeviceProfile) -> Result<Scenario> {
        if profile.kind != DeviceKind::Cpu {
            return Err(SimError::bad_value(
                "--cpu-compression",
                &profile.name,
                "needs a device profile of kind `cpu` (measure one with `syncopate profile --backend host`)",
            ));
        }
        self.host_codec = Some(profile);
        Ok(self)
    }

    /// The ranks of the cluster: nodes × GPUs (or processes) per node.
    pub fn world(&self) -> World {
        World {
            nodes: self.cluster.nodes,
            ranks_per_node: self.cluster.gpus_per_node,
        }
    }

    /// Whether the ranks are CPU processes (a `cpu` device): their compression runs on the CPU.
    pub fn cpu_ranks(&self) -> bool {
        self.device.kind == DeviceKind::Cpu
    }

    /// Run plans under `framework`'s costs.
    pub fn with_framework(mut self, framework: Option<Framework>) -> Scenario {
        self.framework = framework;
        self
    }

    /// The same model on a single GPU of the same cluster, trained without a data-parallel
    /// framework: the scaling baseline.
    pub fn single_gpu(&self) -> Scenario {
        let mut single = self.clone();
        single.cluster.nodes = 1;
        single.cluster.gpus_per_node = 1;
        single.framework = None;
        single
    }
}
