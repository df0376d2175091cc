//! A framework's costs checked against published runs of it.
//!
//! The checks are DDP's overhead over the bare model and its bucket-size effect.

use super::Results;
use crate::base::csv::Csv;
use crate::base::error::{Result, SimError};
use crate::base::stats::median;
use crate::inputs::framework::Framework;
use crate::inputs::model::ModelProfile;
use crate::inputs::topology::{Cluster, ClusterOverrides};
use crate::predict::scenario::Scenario;
use crate::predict::simulate::{simulate, SimOptions};
use crate::strategy::{Strategy, StrategyOptions};
use serde::Deserialize;
use std::path::Path;

/// spec.json of a framework check.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FrameworkSpec {
    /// The published runs: `model,batch_per_gpu,gpus,nodes,config,bucket_mb,percentile,
    /// sec_per_iter,diff_vs_25mb_percent` (relative to the experiment directory).
    pub measurements: String,
    pub cluster: String,
    pub framework: String,
    /// The rows the framework file was fitted on, as `model@gpus`; every other row is held out.
    pub fitted: Vec<String>,
}

/// One published run.
struct Row {
    model: String,
    gpus: u32,
    nodes: u32,
    /// `None`: the model without DDP.
    bucket_mb: Option<f64>,
    seconds: f64,
    diff_percent: Option<f64>,
}

fn read_rows(path: &Path) -> Result<Vec<Row>> {
    let label = path.display().to_string();
    let text = crate::base::data::read_text(path)?;
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let expected = "model,batch_per_gpu,gpus,nodes,config,bucket_mb,percentile,sec_per_iter,diff_vs_25mb_percent";
    if header != expected {
        return Err(SimError::invalid(
            &label,
            "header",
            format!("expected `{expected}`"),
        ));
    }
    lines
        .enumerate()
        .map(|(i, line)| {
            let f: Vec<&str> = line.split(',').collect();
            let bad =
                |what: &str| SimError::invalid(&label, format!("line {}", i + 2), what.to_string());
            if f.len() != 9 {
                return Err(bad("needs 9 fields"));
            }
            let number = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite());
            let count = |s: &str| s.parse::<u32>().ok().filter(|&v| v > 0);
            Ok(Row {
                model: f[0].to_string(),
                gpus: count(f[2]).ok_or_else(|| bad("gpus is a whole number ≥ 1"))?,
                nodes: count(f[3]).ok_or_else(|| bad("nodes is a whole number ≥ 1"))?,
                bucket_mb: match f[4] {
                    "no-ddp" => None,
                    "ddp" => Some(
                        number(f[5])
                            .filter(|&b| b > 0.0)
                            .ok_or_else(|| bad("bucket_mb is a positive number"))?,
                    ),
                    _ => return Err(bad("config is `ddp` or `no-ddp`")),
                },
                seconds: number(f[7])
                    .filter(|&s| s > 0.0)
                    .ok_or_else(|| bad("sec_per_iter is a positive number"))?,
                diff_percent: match f[8] {
                    "" => None,
                    s => Some(number(s).ok_or_else(|| bad("diff_vs_25mb_percent is a number"))?),
                },
            })
        })
        .collect()
}

/// Predicted iteration time (ms) of DDP with `bucket_mb` buckets, and the model alone on one GPU.
fn predict(
    spec: &FrameworkSpec,
    framework: &Framework,
    model: &ModelProfile,
    row: &Row,
    bucket_mb: f64,
) -> Result<(f64, f64)> {
    let overrides = ClusterOverrides {
        nodes: Some(row.nodes),
        gpus_per_node: Some(row.gpus / row.nodes),
        inter_gbps: None,
    };
    let scenario = Scenario::new(model.clone(), Cluster::load(&spec.cluster, overrides)?)?
        .with_framework(Some(framework.clone()));
    let options = StrategyOptions {
        bucket_bytes: (bucket_mb * 1048576.0) as u64,
        ..StrategyOptions::default()
    };
    let mut plan = Strategy::Ddp.plan(&scenario, &options)?;
    plan.framework = Some(spec.framework.clone());
    let summary = simulate(&scenario, &plan, &SimOptions::default())?.summary;
    Ok((
        summary.iteration_time_ms,
        summary.single_gpu_iteration_time_ms,
    ))
}

pub(super) fn run(spec: &FrameworkSpec, label: &str, dir: &Path) -> Result<Results> {
    let rows = read_rows(&dir.join(&spec.measurements))?;
    let framework = Framework::load(&spec.framework)?;
    let mut csv = Csv::new(&[
        "model",
        "gpus",
        "effect",
        "measured_percent",
        "predicted_percent",
        "error_percent",
        "role",
    ]);
    let mut table = String::from(
        "| model | GPUs | effect | measured | predicted | error | role |\n|---|---|---|---|---|---|---|\n",
    );
    let mut held_out = Vec::new();
    for row in &rows {
        let Some(bucket_mb) = row.bucket_mb else {
            continue;
        };
        let model = ModelProfile::load(&row.model)?;
        let key = format!("{}@{}", row.model, row.gpus);
        let role = if spec.fitted.contains(&key) {
            "fitted"
        } else {
            "held out"
        };
        let (time, single) = predict(spec, &framework, &model, row, bucket_mb)?;
        // Each effect as a fraction of a time the same source measured, so that a model
        // profile slower or faster than the source's GPU does not count as an error.
        let (effect, measured, predicted, measured_time, predicted_time) = match row.diff_percent {
            Some(diff) => {
                let (base, _) = predict(spec, &framework, &model, row, 25.0)?;
                (
                    "1 MB vs 25 MB buckets",
                    -diff,
                    (time / base - 1.0) * 100.0,
                    1.0 - diff / 100.0,
                    time / base,
                )
            }
            None => {
                let bare = rows
                    .iter()
                    .find(|r| r.model == row.model && r.bucket_mb.is_none())
                    .ok_or_else(|| {
                        SimError::invalid(
                            label,
                            "measurements",
                            format!("no `no-ddp` row of {}", row.model),
                        )
                    })?;
                let ratio = row.seconds / bare.seconds;
                (
                    "DDP over the bare model",
                    (ratio - 1.0) * 100.0,
                    (time / single - 1.0) * 100.0,
                    ratio,
                    time / single,
                )
            }
        };
        // The error of the iteration time, relative to the bare model or the 25 MB run.
        let error = (predicted_time / measured_time - 1.0) * 100.0;
        if role == "held out" {
            held_out.push(error.abs());
        }
        csv.row([
            row.model.clone(),
            row.gpus.to_string(),
            effect.to_string(),
            format!("{measured:.2}"),
            format!("{predicted:.2}"),
            format!("{error:.2}"),
            role.to_string(),
        ]);
        table.push_str(&format!(
            "| {} | {} | {effect} | +{measured:.1} % | +{predicted:.1} % | {error:+.1} % | {role} |\n",
            row.model, row.gpus
        ));
    }
    table.push_str(&format!(
        "\nHeld-out rows: {}, median |error| of the iteration time {:.1} %. Regenerate with `syncopate experiment run` on this directory.\n",
        held_out.len(),
        median(&held_out).unwrap_or(f64::NAN)
    ));
    Ok(Results {
        inputs: Vec::new(),
        csv: csv.into_text(),
        comparison: None,
        charts: Vec::new(),
        table,
    })
}
