//! A TCP library's collectives slowed by compute on the same cores.
//!
//! They are described by lines through the times of a sweep run alone and of the same sweep run
//! while every rank computes.
//!
//! CPU ranks run their collectives on the cores their compute uses (gloo's and MPI's progress
//! threads, the TCP stack), so a collective beside a backward pass takes longer than the same
//! collective in a sweep, in two ways: every round of it waits for its progress thread to be
//! scheduled (a delay whatever its size: a 64 KiB MPI allreduce on 4 ranks sharing 2 cores
//! took 3.0 ms alone and 34.4 ms beside compute), and its transfer runs somewhat slower. So
//! `beside = factor × alone + delay`: the line through the allreduces gives the factor
//! (`contention.collective_slowdown_with_compute`) and their delay
//! (`collective_delay_with_compute_us`); an allgather, whose rounds differ, has a delay of its
//! own beyond the same factor (`allgather_delay_with_compute_us`). `python -m
//! syncopate.torch.sweep --beside-compute` times gloo's; `syncopate lab probe contention` times
//! MPI's. The sweep also times the other way round, compute slowed by the library's calls
//! ([`compute_slowdown`]).

use crate::base::error::{Result, SimError};
use crate::base::limits::{MAX_DURATION_US, MAX_SLOWDOWN};
use crate::calibrate::tcp_fit::Timed;
use crate::calibrate::{has_column, read_named_column};
use crate::collective_op::Op;
use crate::inputs::topology::ClusterContention;
use std::path::Path;

/// Smaller messages are latency, which the machine's scheduling makes noisy beyond use.
pub const FROM_BYTES: u64 = 64 << 10;

/// One size timed both ways.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    /// The collective timed.
    pub op: Op,
    /// Ranks the collective ran over.
    pub gpus: u32,
    /// Bytes of the collective, as the sweep counts them.
    pub bytes: u64,
    /// Time alone, µs.
    pub alone_us: f64,
    /// Time while every rank computes, µs.
    pub beside_us: f64,
}

/// The fit and the pairs it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepFit {
    /// The fit through `pairs`.
    pub fit: BesideCompute,
    /// The sizes timed both alone and beside compute.
    pub pairs: Vec<Pair>,
    /// Compute slowed by the allreduces, where the sweep beside compute measured it.
    pub compute: Option<ComputeSlowdown>,
}

impl SweepFit {
    /// Writes what was measured into `contention` (see [`BesideCompute::apply_to`]), and the
    /// compute's slowdown beside collectives where it was measured.
    pub fn apply_to(&self, contention: &mut ClusterContention) {
        self.fit.apply_to(contention);
        if let Some(compute) = &self.compute {
            contention.compute_slowdown_with_collective = compute.factor;
        }
    }
}

/// What compute on the same cores adds to a collective.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BesideCompute {
    /// The allreduces' line (every pair's, when none is an allreduce).
    pub line: Line,
    /// The allgathers' delay beyond `line.factor`, when allgathers were timed.
    pub allgather_delay_us: Option<f64>,
}

impl BesideCompute {
    /// Through `pairs` (at least one); errors name `what`.
    pub fn fit(pairs: &[Pair], what: &str) -> Result<BesideCompute> {
        let times = |op: Option<Op>| -> Vec<(f64, f64)> {
            pairs
                .iter()
                .filter(|p| op.is_none_or(|op| p.op == op))
                .map(|p| (p.alone_us, p.beside_us))
                .collect()
        };
        let allreduces = times(Some(Op::Allreduce));
        let line = match allreduces.is_empty() {
            true => Line::fit(&times(None), what)?,
            false => Line::fit(&allreduces, what)?,
        };
        let allgathers = times(Some(Op::Allgather));
        let allgather_delay_us = match allgathers.is_empty() {
            true => None,
            false => Some(line.delay_beyond(&allgathers, what)?),
        };
        Ok(BesideCompute {
            line,
            allgather_delay_us,
        })
    }

    /// Writes the fit into `contention`'s three fields for collectives beside compute (an
    /// allgather delay that was not timed is left out: allgathers then pay the allreduces').
    pub fn apply_to(&self, contention: &mut ClusterContention) {
        contention.collective_slowdown_with_compute = self.line.factor;
        contention.collective_delay_with_compute_us = self.line.delay_us;
        contention.allgather_delay_with_compute_us = self.allgather_delay_us;
    }

    /// The fit in words, for a provenance.
    pub fn describe(&self) -> String {
        let allgather = self.allgather_delay_us.map_or(String::new(), |d| {
            format!(", allgather_delay_with_compute_us {d:.1} (the allgathers' mean time beyond the factor, weighed likewise)")
        });
        format!("{}{allgather}", self.line.describe())
    }
}

/// `beside = factor × alone + delay_us`, with `factor` at least 1 and `delay_us` at least 0:
/// a collective is not faster beside compute, and a line that says so fits the machine's noise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Line {
    /// Factor on the time alone, at least 1.
    pub factor: f64,
    /// Delay added whatever the size, µs, at least 0.
    pub delay_us: f64,
}

impl Line {
    /// The line through `(alone, beside)` times (µs, at least one pair, all positive), fitted
    /// by least squares on relative errors (each pair weighed by 1 / alone², so that the
    /// largest sizes' noise does not swamp the delay the small ones show). Err names `what`
    /// when the fit is out of range.
    pub fn fit(times: &[(f64, f64)], what: &str) -> Result<Line> {
        let (mut w, mut a, mut b, mut aa, mut ab) = (0.0, 0.0, 0.0, 0.0, 0.0);
        // Unweighted, for a line through the origin.
        let (mut plain_aa, mut plain_ab) = (0.0, 0.0);
        for &(alone, beside) in times {
            let weight = 1.0 / (alone * alone);
            w += weight;
            a += weight * alone;
            b += weight * beside;
            aa += weight * alone * alone;
            ab += weight * alone * beside;
            plain_aa += alone * alone;
            plain_ab += alone * beside;
        }
        let spread = w * aa - a * a;
        // One size (or sizes whose times are all alike) cannot tell a delay from a factor.
        let (mut factor, mut delay) = match spread > 1e-9 * w * aa {
            true => {
                let factor = (w * ab - a * b) / spread;
                (factor, (b - factor * a) / w)
            }
            false => (ab / aa, 0.0),
        };
        if factor < 1.0 {
            factor = 1.0;
            delay = (b - a) / w;
        }
        if delay < 0.0 {
            // No delay (a small size measured no slower beside compute): the factor of the
            // line through the origin, by absolute errors, which the large sizes' slowed
            // transfers set rather than the small sizes' noise.
            delay = 0.0;
            factor = (plain_ab / plain_aa).max(1.0);
        }
        if !(factor.is_finite() && factor <= MAX_SLOWDOWN) {
            return Err(SimError::bad_value(
                what,
                crate::base::limits::num(factor),
                format!("the slowdown of collectives beside compute must be a factor up to {MAX_SLOWDOWN}"),
            ));
        }
        Ok(Line {
            factor,
            delay_us: checked_delay(delay, what)?,
        })
    }

    /// The mean of `beside − factor × alone` over `times` (weighed by 1 / alone², at least 0):
    /// the delay of an operation whose rounds differ, beyond this line's factor.
    pub fn delay_beyond(&self, times: &[(f64, f64)], what: &str) -> Result<f64> {
        let (mut weights, mut sum) = (0.0, 0.0);
        for &(alone, beside) in times {
            let weight = 1.0 / (alone * alone);
            weights += weight;
            sum += weight * (beside - self.factor * alone);
        }
        checked_delay((sum / weights).max(0.0), what)
    }

    /// The line in words, for a provenance.
    pub fn describe(&self) -> String {
        format!(
            "collective_slowdown_with_compute {:.3} and collective_delay_with_compute_us {:.1}: the line beside = factor × alone + delay (factor at least 1, delay at least 0) fitted by least squares on relative errors",
            self.factor, self.delay_us
        )
    }
}

/// `delay` (µs), unless it is not a duration (errors name `what`).
fn checked_delay(delay: f64, what: &str) -> Result<f64> {
    if delay.is_finite() && (0.0..=MAX_DURATION_US).contains(&delay) {
        return Ok(delay);
    }
    Err(SimError::bad_value(
        what,
        crate::base::limits::num(delay),
        format!("the delay of a collective beside compute must be 0 to {MAX_DURATION_US:e} µs"),
    ))
}

/// The fit through the rows of at least [`FROM_BYTES`] that both sweeps time (same
/// collective, ranks and size).
pub fn fit(alone: &[Timed], beside: &[Timed]) -> Result<SweepFit> {
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
    Ok(SweepFit {
        fit: BesideCompute::fit(&pairs, "--beside-compute")?,
        pairs,
        compute: None,
    })
}

/// The column of a sweep beside compute that says, per size, how much its calls slowed the
/// compute beside them: the compute's rate alone over its rate during the calls.
pub const COMPUTE_SLOWDOWN_COLUMN: &str = "compute_slowdown";

/// The sizes whose slowdown counts: a framework's buckets are seldom smaller, and a smaller
/// size's calls take a short window, which this machine's scheduling makes noisy (at 64 KiB on
/// the 2-node lab of 2026-11-30: 1.21, against 1.13 at 1 MiB). A lab's default sweep beside
/// compute (`BESIDE_COMPUTE_SIZES`) times two such sizes, 1 and 4 MiB.
pub const COMPUTE_SLOWDOWN_FROM_BYTES: u64 = 1 << 20;

/// Compute slowed by the library's allreduces, as a sweep beside compute measured it.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeSlowdown {
    /// The median over the allreduce sizes of at least [`COMPUTE_SLOWDOWN_FROM_BYTES`], at
    /// least 1 (`contention.compute_slowdown_with_collective`).
    pub factor: f64,
    /// Those sizes: (ranks, bytes, slowdown).
    pub sizes: Vec<(u32, u64, f64)>,
}

impl ComputeSlowdown {
    /// The measurement in words, for a provenance.
    pub fn describe(&self) -> String {
        let sizes: Vec<String> = self
            .sizes
            .iter()
            .map(|(ranks, bytes, s)| format!("allreduce {ranks} ranks {bytes} B: x{s:.3}"))
            .collect();
        format!(
            "compute_slowdown_with_collective {:.3}: the median over the allreduces of at least {} MiB of how much their calls slowed the compute beside them (`{COMPUTE_SLOWDOWN_COLUMN}`: the compute's rate alone over its rate during the size's calls, warm-up and barriers included, the ranks' mean), {}",
            self.factor,
            COMPUTE_SLOWDOWN_FROM_BYTES >> 20,
            sizes.join(", ")
        )
    }
}

/// What the sweep beside compute at `path` measured of compute slowed by its allreduces; None
/// for a sweep without the column (written before it was measured). Rows without `gpus` take
/// `default_gpus`.
pub fn compute_slowdown(path: &Path, default_gpus: u32) -> Result<Option<ComputeSlowdown>> {
    if !has_column(path, COMPUTE_SLOWDOWN_COLUMN)? {
        return Ok(None);
    }
    // The reader keeps a row's chosen column in `time_us`: here, its slowdown. It skips a
    // value that is not a positive number (a compute thread that got no core at all).
    let mut sizes: Vec<(u32, u64, f64)> = read_named_column(
        path,
        Op::Allreduce.name(),
        COMPUTE_SLOWDOWN_COLUMN,
        default_gpus,
    )?
    .into_iter()
    .filter(|m| m.bytes >= COMPUTE_SLOWDOWN_FROM_BYTES)
    .map(|m| (m.gpus, m.bytes, m.time_us))
    .collect();
    if sizes.is_empty() {
        return Err(SimError::bad_value(
            "--beside-compute",
            path.display(),
            format!(
                "has a `{COMPUTE_SLOWDOWN_COLUMN}` column but no allreduce of at least {} MiB with a finite, positive one",
                COMPUTE_SLOWDOWN_FROM_BYTES >> 20
            ),
        ));
    }
    let values: Vec<f64> = sizes.iter().map(|s| s.2).collect();
    let median = crate::base::stats::median(&values).expect("sizes is not empty");
    if median > MAX_SLOWDOWN {
        return Err(SimError::bad_value(
            "--beside-compute",
            path.display(),
            format!(
                "its allreduces' median `{COMPUTE_SLOWDOWN_COLUMN}` is {}: the slowdown of compute beside collectives must be a factor up to {MAX_SLOWDOWN}",
                crate::base::limits::num(median)
            ),
        ));
    }
    sizes.sort_by_key(|s| (s.0, s.1));
    // Compute is not faster beside collectives: a median below 1 is the machine's noise.
    Ok(Some(ComputeSlowdown {
        factor: median.max(1.0),
        sizes,
    }))
}

/// The fit in words, every pair with its times and ratio, for a provenance.
pub fn describe(slowdown: &SweepFit) -> String {
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
    let compute = slowdown
        .compute
        .as_ref()
        .map_or(String::new(), |c| format!("; {}", c.describe()));
    format!(
        "{} to the sizes of at least {} KiB timed alone and with every rank computing on a thread beside: {}{compute}",
        slowdown.fit.describe(),
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
    fn a_factor_and_a_delay_from_the_sizes_timed_both_ways_from_64_kib() {
        let alone = [
            timed(Op::Allreduce, 4096, 100.0),
            timed(Op::Allreduce, 65536, 1000.0),
            timed(Op::Allreduce, 1 << 20, 8000.0),
            timed(Op::Allgather, 1 << 20, 4000.0),
        ];
        // 1.2 × alone + 2000 µs.
        let beside = [
            // Too small to count, however slow.
            timed(Op::Allreduce, 4096, 900.0),
            timed(Op::Allreduce, 65536, 3200.0),
            timed(Op::Allreduce, 1 << 20, 11600.0),
            timed(Op::Allgather, 1 << 20, 6800.0),
            // Not timed alone: no pair.
            timed(Op::Allgather, 4 << 20, 1e6),
        ];
        let fitted = fit(&alone, &beside).unwrap();
        assert_eq!(fitted.pairs.len(), 3);
        let line = fitted.fit.line;
        assert!((line.factor - 1.2).abs() < 1e-9, "{fitted:?}");
        assert!((line.delay_us - 2000.0).abs() < 1e-6, "{fitted:?}");
        // The allgather: 6800 − 1.2 × 4000.
        let allgather = fitted.fit.allgather_delay_us.unwrap();
        assert!((allgather - 2000.0).abs() < 1e-6, "{fitted:?}");
        let text = describe(&fitted);
        assert!(text.contains("allgather 2 ranks 1048576 B"), "{text}");
        assert!(
            text.contains("collective_delay_with_compute_us 2000.0"),
            "{text}"
        );
        assert!(
            text.contains("allgather_delay_with_compute_us 2000.0"),
            "{text}"
        );
    }

    #[test]
    fn a_line_that_says_faster_is_clamped_to_no_speedup() {
        // A delay with a slope below 1 (the largest size's noise): slope 1, the delay the
        // relative errors weigh.
        let line = Line::fit(&[(1000.0, 6000.0), (100_000.0, 102_000.0)], "x").unwrap();
        assert_eq!(line.factor, 1.0);
        assert!((line.delay_us - 5000.0).abs() < 1.0, "{line:?}");
        // Faster beside compute at every size: neither slower nor delayed.
        let line = Line::fit(&[(1000.0, 900.0), (8000.0, 7000.0)], "x").unwrap();
        assert_eq!((line.factor, line.delay_us), (1.0, 0.0));
        // A small size no slower beside compute: no delay, and the factor the large size's
        // slowed transfer sets (1.15), not the mean of the ratios (0.98).
        let line = Line::fit(&[(1000.0, 800.0), (100_000.0, 115_000.0)], "x").unwrap();
        assert_eq!(line.delay_us, 0.0);
        assert!((line.factor - 1.15).abs() < 1e-3, "{line:?}");
        // One size cannot tell a delay from a factor: the ratio.
        let line = Line::fit(&[(8000.0, 12000.0)], "x").unwrap();
        assert_eq!((line.factor, line.delay_us), (1.5, 0.0));
    }

    #[test]
    fn no_common_row_and_absurd_slowdowns_are_errors() {
        let alone = [timed(Op::Allreduce, 1 << 20, 8000.0)];
        let other = [timed(Op::Allgather, 1 << 20, 7000.0)];
        let err = fit(&alone, &other).unwrap_err().to_string();
        assert!(err.contains("--beside-compute"), "{err}");
        let err = Line::fit(&[(1.0, 1e9)], "--beside-compute")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--beside-compute"), "{err}");
    }

    /// `text` as a sweep beside compute in a file of its own.
    fn sweep_file(name: &str, text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!(
            "syncopate-beside-{}-{name}.csv",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn compute_slowdown_is_the_median_of_the_allreduces_from_1_mib() {
        let path = sweep_file(
            "median",
            "op,gpus,size_bytes,time_us,compute_slowdown\n\
             allreduce,4,65536,13000.0,1.050\n\
             allreduce,4,1048576,25000.0,1.300\n\
             allreduce,4,4194304,62000.0,1.400\n\
             allreduce,4,16777216,230000.0,1.350\n\
             allgather,4,4194304,44000.0,2.000\n",
        );
        let measured = compute_slowdown(&path, 4).unwrap().unwrap();
        // 64 KiB and the allgather are left out.
        assert_eq!(measured.factor, 1.35);
        assert_eq!(
            measured.sizes.iter().map(|s| s.1).collect::<Vec<_>>(),
            [1 << 20, 4 << 20, 16 << 20]
        );
        assert!(
            measured.describe().contains("1.350"),
            "{}",
            measured.describe()
        );
        let mut contention: ClusterContention = serde_json::from_value(serde_json::json!({
            "compute_slowdown_with_collective": 1.11,
            "compute_slowdown_with_compression": 1.0,
            "collective_slowdown_with_compute": 1.0,
            "provenance": {"status": "measured", "method": "m"}
        }))
        .unwrap();
        let sweep = SweepFit {
            fit: BesideCompute::fit(
                &[Pair {
                    op: Op::Allreduce,
                    gpus: 4,
                    bytes: 1 << 20,
                    alone_us: 10.0,
                    beside_us: 12.0,
                }],
                "x",
            )
            .unwrap(),
            pairs: Vec::new(),
            compute: Some(measured),
        };
        sweep.apply_to(&mut contention);
        assert_eq!(contention.compute_slowdown_with_collective, 1.35);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_sweep_without_the_column_measured_nothing_and_one_without_its_rows_is_an_error() {
        let old = sweep_file(
            "old",
            "op,gpus,size_bytes,time_us\nallreduce,2,1048576,25000.0\n",
        );
        assert_eq!(compute_slowdown(&old, 2).unwrap(), None);
        let small = sweep_file(
            "small",
            "op,gpus,size_bytes,time_us,compute_slowdown\nallreduce,2,65536,13000.0,1.2\n",
        );
        let err = compute_slowdown(&small, 2).unwrap_err().to_string();
        assert!(
            err.contains("--beside-compute") && err.contains("compute_slowdown"),
            "{err}"
        );
        // Nor does one whose allreduces have no finite value, or that timed no allreduce.
        let none_finite = sweep_file(
            "inf",
            "op,gpus,size_bytes,time_us,compute_slowdown\nallreduce,2,1048576,25000.0,inf\nallgather,2,1048576,9.0,1.2\n",
        );
        let err = compute_slowdown(&none_finite, 2).unwrap_err().to_string();
        assert!(err.contains("--beside-compute"), "{err}");
        std::fs::remove_file(none_finite).unwrap();
        // Noise below 1 is no speed-up; an absurd factor is an error.
        let faster = sweep_file(
            "faster",
            "op,gpus,size_bytes,time_us,compute_slowdown\nallreduce,2,1048576,25000.0,0.97\n",
        );
        assert_eq!(compute_slowdown(&faster, 2).unwrap().unwrap().factor, 1.0);
        let absurd = sweep_file(
            "absurd",
            "op,gpus,size_bytes,time_us,compute_slowdown\nallreduce,2,1048576,25000.0,1e9\n",
        );
        let err = compute_slowdown(&absurd, 2).unwrap_err().to_string();
        assert!(err.contains("--beside-compute"), "{err}");
        for path in [old, small, faster, absurd] {
            std::fs::remove_file(path).unwrap();
        }
    }
}
