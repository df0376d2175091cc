//! The GRACE comparison as results: each row's role (fit, held out, excluded), the CSV, the chart panels and the error table.

use super::calibration::{Calibration, CodecScale};
use super::compute::ComputeTarget;
use super::consistency::Exclusions;
use super::measured::Measurement;
use super::{GraceSpec, MethodSpec};
use crate::chart::{Panel, Series};
use crate::csv::Csv;
use crate::topology::Library;
use std::collections::BTreeMap;
use std::fmt::Write as _;

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

pub struct Report<'a> {
    pub spec: &'a GraceSpec,
    pub rows: &'a [(&'a Measurement, f64)],
    pub targets: &'a BTreeMap<String, ComputeTarget>,
}

impl Report<'_> {
    pub fn csv(&self) -> Csv {
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
    pub fn panels(&self) -> Vec<Panel> {
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

    pub fn markdown(
        &self,
        cal: &Calibration,
        batch: u32,
        scales: &BTreeMap<String, CodecScale>,
        methods: &BTreeMap<String, MethodSpec>,
        data: &[Measurement],
        exclusions: &Exclusions,
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

#[cfg(test)]
mod tests {
    use super::super::compute;
    use super::*;
    use crate::data;

    fn spec() -> GraceSpec {
        let text = r#"{
            "format_version": 1, "title": "t", "data": "grace.csv",
            "base_cluster": "v100-tcp", "base_device": "v100-pcie-32gb", "strategy": "horovod",
            "network_model": "resnet50", "upper_bound_min_ratio": 0.5, "fit_workers": 2,
            "batch_sizes": [32],
            "models": [
                { "grace": "resnet50", "profile": "resnet50", "file": "r.json" },
                { "grace": "vgg19", "profile": "vgg19", "file": "v.json" }
            ],
            "methods": [{ "grace": "none", "compressor": "none", "note": "dense" }]
        }"#;
        data::parse_json("spec.json", text).unwrap()
    }

    #[test]
    fn rows_are_fitted_by_role_and_excluded_rows_never_are() {
        let row = Measurement::test_row;
        let mut vgg_one = row("vgg19", 1, "none", 30.0);
        vgg_one.excluded = Some("slower per worker".to_string());
        let mut excluded = row("resnet50", 2, "dgc", 150.0);
        excluded.excluded = Some("below the upper bound".to_string());
        let data = [
            (row("resnet50", 1, "none", 100.0), true),
            (row("resnet50", 4, "none", 300.0), true),
            (row("vgg19", 4, "none", 60.0), false),
            // vgg19's 1-worker row is excluded: its fastest row per worker is its compute target.
            (vgg_one, false),
            (row("vgg19", 2, "none", 50.0), true),
            (row("resnet50", 2, "fp16", 170.0), true),
            (row("resnet50", 4, "fp16", 320.0), false),
            (excluded, false),
        ];
        let spec = spec();
        let rows: Vec<Measurement> = data.iter().map(|(m, _)| m.clone()).collect();
        let targets = compute::targets(&spec, &rows).unwrap();
        assert_eq!(targets["vgg19"].images_per_s, 25.0);
        for (m, fitted) in &data {
            assert_eq!(fitted_row(&spec, &targets, m), *fitted, "{m:?}");
        }
    }
}
