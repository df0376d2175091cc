//! Dependency counts per (task, rank), held only while their iteration runs.
//!
//! Every rank's unmet-dependency counts of an iteration are held from their first use until
//! every task of the iteration has finished on every rank, so the memory of a run that
//! simulates every rank does not grow with its iterations.

use crate::predict::graph::TaskGraph;
use std::collections::VecDeque;

/// `Window::row` of a task with at most one dependency.
const NO_COUNTER: u32 = u32::MAX;

/// Unmet dependencies of one iteration's tasks with more than one, per rank, task-major (the
/// ranks release the same task at about the same time).
struct CounterBlock {
    iteration: u32,
    counts: Vec<u32>,
}

pub(super) struct Window {
    ranks: usize,
    counters: VecDeque<CounterBlock>,
    /// The next iteration whose counters are set up.
    next_counters: u32,
    /// Each task's iteration.
    iteration: Vec<u32>,
    /// Each task's row among its iteration's counters; a task with one dependency runs when
    /// it is released, with no counter to read at every step.
    row: Vec<u32>,
    /// Per iteration, the counters' starting values (their tasks' in-degrees), in row order.
    indegrees: Vec<Vec<u32>>,
    /// Per iteration, the (task, rank) pairs that have finished, and how many it has.
    finished: Vec<u64>,
    pairs: Vec<u64>,
    /// The first iteration some rank has not finished.
    front: u32,
    /// The most blocks of counts held at once.
    most_held: u32,
}

impl Window {
    pub(super) fn new(graph: &TaskGraph, ranks: u32) -> Window {
        let iterations = graph.iterations() as usize;
        let iteration: Vec<u32> = graph.tasks().iter().map(|t| t.iteration).collect();
        let mut row = vec![NO_COUNTER; graph.len()];
        let mut indegrees = vec![Vec::new(); iterations];
        for (task, &count) in graph.indegree().iter().enumerate() {
            if count > 1 {
                let rows = &mut indegrees[iteration[task] as usize];
                row[task] = rows.len() as u32;
                rows.push(count);
            }
        }
        Window {
            ranks: ranks as usize,
            counters: VecDeque::new(),
            next_counters: 0,
            iteration,
            row,
            indegrees,
            finished: vec![0; iterations],
            pairs: (0..iterations as u32)
                .map(|k| graph.iteration_tasks(k).len() as u64 * u64::from(ranks))
                .collect(),
            front: 0,
            most_held: 0,
        }
    }

    /// Rank `rank`'s unmet dependencies of `task`, None for a task with at most one.
    pub(super) fn counter(&mut self, task: u32, rank: u32) -> Option<&mut u32> {
        let row = self.row[task as usize];
        if row == NO_COUNTER {
            return None;
        }
        let iteration = self.iteration[task as usize];
        while self.next_counters <= iteration {
            let k = self.next_counters;
            self.next_counters += 1;
            // An iteration all finished before any counter of it was needed keeps none.
            if k >= self.front {
                let counts = self.indegrees[k as usize]
                    .iter()
                    .flat_map(|&count| std::iter::repeat_n(count, self.ranks))
                    .collect();
                self.counters.push_back(CounterBlock {
                    iteration: k,
                    counts,
                });
                self.most_held = self.most_held.max(self.counters.len() as u32);
            }
        }
        let first = self.counters.front()?.iteration;
        let block = self.counters.get_mut((iteration - first) as usize)?;
        block
            .counts
            .get_mut(row as usize * self.ranks + rank as usize)
    }

    /// The most iterations whose counts were held at once.
    pub(super) fn most_held(&self) -> u32 {
        self.most_held
    }

    /// The iteration `task` belongs to.
    pub(super) fn iteration(&self, task: u32) -> u32 {
        self.iteration[task as usize]
    }

    /// `pairs` more (task, rank) pairs of `iteration` finished; an iteration all ranks finished
    /// lets go of its state.
    pub(super) fn finished(&mut self, iteration: u32, pairs: u64) {
        self.finished[iteration as usize] += pairs;
        while let Some(&done) = self.finished.get(self.front as usize) {
            if done < self.pairs[self.front as usize] {
                break;
            }
            if self
                .counters
                .front()
                .is_some_and(|b| b.iteration == self.front)
            {
                self.counters.pop_front();
            }
            self.front += 1;
        }
    }
}
