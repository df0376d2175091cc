//! The engine's input: a schedule's K iterations (the Program) with predicted task durations.
//!
//! Every task's predicted duration comes from the cost pass.

use crate::base::error::Result;
use crate::base::time::SimTime;
use crate::collective::{Estimate, Links};
use crate::predict::cost::StepCost;
use crate::schedule::{LaunchKey, Program, Schedule, StepKind, Stream};

/// One task of one iteration, before noise and contention.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// What the task does.
    pub kind: StepKind,
    /// Iteration the task belongs to.
    pub iteration: u32,
    /// Stream the task runs on.
    pub stream: Stream,
    /// Predicted duration, from the cost pass.
    pub duration: SimTime,
    /// Payload bytes per rank (collectives), for traces.
    pub bytes: u64,
    /// For collectives: the predicted algorithm and protocol.
    pub estimate: Option<Estimate>,
    /// For collectives: where it stands in the launch order.
    pub launch_key: LaunchKey,
    /// For collectives: the links they keep busy, shared with concurrent ones.
    pub links: Links,
}

impl Task {
    /// The task's step and iteration, for messages.
    pub fn label(&self) -> String {
        format!("{} of iteration {}", self.kind.label(), self.iteration)
    }
}

/// The program and each of its tasks with its cost.
pub struct TaskGraph {
    /// The unrolled iterations: tasks, dependencies and launch keys.
    pub program: Program,
    tasks: Vec<Task>,
}

impl TaskGraph {
    /// Unrolls `iterations` iterations of `schedule` and prices every task with `costs` (one
    /// per step, from [`crate::predict::cost::step_costs`]).
    pub fn new(schedule: &Schedule, costs: &[StepCost], iterations: u32) -> Result<TaskGraph> {
        let program = Program::unroll(schedule, iterations)?;
        let tasks = program
            .tasks
            .iter()
            .zip(&program.launch_keys)
            .map(|(task, &launch_key)| {
                let step = schedule.step(task.step);
                let cost = costs[task.step as usize];
                let bytes = match step.kind {
                    StepKind::Collective { round, .. } => schedule
                        .piece_of(step)
                        .map_or(0, |p| p.rounds[round as usize].bytes),
                    StepKind::Gather { group, pass } => schedule.gather_shard(group, pass).bytes,
                    _ => 0,
                };
                Task {
                    kind: step.kind,
                    iteration: task.iteration,
                    stream: step.stream,
                    duration: cost.duration,
                    bytes,
                    estimate: cost.estimate,
                    launch_key,
                    links: cost.links,
                }
            })
            .collect();
        Ok(TaskGraph { program, tasks })
    }

    /// Iterations unrolled.
    pub fn iterations(&self) -> u32 {
        self.program.iterations
    }

    /// Number of tasks over all iterations.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the graph has no tasks.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The task at `index`, with its cost.
    pub fn task(&self, index: u32) -> &Task {
        &self.tasks[index as usize]
    }

    /// Every task, in program order.
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// Tasks that wait for task `index`.
    pub fn successors(&self, index: u32) -> &[u32] {
        self.program.successors(index)
    }

    /// Number of predecessors of each task.
    pub fn indegree(&self) -> &[u32] {
        &self.program.indegree
    }

    /// The tasks of `iteration`, a range: tasks are numbered iteration by iteration.
    pub fn iteration_tasks(&self, iteration: u32) -> std::ops::Range<u32> {
        self.program.iteration_tasks(iteration)
    }

    /// Per iteration, the task whose end closes it.
    pub fn iteration_end(&self) -> &[u32] {
        &self.program.iteration_end
    }
}
