//! PyTorch DDP's buckets: parameters in reverse registration order, a bucket closes once it
//! reaches its cap (1 MiB for the first, then `bucket_cap_mb`).

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
}
