//! PyTorch DDP's buckets: parameters in reverse registration order, a bucket closes once it
//! reaches its cap (1 MiB for the first, then `bucket_cap_mb`).

use super::StrategyOptions;
use crate::model::ModelProfile;

pub(super) fn buckets(model: &ModelProfile, options: &StrategyOptions) -> Vec<Vec<usize>> {
    let mut order = model.forward_order();
    order.reverse();
    let mut buckets = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for t in order {
        current.push(t);
        bytes += model.tensors[t].numel * model.tensors[t].dtype.bytes();
        let cap = if buckets.is_empty() {
            options.first_bucket_bytes
        } else {
            options.bucket_bytes
        };
        if bytes >= cap {
            buckets.push(std::mem::take(&mut current));
            bytes = 0;
        }
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}
