//! Seeded noise: per-task lognormal jitter and per-iteration stragglers, drawn in a fixed order
//! so that the same seed gives the same run.

use crate::engine::Noise;
use crate::error::{Result, SimError};
use crate::graph::TaskGraph;
use crate::limits::{MAX_JITTER_CV, MAX_SLOWDOWN};
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
    pub straggler_slowdown: f64,
    pub seed: u64,
}

impl Default for NoiseSpec {
    fn default() -> Self {
        NoiseSpec {
            jitter_cv: 0.0,
            straggler_probability: 0.0,
            straggler_slowdown: 1.0,
            seed: 1,
        }
    }
}

impl NoiseSpec {
    pub fn is_quiet(&self) -> bool {
        self.jitter_cv == 0.0 && self.straggler_probability == 0.0
    }

    pub fn validate(&self) -> Result<()> {
        if !(self.jitter_cv.is_finite() && (0.0..=MAX_JITTER_CV).contains(&self.jitter_cv)) {
            return Err(SimError::bad_value(
                "--jitter",
                crate::limits::num(self.jitter_cv),
                format!("the coefficient of variation is 0 to {MAX_JITTER_CV}"),
            ));
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
    /// collectives from their own generator, each in task order.
    pub fn draw(&self, graph: &TaskGraph, ranks: u32) -> Result<Noise> {
        if self.is_quiet() {
            return Ok(Noise::default());
        }
        let sigma = (1.0 + self.jitter_cv * self.jitter_cv).ln().sqrt();
        // A lognormal with mean 1: mu = -sigma²/2.
        let jitter = LogNormal::new(-sigma * sigma / 2.0, sigma)
            .map_err(|e| SimError::bad_value("--jitter", self.jitter_cv, e.to_string()))?;
        let tasks = graph.len();
        let mut per_rank_task = Vec::with_capacity(ranks as usize * tasks);
        for rank in 0..ranks {
            let mut rng = StdRng::seed_from_u64(
                self.seed ^ (u64::from(rank) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            );
            let stragglers: Vec<bool> = (0..graph.iterations())
                .map(|_| rng.random::<f64>() < self.straggler_probability)
                .collect();
            for t in 0..tasks as u32 {
                let task = graph.task(t);
                let mut factor = if self.jitter_cv > 0.0 {
                    jitter.sample(&mut rng)
                } else {
                    1.0
                };
                if task.stream == Stream::Compute && stragglers[task.iteration as usize] {
                    factor *= self.straggler_slowdown;
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
        })
    }
}
