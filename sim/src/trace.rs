//! Traces: the timeline of a run in Chrome/Perfetto trace-event JSON, with the run's summary;
//! predicted and measured runs share this schema so that they can be compared.

use crate::engine::{EngineResult, TaskRecord};
use crate::graph::{Resource, TaskGraph, TaskKind};
use crate::scenario::Scenario;
use crate::simulate::Summary;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Track (thread) ids within a rank's process.
const COMPUTE_TRACK: u32 = 0;
const CODEC_TRACK: u32 = 1;
const CPU_TRACK: u32 = 2;
const FIRST_COMM_TRACK: u32 = 10;

/// One trace event: a complete span ("X") or a naming record ("M").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    pub name: String,
    pub cat: String,
    pub ph: String,
    /// Start and duration in microseconds, as the trace-event format wants.
    #[serde(default)]
    pub ts: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dur: f64,
    pub pid: u32,
    pub tid: u32,
    #[serde(default)]
    pub args: Value,
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// A run's timeline and summary; opens in Perfetto or chrome://tracing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    #[serde(rename = "traceEvents")]
    pub trace_events: Vec<TraceEvent>,
    #[serde(rename = "displayTimeUnit")]
    pub display_time_unit: String,
    /// The run's summary (`simulate --format json` for predictions).
    #[serde(rename = "otherData")]
    pub other_data: Value,
}

impl Trace {
    /// The recorded ranks' tasks, one track per stream per rank; collectives appear on every
    /// recorded rank's communication track since they span all ranks.
    pub fn from_run(
        scenario: &Scenario,
        graph: &TaskGraph,
        result: &EngineResult,
        summary: &Summary,
    ) -> Trace {
        let summary = serde_json::to_value(summary).expect("a summary serializes");
        Trace::from_records(scenario, graph, &result.records, summary)
    }

    /// A trace from task records of any origin (the simulator's engine, or a real run that timed
    /// the same graph's tasks), with `summary` as its `otherData`.
    pub fn from_records(
        scenario: &Scenario,
        graph: &TaskGraph,
        records: &[TaskRecord],
        summary: Value,
    ) -> Trace {
        let ranks: u32 = records.iter().map(|r| r.rank + 1).max().unwrap_or(0);
        let mut events = Vec::new();
        for rank in 0..ranks {
            events.push(meta(
                "process_name",
                rank,
                0,
                json!({ "name": format!("rank {rank}") }),
            ));
            for (tid, name) in [
                (COMPUTE_TRACK, "compute"),
                (CODEC_TRACK, "codec"),
                (CPU_TRACK, "cpu"),
            ] {
                events.push(meta("thread_name", rank, tid, json!({ "name": name })));
            }
            for stream in 0..scenario.plan.policy.comm_streams {
                events.push(meta(
                    "thread_name",
                    rank,
                    FIRST_COMM_TRACK + stream,
                    json!({ "name": format!("comm {stream}") }),
                ));
            }
        }
        for record in records {
            let task = graph.task(record.task);
            let (name, args) = describe(scenario, task);
            let span = |pid: u32| TraceEvent {
                name: name.clone(),
                cat: task.resource.name().to_string(),
                ph: "X".to_string(),
                ts: record.start.as_us(),
                dur: (record.end - record.start).as_us(),
                pid,
                tid: match task.resource {
                    Resource::Compute => COMPUTE_TRACK,
                    Resource::Codec => CODEC_TRACK,
                    Resource::Cpu => CPU_TRACK,
                    Resource::Comm => FIRST_COMM_TRACK + record.stream,
                },
                args: args.clone(),
            };
            if task.resource == Resource::Comm {
                events.extend((0..ranks).map(span));
            } else {
                events.push(span(record.rank));
            }
        }
        Trace {
            trace_events: events,
            display_time_unit: "ms".to_string(),
            other_data: summary,
        }
    }
}

fn meta(name: &str, pid: u32, tid: u32, args: Value) -> TraceEvent {
    TraceEvent {
        name: name.to_string(),
        cat: "__metadata".to_string(),
        ph: "M".to_string(),
        ts: 0.0,
        dur: 0.0,
        pid,
        tid,
        args,
    }
}

/// A task's display name and arguments: tensor names, group ids, bytes, algorithm.
fn describe(scenario: &Scenario, task: &crate::graph::Task) -> (String, Value) {
    let model = &scenario.model;
    let iteration = task.iteration;
    match task.kind {
        TaskKind::Forward { tensor } => (
            format!("fwd {}", model.tensors[tensor as usize].name),
            json!({ "iteration": iteration, "tensor": tensor }),
        ),
        TaskKind::Backward { tensor } => (
            format!("bwd {}", model.tensors[tensor as usize].name),
            json!({ "iteration": iteration, "tensor": tensor }),
        ),
        TaskKind::Optimizer => ("optimizer".to_string(), json!({ "iteration": iteration })),
        TaskKind::Update { group } => (
            format!("update g{group}"),
            json!({ "iteration": iteration, "group": group }),
        ),
        TaskKind::Encode { group, part } | TaskKind::Decode { group, part } => {
            let verb = if matches!(task.kind, TaskKind::Encode { .. }) {
                "encode"
            } else {
                "decode"
            };
            let g = &scenario.plan.groups[group as usize];
            (
                format!("{verb} g{group}.{part} {}", g.compressor),
                json!({ "iteration": iteration, "group": group, "part": part, "compressor": g.compressor.to_string() }),
            )
        }
        TaskKind::Collective { group, part, round } => {
            let g = &scenario.plan.groups[group as usize];
            let first = &model.tensors[g.tensors[0]].name;
            let last = &model.tensors[*g.tensors.last().expect("non-empty group")].name;
            let estimate = task.estimate.expect("collectives carry their estimate");
            (
                format!(
                    "{} g{group}.{part}.{round} {} B",
                    estimate.algorithm.name(),
                    task.bytes
                ),
                json!({
                    "iteration": iteration,
                    "group": group,
                    "part": part,
                    "round": round,
                    "bytes": task.bytes,
                    "tensors": g.tensors.len(),
                    "first_tensor": first,
                    "last_tensor": last,
                    "algorithm": estimate.algorithm.name(),
                    "protocol": estimate.protocol.name(),
                    "compressor": g.compressor.to_string(),
                }),
            )
        }
    }
}
