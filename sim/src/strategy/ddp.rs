//! PyTorch DDP's buckets: parameters in the order their gradients arrive, a bucket closes once it
//! reaches its cap (the first bucket's, 1 MiB by default, then `bucket_cap_mb`; or one cap per
//! bucket with `bucket_cap_mb_list`).

use crate::inputs::model::ModelProfile;
use crate::inputs::topology::{Cluster, Library};

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

/// Buckets in the order gradients become ready (the profile's backward order), bucket i
/// closing once it reaches `caps[i]` (the last cap for every later bucket): `[first, cap]` by
/// default, `[cap]` with `bucket_cap_mb`, the list itself with `bucket_cap_mb_list`. These are
/// the buckets of every iteration after the first: DDP starts from one bucket per dtype
/// (`compute_bucket_size_limits` in torch/nn/parallel/distributed.py, PyTorch 2.15, with
/// `find_unused_parameters` off) and, after the first backward, the reducer rebuilds them from
/// the parameters in the order their gradients arrived (`Reducer::rebuild_buckets`,
/// torch/csrc/distributed/c10d/reducer.cpp) with these limits
/// (`compute_bucket_assignment_by_size`).
pub(super) fn buckets_by_caps(model: &ModelProfile, caps: &[u64]) -> Vec<Vec<usize>> {
    let cap = |bucket: usize| {
        caps.get(bucket)
            .or(caps.last())
            .copied()
            .unwrap_or(u64::MAX)
    };
    fill_buckets(
        0..model.num_tensors(),
        |t| model.tensors[t].bytes(),
        |bucket, bytes| bytes >= cap(bucket),
    )
}

/// Tensors of `order` into buckets: each takes the next tensor, adds its `size`, and closes
/// once `full(its index, its total)` says so; the rest makes the last bucket.
pub(super) fn fill_buckets(
    order: impl IntoIterator<Item = usize>,
    size: impl Fn(usize) -> u64,
    full: impl Fn(usize, u64) -> bool,
) -> Vec<Vec<usize>> {
    let mut buckets = Vec::new();
    let mut current = Vec::new();
    let mut total = 0;
    for t in order {
        current.push(t);
        total += size(t);
        if full(buckets.len(), total) {
            buckets.push(std::mem::take(&mut current));
            total = 0;
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
    use crate::inputs::topology::ClusterOverrides;

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
        // A bucket closes with the tensor that takes it to its cap: without that tensor it was
        // below the cap, with it at or above.
        let closes_at = |bucket: &[usize], cap: u64| {
            let (bytes, last) = (
                model.bytes_of(bucket),
                model.tensors[*bucket.last().unwrap()].bytes(),
            );
            bytes >= cap && bytes - last < cap
        };
        let (first, cap) = (1 << 20, 25 << 20);
        let (a, b) = (
            buckets_by_caps(&model, &[first, cap]),
            buckets_by_caps(&model, &[cap]),
        );
        // PyTorch 1.x: a 1 MiB first bucket; recent PyTorch with bucket_cap_mb given: the cap.
        assert!(closes_at(&a[0], first));
        assert!(closes_at(&b[0], cap));
        assert!(a[1..]
            .iter()
            .rev()
            .skip(1)
            .all(|bucket| closes_at(bucket, cap)));
        assert!(b.len() < a.len());
        // bucket_cap_mb_list: each bucket at its own cap, the last cap for the rest.
        let caps = [2 << 20, 8 << 20, 4 << 20];
        let c = buckets_by_caps(&model, &caps);
        for (i, bucket) in c.iter().enumerate().take(c.len() - 1) {
            assert!(closes_at(bucket, caps[i.min(2)]), "bucket {i}");
        }
        // Every tensor lands in exactly one bucket either way.
        for plan in [&a, &b, &c] {
            let mut all: Vec<usize> = plan.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..model.tensors.len()).collect::<Vec<_>>());
        }
    }
}
