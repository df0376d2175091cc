//! Cluster files for this machine, fitted to its measured collectives.
//!
//! Either of the host backend's thread-ranks, or of one node of GPUs running NCCL.

use crate::error::Result;
use crate::measure::host_collectives;
use syncopate_sim::calibrate::{self, Measurement};
use syncopate_sim::collective_op::Op;
use syncopate_sim::inputs::model::{Provenance, Status};
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides, Library};
use syncopate_sim::SimError;

/// Times the host backend's collectives on `ranks` thread-ranks at each of `sizes` (bytes) and
/// fits a cluster to them; `device` names the host's `cpu` device profile.
pub fn host_cluster(
    name: &str,
    device: &str,
    ranks: u32,
    repeats: usize,
    memory_gbytes_per_s: f64,
    sizes: &[u64],
) -> Result<Cluster> {
    if ranks < 2 {
        return Err(
            SimError::bad_value("--ranks", ranks, "collectives need at least 2 ranks").into(),
        );
    }
    let points = host_collectives::measure(ranks, sizes, repeats.max(1))?;
    let fitted = host_collectives::fit(ranks, &points)?;
    let cluster = host_collectives::cluster(name, device, ranks, fitted, memory_gbytes_per_s);
    cluster.validate(name)?;
    Ok(cluster)
}

/// Sizes from `from` growing fourfold until one reaches `to`: measured curves must cover the
/// sizes they are used at, since buffers beyond the caches move at memory speed.
pub fn powers_of_four(from: u64, to: u64) -> Vec<u64> {
    let mut sizes = vec![from.max(1)];
    while let Some(&last) = sizes.last().filter(|&&last| last < to) {
        sizes.push(last * 4);
    }
    sizes
}

/// The shipped DGX of the GPU's generation, whose NVLink/NVSwitch parameters are the fit's start.
pub fn default_base(model: &str) -> Result<String> {
    let upper = model.to_uppercase();
    let base = [
        ("H200", "dgx-h200"),
        ("H100", "dgx-h100"),
        ("A100", "dgx-a100"),
        ("V100", "dgx1-v100"),
    ]
    .iter()
    .find(|(part, _)| upper.contains(part))
    .map(|&(_, base)| base.to_string());
    base.ok_or_else(|| {
        SimError::bad_value(
            "GPU model",
            model,
            "no shipped cluster of this generation to start the fit from; pass --cluster-base NAME",
        )
        .into()
    })
}

/// Fits the intra-node NCCL parameters of `base`, resized to one node of `gpus`, to the
/// measured allreduce sweep. One GPU count cannot separate per-hop from fixed latency, so the
/// hop latency and the network keep the base's values.
pub fn gpu_cluster(
    name: &str,
    device: &str,
    base: &str,
    gpus: u32,
    points: &[Measurement],
    memory_gbytes_per_s: f64,
) -> Result<Cluster> {
    let one_node = ClusterOverrides {
        nodes: Some(1),
        gpus_per_node: Some(gpus),
        ..ClusterOverrides::default()
    };
    // The overrides check the GPUs against the base's (a mesh joins a fixed number).
    let start = Cluster::load(base, one_node)?;
    let mut only: Vec<String> = [
        "library.intra_efficiency",
        "library.ll_gbytes_per_s_per_rank",
        "library.base_latency_us.ll",
        "library.base_latency_us.ll128",
        "library.base_latency_us.simple",
        "library.ll128_efficiency",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if start.intra_node.nvls {
        only.push("library.nvls_efficiency".into());
        only.push("library.nvls_latency_us".into());
    }
    let (mut cluster, score) = calibrate::fit(&start, Op::Allreduce, points, Some(&only))?;
    let method = format!(
        "calibrated by syncopate profile --backend cuda: {} fitted to an nccl-tests-style fp32 allreduce sweep ({}..{} bytes) on this machine's {gpus} GPUs, starting from `{base}` (objective {score:.2} % mean error); hop latencies and the network carried over from `{base}`",
        only.join(", "),
        points.first().map_or(0, |p| p.bytes),
        points.last().map_or(0, |p| p.bytes),
    );
    if let Library::Nccl(params) = &mut cluster.library {
        params.provenance = Provenance {
            status: Status::Calibrated,
            method: method.clone(),
        };
    }
    cluster.name = name.to_string();
    cluster.description =
        format!("this machine: one node of {gpus} GPUs, NCCL fitted to its allreduce");
    cluster.source = method;
    cluster.device = device.to_string();
    cluster.device_memory_gbytes_per_s = memory_gbytes_per_s;
    cluster.validate(name)?;
    Ok(cluster)
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate_sim::collective::{self, Group};

    #[test]
    fn sizes_grow_fourfold_until_they_cover_the_end() {
        assert_eq!(powers_of_four(1, 64), [1, 4, 16, 64]);
        assert_eq!(powers_of_four(1, 65), [1, 4, 16, 64, 256]);
        assert_eq!(powers_of_four(0, 1), [1]);
        assert_eq!(powers_of_four(1024, 16), [1024]);
    }

    #[test]
    fn the_fit_starts_from_the_dgx_of_the_gpu_generation() {
        assert_eq!(default_base("NVIDIA H100 80GB HBM3").unwrap(), "dgx-h100");
        assert_eq!(default_base("Tesla V100-SXM2-32GB").unwrap(), "dgx1-v100");
        let err = default_base("GeForce RTX 4090").unwrap_err().to_string();
        assert!(err.contains("--cluster-base"), "{err}");
    }

    #[test]
    fn fewer_than_two_host_ranks_is_an_error_naming_the_flag() {
        let err = host_cluster("host", "host.json", 1, 1, 10.0, &[1024])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--ranks") && err.contains("at least 2"),
            "{err}"
        );
    }

    #[test]
    fn a_gpu_cluster_fitted_to_its_base_model_is_one_node_that_reproduces_it() {
        let base = Cluster::load("dgx-a100", ClusterOverrides::default()).unwrap();
        let gpus = base.gpus_per_node;
        let points: Vec<Measurement> = powers_of_four(1 << 12, 1 << 28)
            .into_iter()
            .map(|bytes| {
                let group = Group {
                    ranks: gpus,
                    nodes: 1,
                };
                let mut one_node = base.clone();
                one_node.nodes = 1;
                let estimate =
                    collective::estimate(&one_node, Op::Allreduce, bytes, group).unwrap();
                Measurement {
                    gpus,
                    bytes,
                    time_us: estimate.time.as_us(),
                }
            })
            .collect();
        let cluster =
            gpu_cluster("here", "here-gpu.json", "dgx-a100", gpus, &points, 900.0).unwrap();
        assert_eq!((cluster.nodes, cluster.gpus_per_node), (1, gpus));
        assert_eq!(
            (cluster.name.as_str(), cluster.device.as_str()),
            ("here", "here-gpu.json")
        );
        assert_eq!(cluster.device_memory_gbytes_per_s, 900.0);
        let Library::Nccl(params) = &cluster.library else {
            panic!("an NCCL cluster");
        };
        assert_eq!(params.provenance.status, Status::Calibrated);
        assert!(
            cluster.source.contains("objective 0.00 %"),
            "{}",
            cluster.source
        );
    }
}
