//! The lab-validation experiment's predictions, with the errors summarized per lab.
//!
//! Every measured configuration of `measurements.json` is predicted from its lab's own measured
//! cluster file.
//!
//! Measuring (bringing labs up, running each plan over MPI) is `syncopate_exec::lab::experiment`,
//! which writes `measurements.json` and `clusters/*.json` into the experiment directory; this
//! module only reads them, so that a model change is re-evaluated without the lab.

mod rerun;

use super::{Input, Results};
use crate::base::chart::{Chart, Panel, Series};
use crate::base::csv::Csv;
use crate::base::data;
use crate::base::error::{Result, SimError};
use crate::base::stats::{median, quantile};
use crate::inputs::model::ModelProfile;
use crate::inputs::topology::{Cluster, ClusterOverrides};
use crate::plan::Plan;
use crate::predict::scenario::Scenario;
use crate::predict::simulate::{simulate, SimOptions};
use crate::predict::validate::relative_error;
use crate::strategy::HorovodFusion;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// One lab: its node count and the rate of every node's link.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabSetting {
    /// Number of nodes.
    pub nodes: u32,
    /// Rate of every node's link, in Gb/s.
    pub gbps: f64,
}

/// A compressor with the memory it runs with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressorSetting {
    /// The compressor, parsed as `crate::compress::Compressor`.
    pub compressor: String,
    /// Its error-feedback memory, parsed as `crate::compress::Memory` (default `none`).
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
    /// The file's format version.
    pub format_version: u32,
    /// The experiment's title.
    pub title: String,
    /// The model whose gradients and (scaled) compute every run reproduces.
    pub model: String,
    /// One iteration's forward + backward + optimizer on one core, in ms: the model's
    /// profiled compute is scaled to it.
    pub compute_ms: f64,
    /// The labs to measure on.
    pub labs: Vec<LabSetting>,
    /// Strategies that plan the configurations, by name.
    pub strategies: Vec<String>,
    /// The Horovod release whose fusion threshold and cycle time the `horovod` plans use;
    /// absent: the current release's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horovod: Option<HorovodFusion>,
    /// Compressors each strategy is run with (those it cannot run are left out).
    pub compressors: Vec<CompressorSetting>,
    /// Runs of every configuration, interleaved (every configuration once, then again).
    pub repeats: u32,
    /// Warm-up iterations of each run (`exec --warmup`).
    pub warmup: u32,
    /// Measured iterations of each run (`exec --iterations`).
    pub iterations: u32,
    /// The lab whose measured cluster file also predicts every other lab, given only their
    /// node count and line rate: its transport parameters (MPI/TCP overheads, the host limit)
    /// carried to networks they were not measured on. The hosts' contention comes from each
    /// lab's own probe: four ranks on two cores are other hosts than two ranks on two cores,
    /// and a user profiles the hosts of a cluster to be, as `lab probe contention` does here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport_from: Option<LabSetting>,
    /// Directories, relative to the experiment's, each holding a `measurements.json` of the
    /// same labs and plans measured again in another session (`rerun`): how far the
    /// lab reproduces its own measurements, and the predictions against every run pooled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reruns: Vec<String>,
}

/// One configuration's runs on one lab.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigRuns {
    /// The strategy that made the plan.
    pub strategy: String,
    /// The compressor, as in [`CompressorSetting`].
    pub compressor: String,
    /// Its error-feedback memory, as in [`CompressorSetting`].
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
    /// The lab's node count and line rate.
    pub setting: LabSetting,
    /// The lab's measured cluster file, relative to the experiment directory.
    pub cluster: String,
    /// Every configuration run on the lab.
    pub configs: Vec<ConfigRuns>,
}

/// measurements.json of a lab experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabMeasurements {
    /// The file's format version.
    pub format_version: u32,
    /// Where and when: the machine's CPU count and the command that measured.
    pub source: String,
    /// Every lab's runs.
    pub labs: Vec<LabRuns>,
}

/// The measurements file of an experiment directory.
pub const MEASUREMENTS: &str = "measurements.json";

/// The measurements of `dir` (an experiment's, or a rerun's), and the label that names them.
pub(super) fn read_measurements(dir: &Path) -> Result<(LabMeasurements, String)> {
    let path = dir.join(MEASUREMENTS);
    let label = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|source| SimError::Io {
        path: path.clone(),
        source,
    })?;
    let measured: LabMeasurements = data::parse_json(&label, &text)?;
    data::check_format_version(&label, measured.format_version)?;
    Ok((measured, label))
}

/// One predicted configuration.
struct Row<'a> {
    setting: LabSetting,
    runs: &'a ConfigRuns,
    /// From the lab's own measured cluster file.
    predicted_ms: f64,
    /// From the `transport_from` lab's cluster file with this lab's nodes and line rate.
    transported_ms: Option<f64>,
    measured_ms: f64,
}

impl Row<'_> {
    fn error(&self) -> f64 {
        relative_error(self.predicted_ms, self.measured_ms)
    }

    fn transported_error(&self) -> Option<f64> {
        self.transported_ms
            .map(|predicted| relative_error(predicted, self.measured_ms))
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
    let (measured, _) = read_measurements(dir)?;
    let model = ModelProfile::load(&spec.model)?;
    let reference = match spec.transport_from {
        Some(setting) => Some(
            measured
                .labs
                .iter()
                .find(|lab| lab.setting == setting)
                .ok_or_else(|| {
                    SimError::invalid(
                        label,
                        "transport_from",
                        format!(
                            "no lab of {} nodes at {} Gb/s was measured",
                            setting.nodes, setting.gbps
                        ),
                    )
                })?,
        ),
        None => None,
    };
    let mut rows = Vec::new();
    for lab in &measured.labs {
        let own = lab_scenario(&model, dir, lab, ClusterOverrides::default())?;
        let transported = match reference {
            Some(reference) => {
                let mut moved = lab_scenario(
                    &model,
                    dir,
                    reference,
                    ClusterOverrides {
                        nodes: Some(lab.setting.nodes),
                        gpus_per_node: None,
                        inter_gbps: Some(lab.setting.gbps),
                    },
                )?;
                moved.cluster.contention = own.cluster.contention.clone();
                Some(moved)
            }
            None => None,
        };
        // A configuration without measured iterations (it failed) has no median and no row.
        let measured = lab
            .configs
            .iter()
            .filter_map(|runs| Some((runs, median(&runs.iteration_ms)?)));
        for (runs, measured_ms) in measured {
            let predict = |base: &Scenario| -> Result<f64> {
                let mut scenario = base.clone();
                scenario.compute_scale = runs.compute_scale;
                let outcome = simulate(&scenario, &runs.plan, &SimOptions::default())?;
                Ok(outcome.summary.iteration_time_ms)
            };
            rows.push(Row {
                setting: lab.setting,
                runs,
                predicted_ms: predict(&own)?,
                transported_ms: transported.as_ref().map(predict).transpose()?,
                measured_ms,
            });
        }
    }
    let mut table = table(spec, &measured, &rows);
    // Each configuration's prediction from its own lab's file, found by its first runs.
    let predicted = |setting: LabSetting, runs: &ConfigRuns| {
        rows.iter()
            .find(|r| r.setting == setting && std::ptr::eq(r.runs, runs))
            .map(|r| r.predicted_ms)
    };
    for rerun in &spec.reruns {
        let again = rerun::load(dir, rerun, &measured)?;
        table.push_str(&rerun::table(rerun, &measured, &again, &predicted));
    }
    Ok(Results {
        inputs: Vec::<(String, Input)>::new(),
        csv: csv(&rows),
        comparison: None,
        charts: vec![chart(spec, &rows)],
        table,
    })
}

/// The model on a lab's measured cluster file, with `overrides`.
fn lab_scenario(
    model: &ModelProfile,
    dir: &Path,
    lab: &LabRuns,
    overrides: ClusterOverrides,
) -> Result<Scenario> {
    let path = dir.join(&lab.cluster);
    let cluster = Cluster::load(&path.to_string_lossy(), overrides)?;
    Scenario::new(model.clone(), cluster)
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
        "transported_ms",
        "transported_error_pct",
    ]);
    let optional = |value: Option<f64>| value.map_or_else(String::new, |v| format!("{v:.1}"));
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
            optional(r.transported_ms),
            optional(r.transported_error().map(|e| e * 100.0)),
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

/// Error statistics of rows under one way of predicting them: median |error|, 90th
/// percentile |error| and Spearman's rank correlation of predicted with measured.
struct Statistics {
    median: f64,
    p90: f64,
    spearman: f64,
}

impl Statistics {
    /// Over the rows that `predicted` gives a prediction for; `None` if there are none.
    fn of(rows: &[&Row], predicted: impl Fn(&Row) -> Option<f64>) -> Option<Statistics> {
        let pairs: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|r| predicted(r).map(|p| (p, r.measured_ms)))
            .collect();
        if pairs.is_empty() {
            return None;
        }
        let errors: Vec<f64> = pairs
            .iter()
            .map(|&(p, m)| relative_error(p, m).abs())
            .collect();
        let (predicted, measured): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
        Some(Statistics {
            median: quantile(&errors, 0.5),
            p90: quantile(&errors, 0.9),
            spearman: spearman(&predicted, &measured),
        })
    }

    /// Table cells: median, 90th percentile and (unless `rank` is false) Spearman.
    fn cells(stats: Option<Statistics>, rank: bool) -> String {
        match stats {
            Some(s) if rank => format!(
                "{:.1} % | {:.1} % | {:.2}",
                s.median * 100.0,
                s.p90 * 100.0,
                s.spearman
            ),
            Some(s) => format!("{:.1} % | {:.1} % |", s.median * 100.0, s.p90 * 100.0),
            None => "– | – | –".into(),
        }
    }
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
    let transported = spec.transport_from.map(|from| {
        format!(
            "the transport of the {} nodes, {} Gb/s lab's file, with this lab's nodes, rate and measured host contention",
            from.nodes, from.gbps
        )
    });
    let _ = writeln!(
        text,
        "Predicted from each lab's own measured cluster file{}.\n",
        transported
            .as_ref()
            .map_or_else(String::new, |t| format!(", and from {t}"))
    );
    let _ = writeln!(
        text,
        "| lab | configurations | median \\|error\\| | 90th percentile \\|error\\| | Spearman (ranking) | transported: median | 90th percentile | Spearman |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|---|---|");
    let own = |r: &Row| Some(r.predicted_ms);
    let moved = |r: &Row| r.transported_ms;
    // One row of the table: its label, its rows' count, and both predictions' statistics.
    let row = |text: &mut String, label: &str, these: &[&Row], rank: bool| {
        let _ = writeln!(
            text,
            "| {label} | {} | {} | {} |",
            these.len(),
            Statistics::cells(Statistics::of(these, own), rank),
            Statistics::cells(Statistics::of(these, moved), rank),
        );
    };
    let mut all: Vec<&Row> = Vec::new();
    for lab in &measured.labs {
        let these: Vec<&Row> = rows.iter().filter(|r| r.setting == lab.setting).collect();
        if these.is_empty() {
            continue;
        }
        let label = format!("{} nodes, {} Gb/s", lab.setting.nodes, lab.setting.gbps);
        row(&mut text, &label, &these, true);
        all.extend(these);
    }
    // The ranking target is per bandwidth: the labs of one rate ranked together.
    let mut rates: Vec<f64> = Vec::new();
    for lab in &measured.labs {
        if !rates.contains(&lab.setting.gbps) {
            rates.push(lab.setting.gbps);
        }
    }
    for gbps in rates {
        // Only the labs that have rows count.
        let labs = measured
            .labs
            .iter()
            .filter(|l| l.setting.gbps == gbps && all.iter().any(|r| r.setting == l.setting))
            .count();
        if labs < 2 {
            continue;
        }
        let these: Vec<&Row> = all
            .iter()
            .copied()
            .filter(|r| r.setting.gbps == gbps)
            .collect();
        let label = format!("{labs} labs at {gbps} Gb/s, ranked together");
        row(&mut text, &label, &these, true);
    }
    if !all.is_empty() {
        row(&mut text, "**all**", &all, false);
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
        "\n| lab | configuration | predicted ms | measured ms (min–max) | error | transported ms | error |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|---|");
    for r in rows {
        let (min, max) = spread(&r.runs.iteration_ms);
        let (moved_ms, moved_error) = match (r.transported_ms, r.transported_error()) {
            (Some(ms), Some(error)) => (format!("{ms:.1}"), format!("{:+.1} %", error * 100.0)),
            _ => ("–".into(), "–".into()),
        };
        let _ = writeln!(
            text,
            "| {}n {}G | {} | {:.1} | {:.1} ({:.1}–{:.1}) | {:+.1} % | {moved_ms} | {moved_error} |",
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
            let these: Vec<&Row> = rows.iter().filter(|r| r.setting == *setting).collect();
            let points = |predicted: &dyn Fn(&Row) -> Option<f64>| {
                let mut points: Vec<(f64, f64)> = these
                    .iter()
                    .filter_map(|r| predicted(r).map(|p| (r.measured_ms, p)))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                points
            };
            let own = points(&|r| Some(r.predicted_ms));
            let moved = points(&|r| r.transported_ms);
            let top = own
                .iter()
                .chain(&moved)
                .map(|p| p.0.max(p.1))
                .fold(0.0, f64::max);
            let mut series = vec![Series {
                label: "own cluster file".into(),
                points: own,
            }];
            if !moved.is_empty() {
                series.push(Series {
                    label: "transported".into(),
                    points: moved,
                });
            }
            series.push(Series {
                label: "exact".into(),
                points: vec![(0.0, 0.0), (top, top)],
            });
            Panel {
                title: format!("{} nodes, {} Gb/s", setting.nodes, setting.gbps),
                x_label: "measured iteration (ms)".into(),
                y_label: "predicted iteration (ms)".into(),
                series,
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
}
