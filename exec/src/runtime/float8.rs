//! torchao's float8 gathers on the CPU backends: each weight's scale, agreed on by every rank,
//! and the cast of a shard's float8 part with it.
//!
//! As torchao 0.18 does under FSDP2 (`float8/fsdp_utils.py`): after each step every rank takes
//! the largest magnitude of its shard of each float8 weight, the ranks agree on the largest
//! (`precompute_float8_dynamic_scale_for_fsdp`: one all-reduce for every weight; here an
//! all-gather of each rank's maxima, each rank taking the largest), and each weight's scale is
//! 448 / that maximum (clamped at 1e-12, divided in f64); a gather casts the shard's values
//! times its weight's scale to float8 e4m3, saturating (`hp_tensor_and_scale_to_float8`), and
//! sends no scale: every rank holds the same ones.

use super::ring::{self, Ring, RingLink};
use crate::compress::minifloat::{f32_to_e4m3, E4M3_MAX};
use crate::compress::wire::{f32s, put_f32s};
use crate::error::Result;
use std::ops::Range;
use std::sync::atomic::AtomicBool;

/// torchao's floor under a maximum before it divides by it (`float8_utils.EPS`).
const EPS: f32 = 1e-12;

/// A unit's float8 weights, one after another in the unit's float8 part.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Float8Weights {
    /// Each weight's first element in the part, and one past the last weight's.
    starts: Vec<usize>,
}

impl Float8Weights {
    /// Weights of `numels` elements each, in that order.
    pub fn new(numels: impl IntoIterator<Item = usize>) -> Float8Weights {
        let mut starts = vec![0];
        for n in numels {
            starts.push(starts[starts.len() - 1] + n);
        }
        Float8Weights { starts }
    }

    /// How many weights there are.
    pub fn count(&self) -> usize {
        self.starts.len() - 1
    }

    /// Elements of every weight.
    pub fn numel(&self) -> usize {
        self.starts[self.starts.len() - 1]
    }

    /// Weight `w`'s elements of the part that lie in `range` (as offsets into `range`).
    fn within(&self, w: usize, range: &Range<usize>) -> Range<usize> {
        let start = self.starts[w].clamp(range.start, range.end);
        let end = self.starts[w + 1].clamp(range.start, range.end);
        start - range.start..end - range.start
    }

    /// The largest magnitude of each weight among `values`, the part's elements from `first`
    /// on (0 for a weight none of them belongs to).
    pub fn maxima(&self, values: &[f32], first: usize) -> Vec<f32> {
        let range = first..first + values.len();
        (0..self.count())
            .map(|w| {
                values[self.within(w, &range)]
                    .iter()
                    .fold(0f32, |m, x| m.max(x.abs()))
            })
            .collect()
    }

    /// Casts `values`, the part's elements from `first` on, each times its weight's scale, to
    /// float8 e4m3 codes in `out`; elements past the last weight (padding) are zeros.
    pub fn cast(&self, values: &[f32], first: usize, scales: &[f32], out: &mut [u8]) {
        let range = first..first + values.len();
        out.fill(0);
        for (w, &scale) in scales.iter().enumerate() {
            let mine = self.within(w, &range);
            for (code, &x) in out[mine.clone()].iter_mut().zip(&values[mine]) {
                *code = f32_to_e4m3(x * scale);
            }
        }
    }
}

/// A weight's scale from the largest magnitude the ranks agreed on.
pub fn scale(maximum: f32) -> f32 {
    (f64::from(E4M3_MAX) / f64::from(maximum.max(EPS))) as f32
}

/// The scales every rank of `ranks` agrees on from its `maxima` of every float8 weight (of every
/// unit, in the same order on every rank): each rank's maxima are all-gathered over `link` and
/// each weight takes the largest.
pub fn agree(
    link: &dyn RingLink,
    ranks: usize,
    maxima: &[f32],
    abort: &AtomicBool,
) -> Result<Vec<f32>> {
    let width = maxima.len() * 4;
    let ring = Ring::node(link.rank(), ranks);
    let mut gathered = vec![0u8; ranks * width];
    let mine = ring::summed_chunk(ring.position(), ranks) * width;
    put_f32s(&mut gathered[mine..mine + width], maxima.iter().copied());
    ring::allgather_chunks(link, &ring, &mut gathered, width, abort)?;
    let mut largest = vec![0f32; maxima.len()];
    for chunk in gathered.chunks_exact(width) {
        for (m, x) in largest.iter_mut().zip(f32s(chunk)) {
            *m = m.max(x);
        }
    }
    Ok(largest.into_iter().map(scale).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::minifloat::e4m3_to_f32;
    use crate::runtime::host::comm::on_host;

    #[test]
    fn a_scale_maps_the_largest_magnitude_to_e4m3s_largest() {
        assert_eq!(scale(2.0), 224.0);
        assert_eq!(scale(448.0), 1.0);
        // A weight of zeros gets torchao's floor, not a division by zero.
        assert_eq!(scale(0.0), (448.0f64 / f64::from(1e-12f32)) as f32);
    }

    /// Two weights of 3 and 4 elements cut at element 2 and 5: each piece finds and casts its
    /// own part of each weight with that weight's scale; padding past them is zero.
    #[test]
    fn each_element_is_cast_with_its_weights_scale() {
        let weights = Float8Weights::new([3, 4]);
        assert_eq!((weights.count(), weights.numel()), (2, 7));
        let values = [1.0, -8.0, 0.5, 2.0, -3.0, 0.0, 0.0];
        assert_eq!(weights.maxima(&values[..2], 0), [8.0, 0.0]);
        assert_eq!(weights.maxima(&values[2..5], 2), [0.5, 3.0]);
        assert_eq!(weights.maxima(&values[5..], 5), [0.0, 0.0]);
        let scales = [scale(8.0), scale(3.0)];
        let mut out = [0xAA; 3];
        weights.cast(&values[2..5], 2, &scales, &mut out);
        let back: Vec<f32> = out.iter().map(|&c| e4m3_to_f32(c)).collect();
        assert_eq!(
            back,
            [0.5 * 56.0, 2.0 * 448.0 / 3.0, -448.0].map(|x| { e4m3_to_f32(f32_to_e4m3(x)) })
        );
        let mut padded = [0xAA; 4];
        weights.cast(&[0.0; 4], 6, &scales, &mut padded);
        assert_eq!(padded, [0; 4]);
    }

    /// Three ranks with different maxima agree on the largest of each weight.
    #[test]
    fn every_rank_agrees_on_the_largest_maximum() {
        let agreed = on_host(3, |mesh, abort| {
            let r = mesh.rank as f32;
            agree(mesh, 3, &[r, 5.0 - r, 1.0], abort)
        })
        .unwrap();
        let want = vec![scale(2.0), scale(5.0), scale(1.0)];
        assert!(agreed.iter().all(|a| *a == want), "{agreed:?}");
    }
}
