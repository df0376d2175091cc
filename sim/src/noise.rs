//! Seeded noise: per-task lognormal jitter, per-iteration stragglers, measured skew between ranks.
//!
//! They are drawn in a fixed order so that the same seed gives the same run.

use crate::engine::Noise;
use crate::error::{Result, SimError};
use crate::graph::TaskGraph;
use crate::limits::{is_cv, MAX_JITTER_CV, MAX_SLOWDOWN};
use crate::schedule::Stream;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};

/// What randomness to add to a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoiseSpec {
    /// Coefficient of variation of every task's duration (lognormal with mean 1); 0 for none.
    pub jitter_cv: f64,
    /// Each rank is a straggler in an iteration with this probability; its compute then takes
    /// `straggler_slowdown` times longer.
    pub straggler_probability: f64,
    /// Factor a straggler's compute time is multiplied by (1: no slowdown).
    pub straggler_slowdown: f64,
    /// Coefficient of variation of each rank's compute per iteration (lognormal with mean 1,
    /// one factor for all of a rank's compute in an iteration): the model profile's measured
    /// `rank_skew`; 0 for none.
    pub rank_skew_cv: f64,
    /// Seed of every draw: the same seed gives the same run.
    pub seed: u64,
}

impl Default for NoiseSpec {
    fn default() -> Self {
        NoiseSpec {
            jitter_cv: 0.0,
            straggler_probability: 0.0,
            straggler_slowdown: 1.0,
            rank_skew_cv: 0.0,
            seed: 1,
        }
    }
}

impl NoiseSpec {
    /// Whether the spec adds no randomness: no jitter, stragglers or rank skew.
    pub fn is_quiet(&self) -> bool {
        self.jitter_cv == 0.0 && self.straggler_probability == 0.0 && self.rank_skew_cv == 0.0
    }

    /// Checks that the coefficients of variation, straggler probability and slowdown are in
    /// range.
    pub fn validate(&self) -> Result<()> {
        for (field, cv) in [
            ("--jitter", self.jitter_cv),
            ("rank_skew.cv", self.rank_skew_cv),
        ] {
            if !is_cv(cv) {
                return Err(SimError::bad_value(
                    field,
                    crate::limits::num(cv),
                    format!("the coefficient of variation is 0 to {MAX_JITTER_CV}"),
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.straggler_probability) {
            return Err(SimError::bad_value(
                "--straggler probability",
                self.straggler_probability,
                "must be in [0, 1]",
            ));
        }
        if !(self.straggler_slowdown.is_finite()
            && (1.0..=MAX_SLOWDOWN).contains(&self.straggler_slowdown))
        {
            return Err(SimError::bad_value(
                "--straggler slowdown",
                crate::limits::num(self.straggler_slowdown),
                format!("must be a factor from 1 to {MAX_SLOWDOWN}"),
            ));
        }
        Ok(())
    }

    /// Draws the factors for `ranks` ranks: rank r's tasks from a generator seeded by (seed, r),
    /// collectives from their own generator, each in task order (stored task-major).
    pub fn draw(&self, graph: &TaskGraph, ranks: u32) -> Result<Noise> {
        if self.is_quiet() {
            return Ok(Noise::default());
        }
        let jitter = mean_one_lognormal("--jitter", self.jitter_cv)?;
        let skew = mean_one_lognormal("rank_skew.cv", self.rank_skew_cv)?;
        let tasks = graph.len();
        // Each rank's generator draws its stragglers, then its tasks in task order; the ranks
        // take turns task by task, so that the factors are written task-major in one pass.
        let mut drawers: Vec<(StdRng, Vec<bool>, Vec<f64>)> = (0..ranks)
            .map(|rank| {
                let mut rng = StdRng::seed_from_u64(
                    self.seed ^ (u64::from(rank) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                );
                let stragglers: Vec<bool> = (0..graph.iterations())
                    .map(|_| rng.random::<f64>() < self.straggler_probability)
                    .collect();
                // Drawn from a generator of its own, so that adding the skew leaves the other
                // draws of a seed as they were.
                let mut skew_rng = StdRng::seed_from_u64(
                    self.seed ^ (u64::from(rank) + 1).wrapping_mul(0xd1b5_4a32_d192_ed03),
                );
                let speed: Vec<f64> = (0..graph.iterations())
                    .map(|_| {
                        if self.rank_skew_cv > 0.0 {
                            skew.sample(&mut skew_rng)
                        } else {
                            1.0
                        }
                    })
                    .collect();
                (rng, stragglers, speed)
            })
            .collect();
        let mut per_rank_task = Vec::with_capacity(ranks as usize * tasks);
        for t in 0..tasks as u32 {
            let task = graph.task(t);
            let iteration = task.iteration as usize;
            for (rng, stragglers, speed) in &mut drawers {
                let mut factor = if self.jitter_cv > 0.0 {
                    jitter.sample(rng)
                } else {
                    1.0
                };
                if task.stream == Stream::Compute {
                    factor *= speed[iteration];
                    if stragglers[iteration] {
                        factor *= self.straggler_slowdown;
                    }
                }
                per_rank_task.push(factor as f32);
            }
        }
        let mut rng = StdRng::seed_from_u64(self.seed);
        let per_collective = (0..tasks)
            .map(|_| {
                if self.jitter_cv > 0.0 {
                    jitter.sample(&mut rng) as f32
                } else {
                    1.0
                }
            })
            .collect();
        Ok(Noise {
            per_rank_task,
            per_collective,
            ranks,
        })
    }
}

/// A lognormal with mean 1 and coefficient of variation `cv` (mu = -sigma²/2).
fn mean_one_lognormal(field: &str, cv: f64) -> Result<LogNormal<f64>> {
    let sigma = (1.0 + cv * cv).ln().sqrt();
    LogNormal::new(-sigma * sigma / 2.0, sigma)
        .map_err(|e| SimError::bad_value(field, cv, e.to_string()))
}
