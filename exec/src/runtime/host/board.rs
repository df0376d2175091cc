//! The launch board: decides which collective each communication stream runs next, identically for every rank, as Horovod's coordinator does.
//!
//! A collective is released once every rank has met its dependencies (and, under a Horovod
//! cycle, at the next cycle tick); the plan's launch policy then picks among released ones,
//! following the simulator's engine: plan order strictly, or lowest priority key first. Each
//! decision is appended to the log of the stream that asked, and the other ranks' threads of
//! that stream replay the log, so every rank issues the same collectives in the same order.

use crate::error::{ExecError, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use syncopate_sim::graph::{LaunchKey, Resource, TaskGraph};
use syncopate_sim::plan::Launch;

const POLL: Duration = Duration::from_millis(20);

struct State {
    /// Per task: ranks that have met its dependencies.
    arrivals: Vec<u32>,
    /// Per task: when it may launch, in ns since the epoch.
    release_at: Vec<Option<u64>>,
    launched: Vec<bool>,
    next_in_order: usize,
    decided: usize,
    /// Per stream: the collectives it ran, in order.
    log: Vec<Vec<u32>>,
}

pub struct Board {
    state: Mutex<State>,
    changed: Condvar,
    world: u32,
    launch: Launch,
    cycle_ns: u64,
    /// Collectives in plan position order.
    order: Vec<u32>,
    keys: Vec<LaunchKey>,
    epoch: Instant,
    timeout: Duration,
}

impl Board {
    pub fn new(
        graph: &TaskGraph,
        world: u32,
        launch: Launch,
        cycle_ns: u64,
        streams: u32,
        epoch: Instant,
        timeout: Duration,
    ) -> Board {
        let n = graph.len();
        let mut order: Vec<u32> = (0..n as u32)
            .filter(|&t| graph.task(t).resource == Resource::Comm)
            .collect();
        order.sort_by_key(|&t| graph.task(t).launch_key.plan_order());
        Board {
            state: Mutex::new(State {
                arrivals: vec![0; n],
                release_at: vec![None; n],
                launched: vec![false; n],
                next_in_order: 0,
                decided: 0,
                log: vec![Vec::new(); streams as usize],
            }),
            changed: Condvar::new(),
            world,
            launch,
            cycle_ns,
            keys: (0..n as u32).map(|t| graph.task(t).launch_key).collect(),
            order,
            epoch,
            timeout,
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A rank met the dependencies of collective `task`.
    pub fn arrive(&self, task: u32) {
        let mut state = self.state.lock().expect("the board lock");
        let t = task as usize;
        state.arrivals[t] += 1;
        if state.arrivals[t] == self.world {
            let now = self.now_ns();
            state.release_at[t] = Some(if self.cycle_ns > 0 {
                now.div_ceil(self.cycle_ns) * self.cycle_ns
            } else {
                now
            });
            self.changed.notify_all();
        }
    }

    fn released(&self, state: &State, task: u32, now: u64) -> bool {
        state.release_at[task as usize].is_some_and(|at| at <= now)
    }

    fn decide(&self, state: &mut State) -> Option<u32> {
        let now = self.now_ns();
        let task = match self.launch {
            Launch::PlanOrder => {
                let &next = self.order.get(state.next_in_order)?;
                if !self.released(state, next, now) {
                    return None;
                }
                state.next_in_order += 1;
                next
            }
            Launch::Priority => self
                .order
                .iter()
                .copied()
                .filter(|&t| !state.launched[t as usize] && self.released(state, t, now))
                .min_by_key(|&t| self.keys[t as usize])?,
        };
        state.launched[task as usize] = true;
        state.decided += 1;
        Some(task)
    }

    /// The `index`-th collective of `stream` for rank `rank`, or `None` once every collective
    /// has been handed out. Waits at most the timeout for a rank to make progress.
    pub fn next(
        &self,
        stream: u32,
        index: usize,
        rank: u32,
        abort: &AtomicBool,
    ) -> Result<Option<u32>> {
        let deadline = Instant::now() + self.timeout;
        let mut state = self.state.lock().expect("the board lock");
        loop {
            if let Some(&task) = state.log[stream as usize].get(index) {
                return Ok(Some(task));
            }
            if state.decided == self.order.len() {
                return Ok(None);
            }
            if let Some(task) = self.decide(&mut state) {
                state.log[stream as usize].push(task);
                self.changed.notify_all();
                return Ok(Some(task));
            }
            if abort.load(Ordering::Relaxed) {
                return Err(ExecError::Rank {
                    rank,
                    message: "aborted while waiting for a collective: another rank failed".into(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = self
                    .order
                    .iter()
                    .find(|&&t| !state.launched[t as usize])
                    .map(|&t| state.arrivals[t as usize])
                    .unwrap_or(self.world);
                return Err(ExecError::Rank {
                    rank,
                    message: format!(
                        "no collective became ready within {:.1} s ({missing} of {} ranks had reached the next one)",
                        self.timeout.as_secs_f64(),
                        self.world
                    ),
                });
            }
            // A collective released at a future cycle tick needs no notification: poll finely.
            let poll = if self.cycle_ns > 0 {
                POLL.min(Duration::from_micros(100))
            } else {
                POLL
            };
            let wait = (deadline - now).min(poll);
            state = self
                .changed
                .wait_timeout(state, wait)
                .expect("the board lock")
                .0;
        }
    }

    pub fn wake_all(&self) {
        self.changed.notify_all();
    }
}
