//! Seeded noise: per-task lognormal jitter, per-iteration stragglers, measured skew between ranks.
//!
//! They are drawn in a fixed order so that the same seed gives the same run.

use crate::base::error::{Result, SimError};
use crate::base::limits::{is_cv, MAX_JITTER_CV, MAX_SLOWDOWN};
use crate::predict::graph::TaskGraph;
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
                    crate::base::limits::num(cv),
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
                crate::base::limits::num(self.straggler_slowdown),
                format!("must be a factor from 1 to {MAX_SLOWDOWN}"),
            ));
        }
        Ok(())
    }

    /// Prepares the factors for `ranks` ranks: each rank's generator, seeded by (seed, r),
    /// draws its stragglers, its skew from one of its own; each (task, rank)'s jitter comes from
    /// a generator keyed by (seed, rank, task) when the run asks for it
    /// ([`Noise::rank_task`]); the collectives' factors come from one generator in task order.
    pub fn draw(&self, graph: &TaskGraph, ranks: u32) -> Result<Noise> {
        if self.is_quiet() {
            return Ok(Noise::default());
        }
        let jitter = mean_one_lognormal("--jitter", self.jitter_cv)?;
        let skew = mean_one_lognormal("rank_skew.cv", self.rank_skew_cv)?;
        let iterations = graph.iterations() as usize;
        let mut slowness = Vec::with_capacity(ranks as usize * iterations);
        for rank in 0..ranks {
            let mut rng = StdRng::seed_from_u64(
                self.seed ^ (u64::from(rank) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            );
            let stragglers: Vec<bool> = (0..iterations)
                .map(|_| rng.random::<f64>() < self.straggler_probability)
                .collect();
            // Drawn from a generator of its own, so that adding the skew leaves the other
            // draws of a seed as they were.
            let mut skew_rng = StdRng::seed_from_u64(
                self.seed ^ (u64::from(rank) + 1).wrapping_mul(0xd1b5_4a32_d192_ed03),
            );
            for straggles in stragglers {
                let speed = match self.rank_skew_cv > 0.0 {
                    true => skew.sample(&mut skew_rng),
                    false => 1.0,
                };
                slowness.push(Slowness { speed, straggles });
            }
        }
        let mut rng = StdRng::seed_from_u64(self.seed);
        let per_collective = (0..graph.len())
            .map(|_| {
                if self.jitter_cv > 0.0 {
                    jitter.sample(&mut rng) as f32
                } else {
                    1.0
                }
            })
            .collect();
        let compute_iteration = graph
            .tasks()
            .iter()
            .map(|task| match task.stream {
                Stream::Compute => task.iteration,
                _ => NOT_COMPUTE,
            })
            .collect();
        Ok(Noise {
            jitter: (self.jitter_cv > 0.0).then_some(jitter),
            seed: self.seed,
            straggler_slowdown: self.straggler_slowdown,
            ranks,
            iterations,
            slowness,
            compute_iteration,
            per_collective,
        })
    }
}

/// A rank's compute in one iteration: its skew and whether it straggles.
#[derive(Clone, Copy, Debug)]
struct Slowness {
    speed: f64,
    straggles: bool,
}

/// `Noise::compute_iteration` of a task that is not compute.
const NOT_COMPUTE: u32 = u32::MAX;

/// Seeded factors on task durations (none by default): one per collective, and one per
/// (task, rank) for rank-local tasks, computed when asked for from a generator keyed by
/// (seed, rank, task), so that a run holds no factor and each is drawn in any order.
#[derive(Clone, Debug, Default)]
pub struct Noise {
    jitter: Option<LogNormal<f64>>,
    seed: u64,
    straggler_slowdown: f64,
    ranks: u32,
    iterations: usize,
    /// Per rank and iteration, rank-major.
    slowness: Vec<Slowness>,
    /// Per task, its iteration if it is compute (skew and stragglers apply).
    compute_iteration: Vec<u32>,
    /// Factors for collectives, one per task index.
    pub per_collective: Vec<f32>,
}

impl Noise {
    /// Whether every factor is 1.
    pub fn is_none(&self) -> bool {
        self.ranks == 0
    }

    /// The factor on collective `task` (1 without noise).
    pub fn collective(&self, task: u32) -> f32 {
        self.per_collective
            .get(task as usize)
            .copied()
            .unwrap_or(1.0)
    }

    /// Rank `rank`'s factor on rank-local `task` (1 without noise or outside the ranks and
    /// tasks it was drawn for).
    pub fn rank_task(&self, task: u32, rank: u32) -> f32 {
        let Some(&iteration) = self.compute_iteration.get(task as usize) else {
            return 1.0;
        };
        if rank >= self.ranks {
            return 1.0;
        }
        let mut factor = match &self.jitter {
            Some(jitter) => jitter.sample(&mut KeyedDraw::new(self.seed, rank, task)),
            None => 1.0,
        };
        if iteration != NOT_COMPUTE {
            let slowness = self.slowness[rank as usize * self.iterations + iteration as usize];
            factor *= slowness.speed;
            if slowness.straggles {
                factor *= self.straggler_slowdown;
            }
        }
        factor as f32
    }
}

/// A generator for one (seed, rank, task): SplitMix64 (Steele, Lea and Flood, "Fast
/// splittable pseudorandom number generators", OOPSLA 2014) started from the key mixed by
/// its finalizer, so that every draw needs no state but its key, in any order.
struct KeyedDraw(u64);

impl KeyedDraw {
    fn new(seed: u64, rank: u32, task: u32) -> KeyedDraw {
        let key = (u64::from(rank) << 32) | u64::from(task);
        KeyedDraw(mix(seed ^ mix(key)))
    }
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl rand::RngCore for KeyedDraw {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        rand::rand_core::impls::fill_bytes_via_next(self, dst)
    }
}

/// A lognormal with mean 1 and coefficient of variation `cv` (mu = -sigma²/2).
fn mean_one_lognormal(field: &str, cv: f64) -> Result<LogNormal<f64>> {
    let sigma = (1.0 + cv * cv).ln().sqrt();
    LogNormal::new(-sigma * sigma / 2.0, sigma)
        .map_err(|e| SimError::bad_value(field, cv, e.to_string()))
}
