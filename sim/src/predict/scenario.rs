//! A scenario: a model on a cluster with its device profiles resolved and checked; plans run on it.

use crate::base::error::{Result, SimError};
use crate::base::time::SimTime;
use crate::codec::CodecSet;
use crate::inputs::carry::carry;
use crate::inputs::device::{DeviceKind, DeviceProfile};
use crate::inputs::framework::{Framework, HostStaging};
use crate::inputs::model::ModelProfile;
use crate::inputs::topology::{Cluster, TcpParams};
use crate::plan::{CodecStream, Group, Plan, Policy};
use crate::predict::contention::collective_slowdown;
use crate::schedule::World;

/// Everything a simulation needs besides the plan, validated against each other.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The model being trained.
    pub model: ModelProfile,
    /// The cluster it trains on.
    pub cluster: Cluster,
    /// The cluster's GPU (or host) profile: compression costs and contention.
    pub device: DeviceProfile,
    /// Run compression kernels on the host CPU with this profile's cost curves (kind `cpu`)
    /// instead of on the GPU.
    pub host_codec: Option<DeviceProfile>,
    /// Multiplier on the model's compute times: 1, unless the profile could not be carried
    /// step by step (`crate::inputs::carry`) and the devices' `compute_speed_vs_v100` carry it
    /// whole.
    pub compute_scale: f64,
    /// The model's compute time on the cluster's device over its time on the device it was
    /// measured on (1 when they are the same device).
    pub compute_ratio: f64,
    /// The framework that runs the plan, whose per-call costs the cost pass adds (none: the
    /// plan's steps alone, as `exec`'s backends run them).
    pub framework: Option<Framework>,
    /// The codec set whose implementations compress the plans (their costs are already in
    /// `device`); none: the device profile's own curves.
    pub codecs: Option<CodecSet>,
    /// How much compute slows while a collective's kernels share the device
    /// (`crate::predict::contention::collective_slowdown`).
    pub collective_slowdown: f64,
    /// The library's host staging, where the framework copies on the compute stream
    /// (`HostStaging::ComputeStream`): taken out of the cluster's collectives, which then price
    /// only their transfers, and charged to the compute steps by the cost pass.
    pub staged_on_compute: Option<TcpParams>,
}

impl Scenario {
    /// Resolves the cluster's device and the model's measurement device, and carries the model's
    /// compute from the one to the other.
    pub fn new(model: ModelProfile, cluster: Cluster) -> Result<Scenario> {
        let device = DeviceProfile::load(&cluster.device).map_err(|e| {
            SimError::invalid(
                &cluster.name,
                "device",
                format!("`{}`: {e}", cluster.device),
            )
        })?;
        let (model, compute_scale, compute_ratio) = carried(model, &device)?;
        let mut scenario = Scenario {
            model,
            compute_ratio,
            cluster,
            device,
            host_codec: None,
            compute_scale,
            framework: None,
            codecs: None,
            collective_slowdown: 1.0,
            staged_on_compute: None,
        };
        scenario.collective_slowdown =
            collective_slowdown(&scenario.model, &scenario.cluster, &scenario.device)?;
        Ok(scenario)
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

    /// Whether a collective call holds the computing thread until it completes: a framework
    /// that calls them synchronously (`Framework::host_calls_block`) on CPU ranks, which have
    /// no streams to queue them on.
    pub fn calls_hold_compute(&self) -> bool {
        self.cpu_ranks()
            && self
                .framework
                .as_ref()
                .is_some_and(|framework| framework.host_calls_block)
    }

    /// Run plans under `framework`'s costs. A framework that makes a host library's copies on
    /// the compute stream moves them out of the collectives (`staged_on_compute`).
    pub fn with_framework(mut self, framework: Option<Framework>) -> Scenario {
        if let (Some(staged), Some(params)) = (
            self.staged_on_compute.take(),
            self.cluster.library.tcp_mut(),
        ) {
            params.host_staging_gbytes_per_s = staged.host_staging_gbytes_per_s;
        }
        let on_compute = framework
            .as_ref()
            .is_some_and(|f| f.host_staging == HostStaging::ComputeStream);
        if let (true, Some(params)) = (on_compute, self.cluster.library.tcp_mut()) {
            if params.host_staging_gbytes_per_s.is_some() {
                self.staged_on_compute = Some(params.clone());
                params.host_staging_gbytes_per_s = None;
            }
        }
        self.framework = framework;
        self
    }

    /// A plan of the scenario's model with `groups` and `policy`, its codecs on the scenario's
    /// stream: the plans strategies and searches make here start from it.
    pub fn plan(&self, strategy: &str, groups: Vec<Group>, policy: Policy) -> Plan {
        let mut plan = Plan::new(strategy, &self.model, groups, policy);
        plan.codec_stream = self.codec_stream();
        plan
    }

    /// The stream a plan's codecs run on here: the codec set's, or a stream of their own.
    pub fn codec_stream(&self) -> CodecStream {
        self.codecs
            .as_ref()
            .map_or(CodecStream::Side, |set| set.stream)
    }

    /// Price the compressors `codecs` implements as that set writes them, each op at the set's
    /// own kernel launch or at the framework's op cost (set the framework first): a plan
    /// compressed by them pays what they launch.
    pub fn with_codecs(mut self, codecs: Option<CodecSet>) -> Result<Scenario> {
        let Some(codecs) = codecs else {
            return Ok(self);
        };
        let Some(priced) = codecs.priced_on(&self.device, self.framework.as_ref()) else {
            return Err(SimError::invalid(
                &codecs.name,
                "codecs",
                "are framework ops, priced by the framework that runs the plan: name one (--framework)",
            ));
        };
        // Each set's curves within the limits a measured profile's are held to.
        priced.validate(&format!("{} priced by codecs {}", priced.name, codecs.name))?;
        self.device = priced;
        self.codecs = Some(codecs);
        Ok(self)
    }

    /// A compute step's time on the scenario's device, from its profiled time.
    pub fn compute_time(&self, profiled_us: f64) -> SimTime {
        SimTime::from_us(profiled_us * self.compute_scale)
    }

    /// The same model on a single GPU of the same cluster, trained without a data-parallel
    /// framework: the scaling baseline.
    pub fn single_gpu(&self) -> Scenario {
        let mut single = self.clone();
        single.cluster.nodes = 1;
        single.cluster.gpus_per_node = 1;
        single.with_framework(None)
    }
}

/// The model as it computes on `device`, with the factor left on its times and the ratio of its
/// compute time there to its measured one. A profile's device names the hardware: a model whose
/// `device` is the cluster's (by name, or a file of that name, e.g. one re-profiled by `profile
/// --backend cuda --name h100-sxm5-80gb`) keeps its measured times, whatever the two files'
/// peaks say.
fn carried(model: ModelProfile, device: &DeviceProfile) -> Result<(ModelProfile, f64, f64)> {
    if model.device == device.name {
        return Ok((model, 1.0, 1.0));
    }
    let measured_on = DeviceProfile::load(&model.device).map_err(|e| {
        SimError::invalid(&model.name, "device", format!("`{}`: {e}", model.device))
    })?;
    if measured_on.name == device.name {
        return Ok((model, 1.0, 1.0));
    }
    Ok(match carry(&model, &measured_on, device)? {
        Some((carried, ratio)) => (carried, 1.0, ratio),
        None => {
            let scale = measured_on.compute_speed_vs_v100 / device.compute_speed_vs_v100;
            (model, scale, scale)
        }
    })
}
