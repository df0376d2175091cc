//! The sign family: signSGD, EF-SignSGD, Signum, 1-bit SGD.
//!
//! EF-SignSGD has a mean-|x| scale, Signum takes the sign of momentum, and 1-bit SGD has two
//! per-sign means.
//!
//! Wire formats: one bit per element (1 = negative, element i at bit i % 8 of byte i / 8),
//! preceded by `efsignsgd`'s f32 mean |x| or `onebit`'s f32 mean of the non-negative elements
//! and f32 mean of the negative ones. `signsgd` and `signum` decode to ±1.

use super::bits::{pack1, unpack1_add};
use super::scan::{check_finite, CHUNK};
use super::wire::{expect_len, get_f32};
use super::{not_in_family, Build, Codec};
use crate::error::Result;
use syncopate_sim::compress::Compressor;

/// Which member of the family.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    SignSgd,
    EfSignSgd,
    Signum(f32),
    OneBit,
}

pub(crate) fn codec(build: &Build) -> Box<dyn Codec> {
    let kind = match build.compressor {
        Compressor::SignSgd => Kind::SignSgd,
        Compressor::EfSignSgd => Kind::EfSignSgd,
        Compressor::Signum { momentum } => Kind::Signum(momentum as f32),
        Compressor::OneBit => Kind::OneBit,
        other => not_in_family(other, "sign"),
    };
    sign(build.compressor, kind)
}

fn sign(c: Compressor, kind: Kind) -> Box<dyn Codec> {
    Box::new(Sign {
        c,
        kind,
        momentum: Vec::new(),
    })
}

struct Sign {
    c: Compressor,
    kind: Kind,
    /// Signum's momentum, sized on first use.
    momentum: Vec<f32>,
}

fn negative(x: f32) -> u8 {
    u8::from(x < 0.0)
}

/// Packs the sign bits chunk by chunk, checking each chunk while it is in cache.
fn pack_checked(grad: &[f32], dst: &mut [u8]) -> Result<()> {
    for (c, (src, out)) in grad
        .chunks(CHUNK)
        .zip(dst.chunks_mut(CHUNK / 8))
        .enumerate()
    {
        check_finite(src, c * CHUNK)?;
        pack1(src, out, negative);
    }
    Ok(())
}

/// Runs `f` on each checked chunk of `grad` and its bytes of `dst` (one bit per element).
fn for_chunks(grad: &[f32], dst: &mut [u8], mut f: impl FnMut(&[f32], &mut [u8])) -> Result<()> {
    for (c, (src, out)) in grad
        .chunks(CHUNK)
        .zip(dst.chunks_mut(CHUNK / 8))
        .enumerate()
    {
        check_finite(src, c * CHUNK)?;
        f(src, out);
    }
    Ok(())
}

/// Block width of the fused loops: 16 f32 lanes per sum, two whole bytes of sign bits.
const LANES: usize = 16;

/// One pass over a chunk: packs the sign bits into `dst` and sums the two values `split(x)`
/// returns in 16 f32 lanes (the lane order of `scan::sum_map`, so the sums are bit-identical to
/// a separate reduction). Returns both sums and the number of negative elements.
#[inline(always)]
fn fused_chunk(
    src: &[f32],
    dst: &mut [u8],
    split: impl Fn(f32) -> (f32, f32),
) -> (f64, f64, usize) {
    let mut a = [0.0f32; LANES];
    let mut b = [0.0f32; LANES];
    let mut negs = [0u32; LANES];
    let mut blocks = src.chunks_exact(LANES);
    for (block, out) in (&mut blocks).zip(dst.chunks_exact_mut(LANES / 8)) {
        let mut mask = 0u32;
        for j in 0..LANES {
            let x = block[j];
            let (p, q) = split(x);
            a[j] += p;
            b[j] += q;
            let neg = u32::from(x < 0.0);
            negs[j] += neg;
            mask |= neg << j;
        }
        out.copy_from_slice(&(mask as u16).to_le_bytes());
    }
    let tail = blocks.remainder();
    let (mut ta, mut tb, mut tn) = (0.0f32, 0.0f32, 0usize);
    for &x in tail {
        let (p, q) = split(x);
        ta += p;
        tb += q;
        tn += usize::from(x < 0.0);
    }
    if !tail.is_empty() {
        let start = (src.len() / LANES) * (LANES / 8);
        pack1(tail, &mut dst[start..], negative);
    }
    let count = negs.iter().map(|&c| c as usize).sum::<usize>() + tn;
    (
        f64::from(a.iter().sum::<f32>() + ta),
        f64::from(b.iter().sum::<f32>() + tb),
        count,
    )
}

/// m ← β·m + (1−β)·g over a chunk (one plain vectorized loop while it is in L1), then the
/// sign bits of the new m.
#[inline(always)]
fn momentum_pack(src: &[f32], m: &mut [f32], dst: &mut [u8], beta: f32) {
    for (v, &g) in m.iter_mut().zip(src) {
        *v = beta * *v + (1.0 - beta) * g;
    }
    pack1(m, dst, negative);
}

impl Codec for Sign {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        let n = grad.len();
        let bytes = n.div_ceil(8);
        out.clear();
        match self.kind {
            Kind::SignSgd => {
                out.resize(bytes, 0);
                pack_checked(grad, out)?;
            }
            Kind::EfSignSgd => {
                out.resize(4 + bytes, 0);
                let mut total = 0.0f64;
                for_chunks(grad, &mut out[4..], |src, dst| {
                    let (abs, _, _) = fused_chunk(src, dst, |x| (x.abs(), 0.0));
                    total += abs;
                })?;
                let mean = if n > 0 {
                    (total / n as f64) as f32
                } else {
                    0.0
                };
                out[..4].copy_from_slice(&mean.to_le_bytes());
            }
            Kind::Signum(beta) => {
                if self.momentum.len() != n {
                    self.momentum = vec![0.0; n];
                }
                out.resize(bytes, 0);
                // One pass: the chunk is checked while in L1, then momentum is updated and its
                // sign packed in the same loop (momentum is read and written once).
                for (c, ((src, m), dst)) in grad
                    .chunks(CHUNK)
                    .zip(self.momentum.chunks_mut(CHUNK))
                    .zip(out.chunks_mut(CHUNK / 8))
                    .enumerate()
                {
                    check_finite(src, c * CHUNK)?;
                    momentum_pack(src, m, dst, beta);
                }
            }
            Kind::OneBit => {
                out.resize(8 + bytes, 0);
                let (mut sum_pos, mut sum_neg, mut neg_count) = (0.0f64, 0.0f64, 0usize);
                for_chunks(grad, &mut out[8..], |src, dst| {
                    let (pos, neg, negs) =
                        fused_chunk(src, dst, |x| if x < 0.0 { (0.0, x) } else { (x, 0.0) });
                    sum_pos += pos;
                    sum_neg += neg;
                    neg_count += negs;
                })?;
                let mean = |sum: f64, count: usize| {
                    if count > 0 {
                        (sum / count as f64) as f32
                    } else {
                        0.0
                    }
                };
                out[..4].copy_from_slice(&mean(sum_pos, n - neg_count).to_le_bytes());
                out[4..8].copy_from_slice(&mean(sum_neg, neg_count).to_le_bytes());
            }
        }
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        expect_len(&self.c, payload, acc.len())?;
        match self.kind {
            Kind::SignSgd | Kind::Signum(_) => unpack1_add(payload, acc, 1.0, -1.0),
            Kind::EfSignSgd => {
                let mean = get_f32(&self.c, payload, 0)?;
                unpack1_add(&payload[4..], acc, mean, -mean);
            }
            Kind::OneBit => {
                let pos = get_f32(&self.c, payload, 0)?;
                let neg = get_f32(&self.c, payload, 4)?;
                unpack1_add(&payload[8..], acc, pos, neg);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(codec: &mut dyn Codec, g: &[f32]) -> Vec<f32> {
        let mut p = Vec::new();
        codec.encode(g, &mut p).unwrap();
        let mut out = vec![0.0; g.len()];
        codec.decode_add(&p, &mut out).unwrap();
        out
    }

    #[test]
    fn scales_by_hand() {
        let g = [1.0f32, -3.0, 0.0, 5.0, -1.0];
        assert_eq!(
            decoded(&mut *sign(Compressor::SignSgd, Kind::SignSgd), &g),
            [1.0, -1.0, 1.0, 1.0, -1.0]
        );
        assert_eq!(
            decoded(&mut *sign(Compressor::EfSignSgd, Kind::EfSignSgd), &g),
            [2.0, -2.0, 2.0, 2.0, -2.0]
        );
        assert_eq!(
            decoded(&mut *sign(Compressor::OneBit, Kind::OneBit), &g),
            [2.0, -2.0, 2.0, 2.0, -2.0]
        );
        let mut signum = sign(Compressor::Signum { momentum: 0.5 }, Kind::Signum(0.5));
        assert_eq!(decoded(&mut *signum, &[1.0, -1.0]), [1.0, -1.0]);
        // momentum 0.5·0.5 + 0.5·(-3) < 0 flips the first sign; 0.5·(-0.5) + 0.5·2 > 0 the second.
        assert_eq!(decoded(&mut *signum, &[-3.0, 2.0]), [-1.0, 1.0]);
    }

    #[test]
    fn nan_is_reported_by_every_member() {
        let mut g = vec![0.5f32; 100];
        g[77] = f32::NAN;
        for (c, k) in [
            (Compressor::SignSgd, Kind::SignSgd),
            (Compressor::EfSignSgd, Kind::EfSignSgd),
            (Compressor::Signum { momentum: 0.9 }, Kind::Signum(0.9)),
            (Compressor::OneBit, Kind::OneBit),
        ] {
            let err = sign(c, k)
                .encode(&g, &mut Vec::new())
                .unwrap_err()
                .to_string();
            assert!(err.contains("element 77"), "{err}");
        }
    }
}
