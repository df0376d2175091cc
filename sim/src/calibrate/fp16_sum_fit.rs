//! gloo's cost of summing float16 elements, fitted to a sweep's fp16 allreduce rows.
//!
//! The library's fit prices an allreduce's sums by their bytes (`reduce_gbytes_per_s`). gloo
//! sums float16 one element at a time through software conversions (gloo/types.h), several times
//! slower than floats. `python -m syncopate.torch.sweep --ops allreduce,allreduce-fp16` times an
//! fp16 allreduce beside the fp32 one of the same bytes: the same bytes cross the same links in
//! the same messages, so what an fp16 row takes beyond the fp32 row of its size is what its sums
//! leave over (`collective::fp16_sum_time`: the sums on the ring's path, or what the transfer
//! does not cover). Each size gives the cost per summed element that leaves that much over; the
//! library's `fp16_sum_ns_per_element` is their median over the sizes of at least a segment of
//! gloo's largest (1 MiB) per rank: below that the segments shrink with the buffer and what their
//! sums leave over is a fraction of a millisecond, within a call's noise.

use crate::base::error::{Result, SimError};
use crate::base::limits::MAX_NS_PER_ELEMENT;
use crate::calibrate::Measurement;
use crate::collective::{self, Group};
use crate::collective_op::Op;
use crate::inputs::topology::{Cluster, Library};

/// The sweep's name for the fp16 allreduce rows.
pub const OP: &str = "allreduce-fp16";

/// One size timed in both types and the cost per summed element it implies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// The fp16 allreduce's row.
    pub fp16: Measurement,
    /// The fp32 allreduce's time at the same size, µs (the median of its rows).
    pub fp32_us: f64,
    /// The cost per summed element that leaves the fp16 row's excess over, ns.
    pub ns_per_element: f64,
}

/// The fitted cost per summed float16 element (at least 0) and the sizes it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp16SumFit {
    /// Fitted ns per element, at least 0.
    pub ns_per_element: f64,
    /// The sizes timed in both types.
    pub rows: Vec<Row>,
}

/// `cluster` with `per_element` as its gloo library's cost of a float16 sum.
fn with_cost(cluster: &Cluster, per_element: f64) -> Cluster {
    let mut out = cluster.clone();
    if let Some(params) = out.library.tcp_mut() {
        params.fp16_sum_ns_per_element = Some(per_element);
    }
    out
}

/// What the sums of an allreduce of `bytes` leave over on `cluster`, µs.
fn left_over_us(cluster: &Cluster, bytes: u64) -> f64 {
    collective::fp16_sum_us(cluster, Op::Allreduce, bytes, Group::world(cluster))
}

/// The smallest buffer the fit reads: gloo's largest segment (1 MiB) for every rank.
fn smallest_bytes(cluster: &Cluster) -> u64 {
    u64::from(cluster.world_size()) << 20
}

/// The cost per element at which an allreduce of `bytes` on `cluster` leaves `excess_us` over:
/// the time left over grows with the cost, so halving the interval finds it.
fn cost_leaving(cluster: &Cluster, bytes: u64, excess_us: f64) -> f64 {
    let (mut low, mut high) = (0.0, MAX_NS_PER_ELEMENT);
    if excess_us <= 0.0 {
        return 0.0;
    }
    if left_over_us(&with_cost(cluster, high), bytes) < excess_us {
        return f64::INFINITY;
    }
    for _ in 0..64 {
        let mid = (low + high) / 2.0;
        if left_over_us(&with_cost(cluster, mid), bytes) < excess_us {
            low = mid;
        } else {
            high = mid;
        }
    }
    (low + high) / 2.0
}

/// The cost per summed float16 element that `fp16` rows imply against the `fp32` allreduce
/// rows of the same sweep on `cluster`'s gloo, every rank of the cluster taking part; `label`
/// names the sweep in errors.
pub fn fit(
    cluster: &Cluster,
    fp16: &[Measurement],
    fp32: &[Measurement],
    label: &str,
) -> Result<Fp16SumFit> {
    if !matches!(cluster.library, Library::Gloo(_)) {
        return Err(SimError::bad_value(
            label,
            OP,
            format!(
                "`{}` runs {}; the cost of float16 sums is fitted for gloo, which sums them in software",
                cluster.name,
                cluster.library.label()
            ),
        ));
    }
    let world = cluster.world_size();
    if let Some(row) = fp16.iter().find(|r| r.gpus != world) {
        return Err(SimError::bad_value(
            label,
            format!("{OP} on {} ranks", row.gpus),
            format!(
                "the fit prices a collective over every rank: `{}` has {world}",
                cluster.name
            ),
        ));
    }
    let rows: Vec<Row> = fp16
        .iter()
        .filter(|r| r.bytes >= smallest_bytes(cluster))
        .filter_map(|&row| {
            let same: Vec<f64> = fp32
                .iter()
                .filter(|r| r.bytes == row.bytes && r.gpus == row.gpus)
                .map(|r| r.time_us)
                .collect();
            let fp32_us = crate::base::stats::median(&same)?;
            Some(Row {
                fp16: row,
                fp32_us,
                ns_per_element: cost_leaving(cluster, row.bytes, row.time_us - fp32_us),
            })
        })
        .collect();
    if let Some(row) = rows.iter().find(|r| r.ns_per_element > MAX_NS_PER_ELEMENT) {
        return Err(SimError::bad_value(
            label,
            format!("{OP} of {} B", row.fp16.bytes),
            format!(
                "took {:.1} µs beyond the fp32 allreduce's {:.1}: more than float16 sums of {MAX_NS_PER_ELEMENT} ns an element leave over",
                row.fp16.time_us - row.fp32_us,
                row.fp32_us
            ),
        ));
    }
    let costs: Vec<f64> = rows.iter().map(|r| r.ns_per_element).collect();
    let Some(median) = crate::base::stats::median(&costs) else {
        return Err(SimError::bad_value(
            label,
            OP,
            format!(
                "no fp16 allreduce row of at least {} B (gloo's largest segment for each of {world} ranks) has an fp32 `allreduce` row of the same size and ranks to be told from: time both in one sweep (`--ops allreduce,allreduce-fp16`)",
                smallest_bytes(cluster)
            ),
        ));
    };
    Ok(Fp16SumFit {
        ns_per_element: median,
        rows,
    })
}

/// `cluster` with the fitted cost in its gloo library.
pub fn apply(cluster: &Cluster, fitted: &Fp16SumFit) -> Cluster {
    with_cost(cluster, fitted.ns_per_element)
}

/// The fit in words, each size with its two times and the cost it implies, for a provenance.
pub fn describe(fitted: &Fp16SumFit) -> String {
    let rows: Vec<String> = fitted
        .rows
        .iter()
        .map(|r| {
            format!(
                "{} ranks {} B: {:.1} µs fp16, {:.1} fp32 ({:.2} ns a summed element)",
                r.fp16.gpus, r.fp16.bytes, r.fp16.time_us, r.fp32_us, r.ns_per_element
            )
        })
        .collect();
    format!(
        "fp16_sum_ns_per_element {:.2}: the median over the sizes timed in both types of the cost per summed float16 element at which gloo's ring leaves over (its segments' sums on the ring's path, or what the transfer does not cover) what the fp16 allreduce takes beyond the fp32 allreduce of as many bytes: {}",
        fitted.ns_per_element,
        rows.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::topology::ClusterOverrides;

    fn lab(name: &str) -> Cluster {
        let path = format!(
            "{}/../experiments/ddp-lab/clusters/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        Cluster::load(&path, ClusterOverrides::default()).unwrap()
    }

    fn row(gpus: u32, bytes: u64, time_us: f64) -> Measurement {
        Measurement {
            gpus,
            bytes,
            time_us,
        }
    }

    #[test]
    fn the_fit_recovers_the_cost_the_rows_were_made_with() {
        let gloo = lab("lab-2n-1g-gloo");
        let truth = with_cost(&gloo, 7.0);
        let sizes = [1u64 << 20, 4 << 20, 16 << 20];
        let fp32: Vec<Measurement> = sizes.iter().map(|&b| row(2, b, 10_000.0)).collect();
        let mut fp16: Vec<Measurement> = sizes
            .iter()
            .map(|&b| row(2, b, 10_000.0 + left_over_us(&truth, b)))
            .collect();
        // Below a 1 MiB segment for each rank, a noisy row is not read.
        fp16[0].time_us += 5_000.0;
        let fitted = fit(&gloo, &fp16, &fp32, "sweep.csv").unwrap();
        assert_eq!(fitted.rows.len(), 2);
        assert!((fitted.ns_per_element - 7.0).abs() < 1e-9, "{fitted:?}");
        let applied = apply(&gloo, &fitted);
        assert!((left_over_us(&applied, 16 << 20) - left_over_us(&truth, 16 << 20)).abs() < 0.01);
        assert!(describe(&fitted).contains("fp16_sum_ns_per_element 7.00"));
    }

    #[test]
    fn on_a_slow_link_only_the_segments_on_the_rings_path_are_left_over() {
        // 16 MiB over 2 ranks at 1 Gb/s: 16 segments of 1 MiB; one step of the ring sums one
        // segment of 512 Ki float16 elements while the transfer hides the other sums.
        let cost = with_cost(&lab("lab-2n-1g-gloo"), 7.0);
        let one_segment = (512 << 10) as f64 * 7.0 / 1e3;
        assert!((left_over_us(&cost, 16 << 20) - one_segment).abs() < 0.01);
        // On 4 ranks, three steps.
        let four = with_cost(&lab("lab-4n-1g-gloo"), 7.0);
        let segment = ((16u64 << 20) / 16 / 2) as f64 * 7.0 / 1e3;
        assert!((left_over_us(&four, 16 << 20) - 3.0 * segment).abs() < 0.01);
        // An allgather sums nothing.
        let gather = collective::fp16_sum_time(&cost, Op::Allgather, 16 << 20, Group::world(&cost));
        assert_eq!(gather.as_ns(), 0);
    }

    #[test]
    fn on_a_fast_link_the_sums_the_transfer_does_not_cover_are_left_over() {
        // At 1000 Gb/s the reduce-scatter's transfer of 16 MiB takes a fraction of its sums.
        let mut fast = with_cost(&lab("lab-2n-1g-gloo"), 7.0);
        fast.inter_node.nic_bandwidth_gbps = 1000.0;
        let transfer =
            collective::estimate(&fast, Op::ReduceScatter, 16 << 20, Group::world(&fast)).unwrap();
        let all = (4u64 << 20) as f64 * 7.0 / 1e3;
        let left = left_over_us(&fast, 16 << 20);
        assert!(left > 0.5 * all && left < all, "{left} of {all}");
        assert!(transfer.time.as_us() > all - left);
    }

    #[test]
    fn a_row_that_no_cost_explains_is_named() {
        let err = fit(
            &lab("lab-2n-1g-gloo"),
            &[row(2, 4 << 20, 1e9)],
            &[row(2, 4 << 20, 10_000.0)],
            "sweep.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("allreduce-fp16 of 4194304 B"), "{err}");
    }

    #[test]
    fn an_fp16_row_faster_than_fp32_fits_no_negative_cost() {
        let fitted = fit(
            &lab("lab-2n-1g-gloo"),
            &[row(2, 4 << 20, 9_000.0)],
            &[row(2, 4 << 20, 10_000.0)],
            "sweep.csv",
        )
        .unwrap();
        assert_eq!(fitted.ns_per_element, 0.0);
    }

    #[test]
    fn rows_without_a_partner_of_their_size_or_of_other_ranks_are_refused() {
        let gloo = lab("lab-2n-1g-gloo");
        let err = fit(
            &gloo,
            &[row(2, 4 << 20, 9_000.0)],
            &[row(2, 1 << 20, 10_000.0)],
            "sweep.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("sweep.csv") && err.contains("--ops allreduce,allreduce-fp16"));
        let err = fit(&gloo, &[row(4, 4 << 20, 9_000.0)], &[], "sweep.csv")
            .unwrap_err()
            .to_string();
        assert!(err.contains("4 ranks") && err.contains("has 2"), "{err}");
    }

    #[test]
    fn only_gloo_has_a_float16_sum_cost_to_fit() {
        for cluster in [
            Cluster::load("dgx1-v100", ClusterOverrides::default()).unwrap(),
            lab("lab-2n-1g"),
        ] {
            let err = fit(&cluster, &[], &[], "sweep.csv")
                .unwrap_err()
                .to_string();
            assert!(err.contains("fitted for gloo"), "{err}");
        }
    }
}
