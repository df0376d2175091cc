//! fp16 conversions with x86's F16C instructions.
//!
//! They give the bytes and sums of `minifloat`'s integer arithmetic at a third of its time.
//!
//! `vcvtps2ph` rounds to nearest even as `minifloat::f32_to_f16` does, but overflows to
//! infinity where the codec saturates, so inputs are clamped to ±65504 first (a value between
//! 65504 and 65520 rounds to 65504 either way). `vcvtph2ps` is exact, as the table-free decode
//! is; a signaling-NaN code comes out quieted, which the sum it is added to does anyway.

use std::arch::x86_64::{
    _mm256_add_ps, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_max_ps, _mm256_min_ps,
    _mm256_set1_ps, _mm256_storeu_ps, _mm_loadu_si128, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
};

use super::minifloat::{f16_to_f32, f32_to_f16};

/// The largest finite fp16 value.
const HALF_MAX: f32 = 65504.0;

/// Whether this CPU runs the F16C loops.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
}

/// Writes `src` (finite) as little-endian fp16 codes into `dst` (two bytes per element).
///
/// # Safety
/// The CPU supports F16C and AVX ([`available`]).
#[target_feature(enable = "avx,f16c")]
pub(super) unsafe fn encode(src: &[f32], dst: &mut [u8]) {
    let blocks = (src.len() / 8).min(dst.len() / 16);
    let (low, high) = (_mm256_set1_ps(-HALF_MAX), _mm256_set1_ps(HALF_MAX));
    for b in 0..blocks {
        // SAFETY: block `b` has 8 elements in `src` and 16 bytes in `dst` (`blocks` fits
        // both); unaligned loads and stores.
        unsafe {
            let x = _mm256_loadu_ps(src.as_ptr().add(b * 8));
            let clamped = _mm256_min_ps(_mm256_max_ps(x, low), high);
            let codes = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(clamped);
            _mm_storeu_si128(dst.as_mut_ptr().add(b * 16).cast(), codes);
        }
    }
    for (d, &x) in dst[blocks * 16..]
        .chunks_exact_mut(2)
        .zip(&src[blocks * 8..])
    {
        d.copy_from_slice(&f32_to_f16(x).to_le_bytes());
    }
}

/// Adds the little-endian fp16 codes of `src` (two bytes per element) to `acc`.
///
/// # Safety
/// The CPU supports F16C and AVX ([`available`]).
#[target_feature(enable = "avx,f16c")]
pub(super) unsafe fn decode_add(src: &[u8], acc: &mut [f32]) {
    let blocks = (acc.len() / 8).min(src.len() / 16);
    for b in 0..blocks {
        // SAFETY: block `b` has 16 bytes in `src` and 8 elements in `acc` (`blocks` fits
        // both); unaligned loads and stores.
        unsafe {
            let codes = _mm_loadu_si128(src.as_ptr().add(b * 16).cast());
            let a = acc.as_mut_ptr().add(b * 8);
            _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), _mm256_cvtph_ps(codes)));
        }
    }
    for (a, c) in acc[blocks * 8..]
        .iter_mut()
        .zip(src[blocks * 16..].chunks_exact(2))
    {
        *a += f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}
