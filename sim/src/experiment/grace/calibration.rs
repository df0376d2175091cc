//! The calibrated inputs of the GRACE experiment (model profiles, cluster, device), the predictions they make, and loading them.

use super::files::{fitted_marker, CLUSTER_FILE};
use super::measured::Measurement;
use super::{GraceSpec, Implementation, MethodSpec, OpWork};
use crate::compress::{GPU_BANDWIDTH_EFFICIENCY, GPU_LAUNCH_US};
use crate::device::{CodecCost, CostCurve, DeviceProfile};
use crate::error::{Result, SimError};
use crate::experiment::resolve;
use crate::model::ModelProfile;
use crate::plan::Scheme;
use crate::scenario::Scenario;
use crate::simulate::{simulate, SimOptions};
use crate::strategy::{Strategy, StrategyOptions};
use crate::topology::{Cluster, ClusterOverrides, Library, TcpParams};
use std::collections::BTreeMap;
use std::path::Path;

/// The calibrated inputs: one model profile per GRACE model, the cluster and its device.
#[derive(Clone)]
pub struct Calibration {
    pub models: BTreeMap<String, ModelProfile>,
    pub cluster: Cluster,
    pub device: DeviceProfile,
}

/// The price of GRACE's codec work on its testbed: a fixed cost per TensorFlow op (dispatch and
/// launch) and a cost per byte its ops move. The op price is each compressor's own (its ops are
/// different kernels); the byte price is one for every compressor (their ops all move bytes
/// through the same GPU memory). Fitted at the calibration workers; the method's
/// [`Implementation`] says how many ops and bytes each phase has.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpCost {
    pub us_per_op: f64,
    pub ns_per_byte: f64,
}

impl OpCost {
    /// A bandwidth-bound GPU kernel on `device`: the catalog fallback's launch floor and
    /// memory-bandwidth efficiency, from which the fit starts and toward which it breaks ties.
    pub fn base(device: &DeviceProfile) -> OpCost {
        OpCost {
            us_per_op: GPU_LAUNCH_US,
            ns_per_byte: 1.0 / (device.memory_bandwidth_gbytes_per_s * GPU_BANDWIDTH_EFFICIENCY),
        }
    }

    /// The curve of `work` at this price.
    fn curve(&self, work: OpWork) -> CostCurve {
        CostCurve {
            floor_us: f64::from(work.ops) * self.us_per_op,
            ns_per_element: work.bytes_per_element * self.ns_per_byte,
        }
    }
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
        plan.wire = spec.wire;
        plan.codec_calls = method.codec_calls.unwrap_or(spec.codec_calls);
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
            *p = TcpParams {
                tcp_efficiency: tcp,
                message_overhead_us: overhead,
                call_overhead_us: 0.0,
                reduce_gbytes_per_s: reduce,
                // The costs varied here, not a sweep's times, price the collectives.
                measured: Vec::new(),
                ..p.clone()
            };
        }
        c
    }

    /// This calibration with `key`'s codec priced as `implementation` at `cost`: its encode,
    /// each payload's decode and the decode call's own part.
    pub fn with_codec(
        &self,
        key: &str,
        implementation: &Implementation,
        cost: OpCost,
    ) -> Result<Calibration> {
        let mut c = self.clone();
        let provenance = self.device.codec_cost(key)?.provenance.clone();
        c.device.compression.insert(
            key.to_string(),
            CodecCost {
                encode: cost.curve(implementation.encode),
                decode: cost.curve(implementation.payload),
                aggregate: cost.curve(implementation.call),
                provenance,
            },
        );
        Ok(c)
    }
}

/// Each fitted method's price, read back from a fitted device: its payload decode curve over
/// the implementation's payload ops and bytes. Methods the fit did not price (no GRACE rows)
/// are left out, as the fit leaves them out.
pub fn op_costs(
    fitted: &DeviceProfile,
    methods: &BTreeMap<String, MethodSpec>,
) -> Result<BTreeMap<String, OpCost>> {
    let mut costs = BTreeMap::new();
    for (name, method) in methods {
        if let (Some(implementation), Some(key)) = (&method.implementation, method.key()?) {
            let cost = fitted.codec_cost(key)?;
            if !cost.provenance.method.starts_with(&fitted_marker(name)) {
                continue;
            }
            let decode = cost.decode;
            let payload = implementation.payload;
            costs.insert(
                name.clone(),
                OpCost {
                    us_per_op: decode.floor_us / f64::from(payload.ops.max(1)),
                    ns_per_byte: decode.ns_per_element
                        / payload.bytes_per_element.max(f64::MIN_POSITIVE),
                },
            );
        }
    }
    Ok(costs)
}
