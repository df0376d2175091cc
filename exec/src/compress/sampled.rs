//! Sampled-threshold sparsifiers: DGC (strided 1% sample, adapted to ±20% of k) and GradDrop (random 0.1% sample).
//!
//! Wire format (both): u32 count c ≤ k, then k u32 index slots, then k f32 value slots; slots
//! from c on are zero. A fixed size keeps the allgather uniform across workers, as DGC's
//! implementation does by truncating to `num_selects`.

use super::rng::Rng;
use super::scan::{check_finite, CHUNK};
use super::sparse::{emit, kth_largest, scatter_add};
use super::wire::{bad_payload, expect_len, get_u32};
use super::Codec;
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
    Dgc,
    GradDrop,
}

pub fn codec(c: Compressor, ratio: f64, sampling: Sampling, seed: u64) -> Box<dyn Codec> {
    Box::new(Sampled {
        c,
        ratio,
        sampling,
        rng: Rng::new(seed),
    })
}

struct Sampled {
    c: Compressor,
    ratio: f64,
    sampling: Sampling,
    rng: Rng,
}

const NOTHING: Estimate = Estimate {
    threshold: 0,
    selected: 0,
};

/// A threshold (as |x| bits) and how many elements are at or above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub threshold: u32,
    pub selected: usize,
}

fn count_at_least(abs_bits: &[u32], t: u32) -> usize {
    abs_bits.iter().filter(|&&a| a >= t).count()
}

/// The k-th largest of a sample (ceil(ratio · samples), at least 1).
fn sample_threshold(samples: &mut [u32], ratio: f64) -> u32 {
    let top = sparse_count(samples.len() as u64, ratio) as usize;
    let (_, &mut t, _) = samples.select_nth_unstable_by(top - 1, |a, b| b.cmp(a));
    t
}

/// DGC's threshold estimation: sample every `stride`-th |x| from a random start (stride chosen
/// as in DGC's `_sparsify` so that at least max(1% of n, 2/ratio) samples are taken), threshold
/// at the sample's top ratio, then, while the mask holds fewer than 0.8·k or more than 1.2·k
/// elements, scale the threshold by 0.8 or 1.2 as DGC does. If ten adaptations do not land
/// inside the band, the exact k-th largest is used, so the count is always within ±20% of k.
pub fn dgc_estimate(grad: &[f32], ratio: f64, rng: &mut Rng) -> Result<Estimate> {
    let n = grad.len();
    let abs: Vec<u32> = abs_bits_checked(grad)?;
    if n == 0 {
        return Ok(NOTHING);
    }
    let k = sparse_count(n as u64, ratio) as usize;
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
    let mut samples: Vec<u32> = abs[start.min(n - 1)..]
        .iter()
        .step_by(stride)
        .copied()
        .collect();
    let mut t = sample_threshold(&mut samples, ratio);
    let low = (LOWER_BOUND * k as f64).ceil() as usize;
    let high = (UPPER_BOUND * k as f64).floor() as usize;
    let mut selected = count_at_least(&abs, t);
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
        selected = count_at_least(&abs, t);
    }
    if (low..=high).contains(&selected) {
        return Ok(Estimate {
            threshold: t,
            selected,
        });
    }
    let (t, _) = kth_largest(grad, k)?;
    Ok(Estimate {
        threshold: t,
        selected: count_at_least(&abs, t),
    })
}

/// GradDrop's estimate: the top-ratio quantile of |x| over 0.1% of the elements drawn at random
/// (at least 2/ratio of them, all of them for small tensors); no adaptation.
pub fn graddrop_estimate(grad: &[f32], ratio: f64, rng: &mut Rng) -> Result<Estimate> {
    let n = grad.len();
    let abs: Vec<u32> = abs_bits_checked(grad)?;
    if n == 0 {
        return Ok(NOTHING);
    }
    let want =
        ((n as f64 * GRADDROP_SAMPLE_RATIO).ceil() as usize).max((2.0 / ratio).ceil() as usize);
    let mut samples: Vec<u32> = if want >= n {
        abs.clone()
    } else {
        (0..want)
            .map(|_| abs[rng.below(n as u64) as usize])
            .collect()
    };
    let t = sample_threshold(&mut samples, ratio);
    Ok(Estimate {
        threshold: t,
        selected: count_at_least(&abs, t),
    })
}

fn abs_bits_checked(grad: &[f32]) -> Result<Vec<u32>> {
    let mut abs = Vec::with_capacity(grad.len());
    for (c, chunk) in grad.chunks(CHUNK).enumerate() {
        check_finite(chunk, c * CHUNK)?;
        abs.extend(chunk.iter().map(|x| x.to_bits() & ABS));
    }
    Ok(abs)
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
        let Estimate {
            threshold,
            selected,
        } = match self.sampling {
            Sampling::Dgc => dgc_estimate(grad, self.ratio, &mut self.rng)?,
            Sampling::GradDrop => graddrop_estimate(grad, self.ratio, &mut self.rng)?,
        };
        // More candidates than slots: keep the k largest of them (exactly top-k), ties by index.
        let (t, ties) = if selected > k {
            let (t, greater) = kth_largest(grad, k)?;
            (t, k - greater)
        } else {
            (threshold, selected)
        };
        let (idx, val) = out[4..].split_at_mut(4 * k);
        let count = emit(grad, t, ties, idx, val);
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
