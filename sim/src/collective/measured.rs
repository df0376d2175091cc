//! Collective times measured on a cluster (a lab's sweep), standing in for the cost model.
//!
//! They stand in where the conditions match the measurement's: same operation, ranks, nodes and
//! link rate.
//!
//! A TCP library's cost model follows Hockney's α–β terms, and a lab's sweep has regimes those
//! terms cannot follow (on 4 nodes sharing 2 cores, allreduces of 256 KiB took 2.3× the fitted
//! time and those of 64 KiB 0.7×: experiments/lab-validation's `lab-4n-0.2g.sweep.csv` of
//! 2026-11-24 morning). Where a sweep measured the very collective a plan runs, its times are
//! the better cost; between two measured sizes the time is interpolated in log-log space, and
//! outside the measured sizes the model's time is scaled by its ratio at the nearest one. A
//! sweep whose larger size measured faster than a smaller one is first made non-decreasing.
//! Anywhere else (other ranks, other links, a `--inter-gbps` or `--nodes` override to another
//! value) the model alone prices the collective.

use super::Group;
use crate::base::limits;
use crate::base::time::SimTime;
use crate::collective_op::Op;
use crate::inputs::topology::{Cluster, MeasuredSweep, SweepPoint};
use std::borrow::Cow;

// A cluster file holds the sweep; how its times stand in for the model's is the cost model's.
impl MeasuredSweep {
    /// The time of `bytes`, which the model prices at `modeled`: interpolated between measured
    /// sizes, or the model's time scaled by its ratio at the nearest measured size outside them.
    fn time(&self, bytes: u64, modeled: SimTime, model: &dyn Fn(u64) -> SimTime) -> SimTime {
        let points = monotone(&self.points);
        let (first, last) = (points[0], points[points.len() - 1]);
        let beyond = |end: SweepPoint| {
            let at_end = model(end.bytes).as_us();
            let us = if at_end > 0.0 {
                modeled.as_us() * end.time_us / at_end
            } else {
                end.time_us
            };
            SimTime::from_us(us.min(limits::MAX_DURATION_US))
        };
        if bytes <= first.bytes {
            return beyond(first);
        }
        if bytes >= last.bytes {
            return beyond(last);
        }
        let upper = points.partition_point(|p| p.bytes < bytes);
        let (a, b) = (points[upper - 1], points[upper]);
        let along = (bytes as f64 / a.bytes as f64).ln() / (b.bytes as f64 / a.bytes as f64).ln();
        SimTime::from_us(a.time_us * (b.time_us / a.time_us).powf(along))
    }
}

/// The points with their times made non-decreasing in size, as close to the measured ones as
/// can be (least squares: pool-adjacent-violators, each run of sizes that measured faster than
/// a smaller one replaced by its mean): a collective of more bytes does not take less time,
/// and a sweep that says so measured the machine's noise (a gloo sweep on 4 nodes sharing 2
/// cores timed 4 KiB at 7.8 ms and 256 KiB at 5.0 ms).
fn monotone(points: &[SweepPoint]) -> Cow<'_, [SweepPoint]> {
    if points.windows(2).all(|w| w[0].time_us <= w[1].time_us) {
        return Cow::Borrowed(points);
    }
    // Blocks of (sum of times, count), each block's mean above the one before.
    let mut blocks: Vec<(f64, usize)> = Vec::with_capacity(points.len());
    for point in points {
        blocks.push((point.time_us, 1));
        while let [.., (sum_a, n_a), (sum_b, n_b)] = blocks[..] {
            if sum_a / n_a as f64 <= sum_b / n_b as f64 {
                break;
            }
            blocks.pop();
            *blocks.last_mut().expect("two blocks") = (sum_a + sum_b, n_a + n_b);
        }
    }
    let times = blocks
        .iter()
        .flat_map(|&(sum, n)| std::iter::repeat_n(sum / n as f64, n));
    Cow::Owned(
        points
            .iter()
            .zip(times)
            .map(|(p, time_us)| SweepPoint {
                bytes: p.bytes,
                time_us,
            })
            .collect(),
    )
}

/// The sweep of `cluster`'s TCP library (none for NCCL) that measured `op` over `group` on its
/// links.
fn matching(cluster: &Cluster, op: Op, group: Group) -> Option<&MeasuredSweep> {
    let links = &cluster.inter_node;
    let wanted = (
        op,
        group.ranks,
        group.nodes,
        links.nics_per_node,
        links.nic_bandwidth_gbps,
    );
    let sweeps = cluster
        .library
        .tcp()
        .map_or(&[][..], |p| p.measured.as_slice());
    sweeps.iter().find(|s| s.conditions() == wanted)
}

/// The measured time of `op` on `bytes` over `group`, when one of `cluster`'s sweeps measured
/// it there; the model prices it at `modeled` and `model` prices other sizes.
pub(super) fn stand_in(
    cluster: &Cluster,
    op: Op,
    bytes: u64,
    group: Group,
    modeled: SimTime,
    model: &dyn Fn(u64) -> SimTime,
) -> Option<SimTime> {
    matching(cluster, op, group).map(|s| s.time(bytes, modeled, model))
}

/// The least ns per byte any measured size of `op` over `group` took on `cluster`: a bound on
/// what the collective costs per byte must not exceed it.
pub fn least_ns_per_byte(cluster: &Cluster, op: Op, group: Group) -> Option<f64> {
    matching(cluster, op, group).and_then(|s| {
        monotone(&s.points)
            .iter()
            .map(|p| p.time_us * 1e3 / p.bytes as f64)
            .min_by(f64::total_cmp)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::topology::ClusterOverrides;

    fn sweep() -> MeasuredSweep {
        MeasuredSweep {
            op: Op::Allreduce,
            ranks: 4,
            nodes: 4,
            nics_per_node: 1,
            nic_bandwidth_gbps: 1.0,
            points: vec![
                SweepPoint {
                    bytes: 1000,
                    time_us: 100.0,
                },
                SweepPoint {
                    bytes: 100_000,
                    time_us: 10_000.0,
                },
            ],
        }
    }

    /// A 4-node 1 Gb/s lab carrying `sweep()`.
    fn lab() -> Cluster {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../experiments/lab-validation/clusters/lab-4n-1g.json"
        );
        let mut cluster = Cluster::load(path, ClusterOverrides::default()).unwrap();
        cluster.library.tcp_mut().unwrap().measured = vec![sweep()];
        cluster
    }

    const FOUR: Group = Group { ranks: 4, nodes: 4 };

    /// A model that takes 1 µs per 200 bytes: a twentieth of the measured times.
    fn model(bytes: u64) -> SimTime {
        SimTime::from_us(bytes as f64 / 200.0)
    }

    #[test]
    fn measured_sizes_give_their_times_and_others_interpolate_or_scale_the_model() {
        let lab = lab();
        let at = |bytes| stand_in(&lab, Op::Allreduce, bytes, FOUR, model(bytes), &model);
        assert_eq!(at(1000), Some(SimTime::from_us(100.0)));
        assert_eq!(at(100_000), Some(SimTime::from_us(10_000.0)));
        // Halfway in log size between 1 kB and 100 kB: halfway in log time.
        let middle = at(10_000).unwrap().as_us();
        assert!((middle - 1000.0).abs() < 1e-3, "{middle}");
        // Beyond the sweep: the model's time times its ratio at the end (20×).
        assert_eq!(at(400_000), Some(SimTime::from_us(40_000.0)));
        assert_eq!(at(100), Some(SimTime::from_us(10.0)));
        assert_eq!(least_ns_per_byte(&lab, Op::Allreduce, FOUR), Some(100.0));
    }

    #[test]
    fn a_larger_size_measured_faster_is_pooled_with_the_smaller_ones() {
        let times = |measured: &[f64]| {
            let points: Vec<SweepPoint> = measured
                .iter()
                .enumerate()
                .map(|(i, &time_us)| SweepPoint {
                    bytes: 1000 << i,
                    time_us,
                })
                .collect();
            monotone(&points)
                .iter()
                .map(|p| p.time_us)
                .collect::<Vec<f64>>()
        };
        assert_eq!(times(&[1.0, 2.0, 3.0]), [1.0, 2.0, 3.0]);
        // 7.8 ms at 4 KiB, 7.3 at 64 KiB, 5.0 at 256 KiB, then 15.3 at 1 MiB: the first three
        // take their mean.
        assert_eq!(times(&[7.8, 7.3, 5.0, 15.3]), [6.7, 6.7, 6.7, 15.3]);
        assert_eq!(times(&[3.0, 1.0, 2.0]), [2.0, 2.0, 2.0]);
        // The stand-in and the bound read the pooled times.
        let mut lab = lab();
        lab.library.tcp_mut().unwrap().measured[0].points[0].time_us = 20_000.0;
        let at = |bytes| stand_in(&lab, Op::Allreduce, bytes, FOUR, model(bytes), &model);
        assert_eq!(at(1000), Some(SimTime::from_us(15_000.0)));
        assert_eq!(at(100_000), Some(SimTime::from_us(15_000.0)));
        assert_eq!(least_ns_per_byte(&lab, Op::Allreduce, FOUR), Some(150.0));
    }

    #[test]
    fn other_conditions_leave_the_model_alone() {
        let at =
            |cluster: &Cluster, op, group| stand_in(cluster, op, 5000, group, model(5000), &model);
        let lab = lab();
        assert!(at(&lab, Op::Allreduce, FOUR).is_some());
        assert_eq!(at(&lab, Op::Allgather, FOUR), None);
        assert_eq!(at(&lab, Op::Allreduce, Group { ranks: 2, nodes: 2 }), None);
        assert_eq!(at(&lab, Op::Allreduce, Group { ranks: 4, nodes: 2 }), None);
        let mut faster = lab.clone();
        faster.inter_node.nic_bandwidth_gbps = 0.2;
        assert_eq!(at(&faster, Op::Allreduce, FOUR), None);
        let mut two_nics = lab.clone();
        two_nics.inter_node.nics_per_node = 2;
        assert_eq!(at(&two_nics, Op::Allreduce, FOUR), None);
    }

    #[test]
    fn a_malformed_sweep_names_its_field() {
        let mut unordered = sweep();
        unordered.points.swap(0, 1);
        let err = unordered
            .validate("c.json", "library.measured[0]")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("library.measured[0].points[1].bytes"),
            "{err}"
        );
        let mut one_rank = sweep();
        one_rank.ranks = 1;
        let err = one_rank
            .validate("c.json", "library.measured[0]")
            .unwrap_err();
        assert!(
            err.to_string().contains("library.measured[0].ranks"),
            "{err}"
        );
        let mut negative = sweep();
        negative.points[1].time_us = -1.0;
        assert!(negative.validate("c.json", "library.measured[0]").is_err());
        let mut nan = sweep();
        nan.nic_bandwidth_gbps = f64::NAN;
        assert!(nan.validate("c.json", "library.measured[0]").is_err());
        // Two sweeps of one collective in one file: which one prices it is ambiguous.
        let mut lab = lab();
        lab.library.tcp_mut().unwrap().measured.push(sweep());
        let err = lab.validate("c.json").unwrap_err();
        assert!(err.to_string().contains("library.measured[1]"), "{err}");
    }
}
