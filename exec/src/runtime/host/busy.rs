//! CPU busy work that reproduces a compute task's duration: a multiply-add loop, not a sleep.
//!
//! The loop's length comes from a calibration.
//!
//! The loop's rate is measured with as many threads running it at once as there are ranks,
//! since in backward every rank computes at the same time; contention with the compression and
//! communication threads then lengthens compute for real, as it does on a GPU.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Multiply-adds per unit of work: 64 independent accumulators × 16 steps.
const UNIT_STEPS: usize = 16;

/// Rounds of a calibration; the median is kept. A round that the scheduler interrupts (a
/// shared machine) is an outlier, not the rate.
const ROUNDS: usize = 7;

/// How long a rank process calibrates (MPI backend, lab probes): every compute of its run
/// scales with the rate, so a few hundred ms against runs of seconds.
const PROCESS_CALIBRATION: Duration = Duration::from_millis(350);

/// A calibrated busy loop.
#[derive(Clone, Copy, Debug)]
pub struct BusyWork {
    /// Nanoseconds one unit of work takes on one thread, with the calibration's threads running.
    pub ns_per_unit: f64,
}

fn run_units(units: u64) {
    let mut acc = [1.0f32; 64];
    let (a, b) = (black_box(0.999_999f32), black_box(1e-7f32));
    for _ in 0..units {
        for _ in 0..UNIT_STEPS {
            for x in acc.iter_mut() {
                *x = *x * a + b;
            }
        }
    }
    black_box(&acc);
}

impl BusyWork {
    /// Measures the loop with `threads` concurrent copies for about `budget` and keeps the
    /// median per-thread rate of [`ROUNDS`] rounds.
    pub fn calibrate(threads: u32, budget: Duration) -> BusyWork {
        let threads = threads.max(1);
        // Size a round from a quick single-thread probe.
        let probe_units = 64;
        let start = Instant::now();
        run_units(probe_units);
        let probe = start.elapsed().as_nanos().max(1) as f64 / probe_units as f64;
        let units = ((budget.as_nanos() as f64 / ROUNDS as f64 / probe) as u64).max(16);
        let mut rates: Vec<f64> = (0..ROUNDS)
            .map(|_| {
                let per_thread: Vec<f64> = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..threads)
                        .map(|_| {
                            scope.spawn(move || {
                                let start = Instant::now();
                                run_units(units);
                                start.elapsed().as_nanos() as f64 / units as f64
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("a calibration thread"))
                        .collect()
                });
                per_thread.iter().sum::<f64>() / per_thread.len() as f64
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        BusyWork {
            ns_per_unit: rates[ROUNDS / 2],
        }
    }

    /// The calibration of a rank process (MPI backend, lab probes): one thread, since every
    /// rank is a process of its own, over [`PROCESS_CALIBRATION`].
    pub fn for_rank_process() -> BusyWork {
        BusyWork::calibrate(1, PROCESS_CALIBRATION)
    }

    /// Works for about `ns` nanoseconds at the calibrated rate.
    pub fn run_for(&self, ns: u64) {
        run_units((ns as f64 / self.ns_per_unit).round() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibrated_work_takes_about_the_asked_time() {
        let busy = BusyWork::calibrate(1, Duration::from_millis(30));
        let start = Instant::now();
        busy.run_for(20_000_000);
        let took = start.elapsed().as_secs_f64();
        // Shared CI machines are noisy: only the order of magnitude is a stable property.
        assert!(took > 0.005 && took < 0.2, "20 ms of work took {took} s");
    }
}
