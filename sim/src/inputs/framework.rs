//! The framework that runs a plan: its per-call costs as a data file.
//!
//! The frameworks are PyTorch DDP, Horovod, BytePS and syncopate.torch.
//!
//! What a plan costs depends on who executes it. A framework adds work the Schedule's steps do
//! not name: the gradient hook of every parameter (DDP copies the gradient into its bucket),
//! the host bookkeeping and launch of every collective call, copies into and out of a fusion
//! buffer, the copy back into `.grad` before the optimizer, and one dispatch per framework op
//! of a compressor written in the framework. These costs are what fusion trades against
//! bandwidth: fewer, larger buckets pay them fewer times. Each framework is a file in
//! `profiles/frameworks/` with the provenance of every number.

use crate::base::data::{self, DataKind};
use crate::base::error::{Result, SimError};
use crate::base::limits;
use crate::base::time::SimTime;
use crate::inputs::model::Provenance;
use serde::{Deserialize, Serialize};

/// Work a framework does for each tensor at one point of the iteration: kernels it launches
/// and bytes it moves through device memory per byte of the tensor's gradient.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorWork {
    /// Kernels launched per tensor (a copy, a scale).
    #[serde(default, skip_serializing_if = "data::is_zero")]
    pub kernels: f64,
    /// Bytes read and written per gradient byte (a copy reads and writes it: 2).
    #[serde(default, skip_serializing_if = "data::is_zero")]
    pub bytes_per_gradient_byte: f64,
}

/// Work a framework does on the compute stream for each gathered unit of a sharded plan,
/// when the unit's first compute waits for it (FSDP2's copy out of the all-gather buffer into
/// the unsharded parameters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatherWork {
    /// Kernels launched per gathered unit.
    #[serde(default, skip_serializing_if = "data::is_zero")]
    pub kernels: f64,
    /// Bytes read and written per byte gathered (a copy reads and writes it: 2).
    #[serde(default, skip_serializing_if = "data::is_zero")]
    pub bytes_per_gathered_byte: f64,
}

/// The thread that issues a framework's collective calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallThread {
    /// The thread running backward, inside the hook of the gradient that completes a bucket
    /// (DDP's `Reducer::mark_bucket_ready`): the backward pass waits for each call.
    Backward,
    /// A thread of the framework's own (Horovod's background loop, BytePS's scheduler,
    /// syncopate.torch's stream threads): the collective waits for its call, backward does not.
    Background,
}

/// Where a framework's copies between the GPU and a library that works on host memory run
/// (a cluster's `library.host_staging_gbytes_per_s`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostStaging {
    /// On copy streams of their own, beside compute: part of each collective's time
    /// (TensorFlow's device-to-host and host-to-device streams).
    #[default]
    Beside,
    /// On the compute stream: the copy off the device waits for the kernels queued before it
    /// and the copy back is ordered among them, so both take compute time (PyTorch's Horovod
    /// binding without GPU operations: a pageable `tensor.to(cpu)` in the gradient's hook,
    /// `copy_` back from the background thread on the default stream).
    ComputeStream,
}

/// A framework profile as stored in `profiles/frameworks/*.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Framework {
    /// Version of the data file format; this build reads only its own.
    pub format_version: u32,
    /// Short name of the framework, as given on the command line (`horovod`).
    pub name: String,
    /// What the framework does when it synchronizes gradients, in prose.
    pub description: String,
    /// Device time of one small kernel the framework launches, launch included, in µs.
    pub kernel_us: f64,
    /// In each parameter's gradient hook, on the compute stream (DDP's copy into the bucket).
    #[serde(default)]
    pub hook: TensorWork,
    /// Host time of one collective call before its kernels start: the framework's bookkeeping,
    /// stream synchronization and the library call, in µs.
    pub collective_call_us: f64,
    /// Kernels launched with each call on the calling thread's stream (DDP's `div_` of the
    /// bucket by the world size).
    #[serde(default, skip_serializing_if = "data::is_zero")]
    pub call_kernels: f64,
    /// Which thread makes the calls, and so which stream waits for them.
    pub call_thread: CallThread,
    /// Host time of one coordination round before each call (Horovod's negotiation of which
    /// tensors are ready on every rank; BytePS's root device signalling its local ranks), in µs.
    #[serde(default, skip_serializing_if = "data::is_zero")]
    pub coordination_us: f64,
    /// For each tensor of a collective's piece, with the call on the calling thread's stream:
    /// copies into and out of a fusion buffer (Horovod's `MemcpyInFusionBuffer` /
    /// `MemcpyOutFusionBuffer`), DDP's pass dividing the bucket.
    #[serde(default)]
    pub fusion: TensorWork,
    /// For each parameter after its synchronization, on the compute stream before the
    /// optimizer reads it (DDP's copy of the bucket back into `.grad`).
    #[serde(default)]
    pub finish: TensorWork,
    /// For each parameter gather of a sharded plan, on the compute stream before the unit's
    /// first compute after it.
    #[serde(default, skip_serializing_if = "is_no_gather_work")]
    pub gather: GatherWork,
    /// Host time of one framework op (a compressor written as framework ops pays one per op).
    pub op_us: f64,
    /// Ops the optimizer step launches per parameter tensor after the framework's blocking
    /// host wait for every collective (Horovod's `optimizer.step()` calls `synchronize()`,
    /// which returns once each handle completed on the device): launched by a host whose queue
    /// drained, the step lasts at least their host time, `op_us` each. 0 (the default) when the
    /// step's kernels are queued while the collectives run (DDP), or on one rank, where there
    /// is nothing to wait for.
    #[serde(default)]
    pub step_ops_per_tensor: f64,
    /// Where the copies to and from a host-memory library run.
    #[serde(default, skip_serializing_if = "is_beside")]
    pub host_staging: HostStaging,
    /// Whether a collective call returns only once the collective has completed on a CPU
    /// rank, holding the thread that computes: FSDP2 calls its all-gathers and reduce-scatters
    /// without `async_op`, which on a GPU returns once they are queued on a stream of their
    /// own but on gloo waits for the result. false: the call returns at once and the library's
    /// threads carry the collective (DDP's Reducer, syncopate.torch).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_calls_block: bool,
    /// Where these costs come from (measured, estimated or calibrated) and how.
    pub provenance: Provenance,
}

impl Framework {
    /// Loads a shipped framework by name or a framework file by path.
    pub fn load(name_or_path: &str) -> Result<Framework> {
        data::load(DataKind::Framework, name_or_path, Framework::validate)
    }

    /// The framework a flag or plan names: `none` is no framework; a name or path loads.
    /// The plan records the returned name (a path made absolute).
    pub fn named(name_or_path: &str) -> Result<Option<(String, Framework)>> {
        if name_or_path == NONE {
            return Ok(None);
        }
        let framework = Framework::load(name_or_path)?;
        Ok(Some((data::absolute(name_or_path), framework)))
    }

    /// Every time finite and within the duration limit, every count and byte ratio finite,
    /// not negative and bounded.
    pub fn validate(&self, label: &str) -> Result<()> {
        data::check_format_version(label, self.format_version)?;
        for (field, value) in [
            ("kernel_us", self.kernel_us),
            ("collective_call_us", self.collective_call_us),
            ("coordination_us", self.coordination_us),
            ("op_us", self.op_us),
        ] {
            limits::check_duration_us(label, field, value)?;
        }
        let per_tensor = |name: &str, work: TensorWork| {
            [
                (format!("{name}.kernels"), work.kernels, "per tensor"),
                (
                    format!("{name}.bytes_per_gradient_byte"),
                    work.bytes_per_gradient_byte,
                    "per tensor",
                ),
            ]
        };
        let counts = std::iter::once(("call_kernels".to_string(), self.call_kernels, "per call"))
            .chain(std::iter::once((
                "step_ops_per_tensor".to_string(),
                self.step_ops_per_tensor,
                "per tensor",
            )))
            .chain(per_tensor("hook", self.hook))
            .chain(per_tensor("fusion", self.fusion))
            .chain(per_tensor("finish", self.finish))
            .chain([
                (
                    "gather.kernels".to_string(),
                    self.gather.kernels,
                    "per gather",
                ),
                (
                    "gather.bytes_per_gathered_byte".to_string(),
                    self.gather.bytes_per_gathered_byte,
                    "per gather",
                ),
            ]);
        for (field, value, per) in counts {
            if !(value.is_finite() && (0.0..=MAX_PER_TENSOR).contains(&value)) {
                return Err(SimError::invalid(
                    label,
                    field,
                    format!("is 0 to {MAX_PER_TENSOR} {per}, got {value}"),
                ));
            }
        }
        Ok(())
    }

    /// Time of `work` on one tensor of `bytes` gradient bytes on a device whose memory moves
    /// `memory_gbytes_per_s`.
    pub fn tensor_time(&self, work: TensorWork, bytes: u64, memory_gbytes_per_s: f64) -> SimTime {
        if work == TensorWork::default() {
            return SimTime::ZERO;
        }
        SimTime::from_us(work.kernels * self.kernel_us)
            + SimTime::from_ns(work.bytes_per_gradient_byte * bytes as f64 / memory_gbytes_per_s)
    }

    /// The time of the framework's work on a gather of `bytes` in all (`gather`).
    pub fn gather_time(&self, bytes: u64, memory_gbytes_per_s: f64) -> SimTime {
        let work = TensorWork {
            kernels: self.gather.kernels,
            bytes_per_gradient_byte: self.gather.bytes_per_gathered_byte,
        };
        self.tensor_time(work, bytes, memory_gbytes_per_s)
    }

    /// The host time of the optimizer step's launches over `tensors` parameter tensors, when
    /// the step waits on the host for every collective first (`step_ops_per_tensor`).
    pub fn step_launch_time(&self, tensors: usize) -> SimTime {
        SimTime::from_us(self.step_ops_per_tensor * tensors as f64 * self.op_us)
    }

    /// One collective call's own time on its thread, without the copies of its tensors: the
    /// host's bookkeeping and coordination, and the kernels it launches.
    pub fn call_time(&self) -> SimTime {
        SimTime::from_us(
            self.collective_call_us + self.coordination_us + self.call_kernels * self.kernel_us,
        )
    }
}

fn is_beside(staging: &HostStaging) -> bool {
    *staging == HostStaging::Beside
}

fn is_no_gather_work(work: &GatherWork) -> bool {
    *work == GatherWork::default()
}

/// The name that asks for no framework: the plan's steps alone.
pub const NONE: &str = "none";

/// Most kernels, or bytes per gradient byte, a framework spends on one tensor at one point.
const MAX_PER_TENSOR: f64 = 1e3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_framework_loads_and_names_itself() {
        for name in DataKind::Framework.shipped_names() {
            let framework = Framework::load(name).unwrap();
            assert_eq!(framework.name, name);
        }
    }

    #[test]
    fn the_strategies_that_model_a_framework_run_on_a_shipped_one() {
        use crate::strategy::Strategy;
        let own = |s: Strategy| {
            s.framework()
                .map(|name| Framework::load(name).unwrap().name)
        };
        assert_eq!(own(Strategy::Ddp).as_deref(), Some("pytorch-ddp"));
        assert_eq!(own(Strategy::Horovod).as_deref(), Some("horovod"));
        let byteps = Framework::load("byteps").unwrap();
        assert_eq!(own(Strategy::BytePs).as_deref(), Some("byteps"));
        // BytePS's threads call, its completion divides each tensor before the optimizer.
        assert_eq!(byteps.call_thread, CallThread::Background);
        assert!(byteps.finish.kernels > 0.0 && byteps.fusion.kernels == 0.0);
        assert_eq!(own(Strategy::Wfbp), None);
    }

    #[test]
    fn a_bad_number_names_its_field() {
        let framework = Framework::load("pytorch-ddp").unwrap();
        for bad in [f64::NAN, -1.0, f64::INFINITY, 1e9] {
            let mut broken = framework.clone();
            broken.hook.kernels = bad;
            let err = broken.validate("f").unwrap_err().to_string();
            assert!(err.contains("hook.kernels"), "{err}");
            let mut broken = framework.clone();
            broken.collective_call_us = bad * 1e6;
            let err = broken.validate("f").unwrap_err().to_string();
            assert!(err.contains("collective_call_us"), "{err}");
            let mut broken = framework.clone();
            broken.step_ops_per_tensor = bad;
            let err = broken.validate("f").unwrap_err().to_string();
            assert!(err.contains("step_ops_per_tensor"), "{err}");
        }
    }

    #[test]
    fn a_copy_costs_its_kernel_and_its_bytes_at_memory_bandwidth() {
        let mut framework = Framework::load("pytorch-ddp").unwrap();
        framework.kernel_us = 3.0;
        let copy = TensorWork {
            kernels: 1.0,
            bytes_per_gradient_byte: 2.0,
        };
        // 1 MB read and written at 1000 GB/s: 2 µs, after a 3 µs kernel.
        let time = framework.tensor_time(copy, 1_000_000, 1000.0);
        assert_eq!(time, SimTime::from_us(5.0));
        assert_eq!(
            framework.tensor_time(TensorWork::default(), 1_000_000, 1000.0),
            SimTime::ZERO
        );
    }
}
