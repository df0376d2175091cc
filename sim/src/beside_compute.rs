//! A TCP library's collectives slowed by compute on the same cores: the ratio of a sweep timed while every rank computes to the same sweep timed alone.
//!
//! CPU ranks run their collectives on the cores their compute uses (gloo's and MPI's progress
//! threads, the TCP stack), so a collective beside a backward pass takes longer than the same
//! collective in a sweep. `python -m syncopate.torch.sweep --beside-compute` times the sweep
//! with a computing thread on every rank; the median ratio over the sizes that move bytes is
//! the cluster's `contention.collective_slowdown_with_compute`.

use crate::collective::Op;
use crate::error::{Result, SimError};
use crate::limits::MAX_SLOWDOWN;
use crate::tcp_fit::Timed;

/// Smaller messages are latency, which the machine's scheduling makes noisy beyond use.
pub const FROM_BYTES: u64 = 64 << 10;

/// One size timed both ways.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    pub op: Op,
    pub gpus: u32,
    pub bytes: u64,
    pub alone_us: f64,
    pub beside_us: f64,
}

/// The fitted slowdown and the pairs it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Slowdown {
    /// The median ratio, at least 1: a collective is not faster beside compute, and a ratio
    /// below 1 is the machine's noise.
    pub factor: f64,
    pub pairs: Vec<Pair>,
}

/// The slowdown from the rows of at least [`FROM_BYTES`] that both sweeps time (same
/// collective, ranks and size).
pub fn fit(alone: &[Timed], beside: &[Timed]) -> Result<Slowdown> {
    let pairs: Vec<Pair> = beside
        .iter()
        .filter(|b| b.measured.bytes >= FROM_BYTES)
        .filter_map(|b| {
            let a = alone.iter().find(|a| {
                a.op == b.op
                    && a.measured.gpus == b.measured.gpus
                    && a.measured.bytes == b.measured.bytes
            })?;
            Some(Pair {
                op: b.op,
                gpus: b.measured.gpus,
                bytes: b.measured.bytes,
                alone_us: a.measured.time_us,
                beside_us: b.measured.time_us,
            })
        })
        .collect();
    if pairs.is_empty() {
        return Err(SimError::bad_value(
            "--beside-compute",
            "its rows",
            format!(
                "no collective, rank count and size of at least {} KiB is timed both there and in --compare",
                FROM_BYTES >> 10
            ),
        ));
    }
    let ratios: Vec<f64> = pairs.iter().map(|p| p.beside_us / p.alone_us).collect();
    let median = crate::stats::median(&ratios).expect("at least one pair");
    if !(median.is_finite() && median <= MAX_SLOWDOWN) {
        return Err(SimError::bad_value(
            "--beside-compute",
            crate::limits::num(median),
            format!("the median slowdown must be a factor up to {MAX_SLOWDOWN}"),
        ));
    }
    Ok(Slowdown {
        factor: median.max(1.0),
        pairs,
    })
}

/// The fit in words, every pair with its times and ratio, for a provenance.
pub fn describe(slowdown: &Slowdown) -> String {
    let pairs: Vec<String> = slowdown
        .pairs
        .iter()
        .map(|p| {
            format!(
                "{} {} ranks {} B: {:.1} µs alone, {:.1} beside compute (x{:.2})",
                p.op,
                p.gpus,
                p.bytes,
                p.alone_us,
                p.beside_us,
                p.beside_us / p.alone_us
            )
        })
        .collect();
    format!(
        "collective_slowdown_with_compute {:.3}: the median ratio (at least 1) over the sizes of at least {} KiB timed alone and with every rank computing on a thread beside: {}",
        slowdown.factor,
        FROM_BYTES >> 10,
        pairs.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::Measurement;

    fn timed(op: Op, bytes: u64, time_us: f64) -> Timed {
        Timed {
            op,
            measured: Measurement {
                gpus: 2,
                bytes,
                time_us,
            },
        }
    }

    #[test]
    fn the_median_ratio_of_sizes_timed_both_ways_from_64_kib() {
        let alone = [
            timed(Op::Allreduce, 4096, 100.0),
            timed(Op::Allreduce, 65536, 1000.0),
            timed(Op::Allreduce, 1 << 20, 8000.0),
            timed(Op::Allgather, 1 << 20, 4000.0),
        ];
        let beside = [
            // Too small to count, however slow.
            timed(Op::Allreduce, 4096, 900.0),
            timed(Op::Allreduce, 65536, 3000.0),
            timed(Op::Allreduce, 1 << 20, 9600.0),
            timed(Op::Allgather, 1 << 20, 6000.0),
            // Not timed alone: no pair.
            timed(Op::Allgather, 4 << 20, 1e6),
        ];
        let fitted = fit(&alone, &beside).unwrap();
        assert_eq!(fitted.pairs.len(), 3);
        // Ratios 3.0, 1.2 and 1.5: the median is 1.5.
        assert!((fitted.factor - 1.5).abs() < 1e-12);
        assert!(describe(&fitted).contains("allgather 2 ranks 1048576 B"));
    }

    #[test]
    fn noise_below_one_is_no_speedup_and_no_common_row_is_an_error() {
        let alone = [timed(Op::Allreduce, 1 << 20, 8000.0)];
        let faster = [timed(Op::Allreduce, 1 << 20, 7000.0)];
        assert_eq!(fit(&alone, &faster).unwrap().factor, 1.0);
        let other = [timed(Op::Allgather, 1 << 20, 7000.0)];
        let err = fit(&alone, &other).unwrap_err().to_string();
        assert!(err.contains("--beside-compute"), "{err}");
    }
}
