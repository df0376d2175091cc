//! The per-rank threads of every real backend; the first failure stops them all.
//!
//! Compute tasks run in program order, compression tasks from the rank's FIFO queue, and each comm
//! stream's collectives in the launch board's order.

use super::backend::{Backend, Lane};
use super::board::Board;
use super::sched::{Failure, Readiness, Sched, Waiter};
use super::sequence::run_sync_task;
use super::Job;
use crate::error::Result;
use std::collections::VecDeque;
use std::time::Duration;
use syncopate_sim::schedule::{StepKind, Stream};

/// A rank driven here: its number, its state and one opener per comm stream.
pub(super) struct Local<'r, B: Backend> {
    pub rank: u32,
    pub state: &'r B::Rank,
    pub openers: Vec<B::Opener>,
}

/// What every thread of a run shares.
struct Driver<'a, B> {
    backend: &'a B,
    job: &'a Job<'a>,
    board: &'a dyn Board,
    timeout: Duration,
    failure: &'a Failure,
}

/// A rank's state as its threads see it.
struct Rank<'r, R> {
    number: u32,
    state: &'r R,
    readiness: Readiness,
}

/// Runs every task of the job's program on the `local` ranks, one thread per stream, and
/// returns the run's first failure: its own threads' or one raised into `failure` from outside.
pub(super) fn drive<B: Backend>(
    backend: &B,
    job: &Job,
    board: &dyn Board,
    failure: &Failure,
    local: Vec<Local<B>>,
) -> Result<()> {
    let driver = Driver {
        backend,
        job,
        board,
        timeout: job.options.timeout,
        failure,
    };
    let (ranks, openers): (Vec<_>, Vec<_>) = local
        .into_iter()
        .map(|l| {
            let rank = Rank {
                number: l.rank,
                state: l.state,
                readiness: Readiness::new(l.rank, job),
            };
            (rank, l.openers)
        })
        .unzip();
    for rank in &ranks {
        rank.readiness.start(job, board);
    }
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

impl<B: Backend> Driver<'_, B> {
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
        rank: &Rank<B::Rank>,
        waiter: Waiter,
        what: &str,
        pick: impl FnMut(&mut Sched) -> Option<X>,
    ) -> Result<X> {
        rank.readiness
            .wait_for(waiter, what, self.timeout, self.failure.flag(), pick)
    }

    /// Marks `task` done on the rank and releases its successors.
    fn complete(&self, rank: &Rank<B::Rank>, task: u32) {
        rank.readiness.complete(self.job, self.board, task);
    }

    /// Tasks of the program on `stream`, in program order.
    fn tasks_on(&self, streams: &[Stream]) -> impl Iterator<Item = u32> + '_ {
        let streams = streams.to_vec();
        (0..self.job.program.len() as u32)
            .filter(move |&t| streams.contains(&self.job.step(t).stream))
    }

    /// Forward, backward, optimizer and update tasks in program order. A task whose only unmet
    /// inputs are compute tasks already enqueued is enqueued at once (the stream runs them
    /// first), so a device's compute stream never idles for a host round trip between such
    /// tasks; tasks in flight are completed, releasing their other successors, as soon as they
    /// are done.
    fn compute_thread(&self, rank: &Rank<B::Rank>) -> Result<()> {
        let mut in_flight: VecDeque<(u32, B::Running)> = VecDeque::new();
        for task in self.tasks_on(&[Stream::Compute]) {
            if self.job.step(task).piece.is_some() {
                // A codec in line: the stream's work before it done, then its own inputs.
                for (done, running) in in_flight.drain(..) {
                    self.backend.finish(rank.state, done, running)?;
                    self.complete(rank, done);
                }
                self.wait_for(rank, Waiter::Compute, "an in-line codec's input", |s| {
                    (s.pending[task as usize] == 0).then_some(())
                })?;
                run_sync_task(self.backend, self.job, rank.state, &Lane::Codec, task)?;
                self.complete(rank, task);
                continue;
            }
            loop {
                self.complete_done(rank, &mut in_flight)?;
                if in_flight.is_empty() {
                    self.wait_for(rank, Waiter::Compute, "a compute task's input", |s| {
                        (s.pending[task as usize] == 0).then_some(())
                    })?;
                    break;
                }
                let on_stream = in_flight
                    .iter()
                    .filter(|(k, _)| self.job.program.successors(*k).contains(&task))
                    .count() as u32;
                if rank.readiness.pending(task) == on_stream {
                    break;
                }
                // An input from another stream is missing, which may wait for a task in
                // flight: finish the oldest one and look again.
                let (oldest, running) = in_flight.pop_front().expect("not empty");
                self.backend.finish(rank.state, oldest, running)?;
                self.complete(rank, oldest);
            }
            match self.backend.compute(rank.state, task)? {
                Some(running) => in_flight.push_back((task, running)),
                None => self.complete(rank, task),
            }
        }
        for (task, running) in in_flight {
            self.backend.finish(rank.state, task, running)?;
            self.complete(rank, task);
        }
        Ok(())
    }

    /// Completes the tasks in flight that are done, oldest first, without waiting.
    fn complete_done(
        &self,
        rank: &Rank<B::Rank>,
        in_flight: &mut VecDeque<(u32, B::Running)>,
    ) -> Result<()> {
        while let Some((_, running)) = in_flight.front() {
            if !self.backend.is_done(running)? {
                break;
            }
            let (task, running) = in_flight.pop_front().expect("looked at above");
            self.backend.finish(rank.state, task, running)?;
            self.complete(rank, task);
        }
        Ok(())
    }

    /// Encode and decode tasks, first ready first served.
    fn codec_thread(&self, rank: &Rank<B::Rank>) -> Result<()> {
        let count = self.tasks_on(&[Stream::Codec, Stream::Cpu]).count();
        for _ in 0..count {
            let task = self.wait_for(rank, Waiter::Codec, "a compression task", |s| {
                s.codec_queue.pop_front()
            })?;
            run_sync_task(self.backend, self.job, rank.state, &Lane::Codec, task)?;
            self.complete(rank, task);
        }
        Ok(())
    }

    /// Collectives in the order the board decides, on this thread's end of the stream.
    fn comm_thread(&self, rank: &Rank<B::Rank>, stream: u32, opener: B::Opener) -> Result<()> {
        let link = self.backend.open(rank.state, stream, opener)?;
        let mut index = 0;
        while let Some(task) = self
            .board
            .next(stream, index, rank.number, self.failure.flag())?
        {
            index += 1;
            let lane = Lane::Comm {
                link: &link,
                stream,
            };
            match self.job.step(task).kind {
                StepKind::Gather { .. } => self.backend.gather(rank.state, &lane, task)?,
                _ => run_sync_task(self.backend, self.job, rank.state, &lane, task)?,
            }
            self.complete(rank, task);
        }
        self.backend.close(link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::ExecOptions;
    use std::sync::Mutex;
    use std::time::Instant;
    use syncopate_sim::inputs::model::ModelProfile;
    use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
    use syncopate_sim::plan::CodecStream;
    use syncopate_sim::predict::scenario::Scenario;
    use syncopate_sim::schedule::{lower, Program, Schedule, World};
    use syncopate_sim::strategy::{Strategy, StrategyOptions};

    /// A backend whose compute tasks stay in flight until the driver asks for them a second
    /// time, and which checks every task's inputs when it runs.
    struct Deferred<'g> {
        job: &'g Job<'g>,
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
                let compute = self.job.step(p).stream == Stream::Compute;
                assert!(
                    log.done[p as usize] || (on_stream && compute && log.enqueued[p as usize]),
                    "task {task} ran before its input {p}"
                );
            }
        }
    }

    /// The piece primitives do nothing here: `timed` checks the step's inputs.
    macro_rules! no_ops {
        ($($name:ident),*) => {$(
            fn $name(&self, _: &Mutex<Log>, _: &Lane<()>, _: &mut (), _: usize) -> Result<()> {
                Ok(())
            }
        )*};
    }

    impl Backend for Deferred<'_> {
        type Rank = Mutex<Log>;
        type Piece = ();
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

        fn open(&self, _: &Mutex<Log>, _: u32, _: ()) -> Result<()> {
            Ok(())
        }

        fn timed(
            &self,
            log: &Mutex<Log>,
            lane: &Lane<()>,
            task: u32,
            _: usize,
            body: &mut dyn FnMut(&mut ()) -> Result<()>,
        ) -> Result<()> {
            body(&mut ())?;
            self.gather(log, lane, task)
        }

        /// Checks the task's inputs and marks it done, as `timed` does after its body.
        fn gather(&self, log: &Mutex<Log>, _: &Lane<()>, task: u32) -> Result<()> {
            let mut log = log.lock().unwrap();
            self.check_inputs(&log, task, false);
            log.done[task as usize] = true;
            Ok(())
        }

        no_ops!(
            compensate,
            encode,
            next_round,
            decode,
            update_memory,
            scale_output
        );

        fn exchange(
            &self,
            _: &Mutex<Log>,
            _: &Lane<()>,
            _: &mut (),
            _: usize,
            _: u32,
        ) -> Result<()> {
            Ok(())
        }
    }

    fn schedule(strategy: &str, compressor: &str, codecs: CodecStream) -> Schedule {
        let model = ModelProfile::load("resnet50").unwrap();
        let overrides = ClusterOverrides {
            nodes: Some(1),
            gpus_per_node: Some(2),
            ..ClusterOverrides::default()
        };
        let cluster = Cluster::load("v100-10gbe", overrides).unwrap();
        let scenario = Scenario::new(model, cluster).unwrap();
        let mut plan = strategy
            .parse::<Strategy>()
            .unwrap()
            .plan(
                &scenario,
                &StrategyOptions {
                    compressor: compressor.parse().unwrap(),
                    ..StrategyOptions::default()
                },
            )
            .unwrap();
        plan.codec_stream = codecs;
        let world = World {
            nodes: 1,
            ranks_per_node: 2,
        };
        lower(&scenario.model, world, false, &plan, strategy).unwrap()
    }

    /// With compute tasks left in flight, every task still runs after its inputs (compute
    /// inputs merely enqueued earlier on the stream count), compute keeps program order, and
    /// the run ends with every task done: the pipelined compute stream cannot deadlock, nor
    /// the compression thread, woken only when its queue gains a task. Codecs in line on the
    /// compute stream run there, after the compute work queued before them. A sharded plan's
    /// gathers run on the comm stream after their inputs, the first ones, which wait for
    /// nothing, too.
    #[test]
    fn in_flight_compute_keeps_every_dependency() {
        for (strategy, compressor, codecs) in [
            ("horovod", "none", CodecStream::Side),
            ("dear", "none", CodecStream::Side),
            ("bytescheduler", "none", CodecStream::Side),
            ("horovod", "topk:0.01", CodecStream::Side),
            ("bytescheduler", "powersgd:4", CodecStream::Side),
            ("horovod", "topk:0.01", CodecStream::Compute),
            ("fsdp", "none", CodecStream::Side),
            ("zero2", "bf16", CodecStream::Side),
        ] {
            let schedule = schedule(strategy, compressor, codecs);
            let options = ExecOptions {
                warmup: 1,
                iterations: 2,
                check: false,
                seed: 1,
                timeout: Duration::from_secs(20),
            };
            let program = Program::unroll(&schedule, 3).unwrap();
            let job = Job {
                schedule: &schedule,
                slots: schedule.tensor_slots(),
                units: crate::runtime::params::units(&schedule).unwrap(),
                program,
                compute_scale: 1.0,
                options: &options,
            };
            let n = job.program.len();
            let mut predecessors = vec![Vec::new(); n];
            for t in 0..n as u32 {
                for &s in job.program.successors(t) {
                    predecessors[s as usize].push(t);
                }
            }
            let board = crate::runtime::board::LocalBoard::new(
                &schedule.policy,
                &job.program,
                1,
                Instant::now(),
                options.timeout,
            );
            let backend = Deferred {
                job: &job,
                predecessors,
                queries: Mutex::new(0),
            };
            let log = Mutex::new(Log {
                enqueued: vec![false; n],
                done: vec![false; n],
                compute_order: Vec::new(),
                ahead: 0,
            });
            let local = vec![Local {
                rank: 0,
                state: &log,
                openers: vec![(); schedule.policy.comm_streams as usize],
            }];
            drive(&backend, &job, &board, &Failure::default(), local).unwrap();
            let log = log.into_inner().unwrap();
            assert!(
                log.done.iter().all(|&d| d),
                "{strategy} + {compressor}: a task never ran"
            );
            let compute: Vec<u32> = (0..n as u32)
                .filter(|&t| job.step(t).stream == Stream::Compute && job.step(t).piece.is_none())
                .collect();
            assert_eq!(log.compute_order, compute, "{strategy} + {compressor}");
            let gathers = (0..n as u32)
                .filter(|&t| matches!(job.step(t).kind, StepKind::Gather { .. }))
                .count();
            assert_eq!(
                gathers > 0,
                !schedule.param_shards.is_empty(),
                "{strategy} + {compressor}"
            );
            assert!(
                log.ahead > 0,
                "{strategy} + {compressor}: nothing was enqueued ahead"
            );
        }
    }
}
