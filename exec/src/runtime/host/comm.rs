//! In-process collectives: a full mesh of channels per communication stream.
//!
//! The channels carry the real wire bytes. The rings of `runtime::ring` and the push/pull of
//! `runtime::push_pull` run on the mesh, and it has a ring allgather of payloads of any length.

use crate::error::{ExecError, Result};
use crate::runtime::push_pull::{Leg, Messages};
use crate::runtime::ring::RingLink;
use crate::runtime::wait::{Bounded, Stop, POLL};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// One rank's end of one stream's mesh.
pub struct Mesh {
    /// This end's rank, in 0..world.
    pub rank: u32,
    /// Number of ranks in the mesh.
    pub world: u32,
    tx: Vec<Option<Sender<Vec<u8>>>>,
    rx: Vec<Option<Receiver<Vec<u8>>>>,
    /// How long a receive waits before giving up.
    pub timeout: Duration,
}

/// Builds `streams` meshes of `world` ranks: `result[stream][rank]`.
pub fn meshes(streams: u32, world: u32, timeout: Duration) -> Vec<Vec<Mesh>> {
    (0..streams)
        .map(|_| {
            let mut ends: Vec<Mesh> = (0..world)
                .map(|rank| Mesh {
                    rank,
                    world,
                    tx: (0..world).map(|_| None).collect(),
                    rx: (0..world).map(|_| None).collect(),
                    timeout,
                })
                .collect();
            for from in 0..world as usize {
                for to in 0..world as usize {
                    if from != to {
                        let (tx, rx) = channel();
                        ends[from].tx[to] = Some(tx);
                        ends[to].rx[from] = Some(rx);
                    }
                }
            }
            ends
        })
        .collect()
}

/// Runs `work` on every rank of a fresh mesh of `world` ranks, each on a thread of its own,
/// and returns what each returned, in rank order (the reference runs of the transports' tests).
pub fn on_host<T: Send>(
    world: u32,
    work: impl Fn(&Mesh, &AtomicBool) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let abort = AtomicBool::new(false);
    let ends = meshes(1, world, Duration::from_secs(30))
        .pop()
        .expect("one stream");
    std::thread::scope(|scope| {
        let handles: Vec<_> = ends
            .into_iter()
            .map(|mesh| {
                let (work, abort) = (&work, &abort);
                scope.spawn(move || work(&mesh, abort))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a host mesh thread"))
            .collect()
    })
}

impl Mesh {
    fn send(&self, to: usize, bytes: Vec<u8>) -> Result<()> {
        let tx = self.tx[to].as_ref().expect("no channel to oneself");
        tx.send(bytes).map_err(|_| ExecError::Rank {
            rank: to as u32,
            message: format!("exited while rank {} was sending to it", self.rank),
        })
    }

    /// Receives from `from`, giving up after the timeout or when another rank aborted.
    fn recv(&self, from: usize, abort: &AtomicBool, what: &str) -> Result<Vec<u8>> {
        let rx = self.rx[from].as_ref().expect("no channel from oneself");
        let bound = Bounded::new(self.timeout, abort);
        loop {
            let wait = bound.next(POLL).map_err(|stop| match stop {
                Stop::Aborted => ExecError::Rank {
                    rank: self.rank,
                    message: format!("aborted during {what}: another rank failed"),
                },
                Stop::TimedOut => ExecError::Timeout {
                    rank: from as u32,
                    waiting: self.rank,
                    what: what.to_string(),
                    seconds: bound.seconds(),
                },
            })?;
            match rx.recv_timeout(wait) {
                Ok(bytes) => return Ok(bytes),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(ExecError::Rank {
                        rank: from as u32,
                        message: format!("exited while rank {} waited for {what}", self.rank),
                    })
                }
            }
        }
    }

    /// Ring allgather of payloads of any length (threshold's is data-dependent): returns every
    /// rank's payload in rank order.
    pub fn allgather(&self, mine: Vec<u8>, abort: &AtomicBool) -> Result<Vec<Vec<u8>>> {
        let (w, r) = (self.world as usize, self.rank as usize);
        let mut blocks: Vec<Vec<u8>> = vec![Vec::new(); w];
        blocks[r] = mine;
        for step in 0..w - 1 {
            let send = (r + w - step) % w;
            let recv = (r + 2 * w - step - 1) % w;
            self.send((r + 1) % w, blocks[send].clone())?;
            blocks[recv] = self.recv((r + w - 1) % w, abort, "an allgather block")?;
        }
        Ok(blocks)
    }

    /// Broadcast from `root` (used to time the channels in the host profile).
    pub fn broadcast(&self, payload: &mut Vec<u8>, root: usize, abort: &AtomicBool) -> Result<()> {
        if self.rank as usize == root {
            for to in (0..self.world as usize).filter(|&to| to != root) {
                self.send(to, payload.clone())?;
            }
        } else {
            *payload = self.recv(root, abort, "a broadcast")?;
        }
        Ok(())
    }
}

impl RingLink for Mesh {
    fn rank(&self) -> usize {
        self.rank as usize
    }

    fn shift(
        &self,
        out: &[u8],
        to: usize,
        from: usize,
        len: usize,
        what: &str,
        abort: &AtomicBool,
        take: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.send(to, out.to_vec())?;
        let received = self.recv(from, abort, what)?;
        if received.len() != len {
            return Err(ExecError::Rank {
                rank: from as u32,
                message: format!(
                    "sent {} bytes as {what} where rank {} expected {len}",
                    received.len(),
                    self.rank
                ),
            });
        }
        take(&received)
    }
}

impl Messages for Mesh {
    fn place(&self) -> (usize, usize) {
        (self.rank as usize, self.world as usize)
    }

    fn send(&self, to: usize, bytes: Vec<u8>, _: Leg, _: &AtomicBool) -> Result<()> {
        Mesh::send(self, to, bytes)
    }

    fn receive(&self, from: usize, leg: Leg, abort: &AtomicBool) -> Result<Vec<u8>> {
        self.recv(from, abort, leg.what())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_peer_times_out_naming_it() {
        let abort = AtomicBool::new(false);
        let mut ends = meshes(1, 2, Duration::from_millis(100)).pop().unwrap();
        let silent = ends.pop().unwrap();
        let err = ends[0].allgather(vec![1], &abort).unwrap_err();
        assert!(err.to_string().contains("rank 1 did not answer"), "{err}");
        drop(silent);
    }
}
