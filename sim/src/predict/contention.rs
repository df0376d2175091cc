//! How much NCCL's kernels slow the compute beside them on one GPU.
//!
//! The slowdown comes from the SMs their channels hold and the memory bandwidth their traffic
//! takes.

use crate::base::error::{Result, SimError};
use crate::collective::{self, Group};
use crate::collective_op::Op;
use crate::inputs::carry::arithmetic_fraction;
use crate::inputs::device::DeviceProfile;
use crate::inputs::model::ModelProfile;
use crate::inputs::topology::{Cluster, Library};

/// Bytes of device-memory traffic per byte a collective moves over its links: NCCL stores what
/// it receives and reads it back, and reads and writes the user's buffers ("300GB/s needs to be
/// multiplied by at least 2x for memory bandwidth ... If you add reading from or writing to user
/// data, it can be 3x", the NCCL maintainer in NVIDIA/nccl#1428).
pub const HBM_BYTES_PER_WIRE_BYTE: f64 = 3.0;

/// The least share of the device's memory bandwidth left to compute, so that a cluster whose
/// links outrun its GPUs' memory (no real one does) slows compute 20-fold, not without bound.
const MIN_FREE_MEMORY_SHARE: f64 = 0.05;

/// What NCCL's kernels cost the compute beside them, and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Contention {
    /// Slowdown of compute-bound kernels: the SMs left when NCCL's channels hold one each
    /// ("NCCL CTAs won't share an SM with compute kernels", NVIDIA/nccl#689).
    pub sm_factor: f64,
    /// Slowdown of memory-bound kernels: the memory bandwidth left beside the collective's
    /// traffic at the rate the iteration's allreduce reaches.
    pub memory_factor: f64,
    /// The share of the model's compute time that is arithmetic (`crate::inputs::carry`); `None`
    /// without FLOP counts, and then the larger factor applies.
    pub arithmetic_fraction: Option<f64>,
}

impl Contention {
    /// The slowdown of the model's compute while a collective runs.
    pub fn slowdown(&self) -> f64 {
        match self.arithmetic_fraction {
            Some(a) => a * self.sm_factor + (1.0 - a) * self.memory_factor,
            None => self.sm_factor.max(self.memory_factor),
        }
    }
}

/// How much `model`'s compute on `cluster`'s `device` slows while a collective shares the
/// device: what the device profile measured for NCCL, what the device and NCCL's channels and
/// traffic price, or 1 for a library that moves and sums on the host (MPI and gloo on an
/// accelerator cluster; Horovod built without GPU operations registers its TensorFlow ops for
/// the CPU only, `REGISTER_KERNEL_BUILDER(... DEVICE_GPU ...)` only under
/// `HOROVOD_GPU_ALLREDUCE` in horovod/tensorflow/mpi_ops.cc). It takes the parts of a scenario
/// rather than the scenario, which is built from its result.
pub fn collective_slowdown(
    model: &ModelProfile,
    cluster: &Cluster,
    device: &DeviceProfile,
) -> Result<f64> {
    let measured = device.contention.compute_slowdown_with_collective;
    Ok(match (&cluster.library, measured) {
        (Library::Nccl(_), Some(measured)) => measured,
        _ => nccl_contention(model, cluster, device)?.map_or(1.0, |c| c.slowdown()),
    })
}

/// The contention of an NCCL cluster's collectives with the model's compute, from the device's
/// SMs and memory bandwidth, NCCL's channels and the rate of an allreduce of every gradient;
/// `None` for a library that works on the host, a world of one rank, or a device whose profile
/// measured the slowdown itself (`contention.compute_slowdown_with_collective`).
pub fn nccl_contention(
    model: &ModelProfile,
    cluster: &Cluster,
    device: &DeviceProfile,
) -> Result<Option<Contention>> {
    let Library::Nccl(params) = &cluster.library else {
        return Ok(None);
    };
    let world = Group::world(cluster);
    if world.ranks < 2 || device.contention.compute_slowdown_with_collective.is_some() {
        return Ok(None);
    }
    let sms = device.sm_count.ok_or_else(|| {
        SimError::invalid(
            &device.name,
            "sm_count",
            "NCCL's contention with compute needs the device's SM count, or a measured contention.compute_slowdown_with_collective",
        )
    })?;
    let channels = params.setup.map(|s| s.channels).ok_or_else(|| {
        SimError::invalid(
            &cluster.name,
            "library.setup.channels",
            "NCCL's contention with compute needs the channels its collectives run on",
        )
    })?;
    let sm_factor = f64::from(sms) / f64::from(sms.saturating_sub(channels).max(1));
    let bytes = model.total_gradient_bytes().max(1);
    let time_us = collective::estimate(cluster, Op::Allreduce, bytes, world)?
        .time
        .as_us();
    let n = f64::from(world.ranks);
    let wire_gbytes_per_s =
        2.0 * (n - 1.0) / n * bytes as f64 / time_us.max(f64::MIN_POSITIVE) / 1e3;
    let bandwidth = device.memory_bandwidth_gbytes_per_s;
    let free = (bandwidth - HBM_BYTES_PER_WIRE_BYTE * wire_gbytes_per_s)
        .max(bandwidth * MIN_FREE_MEMORY_SHARE);
    Ok(Some(Contention {
        sm_factor,
        memory_factor: bandwidth / free,
        arithmetic_fraction: arithmetic_fraction(model, device),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::topology::ClusterOverrides;
    use crate::predict::scenario::Scenario;

    /// The NCCL contention of a scenario's model, cluster and device.
    fn priced(scenario: &Scenario) -> Result<Option<Contention>> {
        nccl_contention(&scenario.model, &scenario.cluster, &scenario.device)
    }

    fn contention(model: &str, cluster: &str, nodes: u32) -> Contention {
        let overrides = ClusterOverrides {
            nodes: Some(nodes),
            ..ClusterOverrides::default()
        };
        let scenario = Scenario::new(
            ModelProfile::load(model).unwrap(),
            Cluster::load(cluster, overrides).unwrap(),
        )
        .unwrap();
        priced(&scenario).unwrap().unwrap()
    }

    #[test]
    fn slowdown_weighs_the_sm_and_memory_factors_by_the_arithmetic_share() {
        let inside = contention("resnet50", "dgx1-v100", 1);
        // DGX-1: 8 channels of 80 SMs.
        assert!((inside.sm_factor - 80.0 / 72.0).abs() < 1e-12);
        let a = inside.arithmetic_fraction.unwrap();
        assert!(a > 0.0 && a < 1.0, "{a}");
        let slowdown = inside.slowdown();
        assert!(slowdown > inside.sm_factor && slowdown < inside.memory_factor);
        // Across two machines the NICs bound the traffic: less of the memory bandwidth is taken.
        let across = contention("resnet50", "dgx1-v100", 2);
        assert!(across.memory_factor < inside.memory_factor);
        assert_eq!(across.sm_factor, inside.sm_factor);
    }

    #[test]
    fn only_nccl_between_ranks_without_a_measured_slowdown_is_priced() {
        let scenario = |cluster: &str, nodes: u32| {
            let overrides = ClusterOverrides {
                nodes: Some(nodes),
                gpus_per_node: Some(1),
                ..ClusterOverrides::default()
            };
            Scenario::new(
                ModelProfile::load("resnet50").unwrap(),
                Cluster::load(cluster, overrides).unwrap(),
            )
            .unwrap()
        };
        assert!(priced(&scenario("v100-10gbe", 1)).unwrap().is_none());
        assert!(priced(&scenario("v100-tcp", 2)).unwrap().is_none());
        assert_eq!(scenario("v100-tcp", 2).collective_slowdown, 1.0);
        let mut measured = scenario("v100-10gbe", 2);
        assert!(measured.collective_slowdown > 1.0);
        measured.device.contention.compute_slowdown_with_collective = Some(1.3);
        assert!(priced(&measured).unwrap().is_none());
        let mut bare = scenario("v100-10gbe", 2);
        bare.device.sm_count = None;
        let err = priced(&bare).unwrap_err().to_string();
        assert!(err.contains("sm_count"), "{err}");
    }
}
