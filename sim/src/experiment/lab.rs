//! The lab-validation experiment's predictions: every measured configuration of `measurements.json` predicted from its lab's own measured cluster file, and the errors summarized per lab.
//!
//! Measuring (bringing labs up, running each plan over MPI) is `syncopate_exec::lab::experiment`,
//! which writes `measurements.json` and `clusters/*.json` into the experiment directory; this
//! module only reads them, so that a model change is re-evaluated without the lab.

use super::{Input, Results};
use crate::chart::{Chart, Panel, Series};
use crate::csv::Csv;
use crate::data;
use crate::error::{Result, SimError};
use crate::model::ModelProfile;
use crate::plan::Plan;
use crate::scenario::Scenario;
use crate::simulate::{simulate, SimOptions};
use crate::topology::{Cluster, ClusterOverrides};
use crate::validate::relative_error;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// One lab: its node count and the rate of every node's link.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabSetting {
    pub nodes: u32,
    pub gbps: f64,
}

/// A compressor with the memory it runs with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressorSetting {
    pub compressor: String,
    #[serde(default = "no_memory")]
    pub memory: String,
}

fn no_memory() -> String {
    "none".into()
}

/// spec.json of a lab experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabSpec {
    pub format_version: u32,
    pub title: String,
    /// The model whose gradients and (scaled) compute every run reproduces.
    pub model: String,
    /// One iteration's forward + backward + optimizer on one core, in ms: the model's
    /// profiled compute is scaled to it.
    pub compute_ms: f64,
    /// The device profile of the lab's cluster files (compression cost curves of this CPU).
    pub device: String,
    pub labs: Vec<LabSetting>,
    pub strategies: Vec<String>,
    pub compressors: Vec<CompressorSetting>,
    /// Runs of every configuration, interleaved (every configuration once, then again).
    pub repeats: u32,
    pub warmup: u32,
    pub iterations: u32,
}

/// One configuration's runs on one lab.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigRuns {
    pub strategy: String,
    pub compressor: String,
    pub memory: String,
    /// The plan that ran (made by the strategy for this lab's cluster).
    pub plan: Plan,
    /// The compute scale the runs used (`exec --compute-scale`).
    pub compute_scale: f64,
    /// Each run's mean measured iteration, in ms.
    pub iteration_ms: Vec<f64>,
    /// Why runs failed, if any did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

/// Everything measured on one lab.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabRuns {
    pub setting: LabSetting,
    /// The lab's measured cluster file, relative to the experiment directory.
    pub cluster: String,
    pub configs: Vec<ConfigRuns>,
}

/// measurements.json of a lab experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabMeasurements {
    pub format_version: u32,
    /// Where and when: the machine's CPU count and the command that measured.
    pub source: String,
    pub labs: Vec<LabRuns>,
}

/// The measurements file of an experiment directory.
pub const MEASUREMENTS: &str = "measurements.json";

/// One predicted configuration.
struct Row<'a> {
    setting: LabSetting,
    runs: &'a ConfigRuns,
    predicted_ms: f64,
    measured_ms: f64,
}

impl Row<'_> {
    fn error(&self) -> f64 {
        relative_error(self.predicted_ms, self.measured_ms)
    }

    fn label(&self) -> String {
        match self.runs.compressor.as_str() {
            "none" => self.runs.strategy.clone(),
            c => format!("{} + {c}", self.runs.strategy),
        }
    }
}

/// Predicts every configuration of the directory's measurements.
pub fn run(spec: &LabSpec, label: &str, dir: &Path) -> Result<Results> {
    data::check_format_version(label, spec.format_version)?;
    let path = dir.join(MEASUREMENTS);
    let text = std::fs::read_to_string(&path).map_err(|source| SimError::Io {
        path: path.clone(),
        source,
    })?;
    let measured: LabMeasurements = data::parse_json(&path.display().to_string(), &text)?;
    let model = ModelProfile::load(&spec.model)?;
    let mut rows = Vec::new();
    for lab in &measured.labs {
        let cluster_path = dir.join(&lab.cluster);
        let cluster = Cluster::load(&cluster_path.to_string_lossy(), ClusterOverrides::default())?;
        let base = Scenario::new(model.clone(), cluster)?;
        for runs in lab.configs.iter().filter(|r| !r.iteration_ms.is_empty()) {
            let mut scenario = base.clone();
            scenario.compute_scale = runs.compute_scale;
            let predicted = simulate(&scenario, &runs.plan, &SimOptions::default())?;
            rows.push(Row {
                setting: lab.setting,
                runs,
                predicted_ms: predicted.summary.iteration_time_ms,
                measured_ms: median(&runs.iteration_ms),
            });
        }
    }
    Ok(Results {
        inputs: Vec::<(String, Input)>::new(),
        csv: csv(&rows),
        charts: vec![chart(spec, &rows)],
        table: table(spec, &measured, &rows),
    })
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn spread(values: &[f64]) -> (f64, f64) {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

fn csv(rows: &[Row]) -> String {
    let mut csv = Csv::new(&[
        "nodes",
        "gbps",
        "strategy",
        "compressor",
        "memory",
        "predicted_ms",
        "measured_median_ms",
        "measured_min_ms",
        "measured_max_ms",
        "runs",
        "error_pct",
    ]);
    for r in rows {
        let (min, max) = spread(&r.runs.iteration_ms);
        csv.row([
            r.setting.nodes.to_string(),
            r.setting.gbps.to_string(),
            r.runs.strategy.clone(),
            r.runs.compressor.clone(),
            r.runs.memory.clone(),
            format!("{:.1}", r.predicted_ms),
            format!("{:.1}", r.measured_ms),
            format!("{min:.1}"),
            format!("{max:.1}"),
            r.runs.iteration_ms.len().to_string(),
            format!("{:.1}", r.error() * 100.0),
        ]);
    }
    csv.into_text()
}

/// Spearman's rank correlation of two samples (average ranks for ties).
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    fn ranks(v: &[f64]) -> Vec<f64> {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
        let mut ranks = vec![0.0; v.len()];
        let mut i = 0;
        while i < order.len() {
            let mut j = i;
            while j + 1 < order.len() && v[order[j + 1]] == v[order[i]] {
                j += 1;
            }
            let rank = (i + j) as f64 / 2.0;
            for &k in &order[i..=j] {
                ranks[k] = rank;
            }
            i = j + 1;
        }
        ranks
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let mean = (n - 1.0) / 2.0;
    let cov: f64 = ra
        .iter()
        .zip(&rb)
        .map(|(x, y)| (x - mean) * (y - mean))
        .sum();
    let var = |r: &[f64]| r.iter().map(|x| (x - mean).powi(2)).sum::<f64>();
    let denominator = (var(&ra) * var(&rb)).sqrt();
    if denominator > 0.0 {
        cov / denominator
    } else {
        0.0
    }
}

/// The `q` quantile (linear between the closest ranks) of `values`.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let position = q * (sorted.len().saturating_sub(1)) as f64;
    let (low, high) = (position.floor() as usize, position.ceil() as usize);
    sorted[low] + (sorted[high] - sorted[low]) * (position - low as f64)
}

/// Error statistics of a set of rows: (median |error|, 90th percentile |error|, Spearman).
fn statistics(rows: &[&Row]) -> (f64, f64, f64) {
    let errors: Vec<f64> = rows.iter().map(|r| r.error().abs()).collect();
    let predicted: Vec<f64> = rows.iter().map(|r| r.predicted_ms).collect();
    let measured: Vec<f64> = rows.iter().map(|r| r.measured_ms).collect();
    (
        quantile(&errors, 0.5),
        quantile(&errors, 0.9),
        spearman(&predicted, &measured),
    )
}

fn table(spec: &LabSpec, measured: &LabMeasurements, rows: &[Row]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{} configurations on {} labs ({}); measured: {}.\n",
        rows.len(),
        measured.labs.len(),
        spec.model,
        measured.source
    );
    let _ = writeln!(
        text,
        "| lab | configurations | median \\|error\\| | 90th percentile \\|error\\| | Spearman (ranking) |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|");
    let mut all: Vec<&Row> = Vec::new();
    for lab in &measured.labs {
        let these: Vec<&Row> = rows.iter().filter(|r| r.setting == lab.setting).collect();
        if these.is_empty() {
            continue;
        }
        let (median, p90, rho) = statistics(&these);
        let _ = writeln!(
            text,
            "| {} nodes, {} Gb/s | {} | {:.1} % | {:.1} % | {:.2} |",
            lab.setting.nodes,
            lab.setting.gbps,
            these.len(),
            median * 100.0,
            p90 * 100.0,
            rho
        );
        all.extend(these);
    }
    if !all.is_empty() {
        let (median, p90, _) = statistics(&all);
        let _ = writeln!(
            text,
            "| **all** | {} | {:.1} % | {:.1} % | |",
            all.len(),
            median * 100.0,
            p90 * 100.0
        );
    }
    let failed: usize = measured
        .labs
        .iter()
        .flat_map(|l| &l.configs)
        .map(|c| c.failures.len())
        .sum();
    if failed > 0 {
        let _ = writeln!(text, "\n{failed} runs failed (see measurements.json).");
    }
    let _ = writeln!(
        text,
        "\n| lab | configuration | predicted ms | measured ms (min–max) | error |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|");
    for r in rows {
        let (min, max) = spread(&r.runs.iteration_ms);
        let _ = writeln!(
            text,
            "| {}n {}G | {} | {:.1} | {:.1} ({:.1}–{:.1}) | {:+.1} % |",
            r.setting.nodes,
            r.setting.gbps,
            r.label(),
            r.predicted_ms,
            r.measured_ms,
            min,
            max,
            r.error() * 100.0
        );
    }
    text
}

/// Per lab, predicted against measured iteration time (one point per configuration), with
/// the diagonal: points on it are exact predictions.
fn chart(spec: &LabSpec, rows: &[Row]) -> Chart {
    let mut settings: Vec<LabSetting> = Vec::new();
    for r in rows {
        if !settings.contains(&r.setting) {
            settings.push(r.setting);
        }
    }
    let panels = settings
        .iter()
        .map(|setting| {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.setting == *setting)
                .map(|r| (r.measured_ms, r.predicted_ms))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let top = points.iter().map(|p| p.0.max(p.1)).fold(0.0, f64::max);
            Panel {
                title: format!("{} nodes, {} Gb/s", setting.nodes, setting.gbps),
                x_label: "measured iteration (ms)".into(),
                y_label: "predicted iteration (ms)".into(),
                series: vec![
                    Series {
                        label: "configurations".into(),
                        points,
                    },
                    Series {
                        label: "exact".into(),
                        points: vec![(0.0, 0.0), (top, top)],
                    },
                ],
            }
        })
        .collect();
    Chart {
        file: "predicted-vs-measured.svg".into(),
        title: spec.title.clone(),
        panels,
        columns: 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_of_orders_and_ties() {
        assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        let rho = spearman(&[1.0, 2.0, 3.0, 4.0], &[1.0, 1.0, 2.0, 3.0]);
        assert!(rho > 0.9 && rho < 1.0, "{rho}");
    }

    #[test]
    fn quantiles_interpolate() {
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert!((quantile(&[0.0, 10.0], 0.9) - 9.0).abs() < 1e-12);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
