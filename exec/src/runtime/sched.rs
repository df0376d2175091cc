//! A rank's task readiness for the real backends: unmet dependencies, the compression queue, and
//! waiting for work within a timeout while watching for another rank's failure.

use super::board::Board;
use super::wait::{Bounded, Stop, POLL};
use super::Job;
use crate::error::{ExecError, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;
use syncopate_sim::schedule::Stream;

/// What a rank's threads pick work from.
pub(super) struct Sched {
    /// Unmet dependencies per task.
    pub pending: Vec<u32>,
    /// Ready compression tasks, first come first served (as the simulator's codec stream).
    pub codec_queue: VecDeque<u32>,
}

/// The thread that waits in `Readiness::wait_for`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waiter {
    /// Waits for its next compute task's inputs.
    Compute,
    /// Waits for the compression queue.
    Codec,
}

/// One rank's scheduling state, shared by its compute, compression and communication threads.
pub(super) struct Readiness {
    rank: u32,
    sched: Mutex<Sched>,
    /// One per waiter, woken only when a task of its own became ready: a CPU rank's threads
    /// share cores, and a thread woken for nothing takes its core from a computing one (on a
    /// 4-node lab over 2 cores, waking the compression thread at every compute task's end left
    /// gaps of 1–9 ms between compute tasks, 60–130 ms per iteration and rank).
    compute_ready: Condvar,
    codec_ready: Condvar,
}

/// A run's first failure and the flag that stops every waiting thread once there is one. The
/// rank's own threads and the control plane (failures of other processes) raise the same one,
/// so the run reports the root cause, not the "aborted" errors that follow it.
#[derive(Default)]
pub(super) struct Failure {
    raised: AtomicBool,
    first: Mutex<Option<ExecError>>,
}

impl Failure {
    /// Records `err` unless an earlier failure is recorded, and raises the flag.
    pub(super) fn raise(&self, err: ExecError) {
        let mut first = self.first.lock().expect("the failure lock");
        if first.is_none() {
            *first = Some(err);
        }
        self.raised.store(true, Ordering::Relaxed);
    }

    /// The flag the waiting loops poll.
    pub(super) fn flag(&self) -> &AtomicBool {
        &self.raised
    }

    /// The first failure, once: the run reports it.
    pub(super) fn take(&self) -> Option<ExecError> {
        self.first.lock().expect("the failure lock").take()
    }
}

/// Err when another rank or thread has failed, so that this one stops instead of waiting.
pub(super) fn check_abort(abort: &AtomicBool, rank: u32) -> Result<()> {
    match abort.load(Ordering::Relaxed) {
        true => Err(aborted(rank)),
        false => Ok(()),
    }
}

fn aborted(rank: u32) -> ExecError {
    ExecError::Rank {
        rank,
        message: "aborted: another rank failed".into(),
    }
}

impl Readiness {
    pub(super) fn new(rank: u32, job: &Job) -> Readiness {
        Readiness {
            rank,
            sched: Mutex::new(Sched {
                pending: job.program.indegree.clone(),
                codec_queue: VecDeque::new(),
            }),
            compute_ready: Condvar::new(),
            codec_ready: Condvar::new(),
        }
    }

    /// Unmet dependencies of `task` now.
    pub(super) fn pending(&self, task: u32) -> u32 {
        self.sched.lock().expect("the scheduler lock").pending[task as usize]
    }

    /// Marks `task` done on this rank: compression tasks it unblocks join the queue, and
    /// collectives it unblocks are announced to the launch board.
    pub(super) fn complete(&self, job: &Job, board: &dyn Board, task: u32) {
        self.release(job, board, |sched, ready| {
            for &next in job.program.successors(task) {
                sched.pending[next as usize] -= 1;
                if sched.pending[next as usize] == 0 {
                    ready.push(next);
                }
            }
        });
    }

    /// Releases the tasks that wait for nothing, as [`Readiness::complete`] releases those a
    /// task unblocks: no completion will (a sharded plan's first gathers).
    pub(super) fn start(&self, job: &Job, board: &dyn Board) {
        self.release(job, board, |sched, ready| {
            ready.extend(
                (0..sched.pending.len() as u32).filter(|&t| sched.pending[t as usize] == 0),
            );
        });
    }

    /// Releases the tasks `find` says became ready: compression tasks join the queue,
    /// collectives are announced to the launch board, and the waiting threads are woken.
    fn release(&self, job: &Job, board: &dyn Board, find: impl FnOnce(&mut Sched, &mut Vec<u32>)) {
        let mut arrivals = Vec::new();
        let (mut compute, mut codec) = (false, false);
        {
            let mut sched = self.sched.lock().expect("the scheduler lock");
            let mut ready = Vec::new();
            find(&mut sched, &mut ready);
            for next in ready {
                match job.step(next).stream {
                    Stream::Comm => arrivals.push(next),
                    Stream::Codec | Stream::Cpu => {
                        sched.codec_queue.push_back(next);
                        codec = true;
                    }
                    Stream::Compute => compute = true,
                }
            }
        }
        if compute {
            self.compute_ready.notify_all();
        }
        if codec {
            self.codec_ready.notify_all();
        }
        for task in arrivals {
            board.arrive(task);
        }
    }

    /// Waits until `pick` finds something in the scheduler state, within `timeout`.
    pub(super) fn wait_for<T>(
        &self,
        waiter: Waiter,
        what: &str,
        timeout: Duration,
        abort: &AtomicBool,
        pick: impl FnMut(&mut Sched) -> Option<T>,
    ) -> Result<T> {
        let ready = match waiter {
            Waiter::Compute => &self.compute_ready,
            Waiter::Codec => &self.codec_ready,
        };
        let bound = Bounded::new(timeout, abort);
        let sched = self.sched.lock().expect("the scheduler lock");
        bound.on_condvar(
            ready,
            sched,
            |_| POLL,
            pick,
            |_, stop| match stop {
                Stop::Aborted => aborted(self.rank),
                Stop::TimedOut => ExecError::Rank {
                    rank: self.rank,
                    message: format!("{what} was not ready within {:.1} s", bound.seconds()),
                },
            },
        )
    }
}
