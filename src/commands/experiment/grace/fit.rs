//! Calibration to GRACE: each model's compute from its own 1-worker row, MPI/TCP costs from the dense rows, one codec-cost scale per compressor.

use super::data::Measurement;
use super::{GraceSpec, MethodSpec};
use rayon::prelude::*;
use std::collections::BTreeMap;
use syncopate_sim::compress::{Compressor, Memory};
use syncopate_sim::device::DeviceProfile;
use syncopate_sim::model::ModelProfile;
use syncopate_sim::plan::Scheme;
use syncopate_sim::scenario::Scenario;
use syncopate_sim::simulate::{simulate, SimOptions};
use syncopate_sim::strategy::{Strategy, StrategyOptions};
use syncopate_sim::topology::{Cluster, ClusterOverrides, Library, MpiParams};
use syncopate_sim::SimError;

/// The calibrated inputs: one model profile per GRACE model, the cluster and its device.
#[derive(Clone)]
pub struct Calibration {
    pub models: BTreeMap<String, ModelProfile>,
    pub cluster: Cluster,
    pub device: DeviceProfile,
}

/// Grids of the MPI/TCP search: TCP goodput share, per-message overhead, CPU reduction rate.
const TCP_EFFICIENCY: [f64; 15] = [
    0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95,
];
const MESSAGE_OVERHEAD_US: [f64; 9] = [0.0, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0];
const REDUCE_GBYTES_PER_S: [f64; 7] = [1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0];
/// Sizes of the three grids, for the provenance written into the cluster file.
pub const GRID_SIZES: (usize, usize, usize) = (
    TCP_EFFICIENCY.len(),
    MESSAGE_OVERHEAD_US.len(),
    REDUCE_GBYTES_PER_S.len(),
);
/// Codec scales (per-kernel floor, per-element slope) are searched on a log2 grid, then on a
/// grid four times finer around the best point.
const SCALE_GRID_LOG2: std::ops::RangeInclusive<i32> = -10..=14;
const REFINE: i32 = 4;
/// Codec scales whose error is within this many percentage points of the best count as ties;
/// among ties the fit keeps the pair nearest the base curve (smallest |log2 floor| + |log2 slope|),
/// so a compressor with fewer fit rows than parameters gets the smallest change that fits.
const TIE_PCT: f64 = 0.5;

impl Calibration {
    /// Predicted throughput (images/s over all workers) of one GRACE configuration.
    pub fn predict(
        &self,
        spec: &GraceSpec,
        m: &Measurement,
        method: &MethodSpec,
    ) -> anyhow::Result<f64> {
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
    fn mape(&self, spec: &GraceSpec, rows: &[(&Measurement, &MethodSpec)]) -> anyhow::Result<f64> {
        let mut sum = 0.0;
        for (m, method) in rows {
            sum += (self.predict(spec, m, method)? / m.throughput - 1.0).abs();
        }
        Ok(100.0 * sum / rows.len().max(1) as f64)
    }

    fn with_mpi(&self, tcp: f64, overhead: f64, reduce: f64) -> Calibration {
        let mut c = self.clone();
        if let Library::Mpi(p) = &mut c.cluster.library {
            *p = MpiParams {
                tcp_efficiency: tcp,
                message_overhead_us: overhead,
                reduce_gbytes_per_s: reduce,
                provenance: p.provenance.clone(),
            };
        }
        c
    }

    /// This calibration with `key`'s encode and decode floors and slopes scaled from the base
    /// device's.
    fn with_codec_scale(
        &self,
        base: &DeviceProfile,
        key: &str,
        scale: CodecScale,
    ) -> anyhow::Result<Calibration> {
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

/// The profile with every compute time multiplied by `k` and GRACE's batch.
fn scaled(profile: &ModelProfile, k: f64, batch: u32) -> ModelProfile {
    let mut m = profile.clone();
    for t in &mut m.tensors {
        t.backward_us *= k;
        t.forward_us *= k;
    }
    m.optimizer_us *= k;
    m.batch_size_per_gpu = batch;
    m
}

/// Multipliers on a codec's per-kernel floor and per-element slope: two numbers, because
/// GRACE's TensorFlow compressors pay per-tensor op overheads (ResNet-50: 161 tensors) and
/// per-element work (VGG-19: 143 M elements) in proportions one scale cannot match.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecScale {
    pub floor: f64,
    pub slope: f64,
}

/// Runs the whole fit. Returns the calibration, the chosen batch, and each method's codec scale.
pub fn fit(
    spec: &GraceSpec,
    base: &Calibration,
    data: &[Measurement],
    methods: &BTreeMap<String, MethodSpec>,
) -> anyhow::Result<(Calibration, u32, BTreeMap<String, CodecScale>)> {
    let none = &methods["none"];
    let targets = compute_targets(spec, data)?;
    let dense: Vec<(&Measurement, &MethodSpec)> = data
        .iter()
        .filter(|m| {
            m.model == spec.network_model
                && m.workers > 1
                && m.method == "none"
                && m.excluded.is_none()
        })
        .map(|m| (m, none))
        .collect();
    let mut best: Option<(f64, Calibration, u32)> = None;
    for &batch in &spec.batch_sizes {
        let cal = with_compute(spec, base, &targets, batch)?;
        let grid: Vec<(f64, f64, f64)> = TCP_EFFICIENCY
            .iter()
            .flat_map(|&t| {
                MESSAGE_OVERHEAD_US
                    .iter()
                    .flat_map(move |&o| REDUCE_GBYTES_PER_S.iter().map(move |&r| (t, o, r)))
            })
            .collect();
        let scored = grid
            .par_iter()
            .map(|&(t, o, r)| {
                let c = cal.with_mpi(t, o, r);
                Ok((c.mape(spec, &dense)?, c))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        for (error, c) in scored {
            if best.as_ref().is_none_or(|b| error < b.0) {
                best = Some((error, c, batch));
            }
        }
    }
    let (_, mut cal, batch) = best.ok_or_else(|| {
        SimError::invalid("spec.json", "batch_sizes", "needs at least one batch size")
    })?;
    let base_device = cal.device.clone();
    let fitted = methods
        .par_iter()
        .filter(|(name, m)| m.compressor.is_some() && name.as_str() != "none")
        .map(|(name, method)| {
            let rows: Vec<(&Measurement, &MethodSpec)> = data
                .iter()
                .filter(|m| {
                    m.workers == spec.fit_workers && &m.method == name && m.excluded.is_none()
                })
                .map(|m| (m, method))
                .collect();
            if rows.is_empty() {
                return Ok(None);
            }
            let key = method.resolve(&rows[0].0.ratio, &rows[0].0.memory)?.0.key();
            let error = |floor: f64, slope: f64| -> anyhow::Result<f64> {
                let scale = CodecScale {
                    floor: floor.exp2(),
                    slope: slope.exp2(),
                };
                cal.with_codec_scale(&base_device, key, scale)?
                    .mape(spec, &rows)
            };
            let mut scored = Vec::new();
            for f in SCALE_GRID_LOG2 {
                for l in SCALE_GRID_LOG2 {
                    let (f, l) = (f64::from(f), f64::from(l));
                    scored.push((error(f, l)?, f, l));
                }
            }
            let (_, f0, l0) = pick(&scored);
            for i in -REFINE..=REFINE {
                for j in -REFINE..=REFINE {
                    let step = |k: i32| f64::from(k) / f64::from(REFINE);
                    let (f, l) = (f0 + step(i), l0 + step(j));
                    scored.push((error(f, l)?, f, l));
                }
            }
            let best = pick(&scored);
            let scale = CodecScale {
                floor: best.1.exp2(),
                slope: best.2.exp2(),
            };
            Ok(Some((name.clone(), key, scale)))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut scales = BTreeMap::new();
    for (name, key, scale) in fitted.into_iter().flatten() {
        cal = cal.with_codec_scale(&base_device, key, scale)?;
        scales.insert(name, scale);
    }
    Ok((cal, batch, scales))
}

/// The best (error, log2 floor, log2 slope): the lowest error, ties (within [`TIE_PCT`]) broken
/// toward the base curve.
fn pick(scored: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    let lowest = scored.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
    scored
        .iter()
        .filter(|s| s.0 <= lowest + TIE_PCT)
        .min_by(|a, b| (a.1.abs() + a.2.abs()).total_cmp(&(b.1.abs() + b.2.abs())))
        .copied()
        .unwrap_or((lowest, 0.0, 0.0))
}

/// The measured compute speed one model is scaled to: images/s of one worker, and where it comes from.
#[derive(Clone, Debug)]
pub struct ComputeTarget {
    pub images_per_s: f64,
    pub source: String,
    /// The row it comes from.
    pub row: Measurement,
}

/// Each model's compute target: its own 1-worker `none` row; where the consistency rules flag
/// that row, its fastest remaining multi-worker row per worker (communication only slows a
/// worker down, so this is a lower bound on its compute speed).
pub fn compute_targets(
    spec: &GraceSpec,
    data: &[Measurement],
) -> anyhow::Result<BTreeMap<String, ComputeTarget>> {
    let mut targets = BTreeMap::new();
    for model in &spec.models {
        let name = &model.grace;
        let one = data
            .iter()
            .find(|m| &m.model == name && m.workers == 1 && m.method == "none")
            .ok_or_else(|| {
                SimError::invalid(
                    &spec.data,
                    "rows",
                    format!("no 1-worker `none` row for {name}"),
                )
            })?;
        let target = if one.excluded.is_none() {
            ComputeTarget {
                images_per_s: one.throughput,
                source: format!("its 1-worker `none` row ({:.2} img/s)", one.throughput),
                row: one.clone(),
            }
        } else {
            let fastest = data
                .iter()
                .filter(|m| &m.model == name && m.workers > 1 && m.excluded.is_none())
                .max_by(|a, b| {
                    (a.throughput / f64::from(a.workers))
                        .total_cmp(&(b.throughput / f64::from(b.workers)))
                })
                .ok_or_else(|| {
                    SimError::invalid(
                        &spec.data,
                        "rows",
                        format!("{name}: 1-worker row excluded and no other row left"),
                    )
                })?;
            let per_worker = fastest.throughput / f64::from(fastest.workers);
            ComputeTarget {
                images_per_s: per_worker,
                source: format!(
                    "its fastest consistent row per worker, `{}` at {} workers ({:.1} img/s = {:.2} per worker; its 1-worker row, {:.2} img/s, is excluded as inconsistent)",
                    fastest.method, fastest.workers, fastest.throughput, per_worker, one.throughput
                ),
                row: fastest.clone(),
            }
        };
        targets.insert(name.clone(), target);
    }
    Ok(targets)
}

/// Scales each model, with its own factor, so that one worker runs at its compute target
/// (GRACE's TensorFlow on its V100 against our profiles' PyTorch timings).
fn with_compute(
    spec: &GraceSpec,
    base: &Calibration,
    targets: &BTreeMap<String, ComputeTarget>,
    batch: u32,
) -> anyhow::Result<Calibration> {
    let none = MethodSpec::dense();
    let mut models = BTreeMap::new();
    for (name, profile) in &base.models {
        let target = targets.get(name).ok_or_else(|| {
            SimError::invalid(
                "spec.json",
                "models",
                format!("no compute target for {name}"),
            )
        })?;
        let one = Measurement {
            model: name.clone(),
            workers: 1,
            method: "none".to_string(),
            ratio: "n/a".to_string(),
            memory: "n/a".to_string(),
            comm_method: "allreduce".to_string(),
            throughput: target.images_per_s,
            runs: 1,
            excluded: None,
        };
        let mut k = 1.0;
        // Two passes: the first from the profile's own time, the second corrects what the
        // simulated single iteration adds beyond compute (the one-rank local copy).
        for _ in 0..2 {
            let trial = Calibration {
                models: BTreeMap::from([(name.clone(), scaled(profile, k, batch))]),
                ..base.clone()
            };
            k *= trial.predict(spec, &one, &none)? / one.throughput;
        }
        models.insert(name.clone(), scaled(profile, k, batch));
    }
    Ok(Calibration {
        models,
        ..base.clone()
    })
}

impl MethodSpec {
    /// The uncompressed baseline.
    pub fn dense() -> MethodSpec {
        MethodSpec {
            grace: "none".to_string(),
            compressor: Some("none".to_string()),
            memory: None,
            note: String::new(),
        }
    }

    /// Our compressor and memory for a GRACE row: `{ratio}` in the spec takes the row's ratio;
    /// GRACE's `memory=true` turns on the method's memory (residual unless stated).
    pub fn resolve(&self, ratio: &str, memory: &str) -> anyhow::Result<(Compressor, Memory)> {
        let template = self.compressor.as_deref().ok_or_else(|| {
            SimError::bad_value("GRACE method", &self.grace, "is not covered by our catalog")
        })?;
        let compressor: Compressor = template.replace("{ratio}", ratio).parse()?;
        let memory: Memory = if memory == "true" {
            self.memory.as_deref().unwrap_or("residual").parse()?
        } else {
            Memory::None
        };
        Ok((compressor, memory))
    }
}
