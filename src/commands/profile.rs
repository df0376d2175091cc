//! `syncopate profile`: measures this machine into a device profile (and, for the host's thread-ranks, a cluster) the simulator can use.

use crate::cli::{ProfileArgs, ProfileBackend};
use anyhow::Context;
use syncopate_exec::profile_host::{profile_host, HostProfileOptions};
use syncopate_exec::runtime::host::profile as host_collectives;
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
    let profile = match args.backend {
        ProfileBackend::Host => profile_host(&HostProfileOptions {
            name: name.clone(),
            repeats: args.repeats.max(1),
            ..HostProfileOptions::default()
        })?,
        ProfileBackend::Cuda => syncopate_exec::runtime::cuda::profile(&name)?,
    };
    write_json(&args.out, &profile)?;
    eprintln!(
        "measured {} compressors; wrote {}",
        profile.compression.len(),
        args.out.display()
    );
    if let (Some(ranks), Some(cluster_out)) = (args.ranks, &args.cluster_out) {
        if args.backend != ProfileBackend::Host {
            return Err(SimError::bad_value(
                "--ranks",
                ranks,
                "fits the host backend's channel collectives; use --backend host",
            )
            .into());
        }
        let cluster = host_cluster(
            &name,
            &args.out.to_string_lossy(),
            ranks,
            args.repeats,
            profile.memory_bandwidth_gbytes_per_s,
        )?;
        write_json(cluster_out, &cluster)?;
        eprintln!(
            "fitted {ranks}-rank channel collectives; wrote {}",
            cluster_out.display()
        );
    }
    Ok(())
}

/// Times the host backend's collectives on `ranks` thread-ranks and fits a cluster to them.
pub fn host_cluster(
    name: &str,
    device: &str,
    ranks: u32,
    repeats: usize,
    memory_gbytes_per_s: f64,
) -> anyhow::Result<syncopate_sim::topology::Cluster> {
    if ranks < 2 {
        return Err(
            SimError::bad_value("--ranks", ranks, "collectives need at least 2 ranks").into(),
        );
    }
    let sizes: Vec<u64> = (10..=20).step_by(2).map(|p| 1u64 << p).collect();
    let points = host_collectives::measure(ranks, &sizes, repeats.max(1))?;
    let fitted = host_collectives::fit(ranks, &points)?;
    let cluster = host_collectives::cluster(name, device, ranks, fitted, memory_gbytes_per_s);
    cluster.validate(name)?;
    Ok(cluster)
}

fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
