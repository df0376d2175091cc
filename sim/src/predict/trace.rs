//! Traces: the timeline of a run in Chrome/Perfetto trace-event JSON, with the run's summary;
//! predicted and measured runs share this schema so that they can be compared.

use crate::collective::Estimate;
use crate::inputs::model::ModelProfile;
use crate::predict::engine::{EngineResult, TaskRecord};
use crate::predict::graph::TaskGraph;
use crate::predict::summary::Summary;
use crate::schedule::{Program, Schedule, StepKind, Stream};
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
    /// The span's task, or the metadata record's kind (`process_name`, `thread_name`).
    pub name: String,
    /// Category: the task's stream, or `__metadata`.
    pub cat: String,
    /// Phase: `X` for a complete span, `M` for metadata.
    pub ph: String,
    /// Start and duration in microseconds, as the trace-event format wants.
    #[serde(default)]
    pub ts: f64,
    /// Duration in µs (0 for metadata).
    #[serde(default, skip_serializing_if = "crate::base::data::is_zero")]
    pub dur: f64,
    /// Process id: the rank.
    pub pid: u32,
    /// Track within the rank: compute, codec, CPU or a communication stream.
    pub tid: u32,
    /// The task's details, or the metadata record's value.
    #[serde(default)]
    pub args: Value,
}

/// A run's timeline and summary; opens in Perfetto or chrome://tracing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Every span and metadata record.
    #[serde(rename = "traceEvents")]
    pub trace_events: Vec<TraceEvent>,
    /// The unit viewers display times in (`ms`).
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
        model: &ModelProfile,
        schedule: &Schedule,
        graph: &TaskGraph,
        result: &EngineResult,
        summary: &Summary,
    ) -> Trace {
        let summary = serde_json::to_value(summary).expect("a summary serializes");
        Trace::from_records(
            model,
            schedule,
            &graph.program,
            &result.records,
            |t| graph.task(t).estimate,
            summary,
        )
    }

    /// A trace from task records of any origin (the simulator's engine, or a real run that timed
    /// the same program's tasks), with `summary` as its `otherData`; `estimate` gives a
    /// collective task's predicted algorithm, when there is a prediction.
    pub fn from_records(
        model: &ModelProfile,
        schedule: &Schedule,
        program: &Program,
        records: &[TaskRecord],
        estimate: impl Fn(u32) -> Option<Estimate>,
        summary: Value,
    ) -> Trace {
        let ranks: u32 = records.iter().map(|r| r.rank + 1).max().unwrap_or(0);
        let is_collective =
            |r: &TaskRecord| schedule.step(program.task(r.task).step).stream == Stream::Comm;
        // The simulator records a collective once, with rank 0, and it spans every rank; a real
        // run records each rank's own span of it (launch to completion on that rank).
        let shared_collectives = !records.iter().any(|r| is_collective(r) && r.rank != 0);
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
            for stream in 0..schedule.policy.comm_streams {
                events.push(meta(
                    "thread_name",
                    rank,
                    FIRST_COMM_TRACK + stream,
                    json!({ "name": format!("comm {stream}") }),
                ));
            }
        }
        for record in records {
            let task = program.task(record.task);
            let stream = schedule.step(task.step).stream;
            let (name, args) = describe(
                model,
                schedule,
                task.step,
                task.iteration,
                estimate(record.task),
            );
            let span = |pid: u32| TraceEvent {
                name: name.clone(),
                cat: stream.name().to_string(),
                ph: "X".to_string(),
                ts: record.start.as_us(),
                dur: (record.end - record.start).as_us(),
                pid,
                tid: match stream {
                    Stream::Compute => COMPUTE_TRACK,
                    Stream::Codec => CODEC_TRACK,
                    Stream::Cpu => CPU_TRACK,
                    Stream::Comm => FIRST_COMM_TRACK + record.stream,
                },
                args: args.clone(),
            };
            if stream == Stream::Comm && shared_collectives {
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

/// A task's display name and arguments: tensor names, group ids, bytes, the exchange and,
/// for predictions, the collective algorithm.
fn describe(
    model: &ModelProfile,
    schedule: &Schedule,
    step: u32,
    iteration: u32,
    estimate: Option<Estimate>,
) -> (String, Value) {
    let step = schedule.step(step);
    let piece = schedule.piece_of(step);
    match step.kind {
        StepKind::Forward { tensor } => (
            format!("fwd {}", model.tensors[tensor as usize].name),
            json!({ "iteration": iteration, "tensor": tensor }),
        ),
        StepKind::Backward { tensor } => (
            format!("bwd {}", model.tensors[tensor as usize].name),
            json!({ "iteration": iteration, "tensor": tensor }),
        ),
        StepKind::Optimizer => ("optimizer".to_string(), json!({ "iteration": iteration })),
        StepKind::Update { group } => (
            format!("update g{group}"),
            json!({ "iteration": iteration, "group": group }),
        ),
        StepKind::Gather { group, pass } => {
            let bytes = schedule.gather_shard(group, pass).bytes;
            (
                format!("allgather params g{group} {}", pass.name()),
                json!({ "iteration": iteration, "group": group, "pass": pass.name(), "bytes": bytes }),
            )
        }
        StepKind::Encode { group, part } | StepKind::Decode { group, part } => {
            let verb = if matches!(step.kind, StepKind::Encode { .. }) {
                "encode"
            } else {
                "decode"
            };
            let compressor = piece.map(|p| p.compressor.to_string()).unwrap_or_default();
            (
                format!("{verb} g{group}.{part} {compressor}"),
                json!({ "iteration": iteration, "group": group, "part": part, "compressor": compressor }),
            )
        }
        StepKind::Collective { group, part, round } => {
            let piece = piece.expect("a collective works on a piece");
            let exchange = piece.rounds[round as usize];
            let slots = &schedule.buffers[group as usize].slots;
            let name = |slot: Option<&crate::schedule::Slot>| {
                slot.map(|s| model.tensors[s.tensor as usize].name.as_str())
                    .unwrap_or_default()
            };
            let mut args = json!({
                "iteration": iteration,
                "group": group,
                "part": part,
                "round": round,
                "bytes": exchange.bytes,
                "exchange": exchange.exchange.name(),
                "tensors": slots.len(),
                "first_tensor": name(slots.first()),
                "last_tensor": name(slots.last()),
                "compressor": piece.compressor.to_string(),
            });
            if let Some(estimate) = estimate {
                args["algorithm"] = json!(estimate.algorithm.name());
                args["protocol"] = json!(estimate.protocol.name());
            }
            (
                format!(
                    "{} g{group}.{part}.{round} {} B",
                    exchange.exchange.name(),
                    exchange.bytes
                ),
                args,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::time::SimTime;
    use crate::schedule::{lower, World};
    use crate::strategy::per_tensor_plan;

    #[test]
    fn a_shared_collective_is_drawn_on_every_rank_and_per_rank_records_on_their_own() {
        let model = ModelProfile::load("resnet50").unwrap();
        let world = World {
            nodes: 2,
            ranks_per_node: 1,
        };
        let schedule = lower(&model, world, false, &per_tensor_plan(&model), "test").unwrap();
        let program = Program::unroll(&schedule, 1).unwrap();
        let first_on = |stream: Stream| {
            (0..program.len() as u32)
                .find(|&t| schedule.step(program.task(t).step).stream == stream)
                .unwrap()
        };
        let (compute, collective) = (first_on(Stream::Compute), first_on(Stream::Comm));
        let record = |rank, task| TaskRecord {
            rank,
            task,
            stream: 0,
            start: SimTime::ZERO,
            end: SimTime(1000),
        };
        let comm_pids = |records: &[TaskRecord]| -> Vec<u32> {
            Trace::from_records(&model, &schedule, &program, records, |_| None, Value::Null)
                .trace_events
                .iter()
                .filter(|e| e.ph == "X" && e.cat == "comm")
                .map(|e| e.pid)
                .collect()
        };
        // The simulator's collective, recorded once with rank 0, spans both ranks.
        let shared = [
            record(0, compute),
            record(1, compute),
            record(0, collective),
        ];
        assert_eq!(comm_pids(&shared), vec![0, 1]);
        // A real run's ranks each record their own span: one span per rank, not one per record
        // on every rank.
        let own = [
            record(0, collective),
            record(1, collective),
            record(1, compute),
        ];
        assert_eq!(comm_pids(&own), vec![0, 1]);
    }
}
