//! The GRACE comparison as results: row roles, the CSV, the chart panels and the error table.
//!
//! Each row's role is fit, held out or excluded.

use super::calibration::{Calibration, CodecPrice, OpCost};
use super::compute::ComputeTarget;
use super::consistency::Exclusions;
use super::measured::Measurement;
use super::{fit, GraceSpec, MethodSpec};
use crate::base::chart::{Panel, Series};
use crate::base::csv::Csv;
use crate::base::stats::median;
use crate::experiment::lab;
use crate::inputs::topology::Library;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Whether a row is a calibration row (at most `fit_workers` workers: the only rows the fit
/// sees) or held out. Excluded rows are never fitted, whichever set they are in.
fn fitted_row(spec: &GraceSpec, m: &Measurement) -> bool {
    m.workers <= spec.fit_workers
}

/// Spearman's rank correlation of the pairs (the lab experiment's); `None` for fewer than two
/// pairs or a constant side, where it is undefined.
fn spearman(pairs: &[(f64, f64)]) -> Option<f64> {
    let x: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let y: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let varies = |v: &[f64]| v.iter().any(|&a| a != v[0]);
    (pairs.len() >= 2 && varies(&x) && varies(&y)).then(|| lab::spearman(&x, &y))
}

pub(super) struct Report<'a> {
    pub spec: &'a GraceSpec,
    pub rows: &'a [(&'a Measurement, f64)],
    pub targets: &'a BTreeMap<String, ComputeTarget>,
}

impl Report<'_> {
    pub(super) fn csv(&self) -> Csv {
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
                if fitted_row(self.spec, m) {
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
    pub(super) fn panels(&self) -> Vec<Panel> {
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

    /// Predicted over measured minus one, in percent, for every row at `workers` workers that
    /// `keep` accepts.
    fn errors_at(&self, workers: u32, keep: &dyn Fn(&Measurement) -> bool) -> Vec<f64> {
        self.rows
            .iter()
            .filter(|(m, _)| m.workers == workers && keep(m))
            .map(|(m, p)| 100.0 * (p / m.throughput - 1.0))
            .collect()
    }

    /// The held-out statistics: median absolute error at each held-out worker count and over
    /// all of them, and each model's Spearman rank correlation of its configurations at the
    /// largest worker count (measured against predicted throughput), from consistent rows.
    fn held_out(&self, md: &mut String) {
        let mut counts: Vec<u32> = self
            .rows
            .iter()
            .map(|(m, _)| m.workers)
            .filter(|&w| w > self.spec.fit_workers)
            .collect();
        counts.sort_unstable();
        counts.dedup();
        let consistent = |m: &Measurement| m.excluded.is_none();
        let all = |_: &Measurement| true;
        let abs = |v: Vec<f64>| v.into_iter().map(f64::abs).collect::<Vec<_>>();
        let show = |v: &[f64]| match median(v) {
            Some(x) => format!("{x:.1} % ({} rows)", v.len()),
            None => "–".to_string(),
        };
        let _ = writeln!(
            md,
            "\n**Held out** (rows with more than {} workers; the fit never sees them):\n\n| workers | median absolute error | median absolute error incl. excluded | median signed error |\n|---|---|---|---|",
            self.spec.fit_workers
        );
        let (mut held, mut held_with) = (Vec::new(), Vec::new());
        for &w in &counts {
            let (c, x) = (self.errors_at(w, &consistent), self.errors_at(w, &all));
            let _ = writeln!(
                md,
                "| {w} | {} | {} | {} |",
                show(&abs(c.clone())),
                show(&abs(x.clone())),
                median(&c).map_or("–".to_string(), |m| format!("{m:+.1} %"))
            );
            held.extend(abs(c));
            held_with.extend(abs(x));
        }
        let _ = writeln!(
            md,
            "| **all held out** | **{}** | {} | |",
            show(&held),
            show(&held_with)
        );
        let Some(&largest) = counts.last() else {
            return;
        };
        let mut models: Vec<&str> = self.rows.iter().map(|(m, _)| m.model.as_str()).collect();
        models.sort_unstable();
        models.dedup();
        let _ = write!(
            md,
            "\n**Spearman rank correlation** of measured and predicted throughput over each model's consistent compressor configurations (method, ratio, memory) at {largest} workers, and with `none` among them:"
        );
        for model in models {
            let pairs = |with_none: bool| -> Vec<(f64, f64)> {
                self.rows
                    .iter()
                    .filter(|(m, _)| {
                        m.model == model
                            && m.workers == largest
                            && m.excluded.is_none()
                            && (with_none || m.method != "none")
                    })
                    .map(|(m, p)| (m.throughput, *p))
                    .collect()
            };
            let rho =
                |v: &[(f64, f64)]| spearman(v).map_or("–".to_string(), |r| format!("{r:.2}"));
            let (compressors, all) = (pairs(false), pairs(true));
            let _ = write!(
                md,
                " **{model}** {} ({} configurations), {} with `none`;",
                rho(&compressors),
                compressors.len(),
                rho(&all)
            );
        }
        md.push('\n');
    }

    pub(super) fn markdown(
        &self,
        cal: &Calibration,
        base: &Calibration,
        prices: &BTreeMap<String, CodecPrice>,
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
            let bounds = fit::mpi_on_bounds(
                p.tcp_efficiency,
                p.message_overhead_us,
                p.reduce_gbytes_per_s,
            );
            let warning = match bounds.is_empty() {
                true => String::new(),
                false => format!(" **On the end of its grid:** {}.", bounds.join(", ")),
            };
            let _ = writeln!(
                md,
                "Fitted on the rows with at most {} workers: MPI/TCP `tcp_efficiency` {:.2}, `message_overhead_us` {:.0}, `reduce_gbytes_per_s` {:.1} (on {}'s dense rows);{warning} batch {} per GPU (not fitted: {}); wire `{}` ({}); codec calls per `{}` ({}).\n",
                self.spec.fit_workers,
                p.tcp_efficiency,
                p.message_overhead_us,
                p.reduce_gbytes_per_s,
                self.spec.network_model,
                self.spec.batch_size_per_gpu,
                self.spec.batch_source,
                self.spec.wire.name(),
                self.spec.wire_source,
                self.spec.codec_calls.name(),
                self.spec.codec_calls_source
            );
        }
        md.push_str("Compute:");
        for (model, target) in self.targets {
            let one = self
                .rows
                .iter()
                .find(|(m, _)| &m.model == model && m.workers == 1 && m.method == "none")
                .map_or(f64::NAN, |(_, p)| *p);
            let source = match target {
                ComputeTarget::Row(row) => {
                    format!("its 1-worker `none` row ({:.2} img/s)", row.throughput)
                }
                ComputeTarget::Fastest { row, excluded } => format!(
                    "its fastest consistent row per worker, `{}` at {} workers ({:.2} img/s = {:.2} per worker; its 1-worker row, {:.2} img/s, is excluded as inconsistent)",
                    row.method,
                    row.workers,
                    row.throughput,
                    target.images_per_s(),
                    excluded.throughput
                ),
            };
            let _ = write!(md, " **{model}** at {one:.2} img/s per worker, {source};");
        }
        md.push_str("\n\n");
        let start = OpCost::base(&base.device);
        md.push_str("| GRACE method | our compressor | encode µs per op / ns per byte; decode, every compressor's (× a bandwidth-bound kernel) | rows fit / held out / excluded | MAPE fit rows | MAPE held-out | MAPE held-out incl. excluded | MAPE all | MAPE all incl. excluded |\n|---|---|---|---|---|---|---|---|---|\n");
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
            let f = errors(&|m| m.excluded.is_none() && fitted_row(self.spec, m));
            let h = errors(&|m| m.excluded.is_none() && !fitted_row(self.spec, m));
            let x = errors(&|m| m.excluded.is_some());
            let cat = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().chain(b).copied().collect() };
            let price = prices
                .get(name)
                .map(|p| {
                    let show = |cost: OpCost| {
                        let (op, byte) = (
                            cost.us_per_op / start.us_per_op,
                            cost.ns_per_byte / start.ns_per_byte,
                        );
                        let bound = match fit::price_on_bound(op) || fit::price_on_bound(byte) {
                            true => " **on the grid's end**",
                            false => "",
                        };
                        format!(
                            "{:.1} / {:.4} ({op:.1}× / {byte:.1}×){bound}",
                            cost.us_per_op, cost.ns_per_byte
                        )
                    };
                    format!("{}; {}", show(p.encode), show(p.decode))
                })
                .unwrap_or_else(|| "–".to_string());
            let _ = writeln!(
                md,
                "| {name} | `{compressor}` | {price} | {} / {} / {} | {} | {} | {} | {} | {} |",
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
        self.held_out(&mut md);
        let excluded: Vec<&(&Measurement, f64)> = self
            .rows
            .iter()
            .filter(|(m, _)| m.excluded.is_some())
            .collect();
        let _ = writeln!(
            md,
            "\n**Excluded as inconsistent** (kept in results.csv, column `excluded`): rule 1 (below {:.2}× the `upper-bound` row of the same configuration) {} rows of the file; rule 2 (`upper-bound` row taking more than {:.2}× the median time of the other methods' with the same model, workers and communication method that send as many bytes) {} rows; rule 3 (1-worker `none` row slower per worker than more than half of its model's remaining rows with 2 to {} workers) {} rows. The {} of covered methods:\n",
            self.spec.upper_bound_min_ratio,
            exclusions.below_upper_bound,
            self.spec.upper_bound_peer_max_ratio,
            exclusions.disturbed_run,
            self.spec.fit_workers,
            exclusions.slow_one_worker,
            excluded.len()
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
        md.push_str("\nMAPE: mean absolute percentage error of throughput over GRACE configurations with 2–8 workers (repeated runs merged into their median); fit rows are those with at most `fit_workers` workers, whether or not a parameter was fitted to them. Not covered:");
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
    use super::super::{calibration_rows, check_rule_ratios, compute};
    use super::*;
    use crate::base::data;

    fn spec() -> GraceSpec {
        let text = r#"{
            "format_version": 1, "title": "t", "data": "grace.csv",
            "base_cluster": "v100-tcp", "base_device": "v100-pcie-32gb", "strategy": "horovod",
            "horovod": { "release": "0.18.2", "source": "s" },
            "network_model": "resnet50", "upper_bound_min_ratio": 0.5,
            "upper_bound_peer_max_ratio": 1.5, "fit_workers": 2,
            "batch_size_per_gpu": 64, "batch_source": "b", "wire": "bytes", "wire_source": "w",
            "codec_calls": "tensor", "codec_calls_source": "c",
            "models": [
                { "grace": "resnet50", "profile": "resnet50", "file": "r.json" },
                { "grace": "vgg19", "profile": "vgg19", "file": "v.json" }
            ],
            "methods": [{ "grace": "none", "compressor": "none", "note": "dense" }]
        }"#;
        data::parse_json("spec.json", text).unwrap()
    }

    #[test]
    fn rule_thresholds_out_of_range_name_their_field() {
        check_rule_ratios("spec.json", &spec()).unwrap();
        for (min, peer, field) in [
            (0.0, 1.5, "upper_bound_min_ratio"),
            (1.5, 1.5, "upper_bound_min_ratio"),
            (f64::NAN, 1.5, "upper_bound_min_ratio"),
            (0.5, 1.0, "upper_bound_peer_max_ratio"),
            (0.5, f64::INFINITY, "upper_bound_peer_max_ratio"),
            (0.5, f64::NAN, "upper_bound_peer_max_ratio"),
        ] {
            let mut spec = spec();
            (spec.upper_bound_min_ratio, spec.upper_bound_peer_max_ratio) = (min, peer);
            let err = check_rule_ratios("spec.json", &spec)
                .unwrap_err()
                .to_string();
            assert!(err.contains(field) && err.contains("spec.json"), "{err}");
        }
    }

    #[test]
    fn the_fit_sees_only_calibration_rows_and_an_inconsistent_model_takes_its_fastest_row() {
        let row = Measurement::test_row;
        let mut vgg_one = row("vgg19", 1, "none", 30.0);
        vgg_one.excluded = Some("slower per worker".to_string());
        let data = [
            row("resnet50", 1, "none", 100.0),
            row("resnet50", 4, "none", 300.0),
            row("vgg19", 4, "none", 60.0),
            vgg_one.clone(),
            row("vgg19", 2, "none", 50.0),
            row("resnet50", 8, "fp16", 320.0),
        ];
        let spec = spec();
        let calibration = calibration_rows(&spec, &data);
        assert_eq!(calibration.len(), 3);
        assert!(calibration
            .iter()
            .all(|m| m.workers <= 2 && fitted_row(&spec, m)));
        assert!(data
            .iter()
            .filter(|m| m.workers > 2)
            .all(|m| !fitted_row(&spec, m)));
        let targets = compute::targets(&spec, &calibration).unwrap();
        assert_eq!(targets["resnet50"], ComputeTarget::Row(data[0].clone()));
        assert_eq!(
            targets["vgg19"],
            ComputeTarget::Fastest {
                row: data[4].clone(),
                excluded: vgg_one
            }
        );
    }

    #[test]
    fn held_out_statistics_come_from_the_held_out_rows_only() {
        let row = Measurement::test_row;
        let mut excluded = row("vgg19", 8, "topk", 10.0);
        excluded.excluded = Some("below the upper bound".to_string());
        let data = [
            row("resnet50", 2, "none", 100.0),
            row("resnet50", 4, "none", 100.0),
            row("resnet50", 4, "fp16", 100.0),
            row("resnet50", 4, "dgc", 100.0),
            row("resnet50", 8, "none", 100.0),
            row("resnet50", 8, "fp16", 200.0),
            row("resnet50", 8, "dgc", 300.0),
            excluded,
        ];
        // Errors: 2 workers +500 %; 4 workers +10, -20, +30 %; 8 workers +5, -10, +33 % (same
        // order as measured) and the excluded row's +9900 %.
        let predicted = [600.0, 110.0, 80.0, 130.0, 105.0, 180.0, 400.0, 1000.0];
        let rows: Vec<(&Measurement, f64)> = data.iter().zip(predicted).collect();
        let spec = spec();
        let report = Report {
            spec: &spec,
            rows: &rows,
            targets: &BTreeMap::new(),
        };
        let mut md = String::new();
        report.held_out(&mut md);
        assert!(md.contains("| 4 | 20.0 % (3 rows) |"), "{md}");
        assert!(
            md.contains("| 8 | 10.0 % (3 rows) | 21.7 % (4 rows) |"),
            "{md}"
        );
        assert!(
            md.contains("**all held out** | **15.0 % (6 rows)**"),
            "{md}"
        );
        assert!(
            md.contains("**resnet50** 1.00 (2 configurations), 1.00 with `none`"),
            "{md}"
        );
        assert!(!md.contains("500"), "{md}");
    }

    #[test]
    fn median_and_spearman_by_hand() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        let same = [(1.0, 10.0), (2.0, 20.0), (3.0, 25.0)];
        assert_eq!(spearman(&same), Some(1.0));
        let reversed = [(1.0, 3.0), (2.0, 2.0), (3.0, 1.0)];
        assert_eq!(spearman(&reversed), Some(-1.0));
        // d = (0, 1, -1): 1 - 6·2 / (3·8) = 0.5.
        let swapped = [(1.0, 1.0), (2.0, 3.0), (3.0, 2.0)];
        assert!((spearman(&swapped).unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(spearman(&[(1.0, 1.0)]), None);
        assert_eq!(spearman(&[(1.0, 1.0), (2.0, 1.0)]), None);
    }
}
