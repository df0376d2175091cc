//! The GRACE calibration experiment: fit, write the calibrated inputs, compare every covered GRACE row.

mod data;
mod fit;

use super::grid::resolve;
use crate::csv::Csv;
use crate::plot::{self, Panel, Series};
use anyhow::Context;
use data::Measurement;
use fit::{Calibration, CodecScale, ComputeTarget};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use syncopate_sim::device::DeviceProfile;
use syncopate_sim::model::{ModelProfile, Provenance, Status};
use syncopate_sim::topology::{Cluster, ClusterOverrides, Library};
use syncopate_sim::SimError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraceSpec {
    format_version: u32,
    title: String,
    /// GRACE's CSV, relative to the experiment directory.
    data: String,
    /// Shipped cluster and device the fit starts from.
    base_cluster: String,
    base_device: String,
    strategy: String,
    /// The GRACE model whose dense multi-worker rows fit the MPI/TCP costs.
    network_model: String,
    /// A `throughput` row below this share of GRACE's `upper-bound` row of the same
    /// configuration is excluded as inconsistent.
    upper_bound_min_ratio: f64,
    fit_workers: u32,
    /// Candidate per-GPU batch sizes (GRACE does not record it).
    batch_sizes: Vec<u32>,
    models: Vec<ModelSpec>,
    methods: Vec<MethodSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSpec {
    grace: String,
    profile: String,
    /// Where the calibrated profile is written, in the experiment directory.
    file: String,
}

/// A GRACE method and our equivalent, or `compressor: null` with the reason in `note`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodSpec {
    grace: String,
    compressor: Option<String>,
    /// Memory spec when GRACE's `memory` column is true (default: residual).
    #[serde(default)]
    memory: Option<String>,
    note: String,
}

const CLUSTER_FILE: &str = "cluster.json";
const DEVICE_FILE: &str = "device.json";

pub fn run(spec: &GraceSpec, label: &str, dir: &Path, reuse_fit: bool) -> anyhow::Result<String> {
    super::check_version(label, spec.format_version)?;
    let mut data = data::load(&dir.join(&spec.data), "throughput")?;
    let upper = data::load(&dir.join(&spec.data), "upper-bound")?;
    let exclusions = data::flag_inconsistent(&mut data, &upper, spec.upper_bound_min_ratio);
    let targets = fit::compute_targets(spec, &data)?;
    let methods: BTreeMap<String, MethodSpec> = spec
        .methods
        .iter()
        .map(|m| (m.grace.clone(), m.clone()))
        .collect();
    if methods.get("none").and_then(|m| m.compressor.as_deref()) != Some("none") {
        return Err(SimError::invalid(
            label,
            "methods",
            "needs GRACE's `none` mapped to compressor `none`",
        )
        .into());
    }
    let base = load_base(spec)?;
    let (cal, batch, scales) = if reuse_fit {
        let cal = load_fitted(spec, dir)?;
        let batch = cal.models[&spec.network_model].batch_size_per_gpu;
        let scales = codec_scales(&cal.device, &base.device, &methods)?;
        (cal, batch, scales)
    } else {
        let (cal, batch, scales) = fit::fit(spec, &base, &data, &methods)?;
        write_fitted(spec, dir, &cal, batch, &scales, &targets)?;
        (cal, batch, scales)
    };
    let rows = data
        .iter()
        .filter_map(|m| {
            methods
                .get(&m.method)
                .filter(|x| x.compressor.is_some())
                .map(|x| (m, x))
        })
        .map(|(m, x)| Ok((m, cal.predict(spec, m, x)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let report = Report {
        spec,
        rows: &rows,
        targets: &targets,
    };
    report.csv().write(&dir.join("results.csv"))?;
    plot::write_svg(&dir.join("grace.svg"), &spec.title, &report.panels(), 4)?;
    Ok(report.markdown(&cal, batch, &scales, &methods, &data, &exclusions))
}

fn load_base(spec: &GraceSpec) -> anyhow::Result<Calibration> {
    let mut device = DeviceProfile::load(&spec.base_device)?;
    // The compute calibration below defines this device's speed; profiles stay on the V100 scale.
    device.compute_speed_vs_v100 = 1.0;
    let models = spec
        .models
        .iter()
        .map(|m| Ok((m.grace.clone(), ModelProfile::load(&m.profile)?)))
        .collect::<anyhow::Result<_>>()?;
    let cluster = Cluster::load(&spec.base_cluster, ClusterOverrides::default())?;
    if !matches!(cluster.library, Library::Mpi(_)) {
        return Err(SimError::invalid(
            "spec.json",
            "base_cluster",
            "GRACE ran Horovod over MPI: the base cluster needs an `mpi` library",
        )
        .into());
    }
    Ok(Calibration {
        models,
        cluster,
        device,
    })
}

fn load_fitted(spec: &GraceSpec, dir: &Path) -> anyhow::Result<Calibration> {
    let cluster_path = dir.join(CLUSTER_FILE).to_string_lossy().into_owned();
    let cluster = Cluster::load(&cluster_path, ClusterOverrides::default())?;
    let device = DeviceProfile::load(&cluster.device)?;
    let models = spec
        .models
        .iter()
        .map(|m| Ok((m.grace.clone(), ModelProfile::load(&resolve(dir, &m.file))?)))
        .collect::<anyhow::Result<_>>()?;
    Ok(Calibration {
        models,
        cluster,
        device,
    })
}

/// Each covered method's fitted scale, read back as the ratio of its slope to the base device's.
fn codec_scales(
    fitted: &DeviceProfile,
    base: &DeviceProfile,
    methods: &BTreeMap<String, MethodSpec>,
) -> anyhow::Result<BTreeMap<String, CodecScale>> {
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

fn write_fitted(
    spec: &GraceSpec,
    dir: &Path,
    cal: &Calibration,
    batch: u32,
    scales: &BTreeMap<String, CodecScale>,
    targets: &BTreeMap<String, ComputeTarget>,
) -> anyhow::Result<()> {
    let write = |file: &str, text: String| {
        let path = dir.join(file);
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))
    };
    let rows = "fitted by `syncopate experiment run experiments/grace` on profiles/validation/grace_imagenet_throughput.csv (GRACE, ICDCS'21, sands-lab/grace-data), mode=throughput backend=mpi rows, rows flagged inconsistent excluded";
    let mut device = cal.device.clone();
    device.name = "grace-v100".to_string();
    device.source = format!(
        "{} with GRACE-calibrated codec curves: {}",
        spec.base_device, device.source
    );
    device.compute_speed_provenance = Provenance {
        status: Status::Calibrated,
        method: format!("1.0: each model profile's compute is scaled to GRACE's measured compute speed of that model instead ({rows})"),
    };
    for (method, scale) in scales {
        let key = spec
            .methods
            .iter()
            .find(|m| &m.grace == method)
            .map(|m| m.resolve("0.01", "false"))
            .transpose()?
            .map(|c| c.0.key());
        if let Some(cost) = key.and_then(|k| device.compression.get_mut(k)) {
            cost.provenance = Provenance {
                status: Status::Calibrated,
                method: format!(
                    "{spec_device}'s curve with floors x {floor:.3} and per-element slopes x {slope:.3} (encode and decode): the pair that minimizes the mean absolute percentage error of GRACE's consistent `{method}` rows at {w} workers, ResNet-50 and VGG-19, ties within 0.5 points broken toward the base curve (mode=throughput, backend=mpi rows of profiles/validation/grace_imagenet_throughput.csv, GRACE ICDCS'21, sands-lab/grace-data), fitted by `syncopate experiment run experiments/grace`; GRACE's TensorFlow compressors run as unfused TF ops, far above the bandwidth-bound kernels of the base profile",
                    spec_device = spec.base_device,
                    floor = scale.floor,
                    slope = scale.slope,
                    w = spec.fit_workers
                ),
            };
        }
    }
    write(DEVICE_FILE, serde_json::to_string_pretty(&device)?)?;
    let mut cluster = cal.cluster.clone();
    cluster.name = "grace-v100-tcp".to_string();
    cluster.description = "GRACE's testbed: one V100 per node, TensorFlow + Horovod over MPI/TCP at 10 Gb/s, calibrated".to_string();
    cluster.device = DEVICE_FILE.to_string();
    if let Library::Mpi(p) = &mut cluster.library {
        p.provenance = Provenance {
            status: Status::Calibrated,
            method: format!(
                "tcp_efficiency, message_overhead_us and reduce_gbytes_per_s chosen on a grid ({} x {} x {}) to minimize the mean absolute percentage error of {}'s `none` (allreduce) rows at 2, 4 and 8 workers ({rows})",
                spec.network_model,
                fit_grid_sizes().0, fit_grid_sizes().1, fit_grid_sizes().2
            ),
        };
    }
    write(CLUSTER_FILE, serde_json::to_string_pretty(&cluster)?)?;
    for m in &spec.models {
        let mut profile = cal.models[&m.grace].clone();
        let provenance = format!(
            "compute scaled from profile `{}` by this model's own factor so that 1 worker runs at {} img/s, GRACE's {}; batch {batch} per GPU chosen among {:?} with the MPI fit (GRACE does not record it) ({rows})",
            m.profile,
            format_args!("{:.2}", targets[&m.grace].images_per_s),
            targets[&m.grace].source,
            spec.batch_sizes
        );
        profile.name = format!("grace-{}", m.grace);
        profile.source = format!("{}; {provenance}", profile.source);
        for p in [
            &mut profile.timing.backward,
            &mut profile.timing.forward,
            &mut profile.timing.optimizer,
        ] {
            p.status = Status::Calibrated;
            p.method = format!("{}; then {provenance}", p.method);
        }
        write(&m.file, serde_json::to_string_pretty(&profile)?)?;
    }
    Ok(())
}

fn fit_grid_sizes() -> (usize, usize, usize) {
    fit::GRID_SIZES
}

/// Whether a consistent row was used by the fit (each model's compute target; the network
/// model's dense rows for the MPI costs; every model's compressed rows at `fit_workers` for the
/// codec scales) or is held out. Excluded rows are never fitted.
fn fitted_row(
    spec: &GraceSpec,
    targets: &BTreeMap<String, ComputeTarget>,
    m: &Measurement,
) -> bool {
    if m.excluded.is_some() {
        false
    } else if targets.get(&m.model).is_some_and(|t| t.row == *m) {
        true
    } else if m.method == "none" {
        m.model == spec.network_model && m.workers > 1
    } else {
        m.workers == spec.fit_workers
    }
}

struct Report<'a> {
    spec: &'a GraceSpec,
    rows: &'a [(&'a Measurement, f64)],
    targets: &'a BTreeMap<String, ComputeTarget>,
}

impl Report<'_> {
    fn csv(&self) -> Csv {
        let mut csv = Csv::new(&[
            "model",
            "workers",
            "method",
            "ratio",
            "memory",
            "comm_method",
            "runs",
            "measured_images_per_s",
            "predicted_images_per_s",
            "error_pct",
            "role",
            "excluded",
        ]);
        for (m, predicted) in self.rows {
            csv.row([
                m.model.clone(),
                m.workers.to_string(),
                m.method.clone(),
                m.ratio.clone(),
                m.memory.clone(),
                m.comm_method.clone(),
                m.runs.to_string(),
                format!("{:.2}", m.throughput),
                format!("{predicted:.2}"),
                format!("{:.2}", 100.0 * (predicted / m.throughput - 1.0)),
                if fitted_row(self.spec, self.targets, m) {
                    "fit"
                } else {
                    "held-out"
                }
                .to_string(),
                m.excluded.clone().unwrap_or_default(),
            ]);
        }
        csv
    }

    /// One panel per method: measured and predicted throughput against workers, per model and
    /// memory setting, at GRACE's default ratio (0.01) where the method has one.
    fn panels(&self) -> Vec<Panel> {
        let mut methods: Vec<&str> = self.rows.iter().map(|(m, _)| m.method.as_str()).collect();
        methods.dedup();
        methods.sort();
        methods.dedup();
        methods
            .into_iter()
            .map(|method| {
                let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
                for (m, predicted) in self
                    .rows
                    .iter()
                    .filter(|(m, _)| m.method == method && (m.ratio == "n/a" || m.ratio == "0.01"))
                {
                    let ef = if m.memory == "true" { " EF" } else { "" };
                    let x = f64::from(m.workers);
                    let flag = if m.excluded.is_some() {
                        " (excluded)"
                    } else {
                        ""
                    };
                    series
                        .entry(format!("{}{ef} measured{flag}", m.model))
                        .or_default()
                        .push((x, m.throughput));
                    series
                        .entry(format!("{}{ef} predicted", m.model))
                        .or_default()
                        .push((x, *predicted));
                }
                Panel {
                    title: method.to_string(),
                    x_label: "workers (1 V100 each, 10 GbE)".to_string(),
                    y_label: "images/s, all workers".to_string(),
                    series: series
                        .into_iter()
                        .map(|(label, mut points)| {
                            points.sort_by(|a, b| a.0.total_cmp(&b.0));
                            Series { label, points }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn markdown(
        &self,
        cal: &Calibration,
        batch: u32,
        scales: &BTreeMap<String, CodecScale>,
        methods: &BTreeMap<String, MethodSpec>,
        data: &[Measurement],
        exclusions: &data::Exclusions,
    ) -> String {
        let ape = |m: &Measurement, p: f64| 100.0 * (p / m.throughput - 1.0).abs();
        let mean = |v: &[f64]| {
            if v.is_empty() {
                None
            } else {
                Some(v.iter().sum::<f64>() / v.len() as f64)
            }
        };
        let show = |v: Option<f64>| {
            v.map(|x| format!("{x:.1} %"))
                .unwrap_or_else(|| "–".to_string())
        };
        let mut md = String::new();
        if let Library::Mpi(p) = &cal.cluster.library {
            let _ = writeln!(
                md,
                "Fitted: batch {batch} per GPU; MPI/TCP `tcp_efficiency` {:.2}, `message_overhead_us` {:.0}, `reduce_gbytes_per_s` {:.1} (on {}'s dense rows).\n",
                p.tcp_efficiency, p.message_overhead_us, p.reduce_gbytes_per_s, self.spec.network_model
            );
        }
        md.push_str("Compute, one factor per model:");
        for (model, target) in self.targets {
            let _ = write!(
                md,
                " **{model}** at {:.2} img/s per worker, {};",
                target.images_per_s, target.source
            );
        }
        md.push_str("\n\n");
        md.push_str("| GRACE method | our compressor | codec scale floor / per element | rows fit / held out / excluded | MAPE fit rows | MAPE held-out | MAPE held-out incl. excluded | MAPE all | MAPE all incl. excluded |\n|---|---|---|---|---|---|---|---|---|\n");
        // (fit, held-out consistent, excluded) absolute percentage errors over all methods.
        let (mut fit_all, mut held_all, mut excl_all) = (Vec::new(), Vec::new(), Vec::new());
        for (name, method) in methods {
            let Some(compressor) = &method.compressor else {
                continue;
            };
            let mine: Vec<&(&Measurement, f64)> = self
                .rows
                .iter()
                .filter(|(m, _)| &m.method == name && m.workers > 1)
                .collect();
            let errors = |keep: &dyn Fn(&Measurement) -> bool| -> Vec<f64> {
                mine.iter()
                    .filter(|(m, _)| keep(m))
                    .map(|(m, p)| ape(m, *p))
                    .collect()
            };
            let f = errors(&|m| fitted_row(self.spec, self.targets, m));
            let h = errors(&|m| m.excluded.is_none() && !fitted_row(self.spec, self.targets, m));
            let x = errors(&|m| m.excluded.is_some());
            let cat = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().chain(b).copied().collect() };
            let scale = scales
                .get(name)
                .map(|s| format!("{:.2}× / {:.1}×", s.floor, s.slope))
                .unwrap_or_else(|| "–".to_string());
            let _ = writeln!(
                md,
                "| {name} | `{compressor}` | {scale} | {} / {} / {} | {} | {} | {} | {} | {} |",
                f.len(),
                h.len(),
                x.len(),
                show(mean(&f)),
                show(mean(&h)),
                show(mean(&cat(&h, &x))),
                show(mean(&cat(&f, &h))),
                show(mean(&cat(&cat(&f, &h), &x)))
            );
            fit_all.extend(f);
            held_all.extend(h);
            excl_all.extend(x);
        }
        let held_with = [held_all.clone(), excl_all.clone()].concat();
        let all = [fit_all.clone(), held_all.clone()].concat();
        let all_with = [all.clone(), excl_all.clone()].concat();
        let _ = writeln!(
            md,
            "| **overall** | | | {} / {} / {} | {} | **{}** | {} | **{}** | {} |",
            fit_all.len(),
            held_all.len(),
            excl_all.len(),
            show(mean(&fit_all)),
            show(mean(&held_all)),
            show(mean(&held_with)),
            show(mean(&all)),
            show(mean(&all_with))
        );
        let _ = writeln!(
            md,
            "\n**Overall MAPE**: held-out {} over {} consistent configurations ({} including the {} excluded ones); all {} over {} ({} including them).",
            show(mean(&held_all)),
            held_all.len(),
            show(mean(&held_with)),
            excl_all.len(),
            show(mean(&all)),
            all.len(),
            show(mean(&all_with))
        );
        let excluded: Vec<&(&Measurement, f64)> = self
            .rows
            .iter()
            .filter(|(m, _)| m.excluded.is_some())
            .collect();
        let _ = writeln!(
            md,
            "\n**Excluded as inconsistent** (kept in results.csv, column `excluded`): rule 1 (below {:.2}× the `upper-bound` row of the same configuration) {} rows of the file, {} of them of covered methods; rule 2 (1-worker `none` row slower per worker than more than half of its model's remaining multi-worker rows) {} rows. The covered ones:\n",
            self.spec.upper_bound_min_ratio,
            exclusions.below_upper_bound,
            excluded.iter().filter(|(m, _)| m.workers > 1).count(),
            exclusions.slow_one_worker
        );
        for (m, p) in excluded {
            let _ = writeln!(
                md,
                "- {} {} workers `{}` ratio {} memory {}: {:.2} img/s measured, {p:.1} predicted; {}",
                m.model,
                m.workers,
                m.method,
                m.ratio,
                m.memory,
                m.throughput,
                m.excluded.as_deref().unwrap_or("")
            );
        }
        md.push_str("\nMAPE: mean absolute percentage error of throughput over GRACE configurations with 2–8 workers (repeated runs merged into their median). Not covered:");
        for (name, method) in methods.iter().filter(|(_, m)| m.compressor.is_none()) {
            let rows = data.iter().filter(|m| &m.method == name).count();
            let _ = write!(md, " `{name}` ({rows} configurations; {})", method.note);
        }
        md.push_str(". Regenerate with `syncopate experiment run experiments/grace` (fit) or `--reuse-fit` (evaluate the shipped files).\n");
        md
    }
}
