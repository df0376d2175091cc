//! The records of the MPI collective micro-benchmarks: sweeps, contention and pace.
//!
//! `measure::mpi_bench` (feature `mpi`) makes them on the ranks of an MPI job; `lab` runs it over
//! its namespaces, pools its probes and fits clusters to them.

use crate::error::{ExecError, Result};
use serde::{Deserialize, Serialize};
use syncopate_sim::calibrate::beside_compute::{BesideCompute, Pair};
use syncopate_sim::collective_op::Op;
use syncopate_sim::SimError;

/// A median with the spread of the repeats it came from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Median of the repeats.
    pub median: f64,
    /// Smallest of the repeats.
    pub min: f64,
    /// Largest of the repeats.
    pub max: f64,
    /// Number of repeats summarized.
    pub repeats: usize,
}

impl Spread {
    /// The spread over several measurements of one quantity: the median of their medians (the
    /// mean of the middle two of an even count: four probes' upper middle would bias every
    /// pooled timing up), the least minimum and the largest maximum, and all their repeats.
    pub fn pooled(spreads: &[Spread]) -> Spread {
        let medians: Vec<f64> = spreads.iter().map(|s| s.median).collect();
        Spread {
            // NaN only for no spreads, which no caller pools.
            median: syncopate_sim::base::stats::median(&medians).unwrap_or(f64::NAN),
            min: spreads.iter().map(|s| s.min).fold(f64::INFINITY, f64::min),
            max: spreads
                .iter()
                .map(|s| s.max)
                .fold(f64::NEG_INFINITY, f64::max),
            repeats: spreads.iter().map(|s| s.repeats).sum(),
        }
    }

    /// The median, minimum and maximum of `values`, each value one repeat.
    pub fn of(values: &[f64]) -> Spread {
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Spread {
            // NaN only for no values: every timing has at least one repeat (`--repeats` ≥ 1).
            median: syncopate_sim::base::stats::median(values).unwrap_or(f64::NAN),
            min,
            max,
            repeats: values.len(),
        }
    }
}

/// One size of an MPI collective sweep over every rank, median of the repeats.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectivePoint {
    /// nccl-tests' size: an allreduce's buffer, an allgather's gathered total.
    pub bytes: u64,
    /// Seconds of one call, over the repeats.
    pub seconds: Spread,
    /// nccl-tests' bus bandwidth of the median (allreduce 2(n−1)/n · S / t, allgather
    /// (n−1)/n · S / t), Gb/s.
    pub busbw_gbps: f64,
}

/// How compute and allreduces slow each other on this job's ranks, as rank 0 saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContentionPoint {
    /// Bytes of the allreduces compute is timed beside.
    pub bytes: u64,
    /// Nanoseconds of calibrated work each compute measurement asks for.
    pub compute_ns: u64,
    /// Seconds of `compute_ns` of calibrated work: alone (every rank computing at once), and
    /// while allreduces run.
    pub compute_alone: Spread,
    /// Seconds of the same compute while allreduces run (see `compute_alone`).
    pub compute_beside_comm: Spread,
    /// Seconds of the same compute while a second thread computes too (as compression does).
    pub compute_beside_compute: Spread,
    /// One collective of each operation and size, alone and while every rank computes.
    pub comm: Vec<CommBesideCompute>,
    /// A small allreduce alone and while a second stream runs large ones. Probes made before
    /// it was measured lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueBehind>,
    /// Seconds of `compute_ns` of calibrated work in draws of `lab probe pace` (see [`Pace`]),
    /// launched apart from this probe and more often: what a run's compute meets. Probes made
    /// before it was measured lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<Spread>,
    /// Probes this point pools (see [`ContentionPoint::pooled`]); one probe's output says 1.
    #[serde(default = "one_probe")]
    pub probes: usize,
}

fn one_probe() -> usize {
    1
}

/// Seconds of `compute_ns` of calibrated work, the slowest rank's, in draws each of which
/// starts with every rank calibrating its loop at once (`lab probe pace`). A run's every compute
/// task rides on the one calibration its rank made at start, so the pace a run meets is a draw
/// of calibration and compute together; a launch of one draw is what a run's start is.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pace {
    /// Nanoseconds of calibrated work each draw asks for.
    pub compute_ns: u64,
    /// Seconds the slowest rank took for that work, over the draws.
    pub seconds: Spread,
}

/// Seconds of an allreduce of `small_bytes` alone and while another stream runs allreduces of
/// `large_bytes` back to back (each repeat the mean over its calls): what it waits behind the
/// bytes they queued on the connections.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueBehind {
    /// Bytes of the small allreduce timed.
    pub small_bytes: u64,
    /// Bytes of each large allreduce on the second stream.
    pub large_bytes: u64,
    /// Seconds of the small allreduce alone.
    pub alone: Spread,
    /// Seconds of the small allreduce while the large ones run.
    pub beside_large: Spread,
}

impl QueueBehind {
    /// Microseconds the small allreduce waited behind the large ones' queued bytes.
    pub fn wait_us(&self) -> f64 {
        ((self.beside_large.median - self.alone.median) * 1e6).max(0.0)
    }
}

/// Seconds of one `op` of `bytes` (an allgather's gathered total): alone, and while every rank
/// computes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommBesideCompute {
    /// The collective timed.
    pub op: Op,
    /// Bytes of the collective (an allgather's gathered total).
    pub bytes: u64,
    /// Seconds of the collective alone.
    pub alone: Spread,
    /// Seconds of the collective while every rank computes.
    pub beside_compute: Spread,
}

impl ContentionPoint {
    /// Probes of one lab taken at different times, as one point: each timing's median over
    /// the probes. The machine's pace drifts over minutes (four probes in a row on a 4-node
    /// lab timed 200 ms of calibrated compute at 187, 241, 219 and 200 ms, each probe's own
    /// repeats within a few percent), so one probe samples one moment of it. `None` when
    /// `points` is empty or its probes timed different collectives.
    pub fn pooled(points: &[ContentionPoint]) -> Option<ContentionPoint> {
        let first = points.first()?;
        let sizes = |p: &ContentionPoint| p.queue.map(|q| (q.small_bytes, q.large_bytes));
        let same = points.iter().all(|p| {
            p.bytes == first.bytes
                && sizes(p) == sizes(first)
                && p.compute_ns == first.compute_ns
                && p.comm.len() == first.comm.len()
                && p.comm
                    .iter()
                    .zip(&first.comm)
                    .all(|(a, b)| a.op == b.op && a.bytes == b.bytes)
        });
        if !same {
            return None;
        }
        let pool = |field: &dyn Fn(&ContentionPoint) -> Spread| {
            Spread::pooled(&points.iter().map(field).collect::<Vec<_>>())
        };
        let comm = (0..first.comm.len())
            .map(|i| CommBesideCompute {
                alone: pool(&|p| p.comm[i].alone),
                beside_compute: pool(&|p| p.comm[i].beside_compute),
                ..first.comm[i]
            })
            .collect();
        Some(ContentionPoint {
            bytes: first.bytes,
            compute_ns: first.compute_ns,
            compute_alone: pool(&|p| p.compute_alone),
            compute_beside_comm: pool(&|p| p.compute_beside_comm),
            compute_beside_compute: pool(&|p| p.compute_beside_compute),
            comm,
            // Every probe has a queue when the first has: their sizes were compared above.
            queue: first.queue.map(|q| QueueBehind {
                alone: pool(&|p| p.queue.map_or(q.alone, |o| o.alone)),
                beside_large: pool(&|p| p.queue.map_or(q.beside_large, |o| o.beside_large)),
                ..q
            }),
            pace: {
                let paces: Vec<Spread> = points.iter().filter_map(|p| p.pace).collect();
                (!paces.is_empty()).then(|| Spread::pooled(&paces))
            },
            probes: points.iter().map(|p| p.probes).sum(),
        })
    }

    /// The probe's queue, the time of its large allreduce alone (the span a small one starts
    /// within, µs) and the simulator's cap that gives the queue's mean wait over such starts
    /// (`syncopate_sim::predict::engine::queue_cap_for_mean_wait`, µs).
    pub fn queue_cap_us(&self) -> Option<(QueueBehind, f64, f64)> {
        let queue = self.queue?;
        let large = self
            .comm
            .iter()
            .find(|c| c.op == Op::Allreduce && c.bytes == queue.large_bytes)?;
        let span_us = large.alone.median * 1e6;
        let cap_us =
            syncopate_sim::predict::engine::queue_cap_for_mean_wait(queue.wait_us(), span_us);
        Some((queue, span_us, cap_us))
    }

    /// This point with its pace from `draws` (each draw's median counts once), replacing any
    /// it had; unchanged without draws. Draws of other work than this probe's are an error.
    pub fn with_pace(mut self, draws: &[Pace]) -> Result<ContentionPoint> {
        if let Some(other) = draws.iter().find(|d| d.compute_ns != self.compute_ns) {
            return Err(ExecError::Tool {
                command: "syncopate lab probe pace".into(),
                message: format!(
                    "timed {} ns of compute where `lab probe contention` timed {} ns: both come from one syncopate build",
                    other.compute_ns, self.compute_ns
                ),
            });
        }
        if !draws.is_empty() {
            let seconds: Vec<Spread> = draws.iter().map(|d| d.seconds).collect();
            self.pace = Some(Spread::pooled(&seconds));
        }
        Ok(self)
    }

    /// Compute alone against the calibrated rate: the slowest rank's pace, from the pace probes
    /// when there are some (their draws calibrate as runs do), else from this probe's repeats.
    pub fn compute_slowdown_with_ranks(&self) -> f64 {
        let alone = self.pace.unwrap_or(self.compute_alone);
        (alone.median / (self.compute_ns as f64 / 1e9)).max(1.0)
    }

    /// Compute's slowdown while allreduces run: beside-comm over alone, at least 1.
    pub fn compute_slowdown(&self) -> f64 {
        (self.compute_beside_comm.median / self.compute_alone.median).max(1.0)
    }

    /// Compute's slowdown while a second thread computes (as compression does), at least 1.
    pub fn compression_slowdown(&self) -> f64 {
        (self.compute_beside_compute.median / self.compute_alone.median).max(1.0)
    }

    /// Collectives beside compute as `factor × alone + delay`, through the collectives timed
    /// on `ranks` ranks.
    pub fn beside_compute(&self, ranks: u32) -> syncopate_sim::Result<BesideCompute> {
        let pairs: Vec<Pair> = self
            .comm
            .iter()
            .map(|c| Pair {
                op: c.op,
                gpus: ranks,
                bytes: c.bytes,
                alone_us: c.alone.median * 1e6,
                beside_us: c.beside_compute.median * 1e6,
            })
            .collect();
        if pairs.is_empty() {
            return Err(SimError::bad_value(
                "lab probe contention",
                "its collectives",
                "none was timed",
            ));
        }
        BesideCompute::fit(&pairs, "lab probe contention")
    }
}

/// The collectives a sweep times: the two the MPI backend's exchanges run through the library.
const SWEPT_OPS: [Op; 2] = [Op::Allreduce, Op::Allgather];

/// Err naming `--op` unless a sweep times `op`.
pub fn check_swept(op: Op) -> Result<()> {
    match SWEPT_OPS.contains(&op) {
        true => Ok(()),
        false => {
            Err(SimError::bad_value("--op", op, "a sweep times allreduce or allgather").into())
        }
    }
}

/// A probe's point with the given compute and allgather-beside-compute times, for tests.
#[cfg(test)]
pub(crate) fn probed(compute_alone_s: f64, allgather_beside_s: f64) -> ContentionPoint {
    let spread = |median: f64| Spread {
        median,
        min: median * 0.9,
        max: median * 1.1,
        repeats: 7,
    };
    ContentionPoint {
        bytes: 4 << 20,
        compute_ns: 200_000_000,
        compute_alone: spread(compute_alone_s),
        compute_beside_comm: spread(0.25),
        compute_beside_compute: spread(0.4),
        comm: vec![
            CommBesideCompute {
                op: Op::Allgather,
                bytes: 64 << 10,
                alone: spread(0.002),
                beside_compute: spread(allgather_beside_s),
            },
            CommBesideCompute {
                op: Op::Allreduce,
                bytes: 4 << 20,
                alone: spread(0.036),
                beside_compute: spread(0.04),
            },
        ],
        // The small allreduce waits as long beside large ones as the allgather beside compute.
        queue: Some(QueueBehind {
            small_bytes: 4096,
            large_bytes: 4 << 20,
            alone: spread(0.0001),
            beside_large: spread(allgather_beside_s),
        }),
        pace: None,
        probes: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_probes_take_each_timings_median_over_the_probes() {
        let probes = [
            probed(0.187, 0.016),
            probed(0.241, 0.020),
            probed(0.219, 0.016),
        ];
        let pooled = ContentionPoint::pooled(&probes).unwrap();
        assert_eq!(pooled.compute_alone.median, 0.219);
        assert_eq!(pooled.compute_alone.min, 0.187 * 0.9);
        assert_eq!(pooled.compute_alone.max, 0.241 * 1.1);
        assert_eq!(pooled.compute_alone.repeats, 21);
        assert_eq!(pooled.comm[0].beside_compute.median, 0.016);
        assert_eq!(
            (pooled.comm[0].op, pooled.comm[0].bytes),
            (Op::Allgather, 64 << 10)
        );
        assert_eq!(pooled.probes, 3);
        let queue = pooled.queue.unwrap();
        assert_eq!(
            (queue.beside_large.median, queue.beside_large.repeats),
            (0.016, 21)
        );
        assert!((queue.wait_us() - 15_900.0).abs() < 1e-6);
        assert_eq!(ContentionPoint::pooled(&probes[..1]).unwrap(), probes[0]);
    }

    #[test]
    fn every_ranks_pace_comes_from_the_pace_draws_when_there_are_some() {
        let mut probes = [probed(0.2, 0.016), probed(0.24, 0.016)];
        // Two probes' medians pool to their mean, not the upper one.
        let pooled = ContentionPoint::pooled(&probes).unwrap();
        assert!((pooled.compute_slowdown_with_ranks() - 1.1).abs() < 1e-12);
        assert_eq!(pooled.pace, None);
        let draw = |median: f64| Spread {
            median,
            min: median,
            max: median,
            repeats: 1,
        };
        probes[0].pace = Some(draw(0.21));
        probes[1].pace = Some(draw(0.25));
        let pooled = ContentionPoint::pooled(&probes).unwrap();
        assert_eq!(pooled.pace.map(|p| p.repeats), Some(2));
        assert!((pooled.compute_slowdown_with_ranks() - 1.15).abs() < 1e-12);
        // This probe's own repeats still give the other slowdowns.
        assert!((pooled.compute_slowdown() - 0.25 / 0.22).abs() < 1e-12);
    }

    #[test]
    fn pace_draws_replace_the_probes_pace_and_must_time_the_same_work() {
        let point = probed(0.2, 0.016);
        let draw = |compute_ns: u64, median: f64| Pace {
            compute_ns,
            seconds: Spread {
                median,
                min: median,
                max: median,
                repeats: 1,
            },
        };
        let ns = point.compute_ns;
        let paced = point
            .clone()
            .with_pace(&[draw(ns, 0.21), draw(ns, 0.3), draw(ns, 0.25)])
            .unwrap();
        assert_eq!(paced.pace.map(|p| (p.median, p.repeats)), Some((0.25, 3)));
        assert!((paced.compute_slowdown_with_ranks() - 1.25).abs() < 1e-12);
        assert_eq!(point.clone().with_pace(&[]).unwrap(), point);
        let err = point
            .with_pace(&[draw(ns / 2, 0.1)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("100000000 ns of compute"), "{err}");
    }

    #[test]
    fn probes_of_different_collectives_or_none_do_not_pool() {
        let mut other = probed(0.2, 0.02);
        other.comm[0].bytes = 4 << 20;
        assert!(ContentionPoint::pooled(&[probed(0.2, 0.02), other]).is_none());
        let mut without_queue = probed(0.2, 0.02);
        without_queue.queue = None;
        assert!(ContentionPoint::pooled(&[probed(0.2, 0.02), without_queue]).is_none());
        assert!(ContentionPoint::pooled(&[]).is_none());
    }

    #[test]
    fn spread_has_median_min_and_max() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.repeats), (2.0, 1.0, 3.0, 3));
    }
}
