//! The per-rank threads of both real backends: compute tasks in program order, compression tasks from the rank's FIFO queue, each comm stream's collectives in the launch board's order; the first failure stops them all.

use super::host::board::Board;
use super::sched::{Failure, Readiness, Sched};
use crate::error::Result;
use std::time::Duration;
use syncopate_sim::graph::{Resource, TaskGraph};

/// What a backend does with each kind of task, timing and recording included; [`drive`] decides
/// when, and releases the task's successors once the call returns.
pub trait Tasks: Sync {
    /// One rank's buffers and streams.
    type Rank: Sync;
    /// What a comm thread opens its end of a stream from; moved onto that thread.
    type Opener: Send;
    /// A comm thread's end of its stream: opened, used and dropped on that thread.
    type Link;

    /// A forward, backward or optimizer task.
    fn compute(&self, rank: &Self::Rank, task: u32) -> Result<()>;
    /// An encode or decode task.
    fn codec(&self, rank: &Self::Rank, task: u32) -> Result<()>;
    /// Opens the rank's end of comm stream `stream`, on that stream's thread.
    fn open(&self, rank: &Self::Rank, stream: u32, opener: Self::Opener) -> Result<Self::Link>;
    /// A collective of comm stream `stream`, on the rank's end of it.
    fn collective(
        &self,
        rank: &Self::Rank,
        link: &Self::Link,
        stream: u32,
        task: u32,
    ) -> Result<()>;
    /// Closes the rank's end of a stream after its last collective succeeded (on a failure the
    /// link is only dropped).
    fn close(&self, link: Self::Link) -> Result<()> {
        drop(link);
        Ok(())
    }
}

/// A rank driven here: its number, its state and one opener per comm stream.
pub struct Local<'r, T: Tasks> {
    pub rank: u32,
    pub state: &'r T::Rank,
    pub openers: Vec<T::Opener>,
}

/// What every thread of a run shares.
struct Driver<'a, T> {
    tasks: &'a T,
    graph: &'a TaskGraph,
    board: &'a Board,
    timeout: Duration,
    failure: &'a Failure,
}

/// A rank's state as its threads see it.
struct Rank<'r, R> {
    number: u32,
    state: &'r R,
    readiness: Readiness,
}

/// Runs every task of `graph` on the `local` ranks, one thread per stream, and returns the run's
/// first failure: its own threads' or one raised into `failure` from outside.
pub fn drive<T: Tasks>(
    tasks: &T,
    graph: &TaskGraph,
    board: &Board,
    timeout: Duration,
    failure: &Failure,
    local: Vec<Local<T>>,
) -> Result<()> {
    let driver = Driver {
        tasks,
        graph,
        board,
        timeout,
        failure,
    };
    let (ranks, openers): (Vec<_>, Vec<_>) = local
        .into_iter()
        .map(|l| {
            let rank = Rank {
                number: l.rank,
                state: l.state,
                readiness: Readiness::new(l.rank, graph),
            };
            (rank, l.openers)
        })
        .unzip();
    std::thread::scope(|scope| {
        for (rank, openers) in ranks.iter().zip(openers) {
            let driver = &driver;
            scope.spawn(move || driver.guard(|| driver.compute_thread(rank)));
            scope.spawn(move || driver.guard(|| driver.codec_thread(rank)));
            for (stream, opener) in openers.into_iter().enumerate() {
                let stream = stream as u32;
                scope.spawn(move || driver.guard(|| driver.comm_thread(rank, stream, opener)));
            }
        }
    });
    failure.take().map_or(Ok(()), Err)
}

impl<T: Tasks> Driver<'_, T> {
    /// Runs a thread's body; the first failure aborts every other thread.
    fn guard(&self, body: impl FnOnce() -> Result<()>) {
        if let Err(err) = body() {
            self.failure.raise(err);
            self.board.wake_all();
        }
    }

    /// Waits until `pick` finds something in the rank's scheduler state, within the timeout.
    fn wait_for<X>(
        &self,
        rank: &Rank<T::Rank>,
        what: &str,
        pick: impl FnMut(&mut Sched) -> Option<X>,
    ) -> Result<X> {
        rank.readiness
            .wait_for(what, self.timeout, self.failure.flag(), pick)
    }

    /// Marks `task` done on the rank and releases its successors.
    fn complete(&self, rank: &Rank<T::Rank>, task: u32) {
        rank.readiness.complete(self.graph, self.board, task);
    }

    /// Forward, backward and optimizer tasks in program order.
    fn compute_thread(&self, rank: &Rank<T::Rank>) -> Result<()> {
        let tasks = (0..self.graph.len() as u32)
            .filter(|&t| self.graph.task(t).resource == Resource::Compute);
        for task in tasks {
            self.wait_for(rank, "a compute task's input", |s| {
                (s.pending[task as usize] == 0).then_some(())
            })?;
            self.tasks.compute(rank.state, task)?;
            self.complete(rank, task);
        }
        Ok(())
    }

    /// Encode and decode tasks, first ready first served.
    fn codec_thread(&self, rank: &Rank<T::Rank>) -> Result<()> {
        let count = self
            .graph
            .graph
            .node_weights()
            .filter(|t| matches!(t.resource, Resource::Codec | Resource::Cpu))
            .count();
        for _ in 0..count {
            let task = self.wait_for(rank, "a compression task", |s| s.codec_queue.pop_front())?;
            self.tasks.codec(rank.state, task)?;
            self.complete(rank, task);
        }
        Ok(())
    }

    /// Collectives in the order the board decides, on this thread's end of the stream.
    fn comm_thread(&self, rank: &Rank<T::Rank>, stream: u32, opener: T::Opener) -> Result<()> {
        let link = self.tasks.open(rank.state, stream, opener)?;
        let mut index = 0;
        while let Some(task) = self
            .board
            .next(stream, index, rank.number, self.failure.flag())?
        {
            index += 1;
            self.tasks.collective(rank.state, &link, stream, task)?;
            self.complete(rank, task);
        }
        self.tasks.close(link)
    }
}
