//! Sparsifiers with exact counts or exact thresholds: top-k (radix selection), shared-seed random-k, fixed threshold.
//!
//! Wire formats: `topk` k × u32 indices then k × f32 values (ascending indices); `randomk`
//! k × f32 values scaled by n/k, indices regenerated from the shared seed and step; `threshold`
//! u32 count c, c × u32 indices, c × f32 values.

use super::rng::Rng;
use super::scan::{check_finite, CHUNK};
use super::wire::{bad_payload, expect_len, f32s, get_u32, put_f32s, sum_f32_payloads};
use super::Codec;
use crate::error::{ExecError, Result};
use syncopate_sim::compress::{sparse_count, Compressor};

const ABS: u32 = 0x7FFF_FFFF;
/// Radix-select bucket shift: 4096 buckets of the top bits of |x| fit in L1.
const BUCKET_SHIFT: u32 = 19;

/// What an [`Exact`] codec keeps.
#[derive(Clone, Copy, Debug)]
pub enum Rule {
    /// The k = max(1, ceil(ratio·n)) largest magnitudes.
    TopK(f64),
    /// Every |x| ≥ the value.
    Threshold(f32),
}

pub fn exact(c: Compressor, rule: Rule) -> Box<dyn Codec> {
    Box::new(Exact { c, rule })
}

pub fn random_k(c: Compressor, ratio: f64, seed: u64) -> Box<dyn Codec> {
    Box::new(RandomK {
        c,
        ratio,
        seed,
        step: 0,
        indices: Vec::new(),
    })
}

/// The k-th largest |x| (as f32 bits, which order like the magnitudes) and how many elements
/// are strictly larger. Radix selection: a histogram of the top bits finds the bucket holding
/// the k-th element, then only that bucket is selected, so no sort and about two passes.
/// Requires 1 ≤ k ≤ len; checks finiteness on the way.
pub fn kth_largest(grad: &[f32], k: usize) -> Result<(u32, usize)> {
    let mut hist = vec![0usize; (ABS >> BUCKET_SHIFT) as usize + 1];
    for (c, chunk) in grad.chunks(CHUNK).enumerate() {
        check_finite(chunk, c * CHUNK)?;
        for x in chunk {
            hist[((x.to_bits() & ABS) >> BUCKET_SHIFT) as usize] += 1;
        }
    }
    let mut above = 0;
    let mut bucket = 0;
    for (b, &count) in hist.iter().enumerate().rev() {
        if above + count >= k {
            bucket = b as u32;
            break;
        }
        above += count;
    }
    let mut candidates: Vec<u32> = grad
        .iter()
        .map(|x| x.to_bits() & ABS)
        .filter(|a| a >> BUCKET_SHIFT == bucket)
        .collect();
    let need = k - above;
    let (_, &mut t, _) = candidates.select_nth_unstable_by(need - 1, |a, b| b.cmp(a));
    let greater = above + candidates.iter().filter(|&&a| a > t).count();
    Ok((t, greater))
}

/// Writes (index, value) for every element with |x| > t and the first `ties` with |x| == t, in
/// index order, up to the capacity of `idx` (4 bytes each); returns how many were written.
/// Blocks of 16 with nothing ≥ t are skipped with one vectorized test.
pub fn emit(grad: &[f32], t: u32, mut ties: usize, idx: &mut [u8], val: &mut [u8]) -> usize {
    let cap = idx.len() / 4;
    let mut n = 0;
    for (b, block) in grad.chunks(16).enumerate() {
        let hit = block
            .iter()
            .fold(0u32, |acc, x| acc | u32::from(x.to_bits() & ABS >= t));
        if hit == 0 {
            continue;
        }
        for (j, &x) in block.iter().enumerate() {
            let a = x.to_bits() & ABS;
            let take = a > t || (a == t && ties > 0);
            if take && n < cap {
                ties -= usize::from(a == t);
                idx[4 * n..4 * n + 4].copy_from_slice(&((16 * b + j) as u32).to_le_bytes());
                val[4 * n..4 * n + 4].copy_from_slice(&x.to_le_bytes());
                n += 1;
            }
        }
    }
    n
}

/// Adds `count` (index, value) pairs read from the two blocks, checking every index.
pub fn scatter_add(
    c: &Compressor,
    idx: &[u8],
    val: &[u8],
    count: usize,
    acc: &mut [f32],
) -> Result<()> {
    for (i, v) in idx.chunks_exact(4).zip(f32s(val)).take(count) {
        let i = u32::from_le_bytes([i[0], i[1], i[2], i[3]]) as usize;
        let n = acc.len();
        let slot = acc
            .get_mut(i)
            .ok_or_else(|| bad_payload(c, format!("index {i} outside a tensor of {n} elements")))?;
        *slot += v;
    }
    Ok(())
}

/// Top-k and threshold: deterministic, stateless.
struct Exact {
    c: Compressor,
    rule: Rule,
}

impl Codec for Exact {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        match self.rule {
            Rule::Threshold(value) => {
                let t = value.to_bits();
                let mut count = 0usize;
                for (c, chunk) in grad.chunks(CHUNK).enumerate() {
                    check_finite(chunk, c * CHUNK)?;
                    count += chunk.iter().filter(|x| x.to_bits() & ABS >= t).count();
                }
                out.clear();
                out.resize(4 + 8 * count, 0);
                out[..4].copy_from_slice(&(count as u32).to_le_bytes());
                let (idx, val) = out[4..].split_at_mut(4 * count);
                emit(grad, t, count, idx, val);
            }
            Rule::TopK(ratio) => {
                let k = sparse_count(grad.len() as u64, ratio) as usize;
                out.clear();
                out.resize(8 * k, 0);
                if k == 0 {
                    return Ok(());
                }
                let (t, greater) = kth_largest(grad, k)?;
                let (idx, val) = out.split_at_mut(4 * k);
                emit(grad, t, k - greater, idx, val);
            }
        }
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        match self.rule {
            Rule::Threshold(_) => {
                let count = get_u32(&self.c, payload, 0)? as usize;
                if payload.len() != 4 + 8 * count || count > acc.len() {
                    return Err(bad_payload(
                        &self.c,
                        format!(
                            "{} bytes do not hold {count} entries for {} elements",
                            payload.len(),
                            acc.len()
                        ),
                    ));
                }
                let (idx, val) = payload[4..].split_at(4 * count);
                scatter_add(&self.c, idx, val, count, acc)
            }
            Rule::TopK(_) => {
                expect_len(&self.c, payload, acc.len())?;
                let k = payload.len() / 8;
                let (idx, val) = payload.split_at(4 * k);
                scatter_add(&self.c, idx, val, k, acc)
            }
        }
    }
}

/// Random-k: every worker with the same seed picks the same k coordinates at the same step,
/// so the scaled values sum element-wise with an allreduce.
struct RandomK {
    c: Compressor,
    ratio: f64,
    seed: u64,
    step: u64,
    indices: Vec<u32>,
}

/// A uniformly random k-subset of 0..n in ascending order: Floyd's algorithm over a bitset
/// (O(k) draws, O(n/64) memory), then one scan of the bitset.
fn random_subset(rng: &mut Rng, n: usize, k: usize, out: &mut Vec<u32>) {
    let mut bits = vec![0u64; n.div_ceil(64)];
    for j in n - k..n {
        let t = rng.below(j as u64 + 1) as usize;
        let pick = if bits[t / 64] >> (t % 64) & 1 == 1 {
            j
        } else {
            t
        };
        bits[pick / 64] |= 1 << (pick % 64);
    }
    out.clear();
    for (w, &word) in bits.iter().enumerate() {
        let mut word = word;
        while word != 0 {
            out.push((64 * w) as u32 + word.trailing_zeros());
            word &= word - 1;
        }
    }
}

impl Codec for RandomK {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        let n = grad.len();
        let k = sparse_count(n as u64, self.ratio) as usize;
        let mut rng = Rng::for_stream(self.seed, self.step);
        self.step += 1;
        random_subset(&mut rng, n, k, &mut self.indices);
        // Only the sent values must be finite, but a NaN anywhere means a broken step: report it.
        for (c, chunk) in grad.chunks(CHUNK).enumerate() {
            check_finite(chunk, c * CHUNK)?;
        }
        let scale = if k > 0 { n as f32 / k as f32 } else { 0.0 };
        out.clear();
        out.resize(4 * k, 0);
        put_f32s(out, self.indices.iter().map(|&i| grad[i as usize] * scale));
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        expect_len(&self.c, payload, acc.len())?;
        if self.indices.len() * 4 != payload.len()
            || self
                .indices
                .last()
                .is_some_and(|&i| i as usize >= acc.len())
        {
            return Err(ExecError::Protocol {
                compressor: self.c.to_string(),
                message: "decode needs this worker's encode of the same step first (the indices come from the shared seed)".into(),
            });
        }
        for (&i, v) in self.indices.iter().zip(f32s(payload)) {
            acc[i as usize] += v;
        }
        Ok(())
    }

    fn sum_into(&self, acc: &mut [u8], other: &[u8]) -> Result<()> {
        sum_f32_payloads(&self.c, acc, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kth_largest_handles_ties_and_signs() {
        let g = [1.0f32, -5.0, 3.0, 3.0, -3.0, 0.0, 2.0];
        assert_eq!(kth_largest(&g, 1).unwrap(), (5.0f32.to_bits(), 0));
        assert_eq!(kth_largest(&g, 3).unwrap(), (3.0f32.to_bits(), 1));
        assert_eq!(kth_largest(&g, 7).unwrap(), (0, 6));
    }

    #[test]
    fn topk_breaks_ties_by_index() {
        let c = Compressor::TopK { ratio: 0.5 };
        let g = [1.0f32, -5.0, 3.0, 3.0, -3.0, 0.0];
        let mut codec = exact(c, Rule::TopK(0.5));
        let mut p = Vec::new();
        codec.encode(&g, &mut p).unwrap();
        let mut out = vec![0.0; 6];
        codec.decode_add(&p, &mut out).unwrap();
        assert_eq!(out, [0.0, -5.0, 3.0, 3.0, 0.0, 0.0]);
    }

    #[test]
    fn random_subset_is_sorted_and_distinct() {
        let mut rng = Rng::new(3);
        let mut out = Vec::new();
        for (n, k) in [(1, 1), (100, 100), (1000, 10), (4097, 2000)] {
            random_subset(&mut rng, n, k, &mut out);
            assert_eq!(out.len(), k);
            assert!(out.windows(2).all(|w| w[0] < w[1]));
            assert!(out.iter().all(|&i| (i as usize) < n));
        }
    }

    #[test]
    fn bad_indices_are_errors() {
        let c = Compressor::TopK { ratio: 1.0 };
        let mut codec = exact(c, Rule::TopK(1.0));
        let mut payload = vec![0u8; 8];
        payload[..4].copy_from_slice(&9u32.to_le_bytes());
        assert!(codec.decode_add(&payload, &mut [0.0]).is_err());
    }
}
