//! Unrolling: K iterations of a schedule as one DAG of tasks, the form every engine walks.
//!
//! The DAG has compact successor lists.

use super::{Schedule, Stream};
use crate::base::error::{Result, SimError};
use crate::base::limits;

/// One task: a step of the schedule in one iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TaskRef {
    /// Index of the step in the schedule.
    pub step: u32,
    /// The iteration, from 0.
    pub iteration: u32,
}

/// Launch order of a collective task. Plan order sorts by (iteration, phase, position); the
/// priority policy puts `priority` first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LaunchKey {
    /// The step's priority, which the priority policy orders by first.
    pub priority: i64,
    /// The task's iteration.
    pub iteration: u32,
    /// 0: synchronization during backward; 1: DeAR's all-gathers before the next forward.
    pub phase: u8,
    /// Position among all collectives of the run; phase-1 collectives count down, so that
    /// they launch in forward order.
    pub position: u32,
}

impl LaunchKey {
    /// The key plan order sorts by: (iteration, phase, position).
    pub fn plan_order(&self) -> (u32, u8, u32) {
        (self.iteration, self.phase, self.position)
    }
}

/// K iterations of a schedule: tasks, dependencies and launch keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// Iterations unrolled.
    pub iterations: u32,
    /// Every task, iteration by iteration in step order.
    pub tasks: Vec<TaskRef>,
    /// Successors of each task (CSR layout: `succ_start[i]..succ_start[i+1]` in `succ`).
    succ_start: Vec<u32>,
    succ: Vec<u32>,
    /// Number of predecessors of each task.
    pub indegree: Vec<u32>,
    /// Per iteration, the task whose end closes it.
    pub iteration_end: Vec<u32>,
    /// Per iteration, its first task; then the number of tasks.
    iteration_start: Vec<u32>,
    /// Launch key of each task (the default for tasks that are not collectives).
    pub launch_keys: Vec<LaunchKey>,
    /// The collective tasks in plan order: (iteration, phase, position).
    pub plan_order: Vec<u32>,
}

impl Program {
    /// Unrolls `iterations` iterations of `schedule`. Tasks are numbered iteration by
    /// iteration in step order; every dependency points to an earlier task, so the result is
    /// acyclic by construction.
    pub fn unroll(schedule: &Schedule, iterations: u32) -> Result<Program> {
        let steps = &schedule.steps;
        let limit = |what: &str| {
            SimError::bad_value(
                "--warmup/--iterations",
                format!("{iterations} iterations in all"),
                format!("{what} would exceed 2^32 tasks: run fewer iterations or a smaller plan"),
            )
        };
        let per_iteration = steps.len() as u64;
        let total = per_iteration
            .checked_mul(u64::from(iterations))
            .filter(|&n| n <= limits::MAX_TASKS)
            .ok_or_else(|| {
                SimError::bad_value(
                    "--warmup/--iterations",
                    format!("{iterations} iterations in all"),
                    format!(
                        "{iterations} iterations (warm-up included) of {per_iteration} steps exceed the {} tasks one run may unroll",
                        limits::MAX_TASKS
                    ),
                )
            })?;
        let collectives = schedule.collectives_per_iteration() as u64;
        u32::try_from(collectives * u64::from(iterations) + 1)
            .map_err(|_| limit("the collectives' positions"))?;
        let mut tasks = Vec::with_capacity(total as usize);
        let mut launch_keys = Vec::with_capacity(total as usize);
        let mut edges: Vec<(u32, u32)> = Vec::new();
        let mut iteration_end = Vec::with_capacity(iterations as usize);
        let mut iteration_start = Vec::with_capacity(iterations as usize + 1);
        let mut collective_tasks = Vec::new();
        let mut previous: Vec<Option<u32>> = vec![None; steps.len()];
        let mut chain_tail: Option<u32> = None;
        for k in 0..iterations {
            let mut current: Vec<Option<u32>> = vec![None; steps.len()];
            iteration_start.push(tasks.len() as u32);
            for (s, step) in steps.iter().enumerate() {
                if !schedule.runs_in(s as u32, k) {
                    continue;
                }
                let node = tasks.len() as u32;
                tasks.push(TaskRef {
                    step: s as u32,
                    iteration: k,
                });
                current[s] = Some(node);
                if step.stream == Stream::Comm {
                    collective_tasks.push(node);
                }
                if step.stream == Stream::Compute {
                    if let Some(tail) = chain_tail {
                        edges.push((tail, node));
                    }
                    chain_tail = Some(node);
                }
                // `validate` puts every `after` step earlier, so each has its task by now.
                for dep in schedule.waits_for(s as u32, k) {
                    edges.extend(current[dep as usize].map(|from| (from, node)));
                }
                for dep in schedule.waits_for_previous(s as u32, k) {
                    edges.extend(previous[dep as usize].map(|from| (from, node)));
                }
                launch_keys.push(match step.launch {
                    Some(slot) => {
                        // Checked above: every position fits in a u32.
                        let position = (collectives * u64::from(k)) as u32 + slot.position;
                        LaunchKey {
                            priority: slot.priority,
                            iteration: k,
                            phase: slot.phase,
                            position: if slot.phase > 0 {
                                u32::MAX - position
                            } else {
                                position
                            },
                        }
                    }
                    None => LaunchKey::default(),
                });
            }
            iteration_end.push(current[schedule.iteration_end as usize].ok_or_else(|| {
                SimError::invalid(
                    "schedule",
                    "iteration_end",
                    "names a step that does not run in every iteration",
                )
            })?);
            previous = current;
        }
        iteration_start.push(tasks.len() as u32);
        // Successor lists in CSR layout by counting sort over the edges, in insertion order.
        let n = tasks.len();
        let mut indegree = vec![0u32; n];
        let mut succ_start = vec![0u32; n + 1];
        for &(from, to) in &edges {
            succ_start[from as usize + 1] += 1;
            indegree[to as usize] += 1;
        }
        for i in 0..n {
            succ_start[i + 1] += succ_start[i];
        }
        let mut fill = succ_start.clone();
        let mut succ = vec![0u32; edges.len()];
        for &(from, to) in &edges {
            let slot = &mut fill[from as usize];
            succ[*slot as usize] = to;
            *slot += 1;
        }
        collective_tasks.sort_by_key(|&t| launch_keys[t as usize].plan_order());
        Ok(Program {
            plan_order: collective_tasks,
            iterations,
            tasks,
            succ_start,
            succ,
            indegree,
            iteration_end,
            iteration_start,
            launch_keys,
        })
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether there are no tasks.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The task numbered `index`.
    pub fn task(&self, index: u32) -> TaskRef {
        self.tasks[index as usize]
    }

    /// The tasks of `iteration`: tasks are numbered iteration by iteration.
    pub fn iteration_tasks(&self, iteration: u32) -> std::ops::Range<u32> {
        let k = iteration as usize;
        self.iteration_start[k]..self.iteration_start[k + 1]
    }

    /// The tasks that depend on task `index`.
    pub fn successors(&self, index: u32) -> &[u32] {
        &self.succ
            [self.succ_start[index as usize] as usize..self.succ_start[index as usize + 1] as usize]
    }
}
