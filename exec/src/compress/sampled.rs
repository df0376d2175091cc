//! Sampled-threshold sparsifiers: DGC and GradDrop.
//!
//! DGC takes a strided 1% sample, adapted to ±20% of k; GradDrop a random 0.1% sample.
//!
//! Wire format (both): u32 count c ≤ k, then k u32 index slots, then k f32 value slots; slots
//! from c on are zero. A fixed size keeps the allgather uniform across workers, as DGC's
//! implementation does by truncating to `num_selects`.

use super::rng::Rng;
use super::scan::check_all;
use super::sparse::{
    collect_at_least, emit, emit_all, emit_k_largest, kth_largest, scatter_add, Candidates,
};
use super::wire::{bad_payload, expect_len, get_u32};
use super::{not_in_family, Build, Codec};
use crate::error::Result;
use syncopate_sim::compress::{sparse_count, Compressor};

const ABS: u32 = 0x7FFF_FFFF;
/// DGC's sample ratio (1%) and GradDrop's (0.1%, Aji & Heafield).
const DGC_SAMPLE_RATIO: f64 = 0.01;
const GRADDROP_SAMPLE_RATIO: f64 = 0.001;
/// DGC accepts a selected count within these factors of k, else moves the threshold.
const LOWER_BOUND: f64 = 0.8;
const UPPER_BOUND: f64 = 1.2;
const MAX_ADAPTATIONS: usize = 10;

/// How the threshold is estimated.
#[derive(Clone, Copy, Debug)]
pub enum Sampling {
    /// DGC: a strided 1% sample, its threshold adapted until the count is within ±20% of k.
    Dgc,
    /// GradDrop: a random 0.1% sample, its threshold used without adaptation.
    GradDrop,
}

pub(crate) fn codec(build: &Build) -> Box<dyn Codec> {
    let c = build.compressor;
    let (ratio, sampling) = match c {
        Compressor::Dgc { ratio } => (ratio, Sampling::Dgc),
        Compressor::GradDrop { ratio } => (ratio, Sampling::GradDrop),
        other => not_in_family(other, "sampled"),
    };
    Box::new(Sampled {
        c,
        ratio,
        sampling,
        rng: Rng::new(build.seed),
        cand: Candidates::default(),
    })
}

struct Sampled {
    c: Compressor,
    ratio: f64,
    sampling: Sampling,
    rng: Rng,
    /// Scratch for the collected candidates, kept across steps.
    cand: Candidates,
}

const NOTHING: Estimate = Estimate {
    threshold: 0,
    selected: 0,
};

/// A threshold (as |x| bits) and how many elements are at or above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    /// The threshold, as the bits of |x| (which order as the values do).
    pub threshold: u32,
    /// How many elements have |x| at or above the threshold.
    pub selected: usize,
}

/// How many |x| ≥ t: one branch-free pass with 16 u32 lanes (|x| bits < 2^31, so the
/// comparison is a signed one, which SSE2 has).
fn count_at_least(grad: &[f32], t: u32) -> usize {
    let mut total = 0usize;
    for part in grad.chunks(1 << 20) {
        let mut lanes = [0u32; 16];
        let mut blocks = part.chunks_exact(16);
        for block in &mut blocks {
            for (l, x) in lanes.iter_mut().zip(block) {
                *l += u32::from(((x.to_bits() & ABS) as i32) >= t as i32);
            }
        }
        total += lanes.iter().map(|&l| l as usize).sum::<usize>()
            + blocks
                .remainder()
                .iter()
                .filter(|x| x.to_bits() & ABS >= t)
                .count();
    }
    total
}

/// The k-th largest of a sample (ceil(ratio · samples), at least 1).
pub fn sample_threshold(samples: &mut [u32], ratio: f64) -> u32 {
    let top = sparse_count(samples.len() as u64, ratio) as usize;
    let (_, &mut t, _) = samples.select_nth_unstable_by(top - 1, |a, b| b.cmp(a));
    t
}

/// Where DGC samples: every `stride`-th element from a random start (stride chosen as in
/// DGC's `_sparsify` so that at least max(1% of n, 2/ratio) samples are taken). Draws one
/// number from `rng`. Requires n ≥ 1.
pub fn dgc_positions(n: usize, ratio: f64, rng: &mut Rng) -> Vec<u32> {
    let min_samples =
        ((n as f64 * DGC_SAMPLE_RATIO).ceil() as usize).max((2.0 / ratio).ceil() as usize);
    let stride = if n <= min_samples {
        1
    } else {
        let mut stride = (n / min_samples).div_ceil(32) * 32 + 1;
        while stride > 8 && n / stride < min_samples {
            stride -= 8;
        }
        stride
    };
    let start = rng.below(stride as u64) as usize;
    (start.min(n - 1)..n)
        .step_by(stride)
        .map(|i| i as u32)
        .collect()
}

/// DGC's first threshold: the top `ratio` of the |x| at [`dgc_positions`]. Reads only the
/// sampled elements. Requires n ≥ 1.
fn dgc_sample(grad: &[f32], ratio: f64, rng: &mut Rng) -> u32 {
    let mut samples: Vec<u32> = dgc_positions(grad.len(), ratio, rng)
        .into_iter()
        .map(|i| grad[i as usize].to_bits() & ABS)
        .collect();
    sample_threshold(&mut samples, ratio)
}

/// DGC's band around k: a selected count in low..=high is accepted.
pub fn dgc_band(k: usize) -> (usize, usize) {
    (
        (LOWER_BOUND * k as f64).ceil() as usize,
        (UPPER_BOUND * k as f64).floor() as usize,
    )
}

/// DGC's adaptation from threshold `t` selecting `selected` elements: while the mask holds
/// fewer than 0.8·k or more than 1.2·k elements, scale the threshold by 0.8 or 1.2 as DGC does.
/// If ten adaptations do not land inside the band, the exact k-th largest is used.
fn dgc_adapt(grad: &[f32], k: usize, t: u32, selected: usize) -> Result<Estimate> {
    dgc_adapt_with(
        k,
        t,
        selected,
        |t| Ok(count_at_least(grad, t)),
        || Ok(kth_largest(grad, k)?.0),
    )
}

/// [`dgc_adapt`] over any tensor: `count(t)` is how many |x| ≥ t, `kth()` the k-th largest
/// |x|; the GPU codec passes its device kernels, so both sides adapt identically.
pub fn dgc_adapt_with(
    k: usize,
    mut t: u32,
    mut selected: usize,
    mut count: impl FnMut(u32) -> Result<usize>,
    kth: impl FnOnce() -> Result<u32>,
) -> Result<Estimate> {
    let (low, high) = dgc_band(k);
    for _ in 0..MAX_ADAPTATIONS {
        let factor = if selected > high {
            UPPER_BOUND
        } else if selected < low {
            LOWER_BOUND
        } else {
            return Ok(Estimate {
                threshold: t,
                selected,
            });
        };
        t = (f32::from_bits(t) * factor as f32).to_bits();
        selected = count(t)?;
    }
    if (low..=high).contains(&selected) {
        return Ok(Estimate {
            threshold: t,
            selected,
        });
    }
    let t = kth()?;
    Ok(Estimate {
        threshold: t,
        selected: count(t)?,
    })
}

/// DGC's threshold estimation: the sampled threshold ([`dgc_sample`]) adapted into the band
/// ([`dgc_adapt`]), so the count is always within ±20% of k.
pub fn dgc_estimate(grad: &[f32], ratio: f64, rng: &mut Rng) -> Result<Estimate> {
    check_all(grad)?;
    let n = grad.len();
    if n == 0 {
        return Ok(NOTHING);
    }
    let k = sparse_count(n as u64, ratio) as usize;
    let t = dgc_sample(grad, ratio, rng);
    dgc_adapt(grad, k, t, count_at_least(grad, t))
}

/// Where GradDrop samples: 0.1% of the elements drawn at random with replacement (at least
/// 2/ratio of them), or every element when that is as many as the tensor holds. Requires n ≥ 1.
pub fn graddrop_positions(n: usize, ratio: f64, rng: &mut Rng) -> Vec<u32> {
    let want =
        ((n as f64 * GRADDROP_SAMPLE_RATIO).ceil() as usize).max((2.0 / ratio).ceil() as usize);
    if want >= n {
        (0..n as u32).collect()
    } else {
        (0..want).map(|_| rng.below(n as u64) as u32).collect()
    }
}

/// GradDrop's threshold: the top-ratio quantile of the |x| at [`graddrop_positions`].
fn graddrop_sample(grad: &[f32], ratio: f64, rng: &mut Rng) -> u32 {
    let mut samples: Vec<u32> = graddrop_positions(grad.len(), ratio, rng)
        .into_iter()
        .map(|i| grad[i as usize].to_bits() & ABS)
        .collect();
    sample_threshold(&mut samples, ratio)
}

/// GradDrop's estimate ([`graddrop_sample`]); no adaptation.
pub fn graddrop_estimate(grad: &[f32], ratio: f64, rng: &mut Rng) -> Result<Estimate> {
    check_all(grad)?;
    if grad.is_empty() {
        return Ok(NOTHING);
    }
    let t = graddrop_sample(grad, ratio, rng);
    Ok(Estimate {
        threshold: t,
        selected: count_at_least(grad, t),
    })
}

impl Codec for Sampled {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        let n = grad.len();
        let k = sparse_count(n as u64, self.ratio) as usize;
        out.clear();
        out.resize(4 + 8 * k, 0);
        if k == 0 {
            return Ok(());
        }
        // The sampled threshold, then one pass that checks the tensor, counts the elements at
        // or above it and collects them (up to 1.2·k, DGC's upper band). In the common case
        // that count is final: at most k are all sent, more are cut to the k largest of them
        // (exactly top-k, since everything else is below the threshold).
        let t = match self.sampling {
            Sampling::Dgc => dgc_sample(grad, self.ratio, &mut self.rng),
            Sampling::GradDrop => graddrop_sample(grad, self.ratio, &mut self.rng),
        };
        let cap = dgc_band(k).1.max(k);
        let selected = collect_at_least(grad, t, cap, &mut self.cand)?;
        let (idx, val) = out[4..].split_at_mut(4 * k);
        let in_band = match self.sampling {
            Sampling::Dgc => {
                let (low, high) = dgc_band(k);
                (low..=high).contains(&selected)
            }
            Sampling::GradDrop => true,
        };
        let count = if in_band && selected <= k {
            emit_all(&self.cand, idx, val)
        } else if in_band && selected <= cap {
            emit_k_largest(&self.cand, k, idx, val)
        } else {
            let Estimate {
                threshold,
                selected,
            } = match self.sampling {
                Sampling::Dgc => dgc_adapt(grad, k, t, selected)?,
                Sampling::GradDrop => Estimate {
                    threshold: t,
                    selected,
                },
            };
            // More candidates than slots: keep the k largest of them (exactly top-k), ties by
            // index.
            let (t, ties) = if selected > k {
                let (t, greater) = kth_largest(grad, k)?;
                (t, k - greater)
            } else {
                (threshold, selected)
            };
            emit(grad, t, ties, idx, val)
        };
        out[..4].copy_from_slice(&(count as u32).to_le_bytes());
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        expect_len(&self.c, payload, acc.len())?;
        let k = (payload.len() - 4) / 8;
        let count = get_u32(&self.c, payload, 0)? as usize;
        if count > k {
            return Err(bad_payload(
                &self.c,
                format!("count {count} exceeds the {k} slots"),
            ));
        }
        let (idx, val) = payload[4..].split_at(4 * k);
        scatter_add(&self.c, idx, val, count, acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaussian(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| rng.normal() as f32).collect()
    }

    #[test]
    fn dgc_lands_within_twenty_percent() {
        let mut rng = Rng::new(11);
        for (n, ratio) in [
            (100_000, 0.001),
            (50_000, 0.01),
            (4097, 0.1),
            (1000, 0.5),
            (7, 0.3),
        ] {
            let g = gaussian(n, n as u64);
            let k = sparse_count(n as u64, ratio) as f64;
            let e = dgc_estimate(&g, ratio, &mut rng).unwrap();
            let r = e.selected as f64 / k;
            assert!(
                (0.8..=1.2).contains(&r) || (e.selected as f64 - k).abs() < 1.0,
                "{n} {ratio}: {r}"
            );
        }
    }

    #[test]
    fn graddrop_keeps_roughly_the_ratio() {
        let g = gaussian(200_000, 1);
        let e = graddrop_estimate(&g, 0.01, &mut Rng::new(2)).unwrap();
        assert!((1000..4000).contains(&e.selected), "{}", e.selected);
        assert_eq!(
            graddrop_estimate(&[], 0.1, &mut Rng::new(2)).unwrap(),
            NOTHING
        );
    }
}
