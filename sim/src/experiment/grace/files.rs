//! The fitted calibration as the data files the GRACE experiment ships, each with its provenance.

use super::calibration::{Calibration, CodecScale};
use super::compute::ComputeTarget;
use super::{fit, GraceSpec};
use crate::error::Result;
use crate::experiment::Input;
use crate::model::{Provenance, Status};
use crate::topology::Library;
use std::collections::BTreeMap;

/// The calibrated cluster and device, in the experiment directory; the cluster names the device.
pub const CLUSTER_FILE: &str = "cluster.json";
pub const DEVICE_FILE: &str = "device.json";

/// Where the fitted rows come from, for every provenance.
const ROWS: &str = "fitted by `syncopate experiment run experiments/grace` on profiles/validation/grace_imagenet_throughput.csv (GRACE, ICDCS'21, sands-lab/grace-data), mode=throughput backend=mpi rows, rows flagged inconsistent excluded";

/// The device, the cluster and each model profile, with file names, in the order they are written.
pub fn inputs(
    spec: &GraceSpec,
    cal: &Calibration,
    batch: u32,
    scales: &BTreeMap<String, CodecScale>,
    targets: &BTreeMap<String, ComputeTarget>,
) -> Result<Vec<(String, Input)>> {
    let mut inputs = vec![
        (
            DEVICE_FILE.to_string(),
            Input::Device(device(spec, cal, scales)?),
        ),
        (CLUSTER_FILE.to_string(), Input::Cluster(cluster(spec, cal))),
    ];
    for m in &spec.models {
        let mut profile = cal.models[&m.grace].clone();
        let provenance = format!(
            "compute scaled from profile `{}` by this model's own factor so that 1 worker runs at {} img/s, GRACE's {}; batch {batch} per GPU chosen among {:?} with the MPI fit (GRACE does not record it) ({ROWS})",
            m.profile,
            format_args!("{:.2}", targets[&m.grace].images_per_s),
            targets[&m.grace].source,
            spec.batch_sizes
        );
        profile.name = format!("grace-{}", m.grace);
        profile.source = format!("{}; {provenance}", profile.source);
        for p in [
            &mut profile.timing.backward,
            &mut profile.timing.forward,
            &mut profile.timing.optimizer,
        ] {
            p.status = Status::Calibrated;
            p.method = format!("{}; then {provenance}", p.method);
        }
        inputs.push((m.file.clone(), Input::Model(profile)));
    }
    Ok(inputs)
}

fn device(
    spec: &GraceSpec,
    cal: &Calibration,
    scales: &BTreeMap<String, CodecScale>,
) -> Result<crate::device::DeviceProfile> {
    let mut device = cal.device.clone();
    device.name = "grace-v100".to_string();
    device.source = format!(
        "{} with GRACE-calibrated codec curves: {}",
        spec.base_device, device.source
    );
    device.compute_speed_provenance = Provenance {
        status: Status::Calibrated,
        method: format!("1.0: each model profile's compute is scaled to GRACE's measured compute speed of that model instead ({ROWS})"),
    };
    for (method, scale) in scales {
        let key = spec
            .methods
            .iter()
            .find(|m| &m.grace == method)
            .map(|m| m.resolve("0.01", "false"))
            .transpose()?
            .map(|c| c.0.key());
        if let Some(cost) = key.and_then(|k| device.compression.get_mut(k)) {
            cost.provenance = Provenance {
                status: Status::Calibrated,
                method: format!(
                    "{spec_device}'s curve with floors x {floor:.3} and per-element slopes x {slope:.3} (encode and decode): the pair that minimizes the mean absolute percentage error of GRACE's consistent `{method}` rows at {w} workers, ResNet-50 and VGG-19, ties within 0.5 points broken toward the base curve (mode=throughput, backend=mpi rows of profiles/validation/grace_imagenet_throughput.csv, GRACE ICDCS'21, sands-lab/grace-data), fitted by `syncopate experiment run experiments/grace`; GRACE's TensorFlow compressors run as unfused TF ops, far above the bandwidth-bound kernels of the base profile",
                    spec_device = spec.base_device,
                    floor = scale.floor,
                    slope = scale.slope,
                    w = spec.fit_workers
                ),
            };
        }
    }
    Ok(device)
}

fn cluster(spec: &GraceSpec, cal: &Calibration) -> crate::topology::Cluster {
    let mut cluster = cal.cluster.clone();
    cluster.name = "grace-v100-tcp".to_string();
    cluster.description = "GRACE's testbed: one V100 per node, TensorFlow + Horovod over MPI/TCP at 10 Gb/s, calibrated".to_string();
    cluster.device = DEVICE_FILE.to_string();
    if let Library::Mpi(p) = &mut cluster.library {
        let (tcp, overhead, reduce) = fit::GRID_SIZES;
        p.provenance = Provenance {
            status: Status::Calibrated,
            method: format!(
                "tcp_efficiency, message_overhead_us and reduce_gbytes_per_s chosen on a grid ({} x {} x {}) to minimize the mean absolute percentage error of {}'s `none` (allreduce) rows at 2, 4 and 8 workers ({ROWS})",
                spec.network_model, tcp, overhead, reduce
            ),
        };
    }
    cluster
}
