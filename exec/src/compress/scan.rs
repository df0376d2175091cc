//! Chunked scans shared by the kernels: finiteness checks and the reductions scales need.
//!
//! A finiteness check names the bad index.

use crate::error::{ExecError, Result};

/// Elements per chunk: small enough to stay in L1 between the check and the kernel's pass,
/// and a multiple of 8 so that bit-packed outputs start on byte boundaries.
pub(crate) const CHUNK: usize = 4096;

const ABS_MASK: u32 = 0x7FFF_FFFF;
const MAX_FINITE: u32 = 0x7F7F_FFFF;

/// Errs with the first non-finite element; `base` is the chunk's offset in the whole tensor.
/// The flag is OR-ed branch-free over the chunk so the common all-finite case vectorizes.
#[inline(always)]
pub(crate) fn check_finite(chunk: &[f32], base: usize) -> Result<()> {
    let bad = chunk.iter().fold(0u32, |acc, x| {
        acc | u32::from((x.to_bits() & ABS_MASK) > MAX_FINITE)
    });
    if bad == 0 {
        return Ok(());
    }
    match chunk.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(ExecError::NonFinite {
            index: base + i,
            value: chunk[i],
        }),
        None => Ok(()),
    }
}

/// Checks the whole tensor.
pub fn check_all(grad: &[f32]) -> Result<()> {
    for (c, chunk) in grad.chunks(CHUNK).enumerate() {
        check_finite(chunk, c * CHUNK)?;
    }
    Ok(())
}

/// max |x| over a finite tensor, checking it on the way.
pub(crate) fn max_abs(grad: &[f32]) -> Result<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2.
        return unsafe { max_abs_avx2(grad) };
    }
    max_abs_impl(grad)
}

/// [`max_abs_impl`] compiled for AVX2: the same lanes, so the same result.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_abs_avx2(grad: &[f32]) -> Result<f32> {
    max_abs_impl(grad)
}

#[inline(always)]
fn max_abs_impl(grad: &[f32]) -> Result<f32> {
    let mut best = 0.0f32;
    for (c, chunk) in grad.chunks(CHUNK).enumerate() {
        check_finite(chunk, c * CHUNK)?;
        let mut lanes = [0.0f32; 16];
        let mut blocks = chunk.chunks_exact(16);
        for block in &mut blocks {
            for (lane, x) in lanes.iter_mut().zip(block) {
                let a = x.abs();
                *lane = if a > *lane { a } else { *lane };
            }
        }
        for x in blocks.remainder() {
            best = best.max(x.abs());
        }
        best = lanes.iter().fold(best, |m, &l| m.max(l));
    }
    Ok(best)
}

/// Σ f(x) over a finite tensor, in f32 lanes per chunk and f64 across chunks so that large
/// tensors do not lose precision.
pub(crate) fn sum_map(grad: &[f32], f: impl Fn(f32) -> f32) -> Result<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2.
        return unsafe { sum_map_avx2(grad, f) };
    }
    sum_map_impl(grad, f)
}

/// [`sum_map_impl`] compiled for AVX2 (no FMA: the same lanes and roundings, the same sum).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_map_avx2(grad: &[f32], f: impl Fn(f32) -> f32) -> Result<f64> {
    sum_map_impl(grad, f)
}

#[inline(always)]
fn sum_map_impl(grad: &[f32], f: impl Fn(f32) -> f32) -> Result<f64> {
    let mut total = 0.0f64;
    for (c, chunk) in grad.chunks(CHUNK).enumerate() {
        check_finite(chunk, c * CHUNK)?;
        let mut lanes = [0.0f32; 16];
        let mut blocks = chunk.chunks_exact(16);
        for block in &mut blocks {
            for (lane, &x) in lanes.iter_mut().zip(block) {
                *lane += f(x);
            }
        }
        let tail: f32 = blocks.remainder().iter().map(|&x| f(x)).sum();
        total += f64::from(lanes.iter().sum::<f32>() + tail);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_the_first_bad_index() {
        let mut g = vec![1.0f32; 10_000];
        g[5000] = f32::NAN;
        g[7000] = f32::INFINITY;
        match check_all(&g) {
            Err(ExecError::NonFinite { index, .. }) => assert_eq!(index, 5000),
            other => panic!("{other:?}"),
        }
        assert!(max_abs(&g).is_err());
        g[5000] = -3.0;
        g[7000] = 2.0;
        assert!(check_all(&g).is_ok());
        assert_eq!(max_abs(&g).unwrap(), 3.0);
        assert_eq!(sum_map(&g, f32::abs).unwrap(), 9998.0 + 5.0);
    }
}
