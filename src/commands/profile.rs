//! `syncopate profile`: measures this machine into a device profile the simulator can use.
//!
//! For the host's thread-ranks or the GPUs' NCCL allreduce, it also measures a cluster.

use super::write_json;
use crate::cli::{ProfileArgs, ProfileBackend};
use anyhow::Context;
use syncopate_exec::measure::captured_speed;
use syncopate_exec::measure::cuda::{self, CudaProfileOptions};
use syncopate_exec::measure::profile_cluster::{
    default_base, gpu_cluster, host_cluster, powers_of_four,
};
use syncopate_exec::measure::profile_host::{profile_host, profiled_sizes, HostProfileOptions};
use syncopate_sim::inputs::model::ModelProfile;
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
            if let Some(file) = args.compute_from.first() {
                return Err(SimError::bad_value(
                    "--compute-from",
                    file.display(),
                    "a CPU's speed is measured by its own FMA rate; --compute-from is for --backend cuda",
                )
                .into());
            }
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
                sizes: profiled_sizes(args.largest as usize),
                repeats: args.repeats as usize,
                ..HostProfileOptions::default()
            })?;
            // Everything is measured before anything is written: a failure leaves no file.
            let cluster = match (args.ranks, &args.cluster_out) {
                (Some(ranks), Some(cluster_out)) => Some((
                    ranks,
                    cluster_out,
                    host_cluster(
                        &name,
                        &device,
                        ranks,
                        args.repeats as usize,
                        profile.memory_bandwidth_gbytes_per_s,
                        &powers_of_four(1 << 10, 1 << 24),
                    )?,
                )),
                _ => None,
            };
            write_profile(&args.out, &profile)?;
            if let Some((ranks, cluster_out, cluster)) = cluster {
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
            // The captures are read before the GPU is: a bad file fails at once.
            let compute_speed = if args.compute_from.is_empty() {
                None
            } else {
                let captured = args
                    .compute_from
                    .iter()
                    .map(|path| {
                        let file = path.display().to_string();
                        ModelProfile::load(&file).map(|model| (file, model))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Some(captured_speed::compute_speed(&name, &captured)?)
            };
            let measured = cuda::profile(&CudaProfileOptions {
                name: name.clone(),
                repeats: args.repeats as usize,
                compute_speed,
                ..CudaProfileOptions::default()
            })?;
            // Everything is measured before anything is written: a failure leaves no file.
            let cluster = match &args.cluster_out {
                Some(cluster_out) => {
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
                    Some((
                        cluster_out,
                        gpu_cluster(
                            &name,
                            &device,
                            &base,
                            measured.gpus as u32,
                            &measured.allreduce,
                            measured.device.memory_bandwidth_gbytes_per_s,
                        )?,
                    ))
                }
                None => None,
            };
            write_profile(&args.out, &measured.device)?;
            if let Some((cluster_out, cluster)) = cluster {
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
    profile: &syncopate_sim::inputs::device::DeviceProfile,
) -> anyhow::Result<()> {
    write_json(out, profile)?;
    eprintln!(
        "measured {} compressors; wrote {}",
        profile.compression.len(),
        out.display()
    );
    Ok(())
}
