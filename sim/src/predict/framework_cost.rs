//! What the framework running a plan adds to each step of its schedule.
//!
//! That is hooks, calls, fusion copies and the copy back. The cost pass adds it; it reads the
//! scenario and the schedule, so it sits above them and apart from the framework's data file.

use crate::base::time::SimTime;
use crate::collective::{staging_split_us, Group};
use crate::collective_op::Op;
use crate::inputs::framework::{CallThread, Framework, GatherWork, TensorWork};
use crate::inputs::model::Tensor;
use crate::inputs::topology::TcpParams;
use crate::predict::scenario::Scenario;
use crate::schedule::{Exchange, Piece, Schedule, Slot, Step, StepKind, Stream};

/// The framework's time on each step of `schedule`, in step order; all zero without one.
///
/// - A backward step: the gradient hook of its tensor; with calls from the backward thread,
///   every call of the groups whose last gradient it produces (the highest tensor index of a
///   group: tensors are in backward order).
/// - A collective step, with calls from a background thread: its call, and on its first round
///   the fusion copies of the piece's tensors.
/// - A parameter gather (sharded plans): its call, from either thread; its copy out, on the
///   first compute step that waits for it.
/// - The optimizer (or a group's update): the copy back of its tensors, and where the step
///   waits on the host for every collective first (`Framework::step_ops_per_tensor`), the
///   host time of its launches beyond its kernels' own.
/// - With a host library whose copies the framework makes on the compute stream
///   (`Scenario::staged_on_compute`): each piece's copies off the device and back, on the
///   compute steps before and after its exchanges.
///
/// A world of one rank has no collective steps, yet a framework still calls its collective
/// once per group (DDP's reducer allreduces each bucket on one rank): from the backward thread
/// those calls are priced as one per group buffer; a background thread's are off the critical
/// path and not priced.
pub fn step_times(scenario: &Scenario, schedule: &Schedule) -> Vec<SimTime> {
    let mut times = vec![SimTime::ZERO; schedule.steps.len()];
    let Some(framework) = &scenario.framework else {
        return times;
    };
    let price = Price {
        framework,
        bandwidth: scenario.device.memory_bandwidth_gbytes_per_s,
        tensors: &scenario.model.tensors,
    };
    let from_backward = framework.call_thread == CallThread::Backward;
    let mut calls_at_tensor = vec![SimTime::ZERO; price.tensors.len()];
    if from_backward {
        // Each group's calls in one pass over the pieces: a round after the first is a call
        // of its own, without the copies.
        let mut group_calls: Vec<Option<SimTime>> = vec![None; schedule.buffers.len()];
        for piece in &schedule.pieces {
            let g = piece.group as usize;
            let later_rounds = piece.rounds.len().saturating_sub(1) as u64;
            let call = price.call(&schedule.buffers[g].slots, piece.offset, piece.numel)
                + SimTime(framework.call_time().as_ns() * later_rounds);
            group_calls[g] = Some(group_calls[g].unwrap_or(SimTime::ZERO) + call);
        }
        for (buffer, calls) in schedule.buffers.iter().zip(group_calls) {
            let Some(last) = buffer.slots.iter().map(|s| s.tensor as usize).max() else {
                continue;
            };
            calls_at_tensor[last] +=
                calls.unwrap_or_else(|| price.call(&buffer.slots, 0, buffer.numel));
        }
    }
    for (time, step) in times.iter_mut().zip(&schedule.steps) {
        *time = match step.kind {
            StepKind::Backward { tensor } => {
                let t = tensor as usize;
                price.tensor(framework.hook, t) + calls_at_tensor[t]
            }
            StepKind::Optimizer => {
                (0..price.tensors.len())
                    .map(|t| price.tensor(framework.finish, t))
                    .sum::<SimTime>()
                    + price.launch_bound(scenario, step, price.tensors.len())
            }
            StepKind::Update { group } => {
                let slots = &schedule.buffers[group as usize].slots;
                slots
                    .iter()
                    .map(|slot| price.tensor(framework.finish, slot.tensor as usize))
                    .sum::<SimTime>()
                    + price.launch_bound(scenario, step, slots.len())
            }
            StepKind::Collective { round, .. } if !from_backward => {
                match (schedule.piece_of(step), round) {
                    (Some(piece), 0) => price.call(
                        &schedule.buffers[piece.group as usize].slots,
                        piece.offset,
                        piece.numel,
                    ),
                    _ => framework.call_time(),
                }
            }
            // A sharded plan's parameter gather: one collective call, on the gather whatever the
            // thread: the hook that issues it (FSDP's pre-forward or pre-backward) runs ahead
            // of the compute it serves, so the call delays the gather, not the compute.
            StepKind::Gather { .. } => framework.call_time(),
            _ => SimTime::ZERO,
        };
    }
    if framework.gather != GatherWork::default() {
        copy_out_gathers(&price, scenario, schedule, &mut times);
    }
    if let Some(params) = &scenario.staged_on_compute {
        stage_on_compute(params, scenario, schedule, &mut times);
    }
    times
}

/// Each parameter gather's copy out (`Framework::gather`), on the first compute step that
/// waits for it: the unit's first forward or backward kernel after the gather (FSDP2's
/// `foreach_all_gather_copy_out` runs on the compute stream when the unit is first used).
fn copy_out_gathers(
    price: &Price,
    scenario: &Scenario,
    schedule: &Schedule,
    times: &mut [SimTime],
) {
    let world = scenario.world();
    let mut copied = vec![false; schedule.steps.len()];
    for (i, step) in schedule.steps.iter().enumerate() {
        if step.stream != Stream::Compute {
            continue;
        }
        for &gather in &step.after {
            let g = gather as usize;
            let StepKind::Gather { group, pass } = schedule.steps[g].kind else {
                continue;
            };
            if std::mem::replace(&mut copied[g], true) {
                continue;
            }
            // The cost pass refused an overflowing unit before pricing the framework's work.
            let bytes = schedule
                .gather_shard(group, pass)
                .gathered_bytes(world)
                .unwrap_or(u64::MAX);
            times[i] += price.framework.gather_time(bytes, price.bandwidth);
        }
    }
}

/// A host library's staging on the compute stream: each piece's copies off the device on the
/// compute step its first collective waits for (the hook of its group's last gradient, before
/// any encode on a codec stream, or the encode in line after it), its copies back on the first compute step that reads its last collective's
/// result (after any decode: its group's update or the optimizer). The copies' time is exact;
/// where they fall is not quite: a later round's copy off is charged before the first round,
/// and copies back that the runtime makes as each collective ends, between backward kernels,
/// are charged where the result is read.
fn stage_on_compute(
    params: &TcpParams,
    scenario: &Scenario,
    schedule: &Schedule,
    times: &mut [SimTime],
) {
    let world = scenario.world();
    let group = Group {
        ranks: world.nodes * world.ranks_per_node,
        nodes: world.nodes,
    };
    // The first step that waits for each step.
    let mut reader: Vec<Option<usize>> = vec![None; schedule.steps.len()];
    for (i, step) in schedule.steps.iter().enumerate() {
        for &dep in step.after.iter().chain(&step.after_previous) {
            reader[dep as usize].get_or_insert(i);
        }
    }
    let on_compute = |s: &usize| schedule.steps[*s].stream == Stream::Compute;
    let mut first_wait: Vec<Option<usize>> = vec![None; schedule.pieces.len()];
    let mut last_read: Vec<Option<usize>> = vec![None; schedule.pieces.len()];
    for (i, step) in schedule.steps.iter().enumerate() {
        let (StepKind::Collective { .. }, Some(p)) = (step.kind, step.piece) else {
            continue;
        };
        let p = p as usize;
        if first_wait[p].is_none() {
            // Back past an encode on the codec stream to the compute step it waits for (a
            // step waits only for earlier ones, so the walk ends).
            let mut at = step.after.first().map(|&s| s as usize);
            while let Some(s) = at.filter(|s| !on_compute(s)) {
                at = schedule.steps[s].after.first().map(|&d| d as usize);
            }
            first_wait[p] = at;
        }
        // On past a decode to the compute step that reads the result (an update of the next
        // iteration reads through `after_previous`, from an earlier place in the list; the
        // walk is bounded whatever the links).
        let mut at = reader[i];
        for _ in 0..schedule.steps.len() {
            match at.filter(|s| !on_compute(s)) {
                Some(s) => at = reader[s],
                None => break,
            }
        }
        last_read[p] = at.filter(on_compute);
    }
    for (p, piece) in schedule.pieces.iter().enumerate() {
        let (off, back) = piece_staging_us(params, piece, group);
        debug_assert!(first_wait[p].is_some() && last_read[p].is_some());
        if let Some(s) = first_wait[p] {
            times[s] += SimTime::from_us(off);
        }
        if let Some(s) = last_read[p] {
            times[s] += SimTime::from_us(back);
        }
    }
}

/// What a host library's copies of `piece`'s exchanges over `group` cost (µs): off the device
/// before its first round, back after its last.
pub(crate) fn piece_staging_us(params: &TcpParams, piece: &Piece, group: Group) -> (f64, f64) {
    piece.rounds.iter().fold((0.0, 0.0), |(off, back), round| {
        let (op, bytes, over) = staged(round.exchange, round.bytes, group);
        let (o, b) = staging_split_us(params, op, bytes, over);
        (off + o, back + b)
    })
}

/// The library operation whose buffers an exchange of `bytes` per rank stages, its size as
/// `Op` reads it, and the ranks it spans: a hierarchical allreduce stages its buffer once, a
/// push-pull the node's reduced payload from one rank (`collective::ps`).
fn staged(exchange: Exchange, bytes: u64, group: Group) -> (Op, u64, Group) {
    match exchange {
        Exchange::ReduceScatter => (Op::ReduceScatter, bytes, group),
        Exchange::AlltoallReduceScatter => (Op::Alltoall, bytes, group),
        Exchange::AllgatherShards => (Op::Allgather, bytes, group),
        Exchange::Allgather => (
            Op::Allgather,
            bytes.saturating_mul(u64::from(group.ranks)),
            group,
        ),
        Exchange::PushPull { .. } => (Op::Allreduce, bytes, Group { ranks: 1, nodes: 1 }),
        Exchange::Allreduce
        | Exchange::HierarchicalAllreduce
        | Exchange::HybridReduceScatter
        | Exchange::CompressedRing => (Op::Allreduce, bytes, group),
    }
}

/// The framework's costs on one scenario's device and model.
struct Price<'a> {
    framework: &'a Framework,
    bandwidth: f64,
    tensors: &'a [Tensor],
}

impl Price<'_> {
    /// `work` on `elements` of tensor `t`.
    fn part(&self, work: TensorWork, t: usize, elements: u64) -> SimTime {
        let bytes = elements * self.tensors[t].dtype.bytes();
        self.framework.tensor_time(work, bytes, self.bandwidth)
    }

    /// `work` on the whole of tensor `t`.
    fn tensor(&self, work: TensorWork, t: usize) -> SimTime {
        self.part(work, t, self.tensors[t].numel)
    }

    /// What the launches of an update `step` over `tensors` parameter tensors add beyond its
    /// kernels' own time, where the framework waits on the host for every collective before
    /// the step: the host then launches into a drained queue. Nothing on one rank, where
    /// there is no collective to wait for (Horovod registers no hooks there).
    fn launch_bound(&self, scenario: &Scenario, step: &Step, tensors: usize) -> SimTime {
        if scenario.world().ranks() <= 1 {
            return SimTime::ZERO;
        }
        let kernels = scenario.compute_time(step.profiled_us.unwrap_or(0.0));
        self.framework
            .step_launch_time(tensors)
            .saturating_sub(kernels)
    }

    /// One call on the buffer elements `offset..offset + numel`: its own time and the fusion
    /// work on the part of each tensor it holds.
    fn call(&self, slots: &[Slot], offset: u64, numel: u64) -> SimTime {
        let copies: SimTime = slots
            .iter()
            .filter_map(|slot| {
                let start = slot.offset.max(offset);
                let end = (slot.offset + slot.numel).min(offset + numel);
                (end > start)
                    .then(|| self.part(self.framework.fusion, slot.tensor as usize, end - start))
            })
            .sum();
        self.framework.call_time() + copies
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::framework::HostStaging;
    use crate::inputs::model::ModelProfile;
    use crate::inputs::topology::{Cluster, ClusterOverrides};
    use crate::predict::simulate::schedule;
    use crate::strategy::{Strategy, StrategyOptions};

    /// ResNet-50 under DDP's buckets on `gpus` GPUs of one DGX-1, run by `framework`.
    fn priced(gpus: u32, framework: Framework) -> (Scenario, Schedule, Vec<SimTime>) {
        let overrides = ClusterOverrides {
            nodes: Some(1),
            gpus_per_node: Some(gpus),
            inter_gbps: None,
        };
        let cluster = Cluster::load("dgx1-v100", overrides).unwrap();
        let model = ModelProfile::load("resnet50").unwrap();
        let scenario = Scenario::new(model, cluster)
            .unwrap()
            .with_framework(Some(framework));
        let plan = Strategy::Ddp
            .plan(&scenario, &StrategyOptions::default())
            .unwrap();
        let schedule = schedule(&scenario, &plan).unwrap();
        let times = step_times(&scenario, &schedule);
        (scenario, schedule, times)
    }

    #[test]
    fn each_gather_is_copied_out_once_by_the_compute_that_first_waits_for_it() {
        let overrides = ClusterOverrides {
            nodes: Some(2),
            ..ClusterOverrides::default()
        };
        let cluster = Cluster::load("dgx-h100", overrides).unwrap();
        let model = ModelProfile::load("gpt2").unwrap();
        let framework = Framework::load("pytorch-fsdp").unwrap();
        let scenario = Scenario::new(model, cluster)
            .unwrap()
            .with_framework(Some(framework.clone()));
        let plan = Strategy::Fsdp
            .plan(&scenario, &StrategyOptions::default())
            .unwrap();
        let schedule = schedule(&scenario, &plan).unwrap();
        let with = step_times(&scenario, &schedule);
        let mut without = framework.clone();
        without.gather = GatherWork::default();
        let scenario_without = scenario.clone().with_framework(Some(without));
        let base = step_times(&scenario_without, &schedule);
        // Only compute steps pay, and in all exactly one copy of every gathered unit.
        let ranks = u64::from(scenario.world().ranks());
        let bandwidth = scenario.device.memory_bandwidth_gbytes_per_s;
        let mut expected = SimTime::ZERO;
        for step in &schedule.steps {
            if let StepKind::Gather { group, pass } = step.kind {
                let bytes = schedule.gather_shard(group, pass).bytes * ranks;
                expected += framework.gather_time(bytes, bandwidth);
            }
        }
        let mut extra = SimTime::ZERO;
        for ((step, &w), &b) in schedule.steps.iter().zip(&with).zip(&base) {
            if w != b {
                assert_eq!(step.stream, Stream::Compute, "{step:?}");
                extra += w - b;
            }
        }
        assert!(expected > SimTime::ZERO);
        assert_eq!(extra, expected);
    }

    /// A framework of round numbers: 10 µs kernels, one per hook and per copy back, 5 µs per
    /// call, nothing moved through memory.
    fn round_numbers(thread: CallThread) -> Framework {
        let one_kernel = TensorWork {
            kernels: 1.0,
            bytes_per_gradient_byte: 0.0,
        };
        Framework {
            kernel_us: 10.0,
            hook: one_kernel,
            collective_call_us: 5.0,
            call_thread: thread,
            call_kernels: 0.0,
            coordination_us: 0.0,
            fusion: TensorWork::default(),
            finish: one_kernel,
            ..Framework::load("pytorch-ddp").unwrap()
        }
    }

    #[test]
    fn one_rank_pays_every_hook_one_call_per_bucket_and_every_copy_back() {
        let (scenario, schedule, times) = priced(1, round_numbers(CallThread::Backward));
        let tensors = scenario.model.tensors.len() as u64;
        let buckets = schedule.buffers.len() as u64;
        let total: SimTime = times.iter().copied().sum();
        assert_eq!(
            total,
            SimTime::from_us((2 * tensors * 10 + buckets * 5) as f64)
        );
        // Without a framework nothing is added.
        let bare = step_times(&scenario.clone().with_framework(None), &schedule);
        assert!(bare.iter().all(|&t| t == SimTime::ZERO));
    }

    /// A step that waits on the host for every collective lasts at least its launches: on
    /// several ranks the optimizer gains what they take beyond its kernels; on one rank, or
    /// when the step's kernels were queued ahead, nothing.
    #[test]
    fn a_step_after_a_blocking_wait_lasts_at_least_its_launches() {
        let optimizer = |times: &[SimTime], schedule: &Schedule| -> SimTime {
            let at = schedule
                .steps
                .iter()
                .position(|s| s.kind == StepKind::Optimizer)
                .unwrap();
            times[at]
        };
        let waiting = Framework {
            step_ops_per_tensor: 4.0,
            op_us: 7.0,
            finish: TensorWork::default(),
            ..round_numbers(CallThread::Background)
        };
        let (scenario, schedule, times) = priced(2, waiting.clone());
        let launches = SimTime::from_us(4.0 * 7.0 * scenario.model.tensors.len() as f64);
        let kernels = scenario.compute_time(scenario.model.optimizer_us);
        assert!(launches > kernels);
        assert_eq!(optimizer(&times, &schedule), launches - kernels);
        let (_, schedule, times) = priced(1, waiting.clone());
        assert_eq!(optimizer(&times, &schedule), SimTime::ZERO);
        let queued = Framework {
            step_ops_per_tensor: 0.0,
            ..waiting
        };
        let (_, schedule, times) = priced(2, queued);
        assert_eq!(optimizer(&times, &schedule), SimTime::ZERO);
    }

    #[test]
    fn calls_from_backward_delay_backward_and_background_calls_the_collective() {
        for (thread, on_compute) in [
            (CallThread::Backward, true),
            (CallThread::Background, false),
        ] {
            let (_, schedule, times) = priced(8, round_numbers(thread));
            let (mut compute, mut comm) = (SimTime::ZERO, SimTime::ZERO);
            for (step, &time) in schedule.steps.iter().zip(&times) {
                match step.kind {
                    StepKind::Collective { .. } => comm += time,
                    _ => compute += time,
                }
            }
            let calls = SimTime::from_us(5.0 * schedule.pieces.len() as f64);
            assert_eq!(
                comm,
                if on_compute { SimTime::ZERO } else { calls },
                "{thread:?}"
            );
            let hooks_and_copies = SimTime::from_us(2.0 * 10.0 * 161.0);
            let expected = hooks_and_copies + if on_compute { calls } else { SimTime::ZERO };
            assert_eq!(compute, expected, "{thread:?}");
        }
    }

    #[test]
    fn a_host_library_staged_on_the_compute_stream_leaves_the_collectives() {
        use crate::collective::Naming;
        use crate::predict::cost::step_costs;
        let overrides = ClusterOverrides {
            nodes: Some(1),
            gpus_per_node: Some(4),
            inter_gbps: None,
        };
        let cluster = Cluster::load("v100-pcie-mpi", overrides).unwrap();
        let model = ModelProfile::load("resnet50").unwrap();
        let horovod = Framework::load("horovod").unwrap();
        assert_eq!(horovod.host_staging, HostStaging::ComputeStream);
        let beside = Framework {
            host_staging: HostStaging::Beside,
            ..horovod.clone()
        };
        let plan_of = |scenario: &Scenario| {
            Strategy::Horovod
                .plan(scenario, &StrategyOptions::default())
                .unwrap()
        };
        let run = |framework: Framework| {
            let scenario = Scenario::new(model.clone(), cluster.clone())
                .unwrap()
                .with_framework(Some(framework));
            let plan = Strategy::Horovod
                .plan(&scenario, &StrategyOptions::default())
                .unwrap();
            let schedule = schedule(&scenario, &plan).unwrap();
            let costs = step_costs(&scenario, &schedule, Naming::Priced).unwrap();
            (scenario, schedule, costs)
        };
        let (on_compute, schedule, staged) = run(horovod);
        let (_, _, apart) = run(beside);
        let params = on_compute.staged_on_compute.as_ref().unwrap();
        let group = Group { ranks: 4, nodes: 1 };
        let (mut compute_added, mut collectives_lost) = (0i64, 0i64);
        let mut expected_us = 0.0;
        for ((step, with), without) in schedule.steps.iter().zip(&staged).zip(&apart) {
            let delta = with.duration.as_ns() as i64 - without.duration.as_ns() as i64;
            match step.kind {
                StepKind::Collective { round, .. } => {
                    collectives_lost -= delta;
                    let piece = &schedule.pieces[step.piece.unwrap() as usize];
                    let bytes = piece.rounds[round as usize].bytes;
                    let (off, back) = staging_split_us(params, Op::Allreduce, bytes, group);
                    expected_us += off + back;
                }
                _ => {
                    assert_eq!(
                        step.stream,
                        crate::schedule::Stream::Compute,
                        "{:?}",
                        step.kind
                    );
                    compute_added += delta;
                }
            }
        }
        // What the collectives no longer pay, the compute steps do: every copy off and back.
        let expected_ns = expected_us * 1e3;
        assert!(expected_ns > 1e6, "{expected_ns}");
        for moved in [compute_added, collectives_lost] {
            assert!(
                (moved as f64 / expected_ns - 1.0).abs() < 1e-3,
                "{moved} vs {expected_ns}"
            );
        }
        // The search's stage estimate of a group carries the same copies, before and after.
        let group_zero = &plan_of(&on_compute).groups[0];
        let stages = |scenario: &Scenario| {
            crate::predict::cost::piece_stages(scenario, group_zero, Default::default()).unwrap()[0]
        };
        let beside_scenario = on_compute.clone().with_framework(Some(Framework {
            host_staging: HostStaging::Beside,
            ..on_compute.framework.clone().unwrap()
        }));
        let [off, exchange, back] = stages(&on_compute);
        let [off_beside, exchange_beside, back_beside] = stages(&beside_scenario);
        let total = |a: SimTime, b: SimTime, c: SimTime| (a + b + c).as_ns() as f64;
        assert!(off > off_beside && back > back_beside && exchange < exchange_beside);
        let ratio = total(off, exchange, back) / total(off_beside, exchange_beside, back_beside);
        assert!((ratio - 1.0).abs() < 1e-3, "{ratio}");
        // Without the framework the library stages in its collectives again.
        let bare = on_compute.with_framework(None);
        assert!(bare.staged_on_compute.is_none());
        assert!(bare
            .cluster
            .library
            .tcp()
            .unwrap()
            .host_staging_gbytes_per_s
            .is_some());
    }
}
