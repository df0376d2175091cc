//! Prediction-vs-measurement statistics of one schedule, in total and per task.
//!
//! A simulated and a measured run of the schedule are compared.

use crate::inputs::real_run;
use crate::predict::scenario::Scenario;
use crate::predict::summary::Summary;
use crate::predict::trace::Trace;
use serde::Serialize;
use std::collections::BTreeMap;

/// A run's time per iteration, in ms: the whole iteration, compute, communication.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Times {
    /// The whole iteration, ms.
    pub iteration_ms: f64,
    /// Compute per iteration, ms.
    pub compute_ms: f64,
    /// Communication per iteration, ms.
    pub comm_ms: f64,
}

impl From<&Summary> for Times {
    fn from(s: &Summary) -> Times {
        Times {
            iteration_ms: s.iteration_time_ms,
            compute_ms: s.compute_ms,
            comm_ms: s.comm_ms,
        }
    }
}

/// One side of the comparison: its times and its trace.
#[derive(Clone, Copy, Debug)]
pub struct Run<'a> {
    /// The run's times per iteration.
    pub times: Times,
    /// The run's trace.
    pub trace: &'a Trace,
}

/// One task kind's mean duration per measured iteration, predicted and measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskRow {
    /// The task's name in the traces.
    pub task: String,
    /// Mean predicted duration, µs.
    pub predicted_us: f64,
    /// Mean measured duration, µs.
    pub measured_us: f64,
    /// (predicted − measured) / measured.
    pub error: f64,
}

/// What `syncopate validate` reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The model's name.
    pub model: String,
    /// The backend of the measured run.
    pub backend: String,
    /// Ranks in the cluster.
    pub world_size: u32,
    /// The cluster's name.
    pub cluster: String,
    /// The device profile's name.
    pub device: String,
    /// Predicted iteration time, ms.
    pub predicted_iteration_ms: f64,
    /// Measured iteration time, ms.
    pub measured_iteration_ms: f64,
    /// (predicted − measured) / measured.
    pub error: f64,
    /// Predicted compute per iteration, ms.
    pub predicted_compute_ms: f64,
    /// Measured compute per iteration, ms.
    pub measured_compute_ms: f64,
    /// Predicted communication per iteration, ms.
    pub predicted_comm_ms: f64,
    /// Measured communication per iteration, ms.
    pub measured_comm_ms: f64,
    /// The tasks that took longest in the measured run, longest first.
    pub largest_tasks: Vec<TaskRow>,
}

impl Report {
    /// Compares two runs of `scenario` on `backend`, each trace's iterations after `warmup`
    /// (the measured one's from `real_run::first_measured`);
    /// lists the `top` tasks that took longest in the measured run.
    pub fn new(
        scenario: &Scenario,
        backend: &str,
        predicted: Run,
        measured: Run,
        warmup: u32,
        top: usize,
    ) -> Report {
        let (p, m) = (predicted.times, measured.times);
        Report {
            model: scenario.model.name.clone(),
            backend: backend.to_string(),
            world_size: scenario.cluster.world_size(),
            cluster: scenario.cluster.name.clone(),
            device: scenario.device.name.clone(),
            predicted_iteration_ms: p.iteration_ms,
            measured_iteration_ms: m.iteration_ms,
            error: relative_error(p.iteration_ms, m.iteration_ms),
            predicted_compute_ms: p.compute_ms,
            measured_compute_ms: m.compute_ms,
            predicted_comm_ms: p.comm_ms,
            measured_comm_ms: m.comm_ms,
            largest_tasks: task_rows(predicted.trace, measured.trace, warmup, top),
        }
    }
}

/// (predicted − measured) / measured; 0 when nothing was measured.
pub fn relative_error(predicted: f64, measured: f64) -> f64 {
    if measured > 0.0 {
        (predicted - measured) / measured
    } else {
        0.0
    }
}

/// Mean duration of each task name on rank 0 over the iterations from `first` on, in µs.
pub fn task_means(trace: &Trace, first: u32) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, u32)> = BTreeMap::new();
    for event in &trace.trace_events {
        let iteration = event.args.get("iteration").and_then(|i| i.as_u64());
        if event.ph != "X" || event.pid != 0 || iteration.is_none_or(|i| i < u64::from(first)) {
            continue;
        }
        let entry = sums.entry(event.name.clone()).or_default();
        entry.0 += event.dur;
        entry.1 += 1;
    }
    sums.into_iter()
        .map(|(k, (s, n))| (k, s / f64::from(n)))
        .collect()
}

/// The tasks both traces ran, longest measured first, at most `top` of them; times rounded
/// to ns, the error from the unrounded means. Each trace counts the iterations its run
/// measures after `warmup`: a real run's start one later (`crate::inputs::real_run`).
pub fn task_rows(predicted: &Trace, measured: &Trace, warmup: u32, top: usize) -> Vec<TaskRow> {
    let predicted = task_means(predicted, warmup);
    let mut rows: Vec<TaskRow> = task_means(measured, real_run::first_measured(warmup))
        .into_iter()
        .filter_map(|(task, measured_us)| {
            let predicted_us = *predicted.get(&task)?;
            Some(TaskRow {
                error: relative_error(predicted_us, measured_us),
                task,
                predicted_us: (predicted_us * 1e3).round() / 1e3,
                measured_us: (measured_us * 1e3).round() / 1e3,
            })
        })
        .collect();
    rows.sort_by(|a, b| b.measured_us.total_cmp(&a.measured_us));
    rows.truncate(top);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::model::ModelProfile;
    use crate::inputs::topology::{Cluster, ClusterOverrides};
    use crate::predict::trace::TraceEvent;
    use serde_json::{json, Value};

    fn event(name: &str, ph: &str, pid: u32, dur: f64, args: Value) -> TraceEvent {
        TraceEvent {
            name: name.to_string(),
            cat: "test".to_string(),
            ph: ph.to_string(),
            ts: 0.0,
            dur,
            pid,
            tid: 0,
            args,
        }
    }

    /// Spans on rank 0 named `name` of `dur` µs at each of the `iterations`.
    fn spans(name: &str, iterations: &[(u64, f64)]) -> Vec<TraceEvent> {
        iterations
            .iter()
            .map(|&(i, dur)| event(name, "X", 0, dur, json!({ "iteration": i })))
            .collect()
    }

    fn trace(events: Vec<TraceEvent>) -> Trace {
        Trace {
            trace_events: events,
            display_time_unit: "ms".to_string(),
            other_data: Value::Null,
        }
    }

    #[test]
    fn means_skip_warmup_other_ranks_metadata_and_untagged_spans() {
        let mut events = spans("allreduce", &[(0, 1000.0), (1, 10.0), (2, 30.0)]);
        events.push(event("allreduce", "X", 1, 500.0, json!({ "iteration": 1 })));
        events.push(event("allreduce", "M", 0, 500.0, json!({ "iteration": 1 })));
        events.push(event("allreduce", "X", 0, 500.0, json!({})));
        events.extend(spans("backward", &[(1, 7.0)]));
        let means = task_means(&trace(events), 1);
        assert_eq!(means.len(), 2);
        assert_eq!(means["allreduce"], 20.0);
        assert_eq!(means["backward"], 7.0);
    }

    #[test]
    fn a_task_run_twice_per_iteration_counts_each_span() {
        let means = task_means(&trace(spans("encode", &[(0, 2.0), (0, 4.0)])), 0);
        assert_eq!(means["encode"], 3.0);
    }

    #[test]
    fn rows_pair_tasks_by_name_longest_measured_first() {
        let predicted = trace(
            [
                spans("a", &[(0, 10.0)]),
                spans("b", &[(0, 30.0)]),
                spans("c", &[(0, 5.0)]),
                spans("only-predicted", &[(0, 99.0)]),
            ]
            .concat(),
        );
        // A real run measures an iteration later: its iteration 0 is the warm-up's tail.
        let measured = trace(
            [
                spans("a", &[(0, 500.0), (1, 20.0)]),
                spans("b", &[(1, 0.0)]),
                spans("c", &[(1, 1.0 / 3.0)]),
                spans("only-measured", &[(1, 99.0)]),
            ]
            .concat(),
        );
        let rows = task_rows(&predicted, &measured, 0, 10);
        let names: Vec<&str> = rows.iter().map(|r| r.task.as_str()).collect();
        assert_eq!(names, ["a", "c", "b"]);
        assert_eq!(rows[0].error, -0.5);
        assert_eq!(rows[1].measured_us, 0.333);
        assert!((rows[1].error - 14.0).abs() < 1e-9, "{:?}", rows[1]);
        // Nothing measured: no error rather than an infinite one.
        assert_eq!(rows[2].error, 0.0);
        assert_eq!(task_rows(&predicted, &measured, 0, 1).len(), 1);
    }

    #[test]
    fn the_report_names_the_run_and_compares_its_times() {
        let model = ModelProfile::load("resnet50").unwrap();
        let cluster = Cluster::load("v100-10gbe", ClusterOverrides::default()).unwrap();
        let scenario = Scenario::new(model, cluster).unwrap();
        let predicted = trace(spans("a", &[(0, 10.0)]));
        let measured = trace(spans("a", &[(1, 8.0)]));
        let times = |iteration_ms| Times {
            iteration_ms,
            compute_ms: 1.0,
            comm_ms: 2.0,
        };
        let report = Report::new(
            &scenario,
            "host",
            Run {
                times: times(12.0),
                trace: &predicted,
            },
            Run {
                times: times(10.0),
                trace: &measured,
            },
            0,
            5,
        );
        assert_eq!(report.model, scenario.model.name);
        assert_eq!(report.world_size, scenario.cluster.world_size());
        assert!((report.error - 0.2).abs() < 1e-12);
        assert_eq!(report.largest_tasks.len(), 1);
        assert_eq!(report.largest_tasks[0].error, 0.25);
        assert_eq!(relative_error(1.0, 0.0), 0.0);
    }
}
