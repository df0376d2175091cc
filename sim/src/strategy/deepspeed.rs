//! DeepSpeed without ZeRO (stage 0): after backward, one allreduce per bucket of 5e8 elements.
//!
//! `DeepSpeedEngine.allreduce_gradients` (deepspeed/runtime/engine.py, 0.19.8) runs after the
//! backward pass, at each gradient-accumulation boundary, `buffered_allreduce_fallback` with
//! `MEMORY_OPT_ALLREDUCE_SIZE` elements per bucket: the gradients in `module.parameters()`
//! order, split by dtype, a bucket allreduced as soon as its element count exceeds the limit
//! (so it overshoots by up to one tensor), then the rest. Stage 0 never reads
//! `reduce_bucket_size`.

use super::ddp::fill_buckets;
use crate::inputs::model::ModelProfile;

/// DeepSpeed's `MEMORY_OPT_ALLREDUCE_SIZE`: elements per bucket at stage 0.
pub(super) const BUCKET_ELEMENTS: u64 = 500_000_000;

/// The buckets in the order DeepSpeed reduces them: the tensors in registration order, taken
/// as the reverse of the order their gradients arrive (the profile's; it records no other),
/// each dtype apart in the order it first appears, a bucket closing once its elements exceed
/// `limit`. The first bucket holds the last gradient of backward, so in plan order every
/// bucket starts after backward, as DeepSpeed's do.
pub(super) fn buckets(model: &ModelProfile, limit: u64) -> Vec<Vec<usize>> {
    let registration: Vec<usize> = (0..model.num_tensors()).rev().collect();
    let mut dtypes = Vec::new();
    for &t in &registration {
        if !dtypes.contains(&model.tensors[t].dtype) {
            dtypes.push(model.tensors[t].dtype);
        }
    }
    dtypes
        .into_iter()
        .flat_map(|dtype| {
            let of_dtype = registration
                .iter()
                .copied()
                .filter(move |&t| model.tensors[t].dtype == dtype);
            fill_buckets(of_dtype, |t| model.tensors[t].numel, |_, n| n > limit)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_fill_in_registration_order_and_overshoot_by_one_tensor() {
        let model = ModelProfile::load("gpt2-xl").unwrap();
        let buckets = buckets(&model, BUCKET_ELEMENTS);
        let n = model.num_tensors();
        // Registration order: the last gradient of backward comes first.
        assert_eq!(buckets[0][0], n - 1);
        let flat: Vec<usize> = buckets.iter().flatten().copied().collect();
        assert_eq!(flat, (0..n).rev().collect::<Vec<_>>());
        let elements = |b: &Vec<usize>| b.iter().map(|&t| model.tensors[t].numel).sum::<u64>();
        for bucket in &buckets[..buckets.len() - 1] {
            // Over the limit, but not without its last tensor.
            assert!(elements(bucket) > BUCKET_ELEMENTS);
            let last = model.tensors[*bucket.last().unwrap()].numel;
            assert!(elements(bucket) - last <= BUCKET_ELEMENTS);
        }
        assert!(
            buckets.len() >= 3,
            "gpt2-xl's 1.56e9 elements in {} buckets",
            buckets.len()
        );
    }
}
