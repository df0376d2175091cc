//! MG-WFBP (Shi, Chu & Li, INFOCOM 2019): merge a gradient into the group still waiting to be
//! sent when the wait for it is shorter than the startup time a separate collective would pay;
//! the startup α and per-byte β come from the cluster's collective model.

use crate::base::error::Result;
use crate::collective::{self, Group};
use crate::collective_op::Op;
use crate::predict::scenario::Scenario;

/// Bytes at which the per-byte slope of the α–β fit is measured.
const SLOPE_BYTES: u64 = 64 << 20;

pub(super) fn groups(scenario: &Scenario) -> Result<Vec<Vec<usize>>> {
    let model = &scenario.model;
    let cluster = &scenario.cluster;
    let world = Group::world(cluster);
    // α: a tiny allreduce; β: the slope up to a large one (µs and µs per byte).
    let alpha = collective::estimate(cluster, Op::Allreduce, 4, world)?
        .time
        .as_us();
    let large = collective::estimate(cluster, Op::Allreduce, SLOPE_BYTES, world)?
        .time
        .as_us();
    let beta = (large - alpha) / SLOPE_BYTES as f64;
    let ready: Vec<f64> = super::ready_times_us(model)
        .iter()
        .map(|t| t * scenario.compute_scale)
        .collect();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut current_bytes = 0u64;
    // When the previously sent group's collective ends.
    let mut link_free = 0.0_f64;
    for (t, tensor) in model.tensors.iter().enumerate() {
        let bytes = tensor.bytes();
        if let Some(&last) = current.last() {
            // The pending group would start once its last gradient is ready and the link is free.
            let start = ready[last].max(link_free);
            if ready[t] - start >= alpha {
                link_free = start + alpha + beta * current_bytes as f64;
                groups.push(std::mem::take(&mut current));
                current_bytes = 0;
            }
        }
        current.push(t);
        current_bytes += bytes;
    }
    groups.push(current);
    Ok(groups)
}
