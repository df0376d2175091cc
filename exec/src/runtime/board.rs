//! The launch board: the launch policy's decisions shared by the ranks of a process.
//!
//! Every rank thus issues the same collectives in the same order, as Horovod's coordinator does.
//!
//! A collective is ready once every rank driven here has met its dependencies; the policy
//! (`syncopate_sim::schedule::launch`, the simulator's own) then decides on wall-clock time. Each
//! decision is appended to the log of the stream that asked, and the other ranks' threads of that
//! stream replay the log.

use super::wait::{Bounded, Stop, POLL};
use crate::error::{ExecError, Result};
use std::sync::atomic::AtomicBool;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use syncopate_sim::schedule::launch::{Launcher, Ticks};
use syncopate_sim::schedule::{LaunchPolicy, Program};

struct State {
    launcher: Launcher,
    /// Per task: ranks that have met its dependencies.
    arrivals: Vec<u32>,
    /// Per stream: the collectives it ran, in order.
    log: Vec<Vec<u32>>,
}

/// What the threads of a run ask about collectives: a rank met one's dependencies, and which
/// one a communication stream runs next. Every rank must get the same answers.
pub(super) trait Board: Sync {
    /// A rank driven here met the dependencies of collective `task`.
    fn arrive(&self, task: u32);
    /// The `index`-th collective of `stream` for rank `rank`, or `None` once every collective
    /// has been handed out; waits at most the run's timeout.
    fn next(&self, stream: u32, index: usize, rank: u32, abort: &AtomicBool)
        -> Result<Option<u32>>;
    /// Wakes every waiting thread (after a failure).
    fn wake_all(&self);
}

/// The launch policy over the ranks of this process.
pub(super) struct LocalBoard {
    state: Mutex<State>,
    changed: Condvar,
    world: u32,
    epoch: Instant,
    timeout: Duration,
}

impl LocalBoard {
    /// A board for the `world` ranks of this process.
    pub(super) fn new(
        policy: &LaunchPolicy,
        program: &Program,
        world: u32,
        epoch: Instant,
        timeout: Duration,
    ) -> LocalBoard {
        LocalBoard {
            state: Mutex::new(State {
                launcher: Launcher::new(policy, program, Ticks::FreeRunning),
                arrivals: vec![0; program.len()],
                log: vec![Vec::new(); policy.comm_streams as usize],
            }),
            changed: Condvar::new(),
            world,
            epoch,
            timeout,
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

impl Board for LocalBoard {
    fn arrive(&self, task: u32) {
        let mut state = self.state.lock().expect("the board lock");
        let t = task as usize;
        state.arrivals[t] += 1;
        if state.arrivals[t] == self.world {
            let now = self.now_ns();
            state.launcher.ready(task, now);
            self.changed.notify_all();
        }
    }

    fn next(
        &self,
        stream: u32,
        index: usize,
        rank: u32,
        abort: &AtomicBool,
    ) -> Result<Option<u32>> {
        let bound = Bounded::new(self.timeout, abort);
        let state = self.state.lock().expect("the board lock");
        // A collective released at a future cycle tick needs no notification: wake for it.
        let slice = |state: &State| match state.launcher.next_release() {
            Some(at) => Duration::from_nanos(at.saturating_sub(self.now_ns())).min(POLL),
            None => POLL,
        };
        let pick = |state: &mut State| {
            if let Some(&task) = state.log[stream as usize].get(index) {
                return Some(Some(task));
            }
            if state.launcher.all_launched() {
                return Some(None);
            }
            let task = state.launcher.next(stream, self.now_ns())?;
            state.log[stream as usize].push(task);
            self.changed.notify_all();
            Some(Some(task))
        };
        bound.on_condvar(&self.changed, state, slice, pick, |state, stop| match stop {
            Stop::Aborted => ExecError::Rank {
                rank,
                message: "aborted while waiting for a collective: another rank failed".into(),
            },
            Stop::TimedOut => {
                let missing = state
                    .launcher
                    .first_pending()
                    .map_or(self.world, |t| state.arrivals[t as usize]);
                ExecError::Rank {
                    rank,
                    message: format!(
                        "no collective became ready within {:.1} s ({missing} of {} ranks had reached the next one)",
                        bound.seconds(),
                        self.world
                    ),
                }
            }
        })
    }

    fn wake_all(&self) {
        self.changed.notify_all();
    }
}
