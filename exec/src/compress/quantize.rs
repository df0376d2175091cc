//! Quantizers: QSGD, TernGrad, natural compression, TBQ.
//!
//! QSGD uses stochastic levels, TernGrad stochastic ternary codes, natural compression stochastic
//! powers of two, and TBQ fixed two-bit codes.
//!
//! Wire formats: `qsgd` f32 L2 norm, then n codes of b = bits(2s) bits holding level + s;
//! `terngrad` f32 max|x| then 2-bit codes (0 → 0, 1 → +max, 2 → −max); `tbq` 2-bit codes only
//! (τ comes from the spec); `natural` i32 exponent `top` then one byte per element: 0 is zero,
//! otherwise bit 7 is the sign and m = bits 0..6 (1..=127) means 2^(top + 1 − m).

use super::bits::{pack2, pack2_codes, unpack2_add, BitReader, BitWriter};
use super::rng::Counter;
use super::scan::{check_finite, max_abs, sum_map, CHUNK};
use super::wire::{bad_payload, expect_len, get4, get_f32};
use super::{not_in_family, Build, Codec};
use crate::error::Result;
use syncopate_sim::compress::{qsgd_bits, Compressor, QSGD_MAX_LEVELS};

/// Which quantizer, with its parameter.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Qsgd(u32),
    TernGrad,
    Natural,
    Tbq(f32),
}

pub(crate) fn codec(build: &Build) -> Box<dyn Codec> {
    let kind = match build.compressor {
        Compressor::Qsgd { levels } => Kind::Qsgd(levels),
        Compressor::TernGrad => Kind::TernGrad,
        Compressor::Natural => Kind::Natural,
        Compressor::Tbq { threshold } => Kind::Tbq(threshold as f32),
        other => not_in_family(other, "quantize"),
    };
    quantizer(build.compressor, kind, build.seed)
}

fn quantizer(c: Compressor, kind: Kind, seed: u64) -> Box<dyn Codec> {
    Box::new(Quantizer {
        c,
        kind,
        rng: Counter::new(seed),
    })
}

struct Quantizer {
    c: Compressor,
    kind: Kind,
    rng: Counter,
}

/// Elements per block: a block's uniforms are drawn first (the scalar draws), then the
/// block is quantized in a branch-free loop that vectorizes. Even, so that pairs never straddle
/// blocks, and a multiple of 16 so that every block of codes starts on a byte boundary.
const BLOCK: usize = 256;

/// An upper bound on QSGD's r = |x|·levels/‖g‖ (at most about 1.23 · `QSGD_MAX_LEVELS`).
const QSGD_CLAMP: f32 = (1u32 << 20) as f32;

/// 2^-24: a 24-bit uniform integer u stands for the float u·2^-24 in [0, 1).
const U24_SCALE: f32 = 1.0 / (1u32 << 24) as f32;

/// Fills `u` with 24-bit uniform integers in index order, two per draw exactly as
/// `Rng::next_f32_pair` splits a draw (so u·2^-24 are the same floats), a lone last element from
/// the high half of a fresh draw. Blocks start at even indices, so the stream does not depend on
/// the block size: a seed fixes the payload. `u` holds at most `BLOCK` elements.
#[inline(always)]
fn fill_u24(rng: &mut Counter, u: &mut [u32]) {
    let mut draws = [0u64; BLOCK / 2];
    let draws = &mut draws[..u.len().div_ceil(2)];
    rng.fill_u64(draws);
    let mut pairs = u.chunks_exact_mut(2);
    for (p, &x) in (&mut pairs).zip(draws.iter()) {
        p[0] = (x >> 40) as u32;
        p[1] = ((x >> 8) & 0xFF_FFFF) as u32;
    }
    if let [last] = pairs.into_remainder() {
        *last = (draws[draws.len() - 1] >> 40) as u32;
    }
}

/// How many raw draws (`Counter::fill_u64` outputs) one encode of `n` elements consumes: element
/// i takes draw i / 2, its bits 40..63 when i is even and bits 8..31 when odd (see
/// [`fill_u24`]). The GPU codecs' threads draw the same ones from their indices.
pub(crate) fn draws_for(n: usize) -> usize {
    n.div_ceil(2)
}

/// Writes B-bit codes (B ≤ 16) back to back, LSB first, as [`BitWriter`] does: every 8 codes
/// fill exactly B bytes, packed branch-free in a u128 (when B is even, every 4 fill B/2 bytes
/// of a u64); a last partial group goes through `BitWriter`. `dst` starts on the byte where these codes start.
fn pack_codes<const B: u32>(codes: &[u32], dst: &mut [u8]) {
    if B.is_multiple_of(2) {
        // Even B: every 4 codes fill exactly B/2 bytes, so a u64 is enough (same bytes).
        let half = B as usize / 2;
        let mut groups = codes.chunks_exact(4);
        let mut bytes = dst.chunks_exact_mut(half);
        for (g, d) in (&mut groups).zip(&mut bytes) {
            let acc = u64::from(g[0])
                | u64::from(g[1]) << B
                | u64::from(g[2]) << (2 * B)
                | u64::from(g[3]) << (3 * B);
            d.copy_from_slice(&acc.to_le_bytes()[..half]);
        }
        let tail = groups.remainder();
        if !tail.is_empty() {
            let mut w = BitWriter::new(&mut dst[codes.len() / 4 * half..]);
            for &c in tail {
                w.put(c, B);
            }
            w.finish();
        }
        return;
    }
    let mut groups = codes.chunks_exact(8);
    let mut bytes = dst.chunks_exact_mut(B as usize);
    for (g, d) in (&mut groups).zip(&mut bytes) {
        let mut acc = 0u128;
        for (j, &c) in g.iter().enumerate() {
            acc |= u128::from(c) << (j as u32 * B);
        }
        d.copy_from_slice(&acc.to_le_bytes()[..B as usize]);
    }
    let tail = groups.remainder();
    if !tail.is_empty() {
        let start = codes.len() / 8 * B as usize;
        let mut w = BitWriter::new(&mut dst[start..]);
        for &c in tail {
            w.put(c, B);
        }
        w.finish();
    }
}

/// QSGD's body: level ⌊r⌋ or ⌊r⌋ + 1 with probability r − ⌊r⌋ (r = |x|·s/‖g‖), code level ± s.
/// `WIDE` keeps the u32 conversions for level counts above `QSGD_MAX_LEVELS` (which only a
/// hand-built spec has); up to it, r < 2^20 and every integer involved is < 2^31, so the i32
/// conversions, which SSE2 vectorizes, give the same values.
#[inline(always)]
fn qsgd_body_impl<const B: u32, const WIDE: bool>(
    grad: &[f32],
    rng: &mut Counter,
    levels: u32,
    scale: f32,
    body: &mut [u8],
) {
    let lv = levels as i32;
    let code = |x: f32, ui: u32| -> u32 {
        if WIDE {
            let r = x.abs() * scale;
            let whole = r as u32;
            let up = u32::from((ui as f32 * U24_SCALE) < r - whole as f32);
            let level = whole.wrapping_add(up).min(levels);
            if x < 0.0 {
                levels - level
            } else {
                levels + level
            }
        } else {
            let r = x.abs() * scale;
            // r ≥ 0: truncation is floor, and stays in the vector unit (SSE2 has no floor
            // instruction). r ≤ about 1.23·levels (the norm's square may round down in
            // the subnormal range), so the clamp changes nothing and makes the unchecked
            // conversion, a plain cvttps2dq, sound. ui < 2^24 converts exactly via i32.
            // SAFETY: r.min(CLAMP) is in [0, 2^20] (r is never NaN: x and scale are finite).
            let whole: i32 = unsafe { r.min(QSGD_CLAMP).to_int_unchecked() };
            let up = i32::from((ui as i32 as f32 * U24_SCALE) < r - whole as f32);
            let level = (whole + up).min(lv);
            let signed = if x < 0.0 { -level } else { level };
            (lv + signed) as u32
        }
    };
    let mut u = [0u32; BLOCK];
    let mut codes = [0u32; BLOCK];
    let block_bytes = BLOCK * B as usize / 8;
    for (block, dst) in grad.chunks(BLOCK).zip(body.chunks_mut(block_bytes)) {
        let codes = &mut codes[..block.len()];
        // Eight elements at a time, their four draws made right where they are used: the
        // scalar RNG chain and the vector quantizing overlap instead of running in turns.
        let mut xs = block.chunks_exact(8);
        let mut cs = codes.chunks_exact_mut(8);
        for (x8, c8) in (&mut xs).zip(&mut cs) {
            let mut d = [0u64; 4];
            rng.fill_u64(&mut d);
            let mut u8s = [0u32; 8];
            for (p, &x) in u8s.chunks_exact_mut(2).zip(&d) {
                p[0] = (x >> 40) as u32;
                p[1] = ((x >> 8) & 0xFF_FFFF) as u32;
            }
            for ((c, &x), &ui) in c8.iter_mut().zip(x8).zip(&u8s) {
                *c = code(x, ui);
            }
        }
        let rest = xs.remainder();
        if !rest.is_empty() {
            // Only the last block has a remainder, starting at an even index.
            let u = &mut u[..rest.len()];
            fill_u24(rng, u);
            for ((c, &x), &ui) in cs.into_remainder().iter_mut().zip(rest).zip(u.iter()) {
                *c = code(x, ui);
            }
        }
        pack_codes::<B>(codes, dst);
    }
}

/// [`qsgd_body_impl`] compiled for AVX2 (no FMA: every float operation rounds as in the
/// baseline build, so the payload bytes are the same).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn qsgd_body_avx2<const B: u32, const WIDE: bool>(
    grad: &[f32],
    rng: &mut Counter,
    levels: u32,
    scale: f32,
    body: &mut [u8],
) {
    qsgd_body_impl::<B, WIDE>(grad, rng, levels, scale, body)
}

fn qsgd_body<const B: u32, const WIDE: bool>(
    grad: &[f32],
    rng: &mut Counter,
    levels: u32,
    scale: f32,
    body: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2.
        return unsafe { qsgd_body_avx2::<B, WIDE>(grad, rng, levels, scale, body) };
    }
    qsgd_body_impl::<B, WIDE>(grad, rng, levels, scale, body)
}

fn qsgd_encode(grad: &[f32], rng: &mut Counter, levels: u32, out: &mut Vec<u8>) -> Result<()> {
    let n = grad.len();
    let norm = sum_map(grad, |x| x * x)?.sqrt() as f32;
    let bits = qsgd_bits(levels);
    out.clear();
    out.resize(4 + (n * bits as usize).div_ceil(8), 0);
    out[..4].copy_from_slice(&norm.to_le_bytes());
    let scale = if norm > 0.0 {
        levels as f32 / norm
    } else {
        0.0
    };
    let body = &mut out[4..];
    if levels > QSGD_MAX_LEVELS {
        qsgd_body::<16, true>(grad, rng, levels, scale, body);
        return Ok(());
    }
    match bits {
        2 => qsgd_body::<2, false>(grad, rng, levels, scale, body),
        3 => qsgd_body::<3, false>(grad, rng, levels, scale, body),
        4 => qsgd_body::<4, false>(grad, rng, levels, scale, body),
        5 => qsgd_body::<5, false>(grad, rng, levels, scale, body),
        6 => qsgd_body::<6, false>(grad, rng, levels, scale, body),
        7 => qsgd_body::<7, false>(grad, rng, levels, scale, body),
        8 => qsgd_body::<8, false>(grad, rng, levels, scale, body),
        9 => qsgd_body::<9, false>(grad, rng, levels, scale, body),
        10 => qsgd_body::<10, false>(grad, rng, levels, scale, body),
        11 => qsgd_body::<11, false>(grad, rng, levels, scale, body),
        12 => qsgd_body::<12, false>(grad, rng, levels, scale, body),
        13 => qsgd_body::<13, false>(grad, rng, levels, scale, body),
        14 => qsgd_body::<14, false>(grad, rng, levels, scale, body),
        15 => qsgd_body::<15, false>(grad, rng, levels, scale, body),
        _ => qsgd_body::<16, false>(grad, rng, levels, scale, body),
    }
    Ok(())
}

fn terngrad_encode(grad: &[f32], rng: &mut Counter, out: &mut Vec<u8>) -> Result<()> {
    let max = max_abs(grad)?;
    let inv = if max > 0.0 { 1.0 / max } else { 0.0 };
    out.clear();
    out.resize(4 + grad.len().div_ceil(4), 0);
    out[..4].copy_from_slice(&max.to_le_bytes());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2.
        unsafe { terngrad_body_avx2(grad, rng, inv, &mut out[4..]) };
        return Ok(());
    }
    terngrad_body(grad, rng, inv, &mut out[4..]);
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn terngrad_body_avx2(grad: &[f32], rng: &mut Counter, inv: f32, body: &mut [u8]) {
    terngrad_body(grad, rng, inv, body)
}

#[inline(always)]
fn terngrad_body(grad: &[f32], rng: &mut Counter, inv: f32, body: &mut [u8]) {
    let mut u = [0u32; BLOCK];
    let mut codes = [0u8; BLOCK];
    for (block, dst) in grad.chunks(BLOCK).zip(body.chunks_mut(BLOCK / 4)) {
        let u = &mut u[..block.len()];
        fill_u24(rng, u);
        let codes = &mut codes[..block.len()];
        for ((c, &x), &ui) in codes.iter_mut().zip(block).zip(u.iter()) {
            // ui < 2^24 converts exactly through i32 (which SSE2 vectorizes).
            let keep = (ui as i32 as f32 * U24_SCALE) < x.abs() * inv;
            *c = u8::from(keep) * (1 + u8::from(x < 0.0));
        }
        pack2_codes(codes, dst);
    }
}

fn tbq_encode(grad: &[f32], tau: f32, out: &mut Vec<u8>) -> Result<()> {
    out.clear();
    out.resize(grad.len().div_ceil(4), 0);
    for (c, (src, dst)) in grad
        .chunks(CHUNK)
        .zip(out.chunks_mut(CHUNK / 4))
        .enumerate()
    {
        check_finite(src, c * CHUNK)?;
        pack2(src, dst, |_, x| {
            u8::from(x > tau) | (u8::from(x < -tau) << 1)
        });
    }
    Ok(())
}

/// Natural compression's exponent range: one byte holds 127 powers of two below `top + 1`.
const NATURAL_EXPONENTS: i32 = 127;

fn natural_encode(grad: &[f32], rng: &mut Counter, out: &mut Vec<u8>) -> Result<()> {
    let max = max_abs(grad)?;
    // top is the largest exponent an element can round up to: floor(log2 max) + 1, kept below
    // 2^128 (elements ≥ 2^127 then round down deterministically, the one biased case).
    let max_exp = ((max.to_bits() >> 23) as i32 - 127).max(-126);
    let top = (max_exp + 1).min(127);
    out.clear();
    out.resize(4 + grad.len(), 0);
    out[..4].copy_from_slice(&top.to_le_bytes());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2.
        unsafe { natural_body_avx2(grad, rng, top, &mut out[4..]) };
        return Ok(());
    }
    natural_body(grad, rng, top, &mut out[4..]);
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn natural_body_avx2(grad: &[f32], rng: &mut Counter, top: i32, body: &mut [u8]) {
    natural_body(grad, rng, top, body)
}

#[inline(always)]
fn natural_body(grad: &[f32], rng: &mut Counter, top: i32, body: &mut [u8]) {
    let bottom = top + 1 - NATURAL_EXPONENTS;
    let low_scale = 2f64.powi(24 - bottom);
    let mut u = [0u32; BLOCK];
    for (block, dst) in grad.chunks(BLOCK).zip(body.chunks_mut(BLOCK)) {
        let u = &mut u[..block.len()];
        fill_u24(rng, u);
        // Elements in range (and zeros) are coded branch-free; the rare ones below the range
        // (|x| < 2^bottom, or subnormal) are flagged and recoded one by one.
        let mut rare = 0u32;
        for ((d, &x), &ui) in dst.iter_mut().zip(block).zip(u.iter()) {
            let bits = x.to_bits();
            let abs = bits & 0x7FFF_FFFF;
            let sign = ((bits >> 31) << 7) as i32;
            let biased = (abs >> 23) as i32;
            let e = biased - 127;
            // a = 2^e·(1 + m·2^-23) rounds up to 2^(e+1) with probability m·2^-23, i.e. when
            // u·2^-24 < m·2^-23: u < 2m, so E = a. Both sides are < 2^24: signed compare.
            let up = i32::from(((ui as i32) < 2 * (abs & 0x7F_FFFF) as i32) & (e < top));
            let in_range = sign | (top + 1 - e - up);
            let zero = abs == 0;
            *d = if zero { 0 } else { in_range as u8 };
            rare |= u32::from(!zero & ((e < bottom) | (biased == 0)));
        }
        if rare != 0 {
            for ((d, &x), &ui) in dst.iter_mut().zip(block).zip(u.iter()) {
                let bits = x.to_bits();
                let abs = bits & 0x7FFF_FFFF;
                let e = (abs >> 23) as i32 - 127;
                if abs != 0 && (e < bottom || abs >> 23 == 0) {
                    // Below the range an element becomes 2^bottom with probability
                    // a / 2^bottom, i.e. when u·2^-24 < a·2^-bottom: u < a·2^(24 − bottom),
                    // exact in f64 (a power-of-two scaling).
                    let sign = ((bits >> 31) << 7) as u8;
                    *d = if f64::from(ui) < f64::from(f32::from_bits(abs)) * low_scale {
                        sign | NATURAL_EXPONENTS as u8
                    } else {
                        0
                    };
                }
            }
        }
    }
}

impl Codec for Quantizer {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        match self.kind {
            Kind::Qsgd(levels) => qsgd_encode(grad, &mut self.rng, levels, out)?,
            Kind::TernGrad => terngrad_encode(grad, &mut self.rng, out)?,
            Kind::Tbq(tau) => tbq_encode(grad, tau, out)?,
            Kind::Natural => natural_encode(grad, &mut self.rng, out)?,
        }
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        expect_len(&self.c, payload, acc.len())?;
        let valid = match self.kind {
            Kind::Qsgd(levels) => {
                let norm = get_f32(&self.c, payload, 0)?;
                let step = norm / levels as f32;
                let bits = qsgd_bits(levels);
                let mut r = BitReader::new(&payload[4..]);
                let mut bad = false;
                for a in acc.iter_mut() {
                    let code = r.get(bits);
                    bad |= code > 2 * levels;
                    *a += (code as f32 - levels as f32) * step;
                }
                !bad
            }
            Kind::TernGrad => {
                let max = get_f32(&self.c, payload, 0)?;
                unpack2_add(&payload[4..], acc, [0.0, max, -max])
            }
            Kind::Tbq(tau) => unpack2_add(payload, acc, [0.0, tau, -tau]),
            Kind::Natural => {
                let top = i32::from_le_bytes(get4(&self.c, payload, 0)?);
                let mut table = [0.0f32; 256];
                for (code, v) in table.iter_mut().enumerate().skip(1) {
                    let m = (code & 0x7F) as i32;
                    let magnitude = if m == 0 {
                        0.0
                    } else {
                        2f64.powi(top + 1 - m) as f32
                    };
                    *v = if code & 0x80 != 0 {
                        -magnitude
                    } else {
                        magnitude
                    };
                }
                for (a, &code) in acc.iter_mut().zip(&payload[4..]) {
                    *a += table[code as usize];
                }
                true
            }
        };
        if valid {
            Ok(())
        } else {
            Err(bad_payload(&self.c, "a code outside the format's range"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(c: Compressor, kind: Kind, g: &[f32], seed: u64) -> Vec<f32> {
        let mut codec = quantizer(c, kind, seed);
        let mut p = Vec::new();
        codec.encode(g, &mut p).unwrap();
        assert_eq!(p.len() as u64, c.wire_bytes(g.len() as u64), "{c}");
        let mut out = vec![0.0; g.len()];
        codec.decode_add(&p, &mut out).unwrap();
        out
    }

    #[test]
    fn outputs_lie_on_the_grid() {
        let g: Vec<f32> = (0..999).map(|i| ((i as f32) * 0.71).cos() * 0.5).collect();
        let max = g.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        for y in decoded(Compressor::TernGrad, Kind::TernGrad, &g, 1) {
            assert!(y == 0.0 || y.abs() == max);
        }
        for (x, y) in g.iter().zip(decoded(
            Compressor::Tbq { threshold: 0.25 },
            Kind::Tbq(0.25),
            &g,
            1,
        )) {
            let want = if *x > 0.25 {
                0.25
            } else if *x < -0.25 {
                -0.25
            } else {
                0.0
            };
            assert_eq!(y, want);
        }
        for (x, y) in g
            .iter()
            .zip(decoded(Compressor::Natural, Kind::Natural, &g, 1))
        {
            // y is 0 or a power of two within a factor of two of x, with x's sign.
            assert!(y == 0.0 || (y.abs().log2().fract() == 0.0 && y.signum() == x.signum()));
            assert!(y.abs() <= 2.0 * x.abs() + 1e-30);
        }
        let norm = g.iter().map(|x| x * x).sum::<f32>().sqrt();
        for y in decoded(Compressor::Qsgd { levels: 4 }, Kind::Qsgd(4), &g, 1) {
            let level = y / norm * 4.0;
            assert!((level - level.round()).abs() < 1e-4 && level.abs() <= 4.0);
        }
    }

    /// The block-wise uniforms equal the whole-tensor mapping `draws_for` documents (what the
    /// GPU codecs rely on), for even and odd lengths and across blocks.
    #[test]
    fn uniforms_follow_the_documented_draw_mapping() {
        for n in [0usize, 1, 2, 7, 255, 256, 257, 1001] {
            let mut a = Counter::new(5);
            let mut want = Vec::new();
            let mut u = [0u32; BLOCK];
            for block in (0..n).collect::<Vec<_>>().chunks(BLOCK) {
                let u = &mut u[..block.len()];
                fill_u24(&mut a, u);
                want.extend_from_slice(u);
            }
            let mut b = Counter::new(5);
            let mut draws = vec![0u64; draws_for(n)];
            b.fill_u64(&mut draws);
            let got: Vec<u32> = (0..n)
                .map(|i| {
                    let d = draws[i / 2];
                    if i % 2 == 0 {
                        (d >> 40) as u32
                    } else {
                        ((d >> 8) & 0xFF_FFFF) as u32
                    }
                })
                .collect();
            assert_eq!(got, want, "n={n}");
            assert_eq!(a.take(1), b.take(1), "n={n}: same stream position");
        }
    }

    #[test]
    fn natural_handles_extreme_magnitudes() {
        let g = [f32::MAX, -1e-30, 1e-45, 0.0, 3.0e38];
        let y = decoded(Compressor::Natural, Kind::Natural, &g, 3);
        assert!(y.iter().all(|v| v.is_finite()));
        assert_eq!(y[0], 2f32.powi(127));
    }

    #[test]
    fn bad_codes_are_errors() {
        let c = Compressor::TernGrad;
        let mut codec = quantizer(c, Kind::TernGrad, 0);
        let payload = [0, 0, 128, 63, 0xFF];
        assert!(codec.decode_add(&payload, &mut [0.0; 4]).is_err());
    }
}
