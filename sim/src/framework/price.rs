//! What the framework running a plan adds to each step of its schedule: hooks, calls, fusion copies, the copy back.

use super::{CallThread, Framework, TensorWork};
use crate::model::Tensor;
use crate::scenario::Scenario;
use crate::schedule::{Schedule, Slot, StepKind};
use crate::time::SimTime;

/// The framework's time on each step of `schedule`, in step order; all zero without one.
///
/// - A backward step: the gradient hook of its tensor; with calls from the backward thread,
///   every call of the groups whose last gradient it produces (the highest tensor index of a
///   group: tensors are in backward order).
/// - A collective step, with calls from a background thread: its call, and on its first round
///   the fusion copies of the piece's tensors.
/// - The optimizer (or a group's update): the copy back of its tensors.
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
            StepKind::Optimizer => (0..price.tensors.len())
                .map(|t| price.tensor(framework.finish, t))
                .sum(),
            StepKind::Update { group } => schedule.buffers[group as usize]
                .slots
                .iter()
                .map(|slot| price.tensor(framework.finish, slot.tensor as usize))
                .sum(),
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
            _ => SimTime::ZERO,
        };
    }
    times
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
    use crate::model::ModelProfile;
    use crate::simulate::schedule;
    use crate::strategy::{Strategy, StrategyOptions};
    use crate::topology::{Cluster, ClusterOverrides};

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
}
