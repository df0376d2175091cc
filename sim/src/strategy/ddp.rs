//! PyTorch DDP's buckets: parameters in reverse registration order, a bucket closes once it
//! reaches its cap (the first bucket's, 1 MiB by default, then `bucket_cap_mb`).

use super::StrategyOptions;
use crate::model::ModelProfile;
use crate::topology::{Cluster, Library};

/// ProcessGroupGloo's worker threads (`ProcessGroupGloo::Options::threads`, 2 by default):
/// DDP's allreduces run on them, two buckets at once.
const GLOO_WORKER_THREADS: u32 = 2;

/// The buckets in flight at once: two on gloo's two worker threads, one on the single NCCL
/// stream or MPI's progress.
pub(super) fn comm_streams(cluster: &Cluster) -> u32 {
    match cluster.library {
        Library::Gloo(_) => GLOO_WORKER_THREADS,
        _ => 1,
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::ClusterOverrides;

    #[test]
    fn ddp_runs_two_buckets_at_once_on_gloo_and_one_elsewhere() {
        let mut cluster = Cluster::load("v100-tcp", ClusterOverrides::default()).unwrap();
        assert_eq!(comm_streams(&cluster), 1);
        cluster.library = Library::Gloo(cluster.library.tcp().unwrap().clone());
        assert_eq!(comm_streams(&cluster), GLOO_WORKER_THREADS);
        let nccl = Cluster::load("dgx-a100", ClusterOverrides::default()).unwrap();
        assert_eq!(comm_streams(&nccl), 1);
    }

    #[test]
    fn the_first_bucket_closes_at_its_own_cap() {
        let model = ModelProfile::load("resnet50").unwrap();
        let size = |t: usize| model.tensors[t].numel * model.tensors[t].dtype.bytes();
        let bytes = |bucket: &[usize]| -> u64 { bucket.iter().map(|&t| size(t)).sum() };
        // A bucket closes with the tensor that takes it to its cap: without that tensor it was
        // below the cap, with it at or above.
        let closes_at = |bucket: &[usize], cap: u64| {
            let last = size(*bucket.last().unwrap());
            bytes(bucket) >= cap && bytes(bucket) - last < cap
        };
        let small_first = StrategyOptions::default();
        let uniform = StrategyOptions {
            first_bucket_bytes: small_first.bucket_bytes,
            ..small_first
        };
        let (a, b) = (buckets(&model, &small_first), buckets(&model, &uniform));
        // PyTorch 1.x: a 1 MiB first bucket; recent PyTorch with bucket_cap_mb given: the cap.
        assert!(closes_at(&a[0], small_first.first_bucket_bytes));
        assert!(closes_at(&b[0], uniform.bucket_bytes));
        assert!(b.len() < a.len());
        // Every tensor lands in exactly one bucket either way.
        for plan in [&a, &b] {
            let mut all: Vec<usize> = plan.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..model.tensors.len()).collect::<Vec<_>>());
        }
    }
}
