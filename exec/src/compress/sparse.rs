//! Sparsifiers with exact counts or exact thresholds: top-k, random-k (shared-seed or indexed), threshold.
//!
//! Top-k uses radix selection; the threshold is fixed.
//!
//! Wire formats: `topk` and `randomk-indexed` k × u32 indices then k × f32 values (ascending
//! indices); `randomk` k × f32 values scaled by n/k, indices regenerated from the shared seed
//! and step; `threshold` u32 count c, c × u32 indices, c × f32 values.

use super::rng::Rng;
use super::scan::{check_finite, CHUNK};
use super::wire::{bad_payload, expect_len, f32s, get_u32, put_f32s, sum_f32_payloads};
use super::{not_in_family, Build, Codec};
use crate::error::{ExecError, Result};
use syncopate_sim::compress::{sparse_count, Compressor};

const ABS: u32 = 0x7FFF_FFFF;
/// Radix-select bucket shift: 4096 buckets of the top bits of |x| fit in L1.
const BUCKET_SHIFT: u32 = 19;

/// What an [`Exact`] codec keeps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rule {
    /// The k = max(1, ceil(ratio·n)) largest magnitudes.
    TopK(f64),
    /// Every |x| ≥ the value.
    Threshold(f32),
}

pub(crate) fn codec(build: &Build) -> Box<dyn Codec> {
    let c = build.compressor;
    match c {
        Compressor::TopK { ratio } => exact(c, Rule::TopK(ratio)),
        Compressor::Threshold { value } => exact(c, Rule::Threshold(value as f32)),
        Compressor::RandomK { ratio } => Box::new(RandomK {
            c,
            draws: Draws::new(ratio, build.seed),
        }),
        Compressor::RandomKIndexed { ratio } => Box::new(RandomKIndexed {
            c,
            draws: Draws::new(ratio, build.seed),
        }),
        other => not_in_family(other, "sparse"),
    }
}

fn exact(c: Compressor, rule: Rule) -> Box<dyn Codec> {
    Box::new(Exact {
        c,
        rule,
        cand: Candidates::default(),
    })
}

/// Histogram of the top bits of |x| (bucket = |x| bits >> BUCKET_SHIFT), checking finiteness.
/// Two interleaved u32 histograms (32 KiB, in L1) halve the store-to-load chains on the few
/// buckets that hold most of a gradient.
fn histogram(grad: &[f32]) -> Result<Vec<usize>> {
    const BUCKETS: usize = (ABS >> BUCKET_SHIFT) as usize + 1;
    let mut h0 = vec![0u32; BUCKETS];
    let mut h1 = vec![0u32; BUCKETS];
    let mut hist = vec![0usize; BUCKETS];
    // u32 counters cannot overflow within a chunk; they are flushed every 2^20 elements.
    for (f, part) in grad.chunks(1 << 20).enumerate() {
        for (c, chunk) in part.chunks(CHUNK).enumerate() {
            check_finite(chunk, (f << 20) + c * CHUNK)?;
            let mut pairs = chunk.chunks_exact(2);
            for p in &mut pairs {
                h0[((p[0].to_bits() & ABS) >> BUCKET_SHIFT) as usize] += 1;
                h1[((p[1].to_bits() & ABS) >> BUCKET_SHIFT) as usize] += 1;
            }
            for x in pairs.remainder() {
                h0[((x.to_bits() & ABS) >> BUCKET_SHIFT) as usize] += 1;
            }
        }
        for ((h, a), b) in hist.iter_mut().zip(&mut h0).zip(&mut h1) {
            *h += (*a + *b) as usize;
            *a = 0;
            *b = 0;
        }
    }
    Ok(hist)
}

/// The bucket holding the k-th largest |x| and how many elements lie in higher buckets.
fn kth_bucket(hist: &[usize], k: usize) -> (u32, usize) {
    let mut above = 0;
    for (b, &count) in hist.iter().enumerate().rev() {
        if above + count >= k {
            return (b as u32, above);
        }
        above += count;
    }
    (0, above)
}

/// The k-th largest |x| (as f32 bits, which order like the magnitudes) and how many elements
/// are strictly larger. Radix selection: a histogram of the top bits finds the bucket holding
/// the k-th element, then only that bucket is selected, so no sort and about two passes.
/// Requires 1 ≤ k ≤ len; checks finiteness on the way.
pub(crate) fn kth_largest(grad: &[f32], k: usize) -> Result<(u32, usize)> {
    let hist = histogram(grad)?;
    let (bucket, above) = kth_bucket(&hist, k);
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

/// (index, value) pairs of the elements with |x| ≥ a threshold, in index order.
#[derive(Default)]
pub(crate) struct Candidates {
    pub idx: Vec<u32>,
    pub val: Vec<f32>,
    /// How many are stored (the first `len` slots of `idx` and `val`).
    pub len: usize,
}

/// One pass that checks finiteness and stores (index, value) for every |x| ≥ t, up to `cap`
/// of them, in index order; returns how many elements are ≥ t in all (possibly more than
/// stored). Blocks of 16 with nothing ≥ t are skipped with one vectorized test; hit blocks are
/// compacted branch-free (every lane is written, the cursor advances only past the kept ones).
pub(crate) fn collect_at_least(
    grad: &[f32],
    t: u32,
    cap: usize,
    out: &mut Candidates,
) -> Result<usize> {
    const W: usize = 16;
    // Grow only: every slot read later is written first.
    if out.idx.len() < cap + W {
        out.idx.resize(cap + W, 0);
        out.val.resize(cap + W, 0.0);
    }
    let (idx, val) = (&mut out.idx[..], &mut out.val[..]);
    let mut n = 0usize;
    let mut overflow = 0usize;
    for (c, chunk) in grad.chunks(CHUNK).enumerate() {
        check_finite(chunk, c * CHUNK)?;
        let base = c * CHUNK;
        let mut blocks = chunk.chunks_exact(W);
        for (b, block) in (&mut blocks).enumerate() {
            let hits = block
                .iter()
                .fold(0u32, |acc, x| acc + u32::from(x.to_bits() & ABS >= t));
            if hits == 0 {
                continue;
            }
            if n >= cap {
                overflow += hits as usize;
                continue;
            }
            let first = (base + b * W) as u32;
            for (j, &x) in block.iter().enumerate() {
                idx[n] = first + j as u32;
                val[n] = x;
                n += usize::from(x.to_bits() & ABS >= t);
            }
        }
        let first = base + chunk.len() / W * W;
        for (j, &x) in blocks.remainder().iter().enumerate() {
            if x.to_bits() & ABS >= t {
                if n < cap {
                    idx[n] = (first + j) as u32;
                    val[n] = x;
                    n += 1;
                } else {
                    overflow += 1;
                }
            }
        }
    }
    // A hit block may push the cursor up to W − 1 past cap.
    let total = n + overflow;
    out.len = n.min(cap);
    Ok(total)
}

/// Writes the k largest stored candidates (ties by index) into `idx`/`val` as
/// [`emit`] would from the whole tensor, given that every element not stored is smaller than
/// every stored one and at least k are stored. Returns k.
pub(crate) fn emit_k_largest(cand: &Candidates, k: usize, idx: &mut [u8], val: &mut [u8]) -> usize {
    let vals = &cand.val[..cand.len];
    let mut abs: Vec<u32> = vals.iter().map(|x| x.to_bits() & ABS).collect();
    let (_, &mut t, _) = abs.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
    let greater = vals.iter().filter(|x| x.to_bits() & ABS > t).count();
    let mut ties = k - greater;
    let mut n = 0;
    for (&i, &x) in cand.idx[..cand.len].iter().zip(vals) {
        let a = x.to_bits() & ABS;
        let take = a > t || (a == t && ties > 0);
        if take {
            ties -= usize::from(a == t);
            idx[4 * n..4 * n + 4].copy_from_slice(&i.to_le_bytes());
            val[4 * n..4 * n + 4].copy_from_slice(&x.to_le_bytes());
            n += 1;
        }
    }
    n
}

/// Writes all stored candidates (at most the capacity of `idx`); returns how many.
pub(crate) fn emit_all(cand: &Candidates, idx: &mut [u8], val: &mut [u8]) -> usize {
    let n = cand.len.min(idx.len() / 4);
    for (d, &i) in idx.chunks_exact_mut(4).zip(&cand.idx[..n]) {
        d.copy_from_slice(&i.to_le_bytes());
    }
    for (d, &x) in val.chunks_exact_mut(4).zip(&cand.val[..n]) {
        d.copy_from_slice(&x.to_le_bytes());
    }
    n
}

/// Top-k's threshold sample: every `TOPK_STRIDE`-th |x|, used from `TOPK_MIN_SAMPLES` samples up.
const TOPK_STRIDE: usize = 128;
const TOPK_MIN_SAMPLES: usize = 512;

/// A threshold (|x| bits) that at least k elements probably reach, and the candidate capacity
/// to collect with it: the k·m/n-th largest of m strided samples, moved up by four standard
/// deviations of the sampled count (plus 8) so that it falls below the k-th largest almost
/// always, while keeping the candidates a little over k. `None` when the tensor is too small.
fn topk_sample(grad: &[f32], k: usize) -> Option<(u32, usize)> {
    let n = grad.len();
    let m = n / TOPK_STRIDE;
    if m < TOPK_MIN_SAMPLES {
        return None;
    }
    let expected = k as f64 * m as f64 / n as f64;
    let rank = (expected + 4.0 * expected.sqrt() + 8.0).ceil() as usize;
    if rank >= m {
        return Some((0, n));
    }
    let mut samples: Vec<u32> = grad[TOPK_STRIDE / 2..]
        .iter()
        .step_by(TOPK_STRIDE)
        .take(m)
        .map(|x| x.to_bits() & ABS)
        .collect();
    let (_, &mut t, _) = samples.select_nth_unstable_by(rank - 1, |a, b| b.cmp(a));
    // About rank·n/m elements reach t; half as many again leaves room for sampling error.
    let cap = (rank * TOPK_STRIDE / 2 * 3 + 1024).min(n);
    Some((t, cap))
}

/// Exact top-k, usually in one pass: a strided sample gives a threshold just below the k-th
/// largest, one pass collects the (index, value) pairs at or above it (a little over k), and
/// the k largest of those are written. Every element not collected is smaller than every
/// collected one, so this writes exactly what the full selection would, ties included. When
/// the sample misjudges (fewer than k reach the threshold, or more than the capacity), the two
/// exact passes run instead: a histogram finds the bucket of the k-th largest, then one pass
/// collects everything from that bucket up (k plus part of one bucket).
fn topk_encode(
    grad: &[f32],
    k: usize,
    cand: &mut Candidates,
    idx: &mut [u8],
    val: &mut [u8],
) -> Result<()> {
    if let Some((t, cap)) = topk_sample(grad, k) {
        let total = collect_at_least(grad, t, cap, cand)?;
        if (k..=cap).contains(&total) {
            emit_k_largest(cand, k, idx, val);
            return Ok(());
        }
    }
    let hist = histogram(grad)?;
    let (bucket, above) = kth_bucket(&hist, k);
    let cap = above + hist[bucket as usize];
    collect_at_least(grad, bucket << BUCKET_SHIFT, cap, cand)?;
    emit_k_largest(cand, k, idx, val);
    Ok(())
}

/// Writes (index, value) for every element with |x| > t and the first `ties` with |x| == t, in
/// index order, up to the capacity of `idx` (4 bytes each); returns how many were written.
/// Blocks of 16 with nothing ≥ t are skipped with one vectorized test.
pub(crate) fn emit(grad: &[f32], t: u32, mut ties: usize, idx: &mut [u8], val: &mut [u8]) -> usize {
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
pub(crate) fn scatter_add(
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
    /// Top-k's scratch, kept across steps.
    cand: Candidates,
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
                let (idx, val) = out.split_at_mut(4 * k);
                topk_encode(grad, k, &mut self.cand, idx, val)?;
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
            Rule::TopK(_) => decode_indexed(&self.c, payload, acc),
        }
    }
}

/// A random-k codec's coordinates: k of n drawn afresh each step from the seed and the step.
struct Draws {
    ratio: f64,
    seed: u64,
    step: u64,
    /// This step's, ascending.
    indices: Vec<u32>,
}

impl Draws {
    fn new(ratio: f64, seed: u64) -> Draws {
        Draws {
            ratio,
            seed,
            step: 0,
            indices: Vec::new(),
        }
    }

    /// Draws the next step's coordinates of `grad`, which must be finite (only the sent values
    /// need be, but a NaN anywhere means a broken step: it is reported).
    fn next(&mut self, grad: &[f32]) -> Result<&[u32]> {
        let n = grad.len();
        let k = sparse_count(n as u64, self.ratio) as usize;
        let mut rng = Rng::for_stream(self.seed, self.step);
        self.step += 1;
        random_subset(&mut rng, n, k, &mut self.indices);
        for (c, chunk) in grad.chunks(CHUNK).enumerate() {
            check_finite(chunk, c * CHUNK)?;
        }
        Ok(&self.indices)
    }
}

/// Random-k: every worker with the same seed picks the same k coordinates at the same step,
/// so the scaled values sum element-wise with an allreduce.
struct RandomK {
    c: Compressor,
    draws: Draws,
}

/// A uniformly random k-subset of 0..n in ascending order: Floyd's algorithm over a bitset
/// (O(k) draws, O(n/64) memory), then one scan of the bitset.
pub(crate) fn random_subset(rng: &mut Rng, n: usize, k: usize, out: &mut Vec<u32>) {
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
        let indices = self.draws.next(grad)?;
        let k = indices.len();
        let scale = if k > 0 {
            grad.len() as f32 / k as f32
        } else {
            0.0
        };
        out.clear();
        out.resize(4 * k, 0);
        put_f32s(out, indices.iter().map(|&i| grad[i as usize] * scale));
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        expect_len(&self.c, payload, acc.len())?;
        let indices = &self.draws.indices;
        if indices.len() * 4 != payload.len()
            || indices.last().is_some_and(|&i| i as usize >= acc.len())
        {
            return Err(ExecError::Protocol {
                compressor: self.c.to_string(),
                message: "decode needs this worker's encode of the same step first (the indices come from the shared seed)".into(),
            });
        }
        for (&i, v) in indices.iter().zip(f32s(payload)) {
            acc[i as usize] += v;
        }
        Ok(())
    }

    fn sum_into(&self, acc: &mut [u8], other: &[u8]) -> Result<()> {
        sum_f32_payloads(&self.c, acc, other)
    }
}

/// Random-k as MergeComp sends it: each worker draws its own k coordinates (its own seed and
/// the step) and sends them with their values, unscaled, in top-k's format.
struct RandomKIndexed {
    c: Compressor,
    draws: Draws,
}

impl Codec for RandomKIndexed {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        let indices = self.draws.next(grad)?;
        out.clear();
        out.reserve(8 * indices.len());
        out.extend(indices.iter().flat_map(|i| i.to_le_bytes()));
        out.extend(indices.iter().flat_map(|&i| grad[i as usize].to_le_bytes()));
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        decode_indexed(&self.c, payload, acc)
    }
}

/// Adds a payload in top-k's format (k u32 indices, then k f32 values; `c`'s wire length for
/// `acc`'s elements) into `acc`.
fn decode_indexed(c: &Compressor, payload: &[u8], acc: &mut [f32]) -> Result<()> {
    expect_len(c, payload, acc.len())?;
    let k = payload.len() / 8;
    let (idx, val) = payload.split_at(4 * k);
    scatter_add(c, idx, val, k, acc)
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

    /// MergeComp's random-k: each worker its own coordinates, sent with their exact values,
    /// so that a decode puts back x at the drawn indices and nothing elsewhere.
    #[test]
    fn indexed_random_k_sends_each_worker_s_own_coordinates_unscaled() {
        let c = Compressor::RandomKIndexed { ratio: 0.05 };
        let grad: Vec<f32> = (0..1000).map(|i| i as f32 - 500.5).collect();
        let mut drawn = Vec::new();
        for seed in [1, 2] {
            let mut codec = crate::compress::codec_for(&c, seed);
            let mut payload = Vec::new();
            codec.encode(&grad, &mut payload).unwrap();
            assert_eq!(payload.len() as u64, c.wire_bytes(1000));
            let mut out = vec![0.0; 1000];
            codec.decode_add(&payload, &mut out).unwrap();
            let kept: Vec<usize> = (0..1000).filter(|&i| out[i] != 0.0).collect();
            assert_eq!(kept.len(), 50);
            assert!(kept.iter().all(|&i| out[i] == grad[i]));
            drawn.push(kept);
        }
        assert_ne!(
            drawn[0], drawn[1],
            "two workers' seeds draw different coordinates"
        );
    }
}
