//! The discrete-event engine: advances integer-nanosecond time over a task graph for every
//! rank, shares streams and links, and applies contention; policies come in as data.
//!
//! Events are processed in batches of equal time; only after a whole batch do streams pick
//! their next task, so the outcome does not depend on the order ranks are visited in. Running
//! tasks progress at a rate (concurrent collectives share the network with their transfers,
//! while a collective's fixed part runs beside them, after waiting behind what the others
//! have queued on its connections; codecs slow beside compute), and a rate change reschedules
//! the task's end; those rates are in `rates.rs`. Compute runs on a clock every rank shares,
//! slowed while collectives or compression kernels run beside it (`compute.rs`).

mod compute;
mod quad_heap;
mod rates;
mod window;

use crate::base::error::{Result, SimError};
use crate::base::time::SimTime;
use crate::collective::Links;
use crate::predict::graph::TaskGraph;
use crate::predict::noise::Noise;
use crate::schedule::launch::{Launcher, Ticks};
use crate::schedule::{LaunchPolicy, Stream};
use compute::{Chain, ComputeEvents, ComputeStream, SharedClock};
use quad_heap::QuadHeap;
use window::Window;

/// How the engine runs one graph.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Ranks simulated explicitly (1 on the symmetric path).
    pub ranks: u32,
    /// Communication streams, launch order and Horovod's cycle.
    pub policy: LaunchPolicy,
    /// Compute time multiplier with every rank computing and nothing beside it (the slowest
    /// rank's pace), and the multipliers on top of it while a collective / a GPU compression
    /// kernel runs beside it.
    pub compute_slowdown: f64,
    /// Compute time multiplier, on top of `compute_slowdown`, while a collective runs beside it.
    pub slowdown_with_collective: f64,
    /// Compute time multiplier, on top of `compute_slowdown`, while a GPU compression kernel
    /// runs beside it.
    pub slowdown_with_codec: f64,
    /// Collective time multiplier while every rank keeps its cores busy, computing or
    /// compressing (CPU ranks: the TCP stack and MPI's progress share those cores).
    pub comm_slowdown_with_compute: f64,
    /// Compression time multiplier while the rank computes (a CPU rank's compression thread
    /// shares the cores its compute runs on), when `shared_cores` does not say more.
    pub codec_slowdown_with_compute: f64,
    /// CPU ranks sharing a host's cores: compression runs at the share of a core its host's
    /// busy threads leave it.
    pub shared_cores: Option<CoreShare>,
    /// Push-pull rounds to different servers that run at full speed together, when the hosts
    /// rather than the links limit them (`TcpParams::p2p_rounds_at_once`).
    pub push_pulls_at_once: Option<f64>,
    /// Nanoseconds at most a collective waits, before its transfer, behind the transfers
    /// other streams' collectives have queued on the same connections
    /// (`TcpParams::queue_behind_bytes` at the links' goodput); 0: they share the links fairly from
    /// the start.
    pub queue_behind_ns: f64,
    /// Ranks whose task times are kept for the trace.
    pub record_ranks: u32,
}

impl EngineConfig {
    /// `ranks` ranks under `policy` with nothing slowing anything down, no rank recorded.
    pub fn uncontended(ranks: u32, policy: LaunchPolicy) -> EngineConfig {
        EngineConfig {
            ranks,
            policy,
            compute_slowdown: 1.0,
            slowdown_with_collective: 1.0,
            slowdown_with_codec: 1.0,
            comm_slowdown_with_compute: 1.0,
            codec_slowdown_with_compute: 1.0,
            shared_cores: None,
            push_pulls_at_once: None,
            queue_behind_ns: 0.0,
            record_ranks: 0,
        }
    }
}

/// The `queue_behind_ns` under which a collective that starts at a uniformly random moment of
/// another's transfer of `span` waits `mean` on average, as the engine charges the wait (the
/// least of the cap and the transfer left): mean = cap − cap² / (2 span), solved for the cap.
/// A probe measures such a mean (`syncopate lab probe contention`); a mean of half the span or
/// more takes the whole span, the most the charge can give.
pub fn queue_cap_for_mean_wait(mean: f64, span: f64) -> f64 {
    let valid = mean > 0.0 && span > 0.0 && span.is_finite();
    if !valid {
        return 0.0;
    }
    if mean >= span / 2.0 {
        return span;
    }
    span - (span * span - 2.0 * mean * span).sqrt()
}

/// How many ranks share how many cores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CoreShare {
    /// Ranks on one host.
    pub ranks: u32,
    /// Cores of that host, which its ranks share.
    pub cores: u32,
}

impl CoreShare {
    /// The time multiplier of a thread while each rank of the host keeps `threads` busy: the
    /// ranks of a data-parallel job run the same program in step, so a rank's busy threads
    /// stand for every rank's.
    fn slowdown(&self, threads: u32) -> f64 {
        (f64::from(self.ranks) * f64::from(threads) / f64::from(self.cores)).max(1.0)
    }
}

/// One executed task of a recorded rank (collectives are recorded once, with `rank` 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    /// The rank that ran the task (0 for collectives).
    pub rank: u32,
    /// Index of the task in the graph.
    pub task: u32,
    /// Communication stream index for collectives, 0 otherwise.
    pub stream: u32,
    /// When the task started.
    pub start: SimTime,
    /// When the task finished.
    pub end: SimTime,
}

/// What a run produced.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineResult {
    /// Per iteration: when its last rank finished its closing step (`Schedule::iteration_end`,
    /// the last backward step).
    pub iteration_end: Vec<SimTime>,
    /// Per iteration: busy time of each rank's compute work and codec work (on its codec or CPU
    /// stream, or in line on its compute stream), summed over ranks.
    pub compute_busy: Vec<SimTime>,
    /// Per iteration: busy time of each rank's codec work, summed over ranks.
    pub codec_busy: Vec<SimTime>,
    /// Per iteration: time some collective was running.
    pub comm_busy: Vec<SimTime>,
    /// Per iteration: time some collective was running while a rank's compute stream was
    /// idle, summed over ranks (communication that compute does not hide).
    pub comm_exposed: Vec<SimTime>,
    /// Executed tasks of the recorded ranks (`EngineConfig::record_ranks`).
    pub records: Vec<TaskRecord>,
    /// Number of events the engine processed.
    pub events: u64,
    /// The most iterations whose per-rank dependency counts were held at once: what the
    /// explicit path's memory grows with, instead of the iterations run.
    pub iterations_held: u32,
    /// When the last task finished.
    pub makespan: SimTime,
}

/// A task in progress whose rate can change.
#[derive(Clone, Copy, Debug)]
struct Running {
    task: u32,
    start: SimTime,
    /// Work left in nanoseconds at full rate.
    remaining: f64,
    rate: f64,
    since: SimTime,
    version: u64,
}

impl Running {
    fn new(task: u32, now: SimTime, work: f64, rate: f64, version: u64) -> Running {
        Running {
            task,
            start: now,
            remaining: work,
            rate,
            since: now,
            version,
        }
    }

    /// Brings `remaining` up to `now` and switches to `rate` under a fresh `version` (versions
    /// are never reused, so events of earlier rates stay stale); returns the new end time.
    fn rerate(&mut self, now: SimTime, rate: f64, version: u64) -> SimTime {
        self.remaining = (self.remaining - (now - self.since).as_ns() as f64 * self.rate).max(0.0);
        self.since = now;
        self.rate = rate;
        self.version = version;
        self.end()
    }

    fn end(&self) -> SimTime {
        // Saturates: a run that reaches `SimTime::MAX` is reported by `run`.
        SimTime(
            self.since
                .as_ns()
                .saturating_add((self.remaining / self.rate).ceil() as u64),
        )
    }
}

/// A per-rank stream that runs one task at a time, taking ready tasks first-come first-served
/// (ties by task index).
#[derive(Debug, Default)]
struct Queue {
    queue: QuadHeap<(SimTime, u32)>,
    running: Option<Running>,
}

#[derive(Debug)]
struct RankState {
    compute: ComputeStream,
    codec: Queue,
    cpu: Queue,
}

/// Event payloads, ordered for deterministic tie-breaking after (time, sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A rank's codec or CPU task may be done (stale if its version moved on).
    Local {
        rank: u32,
        resource: LocalStream,
        version: u64,
    },
    /// A collective on a stream may be done (stale if its version moved on).
    Comm { stream: u32, version: u64 },
    /// A cycle tick releases collectives that became ready between ticks.
    Tick,
}

/// A rank's streams besides compute (`compute.rs`), whose tasks end as events of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum LocalStream {
    Codec,
    Cpu,
}

/// `Engine::dirty` bits.
const DIRTY_COMPUTE: u8 = 1;
const DIRTY_CODEC: u8 = 2;
const DIRTY_CPU: u8 = 4;

/// The `Engine::dirty` bit of a rank-local stream.
fn dirty_bit(stream: Stream) -> u8 {
    match stream {
        Stream::Compute => DIRTY_COMPUTE,
        Stream::Codec => DIRTY_CODEC,
        Stream::Cpu => DIRTY_CPU,
        Stream::Comm => 0,
    }
}

impl LocalStream {
    fn dirty_bit(self) -> u8 {
        match self {
            LocalStream::Codec => DIRTY_CODEC,
            LocalStream::Cpu => DIRTY_CPU,
        }
    }
}

impl RankState {
    fn new() -> RankState {
        RankState {
            compute: ComputeStream::new(),
            codec: Queue::default(),
            cpu: Queue::default(),
        }
    }

    fn stream(&mut self, which: LocalStream) -> &mut Queue {
        match which {
            LocalStream::Codec => &mut self.codec,
            LocalStream::Cpu => &mut self.cpu,
        }
    }
}

struct Engine<'a> {
    graph: &'a TaskGraph,
    config: &'a EngineConfig,
    noise: &'a Noise,
    ranks_n: u32,
    now: SimTime,
    seq: u64,
    events: QuadHeap<(SimTime, u64, Event)>,
    /// Compute runs' ends, kept apart: they move with the shared compute rate.
    compute_events: ComputeEvents,
    clock: SharedClock,
    chain: Chain,
    processed: u64,
    /// Unmet dependencies of the iterations in flight.
    window: Window,
    ranks: Vec<RankState>,
    /// Per rank, the streams that may start a task (`DIRTY_*` bits), and the ranks with any:
    /// dispatch visits only those, not every stream of every rank touched.
    dirty: Vec<u8>,
    dirty_list: Vec<u32>,
    /// Ranks that have met each collective's dependencies.
    arrivals: Vec<u32>,
    /// Ranks that have finished each task (all of them at once for a collective).
    finished: Vec<u32>,
    launcher: Launcher,
    comm: Vec<Option<Running>>,
    /// Per communication stream, while its collective pays its fixed part (which shares no
    /// link): the transfer work that follows it, in nanoseconds at full rate.
    transfer_after: Vec<Option<f64>>,
    /// Running collectives past their fixed part: those that share the links.
    transferring: u32,
    /// Streams running a collective (its fixed part or its transfer).
    active: u32,
    /// Whether any collective keeps only some links busy (a push-pull); if none does, the
    /// running collectives share every link equally, without the per-link account.
    push_pulls: bool,
    /// Scratch for sharing the links: the running collectives' links and their slowdowns.
    comm_links: Vec<Links>,
    comm_shared: Vec<f64>,
    /// Source of versions for running tasks.
    versions: u64,
    /// Start of the current stretch with some collective running, for `comm_busy`.
    comm_busy_since: SimTime,
    /// Ranks whose compute stream is running a task.
    computing: u32,
    /// Rank-nanoseconds of the current stretch with compute idle, for `comm_exposed`.
    exposed_in_stretch: u128,
    codec_active: Vec<bool>,
    /// Ranks whose compute or compression thread is running, and how many they are: what
    /// slows a collective on CPU ranks.
    cpu_busy: Vec<bool>,
    cpu_busy_ranks: u32,
    result: EngineResult,
}

/// Runs the graph on `config.ranks` ranks and returns the timings, or an error naming the
/// first task that never ran (a schedule whose launch order waits for a collective that
/// itself waits for a later one).
pub fn run(graph: &TaskGraph, config: &EngineConfig, noise: &Noise) -> Result<EngineResult> {
    let iterations = graph.iterations() as usize;
    let ranks = config.ranks.max(1) as usize;
    let mut engine = Engine {
        graph,
        config,
        noise,
        ranks_n: ranks as u32,
        now: SimTime::ZERO,
        seq: 0,
        events: QuadHeap::new(),
        compute_events: ComputeEvents::new(),
        clock: SharedClock::new(1.0 / config.compute_slowdown),
        chain: Chain::new(graph),
        processed: 0,
        window: Window::new(graph, ranks as u32),
        ranks: (0..ranks).map(|_| RankState::new()).collect(),
        dirty: vec![0; ranks],
        dirty_list: Vec::new(),
        arrivals: vec![0; graph.len()],
        finished: vec![0; graph.len()],
        launcher: Launcher::new(&config.policy, &graph.program, Ticks::ExpectedPhase),
        comm: vec![None; config.policy.comm_streams.max(1) as usize],
        transfer_after: vec![None; config.policy.comm_streams.max(1) as usize],
        transferring: 0,
        active: 0,
        push_pulls: graph
            .tasks()
            .iter()
            .any(|t| matches!(t.links, Links::Server { .. })),
        comm_links: Vec::new(),
        comm_shared: Vec::new(),
        versions: 0,
        comm_busy_since: SimTime::ZERO,
        computing: 0,
        exposed_in_stretch: 0,
        codec_active: vec![false; ranks],
        cpu_busy: vec![false; ranks],
        cpu_busy_ranks: 0,
        result: EngineResult {
            iteration_end: vec![SimTime::ZERO; iterations],
            compute_busy: vec![SimTime::ZERO; iterations],
            codec_busy: vec![SimTime::ZERO; iterations],
            comm_busy: vec![SimTime::ZERO; iterations],
            comm_exposed: vec![SimTime::ZERO; iterations],
            records: Vec::new(),
            events: 0,
            iterations_held: 0,
            makespan: SimTime::ZERO,
        },
    };
    for task in 0..graph.len() as u32 {
        if graph.indegree()[task as usize] == 0 {
            for rank in 0..engine.ranks_n {
                engine.make_ready(rank, task);
            }
        }
    }
    engine.dispatch();
    while let Some(time) = engine.next_time() {
        engine.advance(time);
        loop {
            let due = engine.events.peek().map(|&(t, _, event)| (t, event));
            match due {
                Some((t, event)) if t == time => {
                    engine.events.pop();
                    engine.handle(event);
                }
                _ if engine.end_compute_run_at(time) => {}
                _ => break,
            }
        }
        engine.dispatch();
    }
    engine.check_finished()?;
    if engine.now == SimTime::MAX {
        return Err(SimError::bad_value(
            "simulated time",
            "2^64 ns",
            "the run lasts longer than 584 years: some time, size or rate of the inputs is out of any real range",
        ));
    }
    engine.result.events = engine.processed;
    engine.result.iterations_held = engine.window.most_held();
    Ok(engine.result)
}

impl Engine<'_> {
    /// When the next event is due.
    fn next_time(&mut self) -> Option<SimTime> {
        let other = self.events.peek().map(|&(time, _, _)| time);
        match (self.next_compute_end(), other) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Moves time to `to`, counting the ranks whose compute stays idle while a collective runs.
    fn advance(&mut self, to: SimTime) {
        if self.active_collectives() > 0 {
            let idle = u128::from(self.ranks_n - self.computing);
            self.exposed_in_stretch += u128::from((to - self.now).as_ns()) * idle;
        }
        self.now = to;
    }

    fn push(&mut self, time: SimTime, event: Event) {
        self.seq += 1;
        self.events.push((time, self.seq, event));
    }

    fn fresh_version(&mut self) -> u64 {
        self.versions += 1;
        self.versions
    }

    fn mark_dirty(&mut self, rank: u32, streams: u8) {
        let dirty = &mut self.dirty[rank as usize];
        if *dirty == 0 {
            self.dirty_list.push(rank);
        }
        *dirty |= streams;
    }

    /// A task's dependencies are met on `rank`: queue it, or count the rank in for a collective.
    fn make_ready(&mut self, rank: u32, task: u32) {
        let now = self.now;
        let state = &mut self.ranks[rank as usize];
        match self.graph.task(task).stream {
            Stream::Comm => {
                self.arrivals[task as usize] += 1;
                if self.arrivals[task as usize] == self.ranks_n {
                    self.collective_ready(task);
                }
                return;
            }
            Stream::Compute => state.compute.enqueue(now, task),
            Stream::Codec => state.codec.queue.push((now, task)),
            Stream::Cpu => state.cpu.queue.push((now, task)),
        }
        self.mark_dirty(rank, dirty_bit(self.graph.task(task).stream));
    }

    /// A collective is ready on every rank; under a cycle it waits for the next tick.
    fn collective_ready(&mut self, task: u32) {
        let release = self.launcher.ready(task, self.now.as_ns());
        if release > self.now.as_ns() {
            self.push(SimTime(release), Event::Tick);
        }
    }

    fn handle(&mut self, event: Event) {
        self.processed += 1;
        match event {
            Event::Local {
                rank,
                resource,
                version,
            } => {
                let stream = self.ranks[rank as usize].stream(resource);
                match stream.running {
                    Some(running) if running.version == version => {
                        stream.running = None;
                        self.finish_local(rank, resource, running);
                    }
                    _ => {}
                }
            }
            Event::Comm { stream, version } => match self.comm[stream as usize] {
                Some(running) if running.version == version => {
                    match self.transfer_after[stream as usize].take() {
                        Some(transfer) if transfer > 0.0 => {
                            self.start_transfer(stream as usize, running, transfer)
                        }
                        // Done; one that was all fixed never shared the links.
                        after => {
                            self.comm[stream as usize] = None;
                            self.active -= 1;
                            self.transferring -= u32::from(after.is_none());
                            self.finish_collective(stream, running);
                        }
                    }
                }
                _ => {}
            },
            // The launcher releases the collective when the streams are next dispatched.
            Event::Tick => {}
        }
    }

    fn finish_local(&mut self, rank: u32, resource: LocalStream, running: Running) {
        self.finish_on_ranks(running.task, 1);
        self.local_ended(rank, running.task, running.start, true);
        if resource == LocalStream::Codec {
            self.codec_active[rank as usize] = false;
            self.refresh_rank_factor(rank);
        }
        self.refresh_cpu_busy(rank);
        self.mark_dirty(rank, resource.dirty_bit());
        self.release_successors(rank, running.task);
    }

    /// Rank-local work that began at `start` ended now with `last` (a task, or the last task
    /// of a compute run): its busy time, as compression or compute, the iteration it may
    /// close, and its times for the trace if the rank is recorded.
    fn local_ended(&mut self, rank: u32, last: u32, start: SimTime, compression: bool) {
        self.finished_at_now();
        let iteration = self.window.iteration(last) as usize;
        let busy = self.now - start;
        match compression {
            true => self.result.codec_busy[iteration] += busy,
            false => self.result.compute_busy[iteration] += busy,
        }
        if self.graph.iteration_end()[iteration] == last {
            let end = &mut self.result.iteration_end[iteration];
            *end = (*end).max(self.now);
        }
        if rank < self.config.record_ranks {
            self.result.records.push(TaskRecord {
                rank,
                task: last,
                stream: 0,
                start,
                end: self.now,
            });
        }
    }

    /// `ranks` more ranks finished `task`.
    fn finish_on_ranks(&mut self, task: u32, ranks: u32) {
        self.finished[task as usize] += ranks;
        let iteration = self.window.iteration(task);
        self.window.finished(iteration, u64::from(ranks));
    }

    fn release_successors(&mut self, rank: u32, task: u32) {
        for &next in self.graph.successors(task) {
            let released = match self.window.counter(next, rank) {
                None => true,
                Some(unmet) => {
                    *unmet -= 1;
                    *unmet == 0
                }
            };
            if released {
                self.make_ready(rank, next);
            }
        }
    }

    /// A task finished now. The makespan is set here, not from the clock after the loop: an
    /// event superseded by a rate change still pops at its old, later time.
    fn finished_at_now(&mut self) {
        self.result.makespan = self.now;
    }

    fn finish_collective(&mut self, stream: u32, running: Running) {
        self.finished_at_now();
        let iteration = self.graph.task(running.task).iteration as usize;
        self.finish_on_ranks(running.task, self.ranks_n);
        if self.config.record_ranks > 0 {
            self.result.records.push(TaskRecord {
                rank: 0,
                task: running.task,
                stream,
                start: running.start,
                end: self.now,
            });
        }
        if self.active_collectives() == 0 {
            self.result.comm_busy[iteration] += self.now - self.comm_busy_since;
            let exposed = u64::try_from(std::mem::take(&mut self.exposed_in_stretch));
            self.result.comm_exposed[iteration] += SimTime(exposed.unwrap_or(u64::MAX));
        }
        self.rerate_comm();
        self.reset_shared_rate();
        for rank in 0..self.ranks_n {
            self.release_successors(rank, running.task);
        }
    }

    /// `running` on `stream` has paid its fixed part: its transfer starts sharing the links.
    fn start_transfer(&mut self, stream: usize, mut running: Running, transfer: f64) {
        let version = self.fresh_version();
        running.remaining = transfer;
        running.since = self.now;
        running.version = version;
        self.comm[stream] = Some(running);
        self.transferring += 1;
        self.push(
            running.end(),
            Event::Comm {
                stream: stream as u32,
                version,
            },
        );
        self.rerate_comm();
    }

    /// Starts what is ready: local work first, so that a collective launched at the same
    /// instant sees the cores its ranks keep busy.
    fn dispatch(&mut self) {
        while let Some(rank) = self.dirty_list.pop() {
            let dirty = std::mem::take(&mut self.dirty[rank as usize]);
            for which in [LocalStream::Codec, LocalStream::Cpu] {
                if dirty & which.dirty_bit() != 0 {
                    self.start_local(rank, which);
                }
            }
            if dirty & DIRTY_COMPUTE != 0 {
                self.start_compute(rank);
            }
        }
        self.dispatch_comm();
    }

    fn start_local(&mut self, rank: u32, which: LocalStream) {
        let now = self.now;
        let stream = self.ranks[rank as usize].stream(which);
        if stream.running.is_some() {
            return;
        }
        let Some((_, task)) = stream.queue.pop() else {
            return;
        };
        let version = self.fresh_version();
        let factor = f64::from(self.noise.rank_task(task, rank));
        let work = self.graph.task(task).duration.as_ns() as f64 * factor;
        if which == LocalStream::Codec {
            self.codec_active[rank as usize] = true;
            self.refresh_rank_factor(rank);
        }
        let rate = match which {
            LocalStream::Codec => self.codec_rate(rank),
            LocalStream::Cpu => 1.0,
        };
        let running = Running::new(task, now, work, rate, version);
        let end = running.end();
        self.ranks[rank as usize].stream(which).running = Some(running);
        self.refresh_cpu_busy(rank);
        self.push_local_end(end, rank, which, version);
    }

    /// Schedules the end of the task running on `rank`'s stream `which`, as of `version`.
    fn push_local_end(&mut self, end: SimTime, rank: u32, which: LocalStream, version: u64) {
        let event = Event::Local {
            rank,
            resource: which,
            version,
        };
        self.push(end, event);
    }

    fn dispatch_comm(&mut self) {
        while self.launcher.may_launch(self.now.as_ns()) {
            let mut launched = false;
            for stream in 0..self.comm.len() {
                if self.comm[stream].is_some() {
                    continue;
                }
                if let Some(next) = self.launcher.next(stream as u32, self.now.as_ns()) {
                    self.start_collective(stream, next);
                    launched = true;
                }
            }
            if !launched {
                return;
            }
        }
    }

    fn start_collective(&mut self, stream: usize, task: u32) {
        if self.active_collectives() == 0 {
            self.comm_busy_since = self.now;
        }
        let factor = f64::from(self.noise.collective(task));
        let task_info = self.graph.task(task);
        // Computing ranks delay the collective's rounds (`Estimate::delay_with_compute`): work
        // before its transfer that shares no link, as much as takes the measured delay at the
        // rate the busy cores leave the collective now.
        let delay = match task_info
            .estimate
            .map_or(0, |e| e.delay_with_compute.as_ns())
        {
            0 => 0.0,
            ns => {
                let share = f64::from(self.computing) / f64::from(self.ranks_n);
                ns as f64 * share / self.comm_slowdown()
            }
        };
        let duration = task_info.duration.as_ns() as f64 * factor;
        let own_fixed = task_info.estimate.map_or(0.0, |e| {
            e.fixed.min(task_info.duration).as_ns() as f64 * factor
        });
        // Only messages that carry bytes queue behind others' bytes.
        let queued = match duration > own_fixed {
            true => self.queued_ahead(task_info.links),
            false => 0.0,
        };
        let work = duration + delay + queued;
        // The fixed part first, beside whatever shares the links, then the transfer.
        let fixed = delay + queued + own_fixed;
        let (first, transfer) = match fixed > 0.0 {
            true => (fixed, Some(work - fixed)),
            false => (work, None),
        };
        self.transfer_after[stream] = transfer;
        self.transferring += u32::from(transfer.is_none());
        let version = self.fresh_version();
        let running = Running::new(task, self.now, first, 1.0, version);
        self.comm[stream] = Some(running);
        self.active += 1;
        let end = running.end();
        self.push(
            end,
            Event::Comm {
                stream: stream as u32,
                version: running.version,
            },
        );
        self.rerate_comm();
        self.reset_shared_rate();
    }

    /// Err naming the first task some rank never finished, and what it was waiting for.
    fn check_finished(&mut self) -> Result<()> {
        let Some(stuck) = (0..self.graph.len()).find(|&t| self.finished[t] < self.ranks_n) else {
            return Ok(());
        };
        let task = self.graph.task(stuck as u32);
        let inputs: Vec<String> = (0..self.graph.len() as u32)
            .filter(|&p| {
                self.graph.successors(p).contains(&(stuck as u32))
                    && self.finished[p as usize] < self.ranks_n
            })
            .map(|p| {
                format!(
                    "{} (finished on {} of {} ranks)",
                    self.graph.task(p).label(),
                    self.finished[p as usize],
                    self.ranks_n
                )
            })
            .collect();
        let waiting = if !inputs.is_empty() {
            // A task with one input has no counter to name the rank by.
            let unmet = (0..self.ranks_n).find(|&r| {
                self.window
                    .counter(stuck as u32, r)
                    .is_some_and(|&mut c| c > 0)
            });
            let on = unmet.map_or_else(String::new, |rank| format!("on rank {rank} "));
            format!("{on}it waits for {}", inputs.join(", "))
        } else {
            let next = self
                .launcher
                .first_pending()
                .map_or_else(|| "nothing".to_string(), |t| self.graph.task(t).label());
            format!("it is ready, but the launch policy waits for {next} first")
        };
        Err(SimError::Stalled {
            task: task.label(),
            message: waiting,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{Estimate, Protocol, ServerLink};
    use crate::collective_op::Algorithm;
    use crate::compress::Compressor;
    use crate::inputs::model::ModelProfile;
    use crate::plan::{Launch, Plan, Scheme};
    use crate::predict::cost::StepCost;
    use crate::schedule::{lower, Schedule, StepKind, World};
    use crate::strategy::per_tensor_plan;

    /// A DeAR-style split allreduce whose all-gather half was edited to launch before its
    /// reduce-scatter half: plan order waits for a collective that waits for a later one.
    #[test]
    fn a_stalled_schedule_is_an_error_naming_the_step() {
        let model = ModelProfile::load("resnet50").unwrap();
        let mut plan = per_tensor_plan(&model);
        plan.groups.truncate(0);
        plan.groups.push(crate::plan::Group {
            tensors: (0..model.num_tensors()).collect(),
            scheme: Scheme::ReduceScatterAllgather,
            ..per_tensor_plan(&model).groups[0].clone()
        });
        let world = World {
            nodes: 1,
            ranks_per_node: 2,
        };
        let mut schedule = lower(&model, world, false, &plan, "t").unwrap();
        for step in &mut schedule.steps {
            if let (StepKind::Collective { round, .. }, Some(slot)) = (step.kind, &mut step.launch)
            {
                slot.position = 2 - round;
            }
        }
        let costs = vec![
            StepCost {
                duration: SimTime(1000),
                estimate: None,
                links: Links::Every,
            };
            schedule.steps.len()
        ];
        let graph = TaskGraph::new(&schedule, &costs, 2).unwrap();
        let config = EngineConfig::uncontended(
            2,
            LaunchPolicy {
                launch: Launch::PlanOrder,
                comm_streams: 1,
                cycle_ns: 0,
            },
        );
        let err = run(&graph, &config, &Noise::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("collective g0.0.0 of iteration 0 never ran")
                && err.contains("the launch policy waits for collective g0.0.1 of iteration 0"),
            "{err}"
        );
    }

    /// Task durations (ns) on `stream` of a per-tensor top-k plan on 4 CPU ranks where every
    /// step costs 1 µs, compute `compute_ns`, compression slowed 2x beside compute.
    fn durations(stream: Stream, compute_ns: u64, contention: EngineConfig) -> Vec<u64> {
        let model = ModelProfile::load("resnet50").unwrap();
        let mut plan = per_tensor_plan(&model);
        for group in &mut plan.groups {
            group.compressor = "topk:0.01".parse::<Compressor>().unwrap();
        }
        let schedule = lower_on(&model, &plan, 4, true);
        let costs = stream_costs(&schedule, compute_ns, 1000);
        let config = EngineConfig {
            codec_slowdown_with_compute: 2.0,
            ..contention
        };
        recorded_durations(&schedule, &costs, &config, stream)
    }

    /// One rank with nothing slowed, collectives in plan order on `streams` streams.
    fn plan_order(streams: u32) -> EngineConfig {
        let policy = LaunchPolicy {
            launch: Launch::PlanOrder,
            comm_streams: streams,
            cycle_ns: 0,
        };
        EngineConfig {
            record_ranks: 1,
            ..EngineConfig::uncontended(1, policy)
        }
    }

    /// `plan` lowered for `model` on `nodes` nodes of one rank each (CPU ranks or not).
    fn lower_on(model: &ModelProfile, plan: &Plan, nodes: u32, cpu_ranks: bool) -> Schedule {
        let world = World {
            nodes,
            ranks_per_node: 1,
        };
        lower(model, world, cpu_ranks, plan, "t").unwrap()
    }

    /// `compute_ns` for every compute step of `schedule` and `other_ns` for every other.
    fn stream_costs(schedule: &Schedule, compute_ns: u64, other_ns: u64) -> Vec<StepCost> {
        schedule
            .steps
            .iter()
            .map(|step| StepCost {
                duration: SimTime(if step.stream == Stream::Compute {
                    compute_ns
                } else {
                    other_ns
                }),
                estimate: None,
                links: Links::Every,
            })
            .collect()
    }

    /// A 1 µs TCP collective of `algorithm` on `links`, `fixed_ns` of it fixed.
    fn collective_cost(algorithm: Algorithm, fixed_ns: u64, links: Links) -> StepCost {
        StepCost {
            duration: SimTime(1000),
            estimate: Some(Estimate {
                time: SimTime(1000),
                algorithm,
                protocol: Protocol::Tcp,
                fixed: SimTime(fixed_ns),
                delay_with_compute: SimTime::ZERO,
            }),
            links,
        }
    }

    /// `collective(piece)` for every collective step of `schedule`, nothing for every other.
    fn collectives_only(
        schedule: &Schedule,
        collective: impl Fn(u32) -> StepCost,
    ) -> Vec<StepCost> {
        schedule
            .steps
            .iter()
            .map(|step| match (step.kind, step.piece) {
                (StepKind::Collective { .. }, Some(piece)) => collective(piece),
                _ => StepCost {
                    duration: SimTime::ZERO,
                    estimate: None,
                    links: Links::Every,
                },
            })
            .collect()
    }

    /// Durations (ns) of rank 0's tasks on `stream` when one iteration of `schedule` at
    /// `costs` runs under `config`.
    fn recorded_durations(
        schedule: &Schedule,
        costs: &[StepCost],
        config: &EngineConfig,
        stream: Stream,
    ) -> Vec<u64> {
        let graph = TaskGraph::new(schedule, costs, 1).unwrap();
        let result = run(&graph, config, &Noise::default()).unwrap();
        result
            .records
            .iter()
            .filter(|r| graph.task(r.task).stream == stream)
            .map(|r| (r.end - r.start).as_ns())
            .collect()
    }

    /// Durations (ns) of the 4 push-pull rounds of a 4-tensor plan on 4 nodes, all ready at
    /// once on 4 streams, each 1 µs alone of which `fixed_ns` is fixed, served by the nodes
    /// `servers` names.
    fn push_pull_durations(servers: [u32; 4], fixed_ns: u64) -> Vec<u64> {
        let mut model = ModelProfile::load("resnet50").unwrap();
        model.tensors.truncate(4);
        let mut plan = per_tensor_plan(&model);
        for group in &mut plan.groups {
            group.scheme = Scheme::Ps;
        }
        let schedule = lower_on(&model, &plan, 4, false);
        let costs = collectives_only(&schedule, |piece| {
            collective_cost(
                Algorithm::ParameterServer,
                fixed_ns,
                Links::Server {
                    server: ServerLink::Node(servers[piece as usize]),
                    senders: 3,
                },
            )
        });
        recorded_durations(&schedule, &costs, &plan_order(4), Stream::Comm)
    }

    /// One run of a top-k plan on 4 CPU ranks sharing cores, under jitter, with `record_ranks`
    /// ranks recorded.
    fn jittered_run(record_ranks: u32, iterations: u32) -> EngineResult {
        let model = ModelProfile::load("resnet50").unwrap();
        let mut plan = per_tensor_plan(&model);
        for group in &mut plan.groups {
            group.compressor = "topk:0.01".parse::<Compressor>().unwrap();
        }
        let schedule = lower_on(&model, &plan, 4, true);
        let costs = stream_costs(&schedule, 5000, 3000);
        let graph = TaskGraph::new(&schedule, &costs, iterations).unwrap();
        let config = EngineConfig {
            compute_slowdown: 1.1,
            slowdown_with_collective: 1.3,
            slowdown_with_codec: 1.2,
            comm_slowdown_with_compute: 1.5,
            shared_cores: Some(CoreShare { ranks: 4, cores: 2 }),
            record_ranks,
            ..EngineConfig::uncontended(4, plan_order(2).policy)
        };
        let noise = crate::predict::noise::NoiseSpec {
            jitter_cv: 0.2,
            seed: 3,
            ..Default::default()
        }
        .draw(&graph, 4)
        .unwrap();
        run(&graph, &config, &noise).unwrap()
    }

    #[test]
    fn compute_runs_folded_into_one_event_end_when_their_tasks_one_by_one_would() {
        // Recorded ranks run every compute task as an event of its own; the others fold the
        // tasks whose ends no one sees into runs.
        let folded = jittered_run(0, 3);
        let one_by_one = jittered_run(4, 3);
        assert!(folded.events < one_by_one.events);
        assert_eq!(folded.iteration_end, one_by_one.iteration_end);
        assert_eq!(folded.compute_busy, one_by_one.compute_busy);
        assert_eq!(folded.codec_busy, one_by_one.codec_busy);
        assert_eq!(folded.comm_busy, one_by_one.comm_busy);
        assert_eq!(folded.comm_exposed, one_by_one.comm_exposed);
        assert_eq!(folded.makespan, one_by_one.makespan);
    }

    #[test]
    fn the_dependency_counts_held_do_not_grow_with_the_iterations() {
        let short = jittered_run(0, 3);
        let long = jittered_run(0, 12);
        assert!(short.iterations_held >= 1);
        assert!(long.iterations_held <= 3, "{}", long.iterations_held);
        assert_eq!(long.iteration_end.len(), 12);
    }

    #[test]
    fn push_pulls_to_different_servers_overlap_and_to_one_server_queue() {
        assert_eq!(push_pull_durations([0, 1, 2, 3], 0), vec![1000; 4]);
        // Four rounds to node 0 at once push together and pull together: they queue.
        assert_eq!(push_pull_durations([0; 4], 0), vec![4000; 4]);
        // Their fixed parts (400 ns each) run side by side; only the transfers queue.
        assert_eq!(push_pull_durations([0; 4], 400), vec![2800; 4]);
        assert_eq!(push_pull_durations([0, 1, 2, 3], 400), vec![1000; 4]);
    }

    #[test]
    fn ranks_sharing_fewer_cores_slow_every_codec_task_by_their_share() {
        let alone = durations(Stream::Codec, 1000, plan_order(1));
        let shared_cores = Some(CoreShare { ranks: 4, cores: 2 });
        let shared = durations(
            Stream::Codec,
            1000,
            EngineConfig {
                shared_cores,
                ..plan_order(1)
            },
        );
        assert!(!alone.is_empty() && alone.len() == shared.len());
        // Own cores: full speed alone, half beside compute (the measured factor).
        assert!(
            alone.iter().all(|&d| (1000..=2000).contains(&d)),
            "{alone:?}"
        );
        assert!(alone.contains(&1000));
        // Four ranks on two cores: half a core alone, a quarter beside compute.
        assert!(
            shared.iter().all(|&d| (2000..=4000).contains(&d)),
            "{shared:?}"
        );
        assert!(shared.contains(&2000) && shared.contains(&4000));
    }

    #[test]
    fn a_collective_slows_beside_compression_as_beside_compute() {
        // Compute takes no time: every overlap of a collective is with a codec task.
        let unslowed = durations(Stream::Comm, 0, plan_order(1));
        let slowed = durations(
            Stream::Comm,
            0,
            EngineConfig {
                comm_slowdown_with_compute: 3.0,
                ..plan_order(1)
            },
        );
        assert!(unslowed.iter().all(|&d| d == 1000), "{unslowed:?}");
        // Ends are whole nanoseconds, rounded up.
        assert!(
            slowed.iter().all(|&d| (1000..=3001).contains(&d)),
            "{slowed:?}"
        );
        assert!(slowed.iter().any(|&d| d > 1000), "{slowed:?}");
    }

    #[test]
    fn a_collective_started_while_its_rank_computes_pays_the_delay_before_its_transfer() {
        let model = ModelProfile::load("resnet50").unwrap();
        let plan = per_tensor_plan(&model);
        let schedule = lower_on(&model, &plan, 4, true);
        // Compute steps of 1 µs; collectives of 1 µs that take 0.5 µs more beside compute.
        let delayed = collective_cost(Algorithm::Ring, 0, Links::Every);
        let delayed = StepCost {
            estimate: delayed.estimate.map(|e| Estimate {
                delay_with_compute: SimTime(500),
                ..e
            }),
            ..delayed
        };
        let costs: Vec<StepCost> = stream_costs(&schedule, 1000, 0)
            .into_iter()
            .zip(&schedule.steps)
            .map(|(cost, step)| match step.stream {
                Stream::Comm => delayed,
                _ => cost,
            })
            .collect();
        let durations = recorded_durations(&schedule, &costs, &plan_order(1), Stream::Comm);
        // Launched while the backward pass computes: 1.5 µs; queued until after it: 1 µs.
        assert!(
            durations.iter().all(|&d| d == 1000 || d == 1500),
            "{durations:?}"
        );
        assert!(
            durations.contains(&1000) && durations.contains(&1500),
            "{durations:?}"
        );
    }

    #[test]
    fn every_rank_computing_at_once_slows_compute_with_nothing_beside_it() {
        let model = ModelProfile::load("resnet50").unwrap();
        let plan = per_tensor_plan(&model);
        let schedule = lower_on(&model, &plan, 1, false);
        // Compute steps take 1 µs and nothing else takes time: no overlap slows them.
        let costs = stream_costs(&schedule, 1000, 0);
        let config = EngineConfig {
            compute_slowdown: 1.25,
            ..plan_order(1)
        };
        let slowed = recorded_durations(&schedule, &costs, &config, Stream::Compute);
        assert!(!slowed.is_empty());
        assert!(slowed.iter().all(|&d| d == 1250), "{slowed:?}");
    }

    /// Durations (ns) of the collectives of a 2-tensor plan on 2 nodes, ready at once on 2
    /// streams, each 1 µs alone of which `fixed_ns` is fixed.
    fn concurrent_durations(fixed_ns: u64) -> Vec<u64> {
        queued_durations(fixed_ns, 0.0)
    }

    /// Durations (ns) of two 1000 ns collectives of `fixed_ns` fixed cost each, started at once
    /// on two streams, where one waits at most `queue_behind_ns` behind the other's transfer.
    fn queued_durations(fixed_ns: u64, queue_behind_ns: f64) -> Vec<u64> {
        let mut model = ModelProfile::load("resnet50").unwrap();
        model.tensors.truncate(2);
        let plan = per_tensor_plan(&model);
        let schedule = lower_on(&model, &plan, 2, false);
        let costs = collectives_only(&schedule, |_| {
            collective_cost(Algorithm::Ring, fixed_ns, Links::Every)
        });
        let config = EngineConfig {
            queue_behind_ns,
            ..plan_order(2)
        };
        let mut durations = recorded_durations(&schedule, &costs, &config, Stream::Comm);
        durations.sort_unstable();
        durations
    }

    #[test]
    fn concurrent_collectives_share_their_transfers_but_not_their_fixed_parts() {
        // All shared: two at once take twice as long.
        assert_eq!(concurrent_durations(0), vec![2000; 2]);
        // 400 ns fixed each, side by side, then 600 ns of transfer each at half the rate.
        assert_eq!(concurrent_durations(400), vec![1600; 2]);
        assert_eq!(concurrent_durations(1000), vec![1000; 2]);
    }

    #[test]
    fn the_queue_cap_gives_the_measured_mean_wait_over_uniform_starts() {
        for (mean, span) in [(17.2, 35.9), (15.5, 54.8), (1.0, 100.0)] {
            let cap = queue_cap_for_mean_wait(mean, span);
            assert!(cap > mean && cap < span, "{cap}");
            let starts = 100_000;
            let average = (0..starts)
                .map(|i| (span * (i as f64 + 0.5) / starts as f64).min(cap))
                .sum::<f64>()
                / starts as f64;
            assert!(
                (average / mean - 1.0).abs() < 1e-6,
                "{average} against {mean}"
            );
        }
        assert_eq!(queue_cap_for_mean_wait(20.0, 35.0), 35.0);
        assert_eq!(queue_cap_for_mean_wait(0.0, 35.0), 0.0);
        assert_eq!(queue_cap_for_mean_wait(f64::NAN, 35.0), 0.0);
    }

    #[test]
    fn a_collective_waits_behind_what_another_stream_has_queued_up_to_the_connections_hold() {
        // The second waits 300 ns while the first transfers alone (700 ns left), then both
        // share: the first ends at 300 + 2 × 700, the second's last 300 ns run alone.
        assert_eq!(queued_durations(0, 300.0), vec![1700, 2000]);
        // A wait longer than the first's transfer ends with it: in order, as over one socket.
        assert_eq!(queued_durations(0, 5000.0), vec![1000, 2000]);
        // Nothing to wait behind while the other pays its fixed part.
        assert_eq!(queued_durations(1000, 5000.0), vec![1000; 2]);
    }
}
