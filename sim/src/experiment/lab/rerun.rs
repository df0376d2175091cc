//! A lab experiment measured again.
//!
//! It reports how far two measurements of the same plans agree, and the predictions against the
//! second and against both pooled.
//!
//! A lab run on a shared two-core machine is a draw. A second measurement of the same labs and
//! plans, in another session, says which differences between configurations the lab itself
//! reproduces: a prediction cannot be held to a ranking that the measurement does not repeat.

use super::{read_measurements, spearman, ConfigRuns, LabMeasurements, LabSetting};
use crate::base::error::{Result, SimError};
use crate::base::stats::{median, quantile};
use crate::predict::validate::relative_error;
use std::fmt::Write as _;
use std::path::Path;

/// One configuration measured in both runs, with its prediction.
struct Pair {
    first: f64,
    again: f64,
    pooled: f64,
    predicted: f64,
}

/// Reads the rerun in `dir/rerun` (its own `measurements.json`) and checks that it ran the
/// plans of `measured`: the same configuration must have the same plan, wherever it ran.
pub(super) fn load(dir: &Path, rerun: &str, measured: &LabMeasurements) -> Result<LabMeasurements> {
    let (again, label) = read_measurements(&dir.join(rerun))?;
    check_same_plans(&label, measured, &again)?;
    Ok(again)
}

/// Every configuration of `again` ran as in `measured`: the same plan and compute scale.
fn check_same_plans(
    label: &str,
    measured: &LabMeasurements,
    again: &LabMeasurements,
) -> Result<()> {
    for lab in &again.labs {
        for config in &lab.configs {
            let same = first_of(measured, lab.setting, config).is_some_and(|first| {
                let (mut a, mut b) = (first.plan.clone(), config.plan.clone());
                // Where the plan's cluster file lay is not part of what ran.
                (a.target, b.target) = (None, None);
                a == b && first.compute_scale == config.compute_scale
            });
            if !same {
                return Err(SimError::invalid(
                    label,
                    "labs",
                    format!(
                        "{} nodes at {} Gb/s, {} + {} ({}): the first measurement ran no such configuration with this plan and compute scale",
                        lab.setting.nodes, lab.setting.gbps, config.strategy, config.compressor, config.memory
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The first measurement's runs of `config` on the lab of `setting`.
fn first_of<'a>(
    measured: &'a LabMeasurements,
    setting: LabSetting,
    config: &ConfigRuns,
) -> Option<&'a ConfigRuns> {
    measured
        .labs
        .iter()
        .find(|lab| lab.setting == setting)?
        .configs
        .iter()
        .find(|c| {
            (&c.strategy, &c.compressor, &c.memory)
                == (&config.strategy, &config.compressor, &config.memory)
        })
}

/// The table of `rerun` against `measured`, with `predicted` giving each configuration's
/// prediction from its lab's own cluster file.
pub(super) fn table(
    rerun: &str,
    measured: &LabMeasurements,
    again: &LabMeasurements,
    predicted: &dyn Fn(LabSetting, &ConfigRuns) -> Option<f64>,
) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "\n**Measured again** (`{rerun}`: {}). Per lab, over the configurations both runs measured: Spearman's correlation of the two runs' medians, how far they differ, and the predictions against the second run and against every run of both pooled.\n",
        again.source
    );
    let _ = writeln!(
        text,
        "| lab | configurations | run against run: Spearman | median \\|difference\\| | 90th percentile | predicted against the rerun: median \\|error\\| | Spearman | against both pooled: median \\|error\\| | 90th percentile | Spearman |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|---|---|---|---|");
    for lab in &again.labs {
        let pairs: Vec<Pair> = lab
            .configs
            .iter()
            .filter_map(|config| {
                let first = first_of(measured, lab.setting, config)?;
                let pooled: Vec<f64> = first
                    .iteration_ms
                    .iter()
                    .chain(&config.iteration_ms)
                    .copied()
                    .collect();
                Some(Pair {
                    first: median(&first.iteration_ms)?,
                    again: median(&config.iteration_ms)?,
                    pooled: median(&pooled)?,
                    predicted: predicted(lab.setting, first)?,
                })
            })
            .collect();
        if pairs.len() < 2 {
            continue;
        }
        let column = |f: fn(&Pair) -> f64| pairs.iter().map(f).collect::<Vec<f64>>();
        let errors = |of: fn(&Pair) -> f64| -> Vec<f64> {
            pairs
                .iter()
                .map(|p| relative_error(p.predicted, of(p)).abs())
                .collect()
        };
        let differences: Vec<f64> = pairs
            .iter()
            .map(|p| relative_error(p.again, p.first).abs())
            .collect();
        let (against_rerun, against_pooled) = (errors(|p| p.again), errors(|p| p.pooled));
        let _ = writeln!(
            text,
            "| {} nodes, {} Gb/s | {} | {:.2} | {:.1} % | {:.1} % | {:.1} % | {:.2} | {:.1} % | {:.1} % | {:.2} |",
            lab.setting.nodes,
            lab.setting.gbps,
            pairs.len(),
            spearman(&column(|p| p.first), &column(|p| p.again)),
            quantile(&differences, 0.5) * 100.0,
            quantile(&differences, 0.9) * 100.0,
            quantile(&against_rerun, 0.5) * 100.0,
            spearman(&column(|p| p.predicted), &column(|p| p.again)),
            quantile(&against_pooled, 0.5) * 100.0,
            quantile(&against_pooled, 0.9) * 100.0,
            spearman(&column(|p| p.predicted), &column(|p| p.pooled)),
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::lab::LabRuns;
    use crate::inputs::model::ModelProfile;
    use crate::strategy::per_tensor_plan;

    const LAB: LabSetting = LabSetting {
        nodes: 2,
        gbps: 1.0,
    };

    /// One lab whose configuration `i` ran `runs[i]` (ms), all with one plan.
    fn measurements(runs: &[&[f64]]) -> LabMeasurements {
        let plan = per_tensor_plan(&ModelProfile::load("resnet50").unwrap());
        let configs = runs
            .iter()
            .enumerate()
            .map(|(i, ms)| ConfigRuns {
                strategy: format!("s{i}"),
                compressor: "none".into(),
                memory: "none".into(),
                plan: plan.clone(),
                compute_scale: 1.0,
                iteration_ms: ms.to_vec(),
                failures: Vec::new(),
            })
            .collect();
        LabMeasurements {
            format_version: 1,
            source: "test".into(),
            labs: vec![LabRuns {
                setting: LAB,
                cluster: "clusters/lab.json".into(),
                configs,
            }],
        }
    }

    /// The cells of the table's one lab row.
    fn cells(table: &str) -> Vec<String> {
        let row = table.lines().find(|l| l.starts_with("| 2 nodes")).unwrap();
        row.split('|').map(|c| c.trim().to_string()).collect()
    }

    #[test]
    fn runs_that_agree_rank_alike_and_a_prediction_is_judged_on_both_pooled() {
        let first = measurements(&[&[100.0, 110.0], &[200.0], &[300.0]]);
        let again = measurements(&[&[120.0], &[200.0], &[330.0]]);
        // The prediction ranks the configurations as both runs do and is 10 % off the pooled
        // medians (110, 200, 315) for the last two.
        let predicted = |_: LabSetting, runs: &ConfigRuns| {
            Some([110.0, 220.0, 346.5][runs.strategy[1..].parse::<usize>().unwrap()])
        };
        let table = table("rerun", &first, &again, &predicted);
        let cells = cells(&table);
        assert_eq!(cells[2], "3");
        assert_eq!(cells[3], "1.00", "{table}");
        // The runs' medians (105, 200, 300 and 120, 200, 330) differ by 14.3, 0 and 10 %.
        assert_eq!(cells[4], "10.0 %", "{table}");
        assert_eq!(cells[5], "13.4 %", "{table}");
        // Against the rerun: −8.3, +10 and +5 %.
        assert_eq!(cells[6], "8.3 %", "{table}");
        assert_eq!(cells[7], "1.00", "{table}");
        assert_eq!(cells[8], "10.0 %", "{table}");
        assert_eq!(cells[10], "1.00", "{table}");
    }

    #[test]
    fn a_rerun_of_another_plan_is_refused_naming_the_configuration() {
        let first = measurements(&[&[100.0], &[200.0]]);
        let mut again = measurements(&[&[100.0], &[200.0]]);
        again.labs[0].configs[1].plan.groups.pop();
        let err = check_same_plans("rerun/measurements.json", &first, &again).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("rerun/measurements.json") && text.contains("s1"),
            "{text}"
        );
        let mut unknown = measurements(&[&[100.0]]);
        unknown.labs[0].configs[0].strategy = "other".into();
        assert!(check_same_plans("rerun", &first, &unknown).is_err());
        assert!(check_same_plans("rerun", &first, &measurements(&[&[1.0], &[2.0]])).is_ok());
    }
}
