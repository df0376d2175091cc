//! The per-rank threads of both real backends: compute tasks in program order, compression tasks from the rank's FIFO queue, each comm stream's collectives in the launch board's order; the first failure stops them all.

use super::host::board::Board;
use super::sched::{Failure, Readiness, Sched};
use crate::error::Result;
use std::collections::VecDeque;
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
    /// Compute work enqueued on a device stream and not yet seen done.
    type Running;

    /// A forward, backward or optimizer task: done when this returns (`None`), or enqueued
    /// behind the rank's earlier compute tasks (`Some`), to be finished with [`Tasks::finish`].
    fn compute(&self, rank: &Self::Rank, task: u32) -> Result<Option<Self::Running>>;
    /// Whether enqueued compute work is done, without waiting.
    fn is_done(&self, running: &Self::Running) -> Result<bool>;
    /// Waits (bounded) until enqueued compute work is done and records its task.
    fn finish(&self, rank: &Self::Rank, task: u32, running: Self::Running) -> Result<()>;
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

    /// Forward, backward and optimizer tasks in program order. A task whose only unmet inputs
    /// are compute tasks already enqueued is enqueued at once (the stream runs them first), so
    /// a device's compute stream never idles for a host round trip between such tasks; tasks
    /// in flight are completed, releasing their other successors, as soon as they are done.
    fn compute_thread(&self, rank: &Rank<T::Rank>) -> Result<()> {
        let mut in_flight: VecDeque<(u32, T::Running)> = VecDeque::new();
        let tasks = (0..self.graph.len() as u32)
            .filter(|&t| self.graph.task(t).resource == Resource::Compute);
        for task in tasks {
            loop {
                self.complete_done(rank, &mut in_flight)?;
                if in_flight.is_empty() {
                    self.wait_for(rank, "a compute task's input", |s| {
                        (s.pending[task as usize] == 0).then_some(())
                    })?;
                    break;
                }
                let on_stream = in_flight
                    .iter()
                    .filter(|(k, _)| self.graph.successors(*k).contains(&task))
                    .count() as u32;
                if rank.readiness.pending(task) == on_stream {
                    break;
                }
                // An input from another stream is missing, which may wait for a task in
                // flight: finish the oldest one and look again.
                let (oldest, running) = in_flight.pop_front().expect("not empty");
                self.tasks.finish(rank.state, oldest, running)?;
                self.complete(rank, oldest);
            }
            match self.tasks.compute(rank.state, task)? {
                Some(running) => in_flight.push_back((task, running)),
                None => self.complete(rank, task),
            }
        }
        for (task, running) in in_flight {
            self.tasks.finish(rank.state, task, running)?;
            self.complete(rank, task);
        }
        Ok(())
    }

    /// Completes the tasks in flight that are done, oldest first, without waiting.
    fn complete_done(
        &self,
        rank: &Rank<T::Rank>,
        in_flight: &mut VecDeque<(u32, T::Running)>,
    ) -> Result<()> {
        while let Some((_, running)) = in_flight.front() {
            if !self.tasks.is_done(running)? {
                break;
            }
            let (task, running) = in_flight.pop_front().expect("looked at above");
            self.tasks.finish(rank.state, task, running)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Instant;
    use syncopate_sim::builder::build_graph;
    use syncopate_sim::model::ModelProfile;
    use syncopate_sim::scenario::Scenario;
    use syncopate_sim::strategy::{Strategy, StrategyOptions};
    use syncopate_sim::topology::{Cluster, ClusterOverrides};

    /// A backend whose compute tasks stay in flight until the driver asks for them a second
    /// time, and which checks every task's inputs when it runs.
    struct Deferred<'g> {
        graph: &'g TaskGraph,
        predecessors: Vec<Vec<u32>>,
        queries: Mutex<u32>,
    }

    #[derive(Default)]
    struct Log {
        enqueued: Vec<bool>,
        done: Vec<bool>,
        compute_order: Vec<u32>,
        /// Compute tasks enqueued while an input was still in flight.
        ahead: u32,
    }

    impl Deferred<'_> {
        /// Every input is done, or (`on_stream`) an earlier compute task already enqueued.
        fn check_inputs(&self, log: &Log, task: u32, on_stream: bool) {
            for &p in &self.predecessors[task as usize] {
                let compute = self.graph.task(p).resource == Resource::Compute;
                assert!(
                    log.done[p as usize] || (on_stream && compute && log.enqueued[p as usize]),
                    "task {task} ran before its input {p}"
                );
            }
        }

        fn run(&self, log: &Mutex<Log>, task: u32) {
            let mut log = log.lock().unwrap();
            self.check_inputs(&log, task, false);
            log.done[task as usize] = true;
        }
    }

    impl Tasks for Deferred<'_> {
        type Rank = Mutex<Log>;
        type Opener = ();
        type Link = ();
        type Running = u32;

        fn compute(&self, log: &Mutex<Log>, task: u32) -> Result<Option<u32>> {
            let mut log = log.lock().unwrap();
            self.check_inputs(&log, task, true);
            if self.predecessors[task as usize]
                .iter()
                .any(|&p| !log.done[p as usize])
            {
                log.ahead += 1;
            }
            log.enqueued[task as usize] = true;
            log.compute_order.push(task);
            Ok(Some(task))
        }

        fn is_done(&self, _: &u32) -> Result<bool> {
            // Seen done every other time, so both of the driver's paths run.
            let mut queries = self.queries.lock().unwrap();
            *queries += 1;
            Ok(queries.is_multiple_of(2))
        }

        fn finish(&self, log: &Mutex<Log>, task: u32, running: u32) -> Result<()> {
            assert_eq!(task, running);
            let mut log = log.lock().unwrap();
            assert!(log.enqueued[task as usize] && !log.done[task as usize]);
            self.check_inputs(&log, task, true);
            log.done[task as usize] = true;
            Ok(())
        }

        fn codec(&self, log: &Mutex<Log>, task: u32) -> Result<()> {
            self.run(log, task);
            Ok(())
        }

        fn open(&self, _: &Mutex<Log>, _: u32, _: ()) -> Result<()> {
            Ok(())
        }

        fn collective(&self, log: &Mutex<Log>, _: &(), _: u32, task: u32) -> Result<()> {
            self.run(log, task);
            Ok(())
        }
    }

    /// With compute tasks left in flight, every task still runs after its inputs (compute
    /// inputs merely enqueued earlier on the stream count), compute keeps program order, and
    /// the run ends with every task done: the pipelined compute stream cannot deadlock.
    #[test]
    fn in_flight_compute_keeps_every_dependency() {
        for strategy in ["horovod", "dear", "bytescheduler"] {
            let model = ModelProfile::load("resnet50").unwrap();
            let overrides = ClusterOverrides {
                nodes: Some(1),
                gpus_per_node: Some(2),
                ..ClusterOverrides::default()
            };
            let cluster = Cluster::load("v100-10gbe", overrides).unwrap();
            let base = Scenario::resolve(model, cluster).unwrap();
            let plan = strategy
                .parse::<Strategy>()
                .unwrap()
                .plan(&base, &StrategyOptions::default())
                .unwrap();
            let scenario = base.with_plan(plan, strategy).unwrap();
            let graph = build_graph(&scenario, 3).unwrap();
            let mut predecessors = vec![Vec::new(); graph.len()];
            for t in 0..graph.len() as u32 {
                for &s in graph.successors(t) {
                    predecessors[s as usize].push(t);
                }
            }
            let policy = &scenario.plan.policy;
            let timeout = Duration::from_secs(20);
            let board = Board::new(
                &graph,
                1,
                policy.launch,
                syncopate_sim::time::SimTime::from_us(policy.cycle_time_us).as_ns(),
                policy.comm_streams,
                Instant::now(),
                timeout,
            );
            let tasks = Deferred {
                graph: &graph,
                predecessors,
                queries: Mutex::new(0),
            };
            let log = Mutex::new(Log {
                enqueued: vec![false; graph.len()],
                done: vec![false; graph.len()],
                compute_order: Vec::new(),
                ahead: 0,
            });
            let local = vec![Local {
                rank: 0,
                state: &log,
                openers: vec![(); policy.comm_streams as usize],
            }];
            drive(&tasks, &graph, &board, timeout, &Failure::default(), local).unwrap();
            let log = log.into_inner().unwrap();
            assert!(log.done.iter().all(|&d| d), "{strategy}: a task never ran");
            let compute: Vec<u32> = (0..graph.len() as u32)
                .filter(|&t| graph.task(t).resource == Resource::Compute)
                .collect();
            assert_eq!(log.compute_order, compute, "{strategy}");
            assert!(log.ahead > 0, "{strategy}: nothing was enqueued ahead");
        }
    }
}
