//! The calibrated inputs of the GRACE experiment, the predictions they make, and loading them.
//!
//! The inputs are model profiles, a cluster and a device.

use super::files::{fitted_marker, CLUSTER_FILE};
use super::measured::Measurement;
use super::{GraceSpec, MethodSpec};
use crate::base::error::{Result, SimError};
use crate::codec::{Implementation, OpWork, GPU_BANDWIDTH_EFFICIENCY, GPU_LAUNCH_US};
use crate::experiment::resolve;
use crate::inputs::device::{CodecCost, CostCurve, DeviceProfile};
use crate::inputs::model::ModelProfile;
use crate::inputs::topology::{Cluster, ClusterOverrides, Library, TcpParams};
use crate::plan::Scheme;
use crate::predict::scenario::Scenario;
use crate::predict::simulate::{simulate, SimOptions};
use crate::strategy::{HorovodFusion, Strategy, StrategyOptions};
use std::collections::BTreeMap;
use std::path::Path;

/// The calibrated inputs: one model profile per GRACE model, the cluster and its device.
#[derive(Clone)]
pub(super) struct Calibration {
    pub models: BTreeMap<String, ModelProfile>,
    pub cluster: Cluster,
    pub device: DeviceProfile,
}

/// The price of TensorFlow ops on GRACE's testbed: a fixed cost per op (dispatch and launch) and
/// a cost per byte the ops move.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct OpCost {
    pub us_per_op: f64,
    pub ns_per_byte: f64,
}

impl OpCost {
    /// A bandwidth-bound GPU kernel on `device`: the catalog fallback's launch floor and
    /// memory-bandwidth efficiency, from which the fit starts and toward which it breaks ties.
    pub(super) fn base(device: &DeviceProfile) -> OpCost {
        OpCost {
            us_per_op: GPU_LAUNCH_US,
            ns_per_byte: 1.0 / (device.memory_bandwidth_gbytes_per_s * GPU_BANDWIDTH_EFFICIENCY),
        }
    }

    /// This price and its multiples of `base`'s, for provenance and reports.
    pub(super) fn describe(&self, base: &OpCost) -> String {
        format!(
            "{:.2} us per op and {:.5} ns per byte ({:.2}x and {:.2}x the base)",
            self.us_per_op,
            self.ns_per_byte,
            self.us_per_op / base.us_per_op,
            self.ns_per_byte / base.ns_per_byte
        )
    }

    /// The curve of `work` at this price. GRACE's TensorFlow compressors declare no fresh
    /// memory (TensorFlow's GPU allocator reuses its own).
    fn curve(&self, work: OpWork) -> CostCurve {
        work.curve(self.us_per_op, self.ns_per_byte, None)
    }
}

/// The price of one compressor's codec work. Its encode's op price is its own: the encode's
/// kernels (`top_k`, random draws, masks, gathers) are the compressor's. Its decode (each
/// payload's slice, casts, scaling or scatter into zeros, and the call's `add_n` and average) is
/// the same few elementwise kernels whatever the compressor, so one decode op price serves every
/// compressor: an op price of the compressor's own, fitted on rows its encode dominates, would
/// carry whatever else those rows expose into every payload, and a rank decodes one payload per
/// worker. The byte price is one for every op of every compressor (they all move bytes through
/// the same GPU memory). Fitted at the calibration workers; the method's [`Implementation`] says
/// how many ops and bytes each phase has.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct CodecPrice {
    pub encode: OpCost,
    pub decode: OpCost,
}

impl Calibration {
    /// The shipped inputs the fit starts from.
    pub(super) fn base(spec: &GraceSpec) -> Result<Calibration> {
        let mut device = DeviceProfile::load(&spec.base_device)?;
        // The compute calibration defines this device's speed; profiles stay on the V100 scale.
        device.compute_speed_vs_v100 = 1.0;
        // The fit scales each profile's compute to GRACE's measured speed on this device: the
        // times it evaluates and writes are this device's.
        let models = spec
            .models
            .iter()
            .map(|m| {
                let mut profile = ModelProfile::load(&m.profile)?;
                profile.device = device.name.clone();
                Ok((m.grace.clone(), profile))
            })
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
    pub(super) fn fitted(spec: &GraceSpec, dir: &Path) -> Result<Calibration> {
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
    pub(super) fn predict(
        &self,
        spec: &GraceSpec,
        m: &Measurement,
        method: &MethodSpec,
    ) -> Result<f64> {
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
            ..HorovodFusion::options(Some(&spec.horovod))?
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
    pub(super) fn mape(
        &self,
        spec: &GraceSpec,
        rows: &[(&Measurement, &MethodSpec)],
    ) -> Result<f64> {
        let mut sum = 0.0;
        for (m, method) in rows {
            sum += (self.predict(spec, m, method)? / m.throughput - 1.0).abs();
        }
        Ok(100.0 * sum / rows.len().max(1) as f64)
    }

    /// This calibration with the cluster's MPI/TCP costs replaced.
    pub(super) fn with_mpi(&self, tcp: f64, overhead: f64, reduce: f64) -> Calibration {
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

    /// This calibration with `key`'s codec priced as `implementation` at `price`: its encode,
    /// each payload's decode and the decode call's own part.
    pub(super) fn with_codec(
        &self,
        key: &str,
        implementation: &Implementation,
        price: CodecPrice,
    ) -> Result<Calibration> {
        let mut c = self.clone();
        let provenance = self.device.codec_cost(key)?.provenance.clone();
        c.device.compression.insert(
            key.to_string(),
            CodecCost {
                encode: price.encode.curve(implementation.encode),
                decode: price.decode.curve(implementation.payload),
                aggregate: price.decode.curve(implementation.call),
                // GRACE's implementations count the codec alone; the passes around it are the
                // plan's.
                includes_passes: false,
                provenance,
            },
        );
        Ok(c)
    }
}

/// Each fitted method's price, read back from a fitted device: its encode curve's floor over the
/// implementation's encode ops, its payload decode curve's floor over the payload's ops, and the
/// byte price (one for every phase) from the payload decode's slopes over its bytes. Methods the
/// fit did not price (no GRACE rows) are left out, as the fit leaves them out.
pub(super) fn codec_prices(
    fitted: &DeviceProfile,
    methods: &BTreeMap<String, MethodSpec>,
) -> Result<BTreeMap<String, CodecPrice>> {
    let mut prices = BTreeMap::new();
    for (name, method) in methods {
        if let (Some(implementation), Some(key)) = (&method.implementation, method.key()?) {
            let cost = fitted.codec_cost(key)?;
            if !cost.provenance.method.starts_with(&fitted_marker(name)) {
                continue;
            }
            let payload = implementation.payload;
            let ns_per_byte = (cost.decode.ns_per_element + cost.decode.ns_per_kept_element)
                / (payload.bytes_per_element + payload.bytes_per_kept_element)
                    .max(f64::MIN_POSITIVE);
            let price = |curve: CostCurve, work: OpWork| OpCost {
                us_per_op: curve.floor_us / f64::from(work.ops.max(1)),
                ns_per_byte,
            };
            prices.insert(
                name.clone(),
                CodecPrice {
                    encode: price(cost.encode, implementation.encode),
                    decode: price(cost.decode, payload),
                },
            );
        }
    }
    Ok(prices)
}
