//! The one bounded wait of the executors.
//!
//! It waits until something is found, the deadline passes or another rank aborts the run, waking at
//! least every poll interval to look at the abort flag.

use crate::error::{ExecError, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, MutexGuard};
use std::time::{Duration, Instant};

/// How often a blocked wait looks at the abort flag.
pub const POLL: Duration = Duration::from_millis(20);

/// Why a bounded wait stopped without finding what it waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Another rank failed and raised the run's abort flag.
    Aborted,
    /// The timeout passed.
    TimedOut,
}

/// A wait of at most `timeout` from now that also stops when `abort` is raised.
pub struct Bounded<'a> {
    deadline: Instant,
    timeout: Duration,
    abort: &'a AtomicBool,
}

impl<'a> Bounded<'a> {
    /// A wait that ends `timeout` from now, or earlier when `abort` is raised.
    pub fn new(timeout: Duration, abort: &'a AtomicBool) -> Bounded<'a> {
        Bounded {
            deadline: Instant::now() + timeout,
            timeout,
            abort,
        }
    }

    /// The timeout in seconds, for messages.
    pub fn seconds(&self) -> f64 {
        self.timeout.as_secs_f64()
    }

    /// How long the next blocking call may block (at most `slice`), or why the wait is over.
    pub fn next(&self, slice: Duration) -> std::result::Result<Duration, Stop> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(Stop::Aborted);
        }
        match self.deadline.saturating_duration_since(Instant::now()) {
            left if left.is_zero() => Err(Stop::TimedOut),
            left => Ok(left.min(slice)),
        }
    }

    /// Waits on `changed` with `guard` until `pick` finds something in the guarded state.
    /// `slice` says how long each wait may block given the state (a future tick needs no
    /// notification); `stopped` makes the error, given the state and why the wait stopped.
    pub fn on_condvar<S, T>(
        &self,
        changed: &Condvar,
        mut guard: MutexGuard<'_, S>,
        slice: impl Fn(&S) -> Duration,
        mut pick: impl FnMut(&mut S) -> Option<T>,
        stopped: impl FnOnce(&S, Stop) -> ExecError,
    ) -> Result<T> {
        loop {
            if let Some(found) = pick(&mut guard) {
                return Ok(found);
            }
            match self.next(slice(&guard)) {
                Ok(wait) => {
                    guard = changed
                        .wait_timeout(guard, wait)
                        .expect("a lock held by a thread that panicked")
                        .0;
                }
                Err(stop) => return Err(stopped(&guard, stop)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_wait_finds_times_out_or_stops_on_abort() {
        let (state, changed) = (Mutex::new(3), Condvar::new());
        let abort = AtomicBool::new(false);
        let bound = Bounded::new(Duration::from_millis(50), &abort);
        let found = bound.on_condvar(
            &changed,
            state.lock().unwrap(),
            |_| POLL,
            |s| (*s == 3).then_some("three"),
            |_, _| unreachable!(),
        );
        assert_eq!(found.unwrap(), "three");
        let why = |_: &i32, stop: Stop| ExecError::Rank {
            rank: 0,
            message: format!("{stop:?}"),
        };
        let timed_out = bound.on_condvar(
            &changed,
            state.lock().unwrap(),
            |_| POLL,
            |_| None::<()>,
            why,
        );
        assert!(timed_out.unwrap_err().to_string().contains("TimedOut"));
        abort.store(true, Ordering::Relaxed);
        let bound = Bounded::new(Duration::from_secs(60), &abort);
        let aborted = bound.on_condvar(
            &changed,
            state.lock().unwrap(),
            |_| POLL,
            |_| None::<()>,
            why,
        );
        assert!(aborted.unwrap_err().to_string().contains("Aborted"));
    }
}
