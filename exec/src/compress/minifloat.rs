//! Round-to-nearest-even, saturating conversions between f32 and fp16, bf16 and fp8 (e4m3, e5m2).
//!
//! Written as branch-free integer arithmetic with one select so that the loops that call them
//! auto-vectorize. Inputs are finite (checked by the caller); values beyond the largest finite
//! value saturate to it instead of becoming infinite, so a large gradient stays large but usable.

/// Encodes a finite f32 into a float with `E` exponent bits and `M` mantissa bits (IEEE-style
/// bias 2^(E-1)-1, subnormals), returning the code with the sign at bit E+M. `MAX` is the code
/// of the largest finite magnitude.
#[inline(always)]
pub fn encode<const E: u32, const M: u32, const MAX: u32>(x: f32) -> u32 {
    let bias = (1i32 << (E - 1)) - 1;
    let bits = x.to_bits();
    let sign = (bits >> 31) << (E + M);
    // Signed arithmetic throughout (|x| bits < 2^31): SSE2 has signed compares but no unsigned
    // ones or integer min, so this keeps the loop vectorized on the baseline target.
    let abs = (bits & 0x7FFF_FFFF) as i32;
    // Normal range: round the f32 mantissa to M bits, ties to even, then rebias the exponent;
    // a carry out of the mantissa correctly bumps the exponent.
    let shift = 23 - M;
    let rounded = abs + ((1 << (shift - 1)) - 1) + ((abs >> shift) & 1);
    let normal = (rounded >> shift) - ((127 - bias) << M);
    let normal = if normal > MAX as i32 {
        MAX as i32
    } else {
        normal
    };
    // Subnormal range: scale so that one unit is the smallest subnormal and let the FPU round
    // ties to even by adding 2^23 (the integer lands in the low mantissa bits).
    let min_normal = (127 - bias + 1) << 23;
    let sub_scale = f32::from_bits(((127 + bias - 1 + M as i32) as u32) << 23);
    let sub = (f32::from_bits(abs as u32) * sub_scale + 8_388_608.0).to_bits() as i32 - 0x4B00_0000;
    let magnitude = if abs < min_normal { sub } else { normal };
    sign | magnitude as u32
}

/// Decodes a code written by [`encode`]. Codes with an all-ones exponent decode as infinity or
/// NaN when the format has them (`IEEE_SPECIALS`), as NaN for e4m3's single NaN code.
#[inline(always)]
pub fn decode<const E: u32, const M: u32, const IEEE_SPECIALS: bool>(code: u32) -> f32 {
    let bias = (1i32 << (E - 1)) - 1;
    let sign = ((code >> (E + M)) & 1) << 31;
    let magnitude = code & ((1 << (E + M)) - 1);
    let normal = (magnitude << (23 - M)) + (((127 - bias) as u32) << 23);
    let smallest_subnormal = f32::from_bits(((127 - bias + 1 - M as i32) as u32) << 23);
    let sub = (magnitude as i32 as f32 * smallest_subnormal).to_bits();
    let exponent_all_ones = magnitude >> M == (1 << E) - 1;
    let special = if IEEE_SPECIALS {
        0x7F80_0000 | ((magnitude & ((1 << M) - 1)) << (23 - M))
    } else if magnitude == (1 << (E + M)) - 1 {
        0x7FC0_0000
    } else {
        normal
    };
    let value = if magnitude < (1 << M) {
        sub
    } else if exponent_all_ones {
        special
    } else {
        normal
    };
    f32::from_bits(value | sign)
}

/// Encodes an f32 as IEEE fp16 bits, ties to even, saturating at ±65504.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    encode::<5, 10, 0x7BFF>(x) as u16
}

/// Decodes IEEE fp16 bits to an f32 (infinities and NaNs included).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    decode::<5, 10, true>(u32::from(h))
}

/// bf16 is the top half of an f32, so rounding is a bias add on the discarded half.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let abs = bits & 0x7FFF_FFFF;
    let rounded = ((abs + 0x7FFF + ((abs >> 16) & 1)) >> 16).min(0x7F7F);
    ((bits >> 16) & 0x8000) as u16 | rounded as u16
}

/// Decodes bf16 bits to an f32 exactly: they are its top 16 bits.
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Encodes an f32 as fp8 e4m3, ties to even, saturating at ±[`E4M3_MAX`].
pub fn f32_to_e4m3(x: f32) -> u8 {
    encode::<4, 3, 0x7E>(x) as u8
}

/// Decodes an fp8 e4m3 code to an f32 (e4m3 has no infinity; its all-ones code is NaN).
pub fn e4m3_to_f32(c: u8) -> f32 {
    decode::<4, 3, false>(u32::from(c))
}

/// Encodes an f32 as fp8 e5m2, ties to even, saturating at ±[`E5M2_MAX`].
pub fn f32_to_e5m2(x: f32) -> u8 {
    encode::<5, 2, 0x7B>(x) as u8
}

/// Decodes an fp8 e5m2 code to an f32 (infinities and NaNs included).
pub fn e5m2_to_f32(c: u8) -> f32 {
    decode::<5, 2, true>(u32::from(c))
}

/// Largest finite magnitude of fp8 e4m3.
pub const E4M3_MAX: f32 = 448.0;
/// Largest finite magnitude of fp8 e5m2.
pub const E5M2_MAX: f32 = 57344.0;

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference rounding: the nearest representable value by exhaustive search over codes,
    /// ties to the even code, saturating.
    fn nearest(x: f32, codes: impl Iterator<Item = u32>, dec: impl Fn(u32) -> f32) -> u32 {
        let mut best = (f64::INFINITY, 0u32);
        for c in codes {
            let v = dec(c);
            if !v.is_finite() {
                continue;
            }
            let d = (f64::from(v) - f64::from(x)).abs();
            if d < best.0 || (d == best.0 && c & 1 == 0 && (best.1 & 1 == 1)) {
                best = (d, c);
            }
        }
        best.1
    }

    fn sweep() -> Vec<f32> {
        let mut r = super::super::rng::Rng::new(5);
        let mut xs = vec![
            0.0, 1.0, -1.0, 448.0, 464.0, 480.0, 1e6, -1e6, 57344.0, 61440.0, 1e-9,
        ];
        for _ in 0..3000 {
            let e = r.below(50) as i32 - 30;
            let (m, s) = r.next_f32_pair();
            let v = (1.0 + m) * 2f32.powi(e);
            xs.push(if s < 0.5 { v } else { -v });
        }
        // Exact midpoints between neighbouring e4m3 codes exercise ties-to-even.
        for c in 0..0x7Eu32 {
            xs.push((e4m3_to_f32(c as u8) + e4m3_to_f32(c as u8 + 1)) / 2.0);
        }
        xs
    }

    #[test]
    fn fp8_matches_exhaustive_nearest_even() {
        for x in sweep() {
            // Compare values: +0 and -0 are equally near for tiny inputs.
            let e4 = nearest(x, 0..256, |c| e4m3_to_f32(c as u8));
            assert_eq!(
                e4m3_to_f32(f32_to_e4m3(x)),
                e4m3_to_f32(e4 as u8),
                "e4m3 {x}"
            );
            let e5 = nearest(x, 0..256, |c| e5m2_to_f32(c as u8));
            assert_eq!(
                e5m2_to_f32(f32_to_e5m2(x)),
                e5m2_to_f32(e5 as u8),
                "e5m2 {x}"
            );
        }
    }

    #[test]
    fn fp8_known_values() {
        assert_eq!(e4m3_to_f32(0x7E), E4M3_MAX);
        assert!(e4m3_to_f32(0x7F).is_nan());
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e5m2_to_f32(0x7B), E5M2_MAX);
        assert_eq!(e5m2_to_f32(0x7C), f32::INFINITY);
        assert_eq!(f32_to_e4m3(1e9), 0x7E);
        assert_eq!(f32_to_e4m3(-1e9), 0xFE);
        assert_eq!(f32_to_e5m2(1.0), 0x3C);
    }

    #[test]
    fn fp16_and_bf16_round_to_nearest_even() {
        for x in sweep() {
            let h = nearest(x, (0..0x7C00).chain(0x8000..0xFC00), |c| {
                f16_to_f32(c as u16)
            });
            let got = f32_to_f16(x);
            // -0 and +0 are the same distance; compare values.
            assert_eq!(f16_to_f32(got), f16_to_f32(h as u16), "f16 {x}");
            let b = f32_to_bf16(x);
            let err = (bf16_to_f32(b) - x).abs();
            assert!(err <= x.abs() * 2f32.powi(-8), "bf16 {x}");
        }
        assert_eq!(f32_to_f16(1.0), 0x3C00);
        assert_eq!(f32_to_f16(1e6), 0x7BFF);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f32_to_bf16(f32::MAX), 0x7F7F);
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3F80); // tie to even
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
    }
}
