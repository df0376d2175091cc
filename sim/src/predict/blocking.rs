//! Collective calls that hold the computing thread until the collective completes.
//!
//! A framework that calls its collectives synchronously (`Framework::host_calls_block`: FSDP2's
//! all-gathers and reduce-scatters) gets them back at once on a GPU, where they only queue on
//! a stream of their own, but on a CPU rank the call returns when gloo has finished: the thread
//! that issued it (forward's, or autograd's in backward) computes nothing meanwhile, whatever
//! the prefetch asked for. The priced schedule then has every compute step wait for the
//! collectives issued before it, as the framework's costs add its times: the plan, and the
//! Schedule the executors run, stay as lowered.

use crate::schedule::{Schedule, Stream};

/// `schedule` with each compute step waiting for every collective and gather issued since the
/// compute step before it (steps are in the order a rank issues its work).
pub fn hold_compute(schedule: &mut Schedule) {
    let mut issued: Vec<u32> = Vec::new();
    for (i, step) in schedule.steps.iter_mut().enumerate() {
        match step.stream {
            Stream::Comm => issued.push(i as u32),
            Stream::Compute => {
                for collective in issued.drain(..) {
                    if !step.after.contains(&collective) {
                        step.after.push(collective);
                    }
                }
            }
            Stream::Codec | Stream::Cpu => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::device::DeviceProfile;
    use crate::inputs::framework::Framework;
    use crate::inputs::model::ModelProfile;
    use crate::inputs::topology::{Cluster, ClusterOverrides};
    use crate::predict::scenario::Scenario;
    use crate::predict::simulate::{schedule, simulate, SimOptions};
    use crate::schedule::StepKind;
    use crate::strategy::{Strategy, StrategyOptions};

    /// GPT-2 under FSDP on 2 nodes of `device`, run by FSDP2 whose calls block or not.
    fn scenario(device: &str, block: bool) -> Scenario {
        let overrides = ClusterOverrides {
            nodes: Some(2),
            gpus_per_node: Some(1),
            inter_gbps: None,
        };
        let cluster = Cluster::load("v100-tcp", overrides).unwrap();
        let mut scenario = Scenario::new(ModelProfile::load("gpt2").unwrap(), cluster).unwrap();
        scenario.device = DeviceProfile::load(device).unwrap();
        let mut fsdp = Framework::load("pytorch-fsdp").unwrap();
        fsdp.host_calls_block = block;
        scenario.with_framework(Some(fsdp))
    }

    #[test]
    fn on_cpu_ranks_compute_waits_for_every_collective_issued_before_it() {
        let cpu = scenario("host-2core", true);
        let plan = Strategy::Fsdp
            .plan(&cpu, &StrategyOptions::default())
            .unwrap();
        let held = schedule(&cpu, &plan).unwrap();
        let mut waits = 0;
        for (i, step) in held.steps.iter().enumerate() {
            if step.stream != Stream::Comm {
                continue;
            }
            let next = (i + 1..held.steps.len()).find(|&j| held.steps[j].stream == Stream::Compute);
            if let Some(j) = next {
                assert!(
                    held.steps[j].after.contains(&(i as u32)),
                    "step {j} after {i}"
                );
                waits += 1;
            }
        }
        assert!(waits > 0);
        // Nothing changes on a GPU, or where the calls return at once.
        let lowered = schedule(&scenario("host-2core", false), &plan).unwrap();
        assert_ne!(held.steps, lowered.steps);
        assert_eq!(
            schedule(&scenario("v100-sxm2-32gb", true), &plan)
                .unwrap()
                .steps,
            lowered.steps
        );
        // Held, an iteration is its compute and its communication one after the other.
        let options = SimOptions::default();
        let serial = simulate(&cpu, &plan, &options).unwrap().summary;
        let overlapped = simulate(&scenario("host-2core", false), &plan, &options)
            .unwrap()
            .summary;
        assert!(serial.iteration_time_ms > overlapped.iteration_time_ms);
        let busy = serial.compute_ms + serial.comm_ms;
        assert!(
            (serial.iteration_time_ms / busy - 1.0).abs() < 0.02,
            "{serial:?}"
        );
        assert!(held
            .steps
            .iter()
            .any(|s| matches!(s.kind, StepKind::Gather { .. })));
    }
}
