//! `syncopate profile`: measures this machine into a device profile (and, for the host's thread-ranks or the GPUs' NCCL allreduce, a cluster) the simulator can use.

use crate::cli::{ProfileArgs, ProfileBackend};
use anyhow::Context;
use syncopate_exec::profile_host::{profile_host, HostProfileOptions};
use syncopate_exec::runtime::cuda::{self, CudaProfileOptions};
use syncopate_exec::runtime::host::profile as host_collectives;
use syncopate_sim::calibrate::{self, Measurement};
use syncopate_sim::collective::Op;
use syncopate_sim::model::{Provenance, Status};
use syncopate_sim::topology::{Cluster, ClusterOverrides, Library};
use syncopate_sim::SimError;

pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    let name = match &args.name {
        Some(name) => name.clone(),
        None => args
            .out
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .context("--out needs a file name")?,
    };
    let device = args.out.to_string_lossy();
    match args.backend {
        ProfileBackend::Host => {
            if args.cluster_out.is_some() && args.ranks.is_none() {
                return Err(SimError::bad_value(
                    "--cluster-out",
                    "without --ranks",
                    "the host backend fits the collectives of --ranks thread-ranks",
                )
                .into());
            }
            let profile = profile_host(&HostProfileOptions {
                name: name.clone(),
                repeats: args.repeats as usize,
                ..HostProfileOptions::default()
            })?;
            write_profile(&args.out, &profile)?;
            if let (Some(ranks), Some(cluster_out)) = (args.ranks, &args.cluster_out) {
                let cluster = host_cluster(
                    &name,
                    &device,
                    ranks,
                    args.repeats as usize,
                    profile.memory_bandwidth_gbytes_per_s,
                    &powers_of_four(1 << 10, 1 << 24),
                )?;
                write_json(cluster_out, &cluster)?;
                eprintln!(
                    "fitted {ranks}-rank channel collectives; wrote {}",
                    cluster_out.display()
                );
            }
        }
        ProfileBackend::Cuda => {
            if let Some(ranks) = args.ranks {
                return Err(SimError::bad_value(
                    "--ranks",
                    ranks,
                    "the cuda backend uses every visible GPU; leave --ranks out",
                )
                .into());
            }
            let measured = cuda::profile(&CudaProfileOptions {
                name: name.clone(),
                repeats: args.repeats as usize,
                ..CudaProfileOptions::default()
            })?;
            write_profile(&args.out, &measured.device)?;
            if let Some(cluster_out) = &args.cluster_out {
                if measured.gpus < 2 {
                    return Err(SimError::bad_value(
                        "--cluster-out",
                        cluster_out.display(),
                        format!(
                            "a collective needs at least 2 GPUs, this machine has {}",
                            measured.gpus
                        ),
                    )
                    .into());
                }
                let base = match &args.cluster_base {
                    Some(base) => base.clone(),
                    None => default_base(&measured.device.model)?,
                };
                let cluster = gpu_cluster(
                    &name,
                    &device,
                    &base,
                    measured.gpus as u32,
                    &measured.allreduce,
                    measured.device.memory_bandwidth_gbytes_per_s,
                )?;
                write_json(cluster_out, &cluster)?;
                eprintln!(
                    "fitted NCCL allreduce on {} GPUs; wrote {}",
                    measured.gpus,
                    cluster_out.display()
                );
            }
        }
    }
    Ok(())
}

fn write_profile(
    out: &std::path::Path,
    profile: &syncopate_sim::device::DeviceProfile,
) -> anyhow::Result<()> {
    write_json(out, profile)?;
    eprintln!(
        "measured {} compressors; wrote {}",
        profile.compression.len(),
        out.display()
    );
    Ok(())
}

/// Times the host backend's collectives on `ranks` thread-ranks and fits a cluster to them.
pub fn host_cluster(
    name: &str,
    device: &str,
    ranks: u32,
    repeats: usize,
    memory_gbytes_per_s: f64,
    sizes: &[u64],
) -> anyhow::Result<Cluster> {
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
fn default_base(model: &str) -> anyhow::Result<String> {
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
fn gpu_cluster(
    name: &str,
    device: &str,
    base: &str,
    gpus: u32,
    points: &[Measurement],
    memory_gbytes_per_s: f64,
) -> anyhow::Result<Cluster> {
    let mut start = Cluster::load(base, ClusterOverrides::default())?;
    start.nodes = 1;
    start.gpus_per_node = gpus;
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

fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
