//! The launch policy: which ready collective takes a free communication stream.
//!
//! One state machine decides it, for the simulator's engine and every executor.
//!
//! A collective is *ready* once every rank has met its dependencies; under a Horovod cycle it
//! is *released* at the cycle's next tick, otherwise at once. A runtime's ticks run free on its
//! clock; a prediction places them where they fall on average (see [`Ticks`]). The policy then
//! picks among released collectives: plan order strictly (the next in plan order, or nothing;
//! with several streams the collectives of an iteration take them in turn, so that every rank
//! puts the same collective on the same stream without exchanging decisions), or the lowest
//! launch key first (priority, on whichever stream is free). The caller asks for decisions and applies them;
//! time is whatever clock the caller runs on (simulated or wall-clock nanoseconds).

use crate::plan::Launch;
use crate::schedule::{LaunchKey, LaunchPolicy, Program};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Where a Horovod cycle's ticks fall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ticks {
    /// At multiples of the cycle on the caller's clock: a runtime's background loop (Horovod's
    /// sleeps out the rest of each cycle), whose phase against an iteration is whatever it is.
    FreeRunning,
    /// A prediction of that loop. Its phase against an iteration is arbitrary: iterations are
    /// not whole cycles long and jitter by more than the cycle, so whenever a collective is
    /// ready the next tick is anywhere within a cycle, and on average half a cycle away. Each
    /// collective is therefore released half a cycle after it is ready. (Ticks at fixed
    /// multiples of a simulated clock lock every iteration to a whole number of cycles, with
    /// the same, arbitrary, wait each time: 1.2 ms instead of the 2.5 ms that a measured run of
    /// 5 ms cycles averaged. Ticks every cycle from half a cycle after an iteration's first
    /// ready collective get the first one's wait right and leave each later one's to where
    /// its ready time falls between two ticks: a change of 0.3 ms in the encode before them
    /// moved a ResNet-50 iteration under 5 ms cycles by 3.5 ms, the other way.)
    ExpectedPhase,
}

/// Which collectives are ready, released and launched.
#[derive(Clone, Debug)]
pub struct Launcher {
    launch: Launch,
    cycle_ns: u64,
    ticks: Ticks,
    keys: Vec<LaunchKey>,
    /// Collective tasks in plan order.
    order: Vec<u32>,
    /// Under plan order, the stream each collective runs on: its place among its iteration's
    /// collectives in plan order, modulo the streams.
    stream_of: Vec<u32>,
    next_in_order: usize,
    released: Vec<bool>,
    launched: Vec<bool>,
    launched_count: usize,
    /// Released collectives by launch key (priority policy).
    by_key: BinaryHeap<Reverse<(LaunchKey, u32)>>,
    /// Ready collectives waiting for their cycle tick: (release time, task).
    waiting: BinaryHeap<Reverse<(u64, u32)>>,
}

impl Launcher {
    /// A launcher for `program`'s collectives under `policy`, with nothing ready or launched yet.
    pub fn new(policy: &LaunchPolicy, program: &Program, ticks: Ticks) -> Launcher {
        let n = program.len();
        Launcher {
            launch: policy.launch,
            cycle_ns: policy.cycle_ns,
            ticks,
            keys: program.launch_keys.clone(),
            order: program.plan_order.clone(),
            stream_of: turns(program, policy.comm_streams.max(1)),
            next_in_order: 0,
            released: vec![false; n],
            launched: vec![false; n],
            launched_count: 0,
            by_key: BinaryHeap::new(),
            waiting: BinaryHeap::new(),
        }
    }

    /// Every rank has met the dependencies of collective `task` at `now`. Returns when it is
    /// released: `now`, or the next cycle tick (ask [`Launcher::next`] again then).
    pub fn ready(&mut self, task: u32, now: u64) -> u64 {
        let at = self.release_time(now);
        if at <= now {
            self.release(task);
        } else {
            self.waiting.push(Reverse((at, task)));
        }
        at
    }

    /// When a collective ready at `now` is released: at the next tick.
    fn release_time(&self, now: u64) -> u64 {
        let cycle = self.cycle_ns;
        if cycle == 0 {
            return now;
        }
        match self.ticks {
            Ticks::FreeRunning => now.div_ceil(cycle).saturating_mul(cycle),
            Ticks::ExpectedPhase => now.saturating_add(cycle / 2),
        }
    }

    fn release(&mut self, task: u32) {
        match self.launch {
            Launch::PlanOrder => self.released[task as usize] = true,
            Launch::Priority => self.by_key.push(Reverse((self.keys[task as usize], task))),
        }
    }

    /// The collective to launch now on free stream `stream`, if the policy has one for it.
    pub fn next(&mut self, stream: u32, now: u64) -> Option<u32> {
        while let Some(&Reverse((at, task))) = self.waiting.peek() {
            if at > now {
                break;
            }
            self.waiting.pop();
            self.release(task);
        }
        let task = match self.launch {
            Launch::PlanOrder => {
                let &task = self.order.get(self.next_in_order)?;
                if !self.released[task as usize] || self.stream_of[task as usize] != stream {
                    return None;
                }
                self.next_in_order += 1;
                task
            }
            Launch::Priority => self.by_key.pop()?.0 .1,
        };
        self.launched[task as usize] = true;
        self.launched_count += 1;
        Some(task)
    }

    /// Whether [`Launcher::next`] may have a collective for some stream at `now`: one released
    /// (the next in plan order, or any under priority) or one whose tick has come. Most
    /// dispatches of an engine find none, and this check is cheaper than asking each stream.
    #[inline]
    pub fn may_launch(&self, now: u64) -> bool {
        let ticked = self
            .waiting
            .peek()
            .is_some_and(|Reverse((at, _))| *at <= now);
        ticked
            || match self.launch {
                Launch::PlanOrder => self
                    .order
                    .get(self.next_in_order)
                    .is_some_and(|&task| self.released[task as usize]),
                Launch::Priority => !self.by_key.is_empty(),
            }
    }

    /// When the earliest collective waiting for a cycle tick is released.
    pub fn next_release(&self) -> Option<u64> {
        self.waiting.peek().map(|Reverse((at, _))| *at)
    }

    /// Whether every collective of the program has been launched.
    pub fn all_launched(&self) -> bool {
        self.launched_count == self.order.len()
    }

    /// The first collective in plan order not launched yet (for error messages).
    pub fn first_pending(&self) -> Option<u32> {
        self.order
            .iter()
            .copied()
            .find(|&t| !self.launched[t as usize])
    }
}

/// Each collective's stream under plan order: its place among its iteration's collectives in
/// plan order, modulo `streams` (0 for tasks that are not collectives).
fn turns(program: &Program, streams: u32) -> Vec<u32> {
    let mut stream_of = vec![0; program.len()];
    let mut taken = vec![0u32; program.iterations as usize];
    for &task in &program.plan_order {
        let iteration = program.task(task).iteration as usize;
        stream_of[task as usize] = taken[iteration] % streams;
        taken[iteration] += 1;
    }
    stream_of
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::model::ModelProfile;
    use crate::plan::Plan;
    use crate::schedule::{lower, World};
    use crate::strategy::{per_tensor_plan, plan_order};

    fn launcher(launch: Launch, cycle_us: f64, priorities: bool) -> (Launcher, Vec<u32>) {
        launcher_with(launch, cycle_us, priorities, Ticks::FreeRunning, 1, 1)
    }

    fn launcher_with(
        launch: Launch,
        cycle_us: f64,
        priorities: bool,
        ticks: Ticks,
        iterations: u32,
        streams: u32,
    ) -> (Launcher, Vec<u32>) {
        let model = ModelProfile::load("resnet50").unwrap();
        let mut plan: Plan = per_tensor_plan(&model);
        plan.policy = plan_order(cycle_us);
        plan.policy.launch = launch;
        plan.policy.comm_streams = streams;
        if priorities {
            // Reverse priorities: the last group in plan order goes first.
            for (g, group) in plan.groups.iter_mut().enumerate() {
                group.priority = -(g as i64);
            }
        }
        let world = World {
            nodes: 2,
            ranks_per_node: 1,
        };
        let schedule = lower(&model, world, false, &plan, "test").unwrap();
        let program = Program::unroll(&schedule, iterations).unwrap();
        let order = program.plan_order.clone();
        (Launcher::new(&schedule.policy, &program, ticks), order)
    }

    #[test]
    fn plan_order_waits_for_the_next_collective_in_order() {
        let (mut l, order) = launcher(Launch::PlanOrder, 0.0, false);
        assert_eq!(l.ready(order[1], 10), 10);
        assert_eq!(l.next(0, 10), None, "the second may not pass the first");
        l.ready(order[0], 20);
        assert_eq!(l.next(0, 20), Some(order[0]));
        assert_eq!(l.next(0, 20), Some(order[1]));
        assert_eq!(l.next(0, 20), None);
        assert_eq!(l.first_pending(), Some(order[2]));
    }

    #[test]
    fn priority_takes_the_lowest_key_among_released() {
        let (mut l, order) = launcher(Launch::Priority, 0.0, true);
        l.ready(order[0], 5);
        l.ready(order[3], 5);
        assert_eq!(
            l.next(0, 5),
            Some(order[3]),
            "the later group has the lower priority"
        );
        assert_eq!(l.next(0, 5), Some(order[0]));
        assert_eq!(l.next(0, 5), None);
    }

    #[test]
    fn a_cycle_releases_at_the_next_tick() {
        let (mut l, order) = launcher(Launch::PlanOrder, 5.0, false);
        assert_eq!(l.ready(order[0], 12_000), 15_000);
        assert_eq!(l.next(0, 14_999), None);
        assert_eq!(l.next_release(), Some(15_000));
        assert_eq!(l.next(0, 15_000), Some(order[0]));
        assert_eq!(l.next_release(), None);
        // Ready exactly on a tick: released at once.
        assert_eq!(l.ready(order[1], 20_000), 20_000);
        assert_eq!(l.next(0, 20_000), Some(order[1]));
    }

    #[test]
    fn a_predicted_cycle_releases_each_collective_half_a_cycle_after_it_is_ready() {
        let (mut l, order) =
            launcher_with(Launch::PlanOrder, 5.0, false, Ticks::ExpectedPhase, 2, 1);
        let per_iteration = order.len() / 2;
        // Whatever came before: a tick's phase is unknown, so the expected wait is half a cycle.
        for (task, ready) in [(order[0], 12_000), (order[1], 14_500), (order[2], 16_000)] {
            assert_eq!(l.ready(task, ready), ready + 2_500);
        }
        assert_eq!(l.ready(order[per_iteration], 31_000), 33_500);
        // A later ready time never releases earlier: the prediction is monotone.
        let (mut a, order_a) =
            launcher_with(Launch::PlanOrder, 5.0, false, Ticks::ExpectedPhase, 1, 1);
        let (mut b, _) = launcher_with(Launch::PlanOrder, 5.0, false, Ticks::ExpectedPhase, 1, 1);
        assert!(a.ready(order_a[1], 19_999) < b.ready(order_a[1], 20_001));
    }

    #[test]
    fn every_collective_launches_once() {
        let (mut l, order) = launcher(Launch::Priority, 0.0, true);
        for &t in &order {
            l.ready(t, 0);
        }
        let mut launched: Vec<u32> = std::iter::from_fn(|| l.next(0, 0)).collect();
        assert!(l.all_launched());
        launched.sort_unstable();
        let mut expected = order.clone();
        expected.sort_unstable();
        assert_eq!(launched, expected);
    }

    #[test]
    fn under_plan_order_each_iterations_collectives_take_the_streams_in_turn() {
        let (mut l, order) = launcher_with(Launch::PlanOrder, 0.0, false, Ticks::FreeRunning, 2, 2);
        let per_iteration = order.len() / 2;
        assert_eq!(
            per_iteration % 2,
            1,
            "an odd count shows the turns restart per iteration"
        );
        for &t in &order {
            l.ready(t, 0);
        }
        assert_eq!(l.next(1, 0), None, "the first collective is stream 0's");
        assert_eq!(l.next(0, 0), Some(order[0]));
        assert_eq!(l.next(0, 0), None, "the second is stream 1's");
        assert_eq!(l.next(1, 0), Some(order[1]));
        for (k, &task) in order.iter().enumerate().take(per_iteration).skip(2) {
            assert_eq!(l.next(k as u32 % 2, 0), Some(task));
        }
        // The next iteration starts again on stream 0.
        assert_eq!(l.next(1, 0), None);
        assert_eq!(l.next(0, 0), Some(order[per_iteration]));
        // Priority takes the lowest key on whichever stream asks.
        let (mut p, order) = launcher_with(Launch::Priority, 0.0, true, Ticks::FreeRunning, 1, 2);
        p.ready(order[0], 0);
        assert_eq!(p.next(1, 0), Some(order[0]));
    }
}
