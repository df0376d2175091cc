//! Fits an MPI cluster's per-rank host cap and per-message overhead to measured allreduce times, scored by the simulator's own MPI cost model.
//!
//! Each parameter comes from the sizes that determine it: the cap from the messages of at
//! least [`RATE_REGIME_BYTES`] (each weighed by its time), then the overhead over every size
//! with that cap (mean relative error). One fit over
//! all sizes trades the large messages' rate for the small ones', and a shaped link that lets
//! small messages through on credit (a `syncopate lab`'s veths hand the shaper 64 KiB GSO
//! packets) is described by no per-message cost plus rate. Each stage searches a log-spaced
//! grid and refines the best point: a pattern search alone stalls on the plateau where the cap
//! is above what the link allows and no longer changes a prediction.

use crate::calibrate::{self, Measurement};
use crate::collective::Op;
use crate::error::{Result, SimError};
use crate::topology::{Cluster, Library};

/// Messages at least this large cross at the rate the transport sustains: 64 GSO packets, so
/// that what a shaper lets through at once is a small part of them.
pub const RATE_REGIME_BYTES: u64 = 4 << 20;

/// The fitted parameters and how well they describe the measurements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MpiFit {
    pub message_overhead_us: f64,
    /// `None` when no cap below the link's rate describes the measurements better: the MPI
    /// path keeps up with the link.
    pub host_gbps: Option<f64>,
    /// Mean relative error over every measurement, in percent.
    pub mean_error_pct: f64,
}

/// The cap's grid: 2 % steps from 4 % to 150 % of the line rate.
const CAP_STEP: f64 = 1.02;
const CAP_FROM: f64 = 0.04;
const CAP_TO: f64 = 1.5;
/// The overhead's grid: quarter decades from 0.01 µs to 100 ms.
const OVERHEAD_FROM_US: f64 = 0.01;
const OVERHEAD_TO_US: f64 = 1e5;
/// Below a hundredth of a µs the overhead no longer changes a prediction.
const MIN_OVERHEAD_US: f64 = 0.01;
/// A cap whose error is within this many percentage points of no cap at all is no cap.
const UNBOUND_TOLERANCE_PCT: f64 = 1e-6;

/// Fits `start`'s MPI `host_gbps` and `message_overhead_us` to allreduce `points`.
pub fn fit(start: &Cluster, points: &[Measurement]) -> Result<MpiFit> {
    if !matches!(start.library, Library::Mpi(_)) {
        return Err(SimError::invalid(
            &start.name,
            "library.kind",
            "only an MPI cluster's host cap and message overhead are fitted this way",
        ));
    }
    if points.is_empty() {
        return Err(SimError::invalid(
            &start.name,
            "measurements",
            "no allreduce measurement to fit to",
        ));
    }
    let large: Vec<Measurement> = points
        .iter()
        .filter(|m| m.bytes >= RATE_REGIME_BYTES)
        .copied()
        .collect();
    let rate_points = if large.len() >= 2 { &large[..] } else { points };
    let line = start.inter_node.nic_bandwidth_gbps;
    let caps = log_grid(CAP_FROM * line, CAP_TO * line, CAP_STEP);
    let overheads = log_grid(OVERHEAD_FROM_US, OVERHEAD_TO_US, 10f64.powf(0.25));
    // Stage 1: the cap, from the messages that cross at the sustained rate.
    let (rate_overhead, cap, capped) = search(&overheads, &caps, &|o, c| {
        time_error(start, rate_points, o, Some(c))
    })?;
    // No cap at all when none describes the large messages better: the path keeps up.
    let uncapped = time_error(start, rate_points, rate_overhead, None)?;
    let cap = (uncapped > capped + UNBOUND_TOLERANCE_PCT).then_some(cap);
    // Stage 2: the overhead over every size, with that cap (the cap axis is a single point).
    let (overhead, _, error) = search(&overheads, &[1.0], &|o, _| {
        mean_error(start, points, o, cap)
    })?;
    Ok(MpiFit {
        message_overhead_us: overhead,
        host_gbps: cap,
        mean_error_pct: error,
    })
}

/// What was fitted to what, for a provenance: every size's measured and fitted time.
pub fn describe(
    fitted_cluster: &Cluster,
    points: &[Measurement],
    fitted: &MpiFit,
) -> Result<String> {
    let predictions = calibrate::predict(fitted_cluster, Op::Allreduce, points)?;
    let sizes: Vec<String> = points
        .iter()
        .zip(&predictions)
        .map(|(m, p)| {
            format!(
                "{} ranks {} B: {:.1} µs (fit {:.1})",
                m.gpus,
                m.bytes,
                m.time_us,
                p.time.as_us()
            )
        })
        .collect();
    let cap = match fitted.host_gbps {
        Some(cap) => format!(
            "host_gbps {cap:.4} (from the sizes of at least {RATE_REGIME_BYTES} B, each weighed by its time)"
        ),
        None => format!(
            "no host cap (none below the link's rate describes the sizes of at least {RATE_REGIME_BYTES} B better)"
        ),
    };
    Ok(format!(
        "{cap} and message_overhead_us {:.2} (over every size) fitted with syncopate-sim's MPI cost model to fp32 allreduce times, mean |error| {:.1} %: {}",
        fitted.message_overhead_us,
        fitted.mean_error_pct,
        sizes.join(", ")
    ))
}

/// `cluster` with the fitted parameters in its MPI library.
pub fn apply(cluster: &Cluster, fitted: &MpiFit) -> Cluster {
    let mut out = cluster.clone();
    if let Library::Mpi(params) = &mut out.library {
        params.message_overhead_us = fitted.message_overhead_us;
        params.host_gbps = fitted.host_gbps;
    }
    out
}

/// Mean relative error (%) of the MPI cost model with `overhead` µs per message and a host
/// cap of `cap` Gb/s against `points`.
fn mean_error(
    start: &Cluster,
    points: &[Measurement],
    overhead: f64,
    cap: Option<f64>,
) -> Result<f64> {
    let errors = relative_errors(start, points, overhead, cap)?;
    Ok(errors.iter().sum::<f64>() / points.len() as f64 * 100.0)
}

/// The total |error| over the total measured time (%): each size weighed by its time, so that
/// the rate fits the largest messages, which carry most of a run's time.
fn time_error(
    start: &Cluster,
    points: &[Measurement],
    overhead: f64,
    cap: Option<f64>,
) -> Result<f64> {
    let errors = relative_errors(start, points, overhead, cap)?;
    let total: f64 = points.iter().map(|m| m.time_us).sum();
    let weighted: f64 = points.iter().zip(&errors).map(|(m, e)| m.time_us * e).sum();
    Ok(weighted / total * 100.0)
}

/// |predicted − measured| / measured per point.
fn relative_errors(
    start: &Cluster,
    points: &[Measurement],
    overhead: f64,
    cap: Option<f64>,
) -> Result<Vec<f64>> {
    let candidate = apply(
        start,
        &MpiFit {
            message_overhead_us: overhead,
            host_gbps: cap,
            mean_error_pct: 0.0,
        },
    );
    let predictions = calibrate::predict(&candidate, Op::Allreduce, points)?;
    Ok(points
        .iter()
        .zip(&predictions)
        .map(|(m, p)| (p.time.as_us() - m.time_us).abs() / m.time_us)
        .collect())
}

/// Values from `from` to `to` (inclusive of the first past it), each `step` times the last.
fn log_grid(from: f64, to: f64, step: f64) -> Vec<f64> {
    let mut values = vec![from];
    while let Some(&last) = values.last().filter(|&&v| v < to) {
        values.push(last * step);
    }
    values
}

/// The best (overhead, cap) of the grid `overheads` × `caps`, refined by pattern search in log
/// space with steps below the grid's spacing; a single-point `caps` stays where it is. Returns
/// (overhead, cap, score).
fn search(
    overheads: &[f64],
    caps: &[f64],
    score: &dyn Fn(f64, f64) -> Result<f64>,
) -> Result<(f64, f64, f64)> {
    let mut best = (overheads[0], caps[0], f64::INFINITY);
    for &overhead in overheads {
        for &cap in caps {
            let s = score(overhead, cap)?;
            if s < best.2 {
                best = (overhead, cap, s);
            }
        }
    }
    let (mut overhead, mut cap, mut best) = best;
    let move_cap = caps.len() > 1;
    let mut step = 0.1_f64;
    while step > 1e-4 {
        let cap_step = if move_cap { step } else { 0.0 };
        let mut improved = false;
        for (d_overhead, d_cap) in [(step, 0.0), (-step, 0.0), (0.0, cap_step), (0.0, -cap_step)] {
            let o = (overhead * f64::exp(d_overhead)).max(MIN_OVERHEAD_US);
            let c = cap * f64::exp(d_cap);
            let s = score(o, c)?;
            if s < best {
                (overhead, cap, best) = (o, c, s);
                improved = true;
            }
        }
        if !improved {
            step /= 2.0;
        }
    }
    Ok((overhead, cap, best))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{estimate, Group};
    use crate::topology::ClusterOverrides;

    fn lab() -> Cluster {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../experiments/lab-validation/clusters/lab-2n-1g.json"
        );
        Cluster::load(path, ClusterOverrides::default()).unwrap()
    }

    fn sweep(truth: &Cluster) -> Vec<Measurement> {
        [4u64 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 32 << 20]
            .iter()
            .map(|&bytes| Measurement {
                gpus: 2,
                bytes,
                time_us: estimate(truth, Op::Allreduce, bytes, Group::world(truth))
                    .unwrap()
                    .time
                    .as_us(),
            })
            .collect()
    }

    #[test]
    fn the_fit_recovers_the_models_own_parameters() {
        let truth = apply(
            &lab(),
            &MpiFit {
                message_overhead_us: 40.0,
                host_gbps: Some(0.6),
                mean_error_pct: 0.0,
            },
        );
        let fitted = fit(&lab(), &sweep(&truth)).unwrap();
        assert!(fitted.mean_error_pct < 0.5, "{fitted:?}");
        assert!(
            (fitted.message_overhead_us / 40.0 - 1.0).abs() < 0.05,
            "{fitted:?}"
        );
        assert!(
            (fitted.host_gbps.unwrap() / 0.6 - 1.0).abs() < 0.01,
            "{fitted:?}"
        );
    }

    #[test]
    fn a_path_that_keeps_up_with_the_link_has_no_cap() {
        let truth = apply(
            &lab(),
            &MpiFit {
                message_overhead_us: 20.0,
                host_gbps: None,
                mean_error_pct: 0.0,
            },
        );
        let fitted = fit(&lab(), &sweep(&truth)).unwrap();
        assert_eq!(fitted.host_gbps, None, "{fitted:?}");
        assert!(fitted.mean_error_pct < 0.5, "{fitted:?}");
    }

    #[test]
    fn a_cap_just_below_the_link_is_found_from_a_plateau() {
        // The pattern search alone stopped at a cap above the link when the truth was 4 %
        // below what the link allows (a 2-node, 0.2 Gb/s lab).
        let start = lab();
        let Library::Mpi(params) = &start.library else {
            panic!("an MPI lab")
        };
        let allowed = start.inter_node.nic_bandwidth_gbps * params.tcp_efficiency;
        let truth = apply(
            &start,
            &MpiFit {
                message_overhead_us: 5.0,
                host_gbps: Some(0.96 * allowed),
                mean_error_pct: 0.0,
            },
        );
        let fitted = fit(&start, &sweep(&truth)).unwrap();
        assert!(
            (fitted.host_gbps.unwrap() / (0.96 * allowed) - 1.0).abs() < 0.01,
            "{fitted:?}"
        );
    }

    #[test]
    fn only_mpi_clusters_are_fitted() {
        let nccl = Cluster::load("dgx-a100", ClusterOverrides::default()).unwrap();
        let err = fit(&nccl, &[]).unwrap_err().to_string();
        assert!(err.contains("library.kind"), "{err}");
        let err = fit(&lab(), &[]).unwrap_err().to_string();
        assert!(err.contains("no allreduce measurement"), "{err}");
    }
}
