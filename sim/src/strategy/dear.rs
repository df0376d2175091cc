//! DeAR's fusion: contiguous layers in backward order fused until a bucket reaches the
//! threshold (DeAR's THRESHOLD, 25 MB by default).

use super::StrategyOptions;
use crate::model::ModelProfile;

pub(super) fn buckets(model: &ModelProfile, options: &StrategyOptions) -> Vec<Vec<usize>> {
    let mut buckets = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for (t, tensor) in model.tensors.iter().enumerate() {
        current.push(t);
        bytes += tensor.numel * tensor.dtype.bytes();
        if bytes >= options.bucket_bytes {
            buckets.push(std::mem::take(&mut current));
            bytes = 0;
        }
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}
