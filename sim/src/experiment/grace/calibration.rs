//! The calibrated inputs of the GRACE experiment (model profiles, cluster, device), the predictions they make, and loading them.

use super::files::CLUSTER_FILE;
use super::measured::Measurement;
use super::{GraceSpec, MethodSpec};
use crate::device::DeviceProfile;
use crate::error::{Result, SimError};
use crate::experiment::resolve;
use crate::model::ModelProfile;
use crate::plan::Scheme;
use crate::scenario::Scenario;
use crate::simulate::{simulate, SimOptions};
use crate::strategy::{Strategy, StrategyOptions};
use crate::topology::{Cluster, ClusterOverrides, Library, MpiParams};
use std::collections::BTreeMap;
use std::path::Path;

/// The calibrated inputs: one model profile per GRACE model, the cluster and its device.
#[derive(Clone)]
pub struct Calibration {
    pub models: BTreeMap<String, ModelProfile>,
    pub cluster: Cluster,
    pub device: DeviceProfile,
}

/// Multipliers on a codec's per-kernel floor and per-element slope: two numbers, because
/// GRACE's TensorFlow compressors pay per-tensor op overheads (ResNet-50: 161 tensors) and
/// per-element work (VGG-19: 143 M elements) in proportions one scale cannot match.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecScale {
    pub floor: f64,
    pub slope: f64,
}

impl Calibration {
    /// The shipped inputs the fit starts from.
    pub fn base(spec: &GraceSpec) -> Result<Calibration> {
        let mut device = DeviceProfile::load(&spec.base_device)?;
        // The compute calibration defines this device's speed; profiles stay on the V100 scale.
        device.compute_speed_vs_v100 = 1.0;
        let models = spec
            .models
            .iter()
            .map(|m| Ok((m.grace.clone(), ModelProfile::load(&m.profile)?)))
            .collect::<Result<_>>()?;
        let cluster = Cluster::load(&spec.base_cluster, ClusterOverrides::default())?;
        if !matches!(cluster.library, Library::Mpi(_)) {
            return Err(SimError::invalid(
                "spec.json",
                "base_cluster",
                "GRACE ran Horovod over MPI: the base cluster needs an `mpi` library",
            ));
        }
        Ok(Calibration {
            models,
            cluster,
            device,
        })
    }

    /// The inputs an earlier fit wrote into the experiment directory.
    pub fn fitted(spec: &GraceSpec, dir: &Path) -> Result<Calibration> {
        let cluster_path = dir.join(CLUSTER_FILE).to_string_lossy().into_owned();
        let cluster = Cluster::load(&cluster_path, ClusterOverrides::default())?;
        let device = DeviceProfile::load(&cluster.device)?;
        let models = spec
            .models
            .iter()
            .map(|m| Ok((m.grace.clone(), ModelProfile::load(&resolve(dir, &m.file))?)))
            .collect::<Result<_>>()?;
        Ok(Calibration {
            models,
            cluster,
            device,
        })
    }

    /// Predicted throughput (images/s over all workers) of one GRACE configuration.
    pub fn predict(&self, spec: &GraceSpec, m: &Measurement, method: &MethodSpec) -> Result<f64> {
        let model = self.models.get(&m.model).ok_or_else(|| {
            SimError::invalid(
                "spec.json",
                "models",
                format!("no model for GRACE's `{}`", m.model),
            )
        })?;
        let mut cluster = self.cluster.clone();
        cluster.apply(ClusterOverrides {
            nodes: Some(m.workers),
            gpus_per_node: Some(1),
            inter_gbps: None,
        })?;
        let mut scenario = Scenario::new(model.clone(), cluster)?;
        scenario.device = self.device.clone();
        scenario.compute_scale = 1.0;
        let (compressor, memory) = method.resolve(&m.ratio, &m.memory)?;
        let strategy: Strategy = spec.strategy.parse()?;
        let options = StrategyOptions {
            compressor,
            memory,
            ..StrategyOptions::default()
        };
        let mut plan = strategy.plan(&scenario, &options)?;
        plan.set_scheme(if m.comm_method == "allgather" {
            Scheme::Allgather
        } else {
            Scheme::Allreduce
        });
        Ok(simulate(&scenario, &plan, &SimOptions::default())?
            .summary
            .throughput_samples_per_s)
    }

    /// Mean absolute percentage error over `rows`.
    pub fn mape(&self, spec: &GraceSpec, rows: &[(&Measurement, &MethodSpec)]) -> Result<f64> {
        let mut sum = 0.0;
        for (m, method) in rows {
            sum += (self.predict(spec, m, method)? / m.throughput - 1.0).abs();
        }
        Ok(100.0 * sum / rows.len().max(1) as f64)
    }

    /// This calibration with the cluster's MPI/TCP costs replaced.
    pub fn with_mpi(&self, tcp: f64, overhead: f64, reduce: f64) -> Calibration {
        let mut c = self.clone();
        if let Library::Mpi(p) = &mut c.cluster.library {
            *p = MpiParams {
                tcp_efficiency: tcp,
                message_overhead_us: overhead,
                reduce_gbytes_per_s: reduce,
                host_gbps: p.host_gbps,
                provenance: p.provenance.clone(),
            };
        }
        c
    }

    /// This calibration with `key`'s encode and decode floors and slopes scaled from the base
    /// device's.
    pub fn with_codec_scale(
        &self,
        base: &DeviceProfile,
        key: &str,
        scale: CodecScale,
    ) -> Result<Calibration> {
        let mut c = self.clone();
        let mut cost = base.codec_cost(key)?.clone();
        for curve in [&mut cost.encode, &mut cost.decode] {
            curve.floor_us *= scale.floor;
            curve.ns_per_element *= scale.slope;
        }
        c.device.compression.insert(key.to_string(), cost);
        Ok(c)
    }
}

/// Each covered method's fitted scale, read back as the ratio of its slope to the base device's.
pub fn codec_scales(
    fitted: &DeviceProfile,
    base: &DeviceProfile,
    methods: &BTreeMap<String, MethodSpec>,
) -> Result<BTreeMap<String, CodecScale>> {
    let mut scales = BTreeMap::new();
    for (name, method) in methods
        .iter()
        .filter(|(n, m)| m.compressor.is_some() && n.as_str() != "none")
    {
        let key = method.resolve("0.01", "false")?.0.key();
        let (f, b) = (fitted.codec_cost(key)?, base.codec_cost(key)?);
        if b.encode.ns_per_element > 0.0 && b.encode.floor_us > 0.0 && f != b {
            let scale = CodecScale {
                floor: f.encode.floor_us / b.encode.floor_us,
                slope: f.encode.ns_per_element / b.encode.ns_per_element,
            };
            scales.insert(name.clone(), scale);
        }
    }
    Ok(scales)
}
