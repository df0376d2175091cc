//! Compute streams: each rank's work clock under the shared compute rate, and fused runs.
//!
//! Compute on every rank progresses at one rate shared by all ranks (the ranks' pace, slower
//! while a collective runs) times the rank's own factor (slower while its compression kernel
//! runs). Each rank measures its compute on a work clock that advances at that rate, and a
//! running task's end is kept as a reading of the shared clock: a change of the shared rate
//! moves nothing, the ends are turned into times only when they come due. A compute task
//! starts where the previous one ended on the work clock when it was waiting for it, so time
//! is not rounded task by task. A run of chain tasks whose ends nothing outside the rank's
//! compute stream sees (no collective, codec or closing step waits for them) is one event.

use super::quad_heap::QuadHeap;
use super::Engine;
use crate::base::time::SimTime;
use crate::predict::graph::TaskGraph;
use crate::schedule::Stream;

/// The clock every rank's compute shares: full-rate work done since time zero by a rank
/// running at the shared rate.
#[derive(Debug)]
pub(super) struct SharedClock {
    since: SimTime,
    at: f64,
    rate: f64,
}

impl SharedClock {
    pub(super) fn new(rate: f64) -> SharedClock {
        SharedClock {
            since: SimTime::ZERO,
            at: 0.0,
            rate,
        }
    }

    /// The clock's reading at `now` (not before its last rate change).
    fn reading(&self, now: SimTime) -> f64 {
        self.at + (now - self.since).as_ns() as f64 * self.rate
    }

    /// Switches to `rate` from `now` on.
    pub(super) fn set_rate(&mut self, now: SimTime, rate: f64) {
        if rate != self.rate {
            self.at = self.reading(now);
            self.since = now;
            self.rate = rate;
        }
    }

    /// The first whole nanosecond at which the clock reads `reading` or more, at the current
    /// rate (saturating: a run that reaches `SimTime::MAX` is reported by `run`).
    fn time_of(&self, reading: f64) -> SimTime {
        let ns = ((reading - self.at) / self.rate).ceil().max(0.0) as u64;
        SimTime(self.since.as_ns().saturating_add(ns))
    }
}

/// Chain tasks a rank's compute stream runs back to back as one event.
#[derive(Clone, Copy, Debug)]
struct Run {
    first: u32,
    last: u32,
    start: SimTime,
    /// The rank's work clock when the last task ends.
    end_work: f64,
    /// Sequence number of the run's end event; an event with another is stale.
    event: u64,
}

/// One rank's compute stream: the ready task, the running run and the rank's work clock,
/// which reads `work_at + factor × (shared − shared_at)`.
#[derive(Debug)]
pub(super) struct ComputeStream {
    /// The task that is ready and when it became so: one at most, since every compute task
    /// waits for the one before it (`Program::unroll` chains them).
    ready: Option<(SimTime, u32)>,
    run: Option<Run>,
    work_at: f64,
    shared_at: f64,
    factor: f64,
    /// When the last run ended, and the work clock then.
    last_end: SimTime,
    last_end_work: f64,
}

impl ComputeStream {
    pub(super) fn new() -> ComputeStream {
        ComputeStream {
            ready: None,
            run: None,
            work_at: 0.0,
            shared_at: 0.0,
            factor: 1.0,
            last_end: SimTime::ZERO,
            last_end_work: 0.0,
        }
    }

    pub(super) fn is_running(&self) -> bool {
        self.run.is_some()
    }

    pub(super) fn enqueue(&mut self, now: SimTime, task: u32) {
        debug_assert!(self.ready.is_none(), "compute tasks are chained");
        self.ready = Some((now, task));
    }

    /// The shared clock's reading at which the work clock reads `work`.
    fn shared_reading(&self, work: f64) -> f64 {
        self.shared_at + (work - self.work_at) / self.factor
    }
}

/// End events of compute runs, ordered by the shared clock's reading at their end.
pub(super) type ComputeEvents = QuadHeap<(u64, u64, u32)>;

/// What the graph says about each task's end, the same on every rank.
pub(super) struct Chain {
    /// The next task on the compute stream, `u32::MAX` for none.
    next: Vec<u32>,
    /// How many of each task's dependencies are on the previous compute task.
    on_previous: Vec<u32>,
    /// Each task's predicted duration in nanoseconds, before noise and contention.
    duration: Vec<f64>,
    /// Whether the task's end may be folded into a run with the next: it is a compute task
    /// of the same iteration as the next, neither is a codec, it closes no iteration, and
    /// every other task that waits for it also waits for a later compute task of the rank.
    foldable: Vec<bool>,
}

impl Chain {
    pub(super) fn new(graph: &TaskGraph) -> Chain {
        let n = graph.len();
        let tasks = graph.tasks();
        let mut next = vec![u32::MAX; n];
        let mut previous: Option<usize> = None;
        for (i, task) in tasks.iter().enumerate() {
            if task.stream == Stream::Compute {
                if let Some(p) = previous {
                    next[p] = i as u32;
                }
                previous = Some(i);
            }
        }
        // The latest input of each task, and whether all its inputs are compute tasks.
        let mut latest_input = vec![0u32; n];
        let mut inputs_compute = vec![true; n];
        for from in 0..n as u32 {
            for &to in graph.successors(from) {
                let to = to as usize;
                latest_input[to] = latest_input[to].max(from);
                inputs_compute[to] &= tasks[from as usize].stream == Stream::Compute;
            }
        }
        let closing: Vec<bool> = {
            let mut closing = vec![false; n];
            for &end in graph.iteration_end() {
                closing[end as usize] = true;
            }
            closing
        };
        let plain =
            |t: &crate::predict::graph::Task| t.stream == Stream::Compute && !t.kind.is_codec();
        let foldable = (0..n)
            .map(|i| {
                let task = &tasks[i];
                let Some(after) = tasks.get(next[i] as usize) else {
                    return false;
                };
                plain(task)
                    && plain(after)
                    && after.iteration == task.iteration
                    && !closing[i]
                    && graph.successors(i as u32).iter().all(|&s| {
                        s == next[i]
                            || (inputs_compute[s as usize] && latest_input[s as usize] > i as u32)
                    })
            })
            .collect();
        let mut on_previous = vec![0; n];
        for (i, &after) in next.iter().enumerate() {
            if let Some(count) = on_previous.get_mut(after as usize) {
                *count = graph
                    .successors(i as u32)
                    .iter()
                    .filter(|&&s| s == after)
                    .count() as u32;
            }
        }
        Chain {
            next,
            on_previous,
            foldable,
            duration: tasks.iter().map(|t| t.duration.as_ns() as f64).collect(),
        }
    }
}

impl Engine<'_> {
    /// The shared compute rate now: every rank's pace, slower while a collective runs.
    pub(super) fn shared_compute_rate(&self) -> f64 {
        let mut slowdown = self.config.compute_slowdown;
        if self.active_collectives() > 0 {
            slowdown *= self.config.slowdown_with_collective;
        }
        1.0 / slowdown
    }

    /// The rank's own factor on the shared rate: slower while its compression kernel runs.
    fn rank_compute_factor(&self, rank: u32) -> f64 {
        match self.codec_active[rank as usize] {
            true => 1.0 / self.config.slowdown_with_codec,
            false => 1.0,
        }
    }

    /// Applies a change of the collectives running to every rank's compute at once.
    pub(super) fn reset_shared_rate(&mut self) {
        let rate = self.shared_compute_rate();
        self.clock.set_rate(self.now, rate);
    }

    /// The rank's work clock now.
    fn work_now(&self, rank: u32) -> f64 {
        let stream = &self.ranks[rank as usize].compute;
        stream.work_at + stream.factor * (self.clock.reading(self.now) - stream.shared_at)
    }

    /// The rank's codec started or stopped: its compute factor changes from now on, and with
    /// it the time its running run ends.
    pub(super) fn refresh_rank_factor(&mut self, rank: u32) {
        let factor = self.rank_compute_factor(rank);
        if factor == self.ranks[rank as usize].compute.factor {
            return;
        }
        let work = self.work_now(rank);
        let shared = self.clock.reading(self.now);
        let stream = &mut self.ranks[rank as usize].compute;
        stream.work_at = work;
        stream.shared_at = shared;
        stream.factor = factor;
        if let Some(run) = stream.run {
            self.schedule_run_end(rank, run);
        }
    }

    /// The time the next compute run ends (not before now), dropping stale events on the way.
    pub(super) fn next_compute_end(&mut self) -> Option<SimTime> {
        while let Some(&(reading, event, rank)) = self.compute_events.peek() {
            let current = self.ranks[rank as usize].compute.run;
            if current.is_some_and(|run| run.event == event) {
                return Some(self.clock.time_of(f64::from_bits(reading)).max(self.now));
            }
            self.compute_events.pop();
        }
        None
    }

    /// Ends the next compute run if it ends at `time`; false if none does.
    pub(super) fn end_compute_run_at(&mut self, time: SimTime) -> bool {
        if self.next_compute_end() != Some(time) {
            return false;
        }
        let Some((_, _, rank)) = self.compute_events.pop() else {
            return false;
        };
        self.processed += 1;
        self.end_run(rank);
        true
    }

    /// Starts the rank's next ready compute task if its stream is idle.
    pub(super) fn start_compute(&mut self, rank: u32) {
        let stream = &mut self.ranks[rank as usize].compute;
        if stream.run.is_some() {
            return;
        }
        let Some((ready, task)) = stream.ready.take() else {
            return;
        };
        // A task that was waiting when the previous one ended starts where it ended.
        let start = match ready <= stream.last_end {
            true => stream.last_end_work,
            false => self.work_now(rank),
        };
        self.computing += 1;
        self.begin_run(rank, task, start);
        self.rerate_codec(rank);
        self.refresh_cpu_busy(rank);
    }

    /// Runs `first` from work-clock reading `start`, folding in the chain tasks after it
    /// whose ends no one else sees (not on recorded ranks: each of their tasks is recorded).
    fn begin_run(&mut self, rank: u32, first: u32, start: f64) {
        let mut last = first;
        let mut end = start + self.work(first, rank);
        if rank >= self.config.record_ranks {
            while let Some(next) = self.foldable_next(rank, last) {
                self.release_silently(rank, last);
                last = next;
                end += self.work(next, rank);
            }
        }
        let run = Run {
            first,
            last,
            start: self.now,
            end_work: end,
            event: 0,
        };
        self.schedule_run_end(rank, run);
    }

    /// The task's work on `rank` in nanoseconds at full rate.
    fn work(&mut self, task: u32, rank: u32) -> f64 {
        self.chain.duration[task as usize] * f64::from(self.noise.rank_task(task, rank))
    }

    /// The chain task after `task` if the run may go on to it: `task`'s end is foldable and
    /// the next waits for nothing else on this rank.
    fn foldable_next(&mut self, rank: u32, task: u32) -> Option<u32> {
        if !self.chain.foldable[task as usize] {
            return None;
        }
        let next = self.chain.next[task as usize];
        let on_previous = self.chain.on_previous[next as usize];
        match self.window.counter(next, rank) {
            Some(&mut unmet) if unmet != on_previous => None,
            _ => Some(next),
        }
    }

    /// Counts `task`'s end on `rank` for every task that waits for it, ahead of time: none of
    /// them becomes ready by it (`Chain::foldable`), except the next, which the run takes.
    fn release_silently(&mut self, rank: u32, task: u32) {
        for &next in self.graph.successors(task) {
            if let Some(unmet) = self.window.counter(next, rank) {
                *unmet -= 1;
            }
        }
    }

    /// Schedules the end of `run` on `rank` under a fresh sequence number.
    fn schedule_run_end(&mut self, rank: u32, mut run: Run) {
        self.seq += 1;
        run.event = self.seq;
        let stream = &mut self.ranks[rank as usize].compute;
        let reading = stream.shared_reading(run.end_work);
        stream.run = Some(run);
        self.compute_events
            .push((reading.max(0.0).to_bits(), run.event, rank));
    }

    /// The rank's run ended now: its tasks are done; the stream goes on with what is ready.
    fn end_run(&mut self, rank: u32) {
        let Some(run) = self.ranks[rank as usize].compute.run.take() else {
            return;
        };
        let mut task = run.first;
        self.finish_on_ranks(task, 1);
        while task != run.last {
            task = self.chain.next[task as usize];
            self.finish_on_ranks(task, 1);
        }
        // Codecs in line on the compute stream count as compression, not compute; a run of
        // more than one task has none (`Chain::foldable`), nor two iterations.
        let compression = self.graph.task(run.last).kind.is_codec();
        self.local_ended(rank, run.last, run.start, compression);
        let stream = &mut self.ranks[rank as usize].compute;
        stream.last_end = self.now;
        stream.last_end_work = run.end_work;
        self.release_successors(rank, run.last);
        // What is ready now runs on from where this run ended, without the stream idling.
        match self.ranks[rank as usize].compute.ready.take() {
            Some((_, next)) => self.begin_run(rank, next, run.end_work),
            None => {
                self.computing -= 1;
                self.rerate_codec(rank);
                self.refresh_cpu_busy(rank);
            }
        }
    }
}
