//! The launch policy across the processes of an MPI job, decided by rank 0's board.
//!
//! Rank 0's board tells every other rank which collective each stream runs next; when every rank
//! can decide alone (plan order on one stream), no message is sent.
//!
//! Every rank must issue the same collectives in the same order on each stream (a mismatch
//! hangs MPI). Under plan order on one stream the order is fixed, so each rank follows it by
//! itself, as DDP and NCCL do. Otherwise (priority with credits, several streams) rank 0 runs
//! the policy, as Horovod's coordinator does, on its own readiness: ranks run the same
//! steps, so they reach each collective at about the same time, and a collective waits for
//! the ranks that are late anyway. Each stream has its own control communicator, used by that
//! stream's thread only.

use super::transport::Stream;
use crate::error::{ExecError, Result};
use crate::runtime::board::{Board, LocalBoard};
use crate::runtime::wait::{Bounded, Stop, POLL};
use std::sync::atomic::AtomicBool;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use syncopate_sim::schedule::{LaunchPolicy, Program};

/// The word that ends a stream's decisions.
const END: u64 = u64::MAX;

/// This process's part in the job-wide launch policy.
pub(super) enum MpiBoard<'w> {
    /// Every rank decides by itself.
    Alone(LocalBoard),
    /// Rank 0: decides, then tells every other rank on the stream's control communicator.
    Leader {
        board: LocalBoard,
        control: Vec<Mutex<Stream<'w>>>,
    },
    /// Another rank: runs what rank 0 decided, once its own inputs are ready.
    Follower {
        control: Vec<Mutex<Stream<'w>>>,
        arrived: Mutex<Vec<bool>>,
        changed: Condvar,
        timeout: Duration,
    },
}

impl<'w> MpiBoard<'w> {
    /// The board for rank `rank`; `control` holds one control stream per communication stream.
    pub(super) fn new(
        rank: u32,
        policy: &LaunchPolicy,
        program: &Program,
        control: Vec<Stream<'w>>,
        epoch: Instant,
        timeout: Duration,
    ) -> MpiBoard<'w> {
        let alone = policy.order_is_fixed();
        let control = control.into_iter().map(Mutex::new).collect();
        match (alone, rank) {
            (true, _) => MpiBoard::Alone(LocalBoard::new(policy, program, 1, epoch, timeout)),
            (false, 0) => MpiBoard::Leader {
                board: LocalBoard::new(policy, program, 1, epoch, timeout),
                control,
            },
            (false, _) => MpiBoard::Follower {
                control,
                arrived: Mutex::new(vec![false; program.len()]),
                changed: Condvar::new(),
                timeout,
            },
        }
    }
}

impl Board for MpiBoard<'_> {
    fn arrive(&self, task: u32) {
        match self {
            MpiBoard::Alone(board) | MpiBoard::Leader { board, .. } => board.arrive(task),
            MpiBoard::Follower {
                arrived, changed, ..
            } => {
                arrived.lock().expect("the arrival lock")[task as usize] = true;
                changed.notify_all();
            }
        }
    }

    fn next(
        &self,
        stream: u32,
        index: usize,
        rank: u32,
        abort: &AtomicBool,
    ) -> Result<Option<u32>> {
        match self {
            MpiBoard::Alone(board) => board.next(stream, index, rank, abort),
            MpiBoard::Leader { board, control } => {
                let decided = board.next(stream, index, rank, abort)?;
                let control = control[stream as usize].lock().expect("a control lock");
                let word = decided.map_or(END, u64::from);
                for follower in 1..control.world as usize {
                    control.send_word(follower, word, "a launch decision", abort)?;
                }
                Ok(decided)
            }
            MpiBoard::Follower {
                control,
                arrived,
                changed,
                timeout,
            } => {
                let word = control[stream as usize]
                    .lock()
                    .expect("a control lock")
                    .receive_word(0, "rank 0's launch decision", abort)?;
                if word == END {
                    return Ok(None);
                }
                let task = u32::try_from(word)
                    .ok()
                    .filter(|&t| (t as usize) < arrived.lock().expect("the arrival lock").len())
                    .ok_or_else(|| ExecError::Mpi {
                        rank,
                        operation: format!("launch decision on stream {stream}"),
                        message: format!("rank 0 named collective {word}, which this plan does not have: do all ranks run the same plan?"),
                    })?;
                // Run it once this rank's own inputs of it are ready.
                let bound = Bounded::new(*timeout, abort);
                let ready = arrived.lock().expect("the arrival lock");
                let run = |ready: &mut Vec<bool>| ready[task as usize].then_some(Some(task));
                bound.on_condvar(changed, ready, |_| POLL, run, |_, stop| match stop {
                    Stop::Aborted => ExecError::Rank {
                        rank,
                        message: "aborted while waiting for a collective's inputs: another rank failed".into(),
                    },
                    Stop::TimedOut => ExecError::Rank {
                        rank,
                        message: format!(
                            "the inputs of collective {task}, which rank 0 launched, were not ready within {:.1} s",
                            bound.seconds()
                        ),
                    },
                })
            }
        }
    }

    fn wake_all(&self) {
        match self {
            MpiBoard::Alone(board) | MpiBoard::Leader { board, .. } => board.wake_all(),
            MpiBoard::Follower { changed, .. } => changed.notify_all(),
        }
    }
}
