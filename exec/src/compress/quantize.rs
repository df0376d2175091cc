//! Quantizers: QSGD (stochastic levels), TernGrad (stochastic ternary), natural compression (stochastic powers of two), TBQ (fixed two-bit).
//!
//! Wire formats: `qsgd` f32 L2 norm, then n codes of b = bits(2s) bits holding level + s;
//! `terngrad` f32 max|x| then 2-bit codes (0 → 0, 1 → +max, 2 → −max); `tbq` 2-bit codes only
//! (τ comes from the spec); `natural` i32 exponent `top` then one byte per element: 0 is zero,
//! otherwise bit 7 is the sign and m = bits 0..6 (1..=127) means 2^(top + 1 − m).

use super::bits::{pack2, unpack2_add, BitReader, BitWriter};
use super::rng::Rng;
use super::scan::{check_all, max_abs, sum_map};
use super::wire::{bad_payload, expect_len, get4, get_f32};
use super::Codec;
use crate::error::Result;
use syncopate_sim::compress::{qsgd_bits, Compressor};

/// Which quantizer, with its parameter.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Qsgd(u32),
    TernGrad,
    Natural,
    Tbq(f32),
}

pub fn codec(c: Compressor, kind: Kind, seed: u64) -> Box<dyn Codec> {
    Box::new(Quantizer {
        c,
        kind,
        rng: Rng::new(seed),
    })
}

struct Quantizer {
    c: Compressor,
    kind: Kind,
    rng: Rng,
}

/// Calls `f(i, x, u)` for every element with a fresh uniform u in [0, 1), two per RNG draw, in
/// index order so that a seed fixes the payload.
fn with_uniforms(grad: &[f32], rng: &mut Rng, mut f: impl FnMut(usize, f32, f32)) {
    let mut pairs = grad.chunks_exact(2);
    for (p, pair) in (&mut pairs).enumerate() {
        let (u, v) = rng.next_f32_pair();
        f(2 * p, pair[0], u);
        f(2 * p + 1, pair[1], v);
    }
    if let [x] = pairs.remainder() {
        f(grad.len() - 1, *x, rng.next_f32_pair().0);
    }
}

/// Natural compression's exponent range: one byte holds 127 powers of two below `top + 1`.
const NATURAL_EXPONENTS: i32 = 127;

fn natural_encode(grad: &[f32], rng: &mut Rng, out: &mut Vec<u8>) -> Result<()> {
    let max = max_abs(grad)?;
    // top is the largest exponent an element can round up to: floor(log2 max) + 1, kept below
    // 2^128 (elements ≥ 2^127 then round down deterministically, the one biased case).
    let max_exp = ((max.to_bits() >> 23) as i32 - 127).max(-126);
    let top = (max_exp + 1).min(127);
    let bottom = top + 1 - NATURAL_EXPONENTS;
    let floor = 2f64.powi(bottom);
    out.clear();
    out.resize(4 + grad.len(), 0);
    out[..4].copy_from_slice(&top.to_le_bytes());
    let body = &mut out[4..];
    with_uniforms(grad, rng, |i, x, u| {
        let a = x.abs();
        let sign = if x < 0.0 { 0x80 } else { 0 };
        let e = (a.to_bits() >> 23) as i32 - 127;
        body[i] = if a == 0.0 {
            0
        } else if e >= bottom && a.is_normal() {
            // a = 2^e·(1 + f): round up to 2^(e+1) with probability f, so E = a.
            let low = f32::from_bits(a.to_bits() & 0x7F80_0000);
            let up = u < (a - low) / low && e < top;
            let exponent = e + i32::from(up);
            sign | (top + 1 - exponent) as u8
        } else {
            // Below the range: 0 or 2^bottom with probability a / 2^bottom.
            let up = f64::from(u) < f64::from(a) / floor;
            if up {
                sign | NATURAL_EXPONENTS as u8
            } else {
                0
            }
        };
    });
    Ok(())
}

impl Codec for Quantizer {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        let n = grad.len();
        match self.kind {
            Kind::Qsgd(levels) => {
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
                let mut w = BitWriter::new(&mut out[4..]);
                with_uniforms(grad, &mut self.rng, |_, x, u| {
                    let r = x.abs() * scale;
                    let low = r.floor();
                    let level = ((low + f32::from(u8::from(u < r - low))) as u32).min(levels);
                    let code = if x < 0.0 {
                        levels - level
                    } else {
                        levels + level
                    };
                    w.put(code, bits);
                });
                w.finish();
            }
            Kind::TernGrad => {
                let max = max_abs(grad)?;
                let inv = if max > 0.0 { 1.0 / max } else { 0.0 };
                out.clear();
                out.resize(4 + n.div_ceil(4), 0);
                out[..4].copy_from_slice(&max.to_le_bytes());
                let mut uniforms = vec![0.0f32; n];
                with_uniforms(grad, &mut self.rng, |i, _, u| uniforms[i] = u);
                pack2(grad, &mut out[4..], |i, x| {
                    let keep = uniforms[i] < x.abs() * inv;
                    u8::from(keep) * (1 + u8::from(x < 0.0))
                });
            }
            Kind::Tbq(tau) => {
                check_all(grad)?;
                out.clear();
                out.resize(n.div_ceil(4), 0);
                pack2(grad, out, |_, x| {
                    u8::from(x > tau) | (u8::from(x < -tau) << 1)
                });
            }
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
        let mut codec = codec(c, kind, seed);
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
        let mut codec = codec(c, Kind::TernGrad, 0);
        let payload = [0, 0, 128, 63, 0xFF];
        assert!(codec.decode_add(&payload, &mut [0.0; 4]).is_err());
    }
}
