//! The fitted calibration as the data files the GRACE experiment ships, each with its provenance.

use super::calibration::{Calibration, CodecPrice, OpCost};
use super::compute::ComputeTarget;
use super::{fit, GraceSpec};
use crate::base::error::Result;
use crate::experiment::Input;
use crate::inputs::model::{Provenance, Status};
use crate::inputs::topology::Library;
use std::collections::BTreeMap;

/// The calibrated cluster and device, in the experiment directory; the cluster names the device.
pub(super) const CLUSTER_FILE: &str = "cluster.json";
pub(super) const DEVICE_FILE: &str = "device.json";

/// Where the fitted rows come from, for every provenance.
const ROWS: &str = "fitted by `syncopate experiment run experiments/grace` on profiles/validation/grace_imagenet_throughput.csv (GRACE, ICDCS'21, sands-lab/grace-data), mode=throughput backend=mpi rows";

/// The device, the cluster and each model profile, with file names, in the order they are written.
/// The calibrated device's name, which the calibrated models' compute belongs to.
const DEVICE_NAME: &str = "grace-v100";

pub(super) fn inputs(
    spec: &GraceSpec,
    cal: &Calibration,
    factors: &BTreeMap<String, f64>,
    prices: &BTreeMap<String, CodecPrice>,
    targets: &BTreeMap<String, ComputeTarget>,
) -> Result<Vec<(String, Input)>> {
    let mut inputs = vec![
        (
            DEVICE_FILE.to_string(),
            Input::Device(device(spec, cal, prices)?),
        ),
        (CLUSTER_FILE.to_string(), Input::Cluster(cluster(spec, cal))),
    ];
    for m in &spec.models {
        let mut profile = cal.models[&m.grace].clone();
        let target = match &targets[&m.grace] {
            ComputeTarget::Row(row) => format!(
                "so that 1 worker runs at GRACE's 1-worker `none` row ({:.2} img/s)",
                row.throughput
            ),
            ComputeTarget::Fastest { row, excluded } => format!(
                "so that 1 worker runs at {:.2} img/s, GRACE's fastest consistent {} row per worker (`{}` at {} workers, {:.2} img/s), a lower bound on its compute speed: its own 1-worker `none` row ({:.2} img/s) is excluded as inconsistent ({})",
                row.throughput / f64::from(row.workers),
                m.grace,
                row.method,
                row.workers,
                row.throughput,
                excluded.throughput,
                excluded.excluded.as_deref().unwrap_or("")
            ),
        };
        let provenance = format!(
            "compute scaled from profile `{}` by {:.4} {target}; batch {} per GPU: {} ({ROWS} with at most {} workers)",
            m.profile, factors[&m.grace], spec.batch_size_per_gpu, spec.batch_source, spec.fit_workers
        );
        profile.name = format!("grace-{}", m.grace);
        profile.device = DEVICE_NAME.to_string();
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
    prices: &BTreeMap<String, CodecPrice>,
) -> Result<crate::inputs::device::DeviceProfile> {
    let mut device = cal.device.clone();
    device.name = DEVICE_NAME.to_string();
    device.source = format!(
        "{} with codec curves of GRACE's TensorFlow compressors: {}",
        spec.base_device, device.source
    );
    device.compute_speed_provenance = Provenance {
        status: Status::Calibrated,
        method: format!("1.0: each model profile's compute is scaled to GRACE's measured compute speed instead ({ROWS})"),
    };
    let base = OpCost::base(&cal.device);
    for method in &spec.methods {
        let (Some(price), Some(implementation), Some(key)) = (
            prices.get(&method.grace),
            &method.implementation,
            method.key()?,
        ) else {
            continue;
        };
        if let Some(cost) = device.compression.get_mut(key) {
            cost.provenance = Provenance {
                status: Status::Calibrated,
                method: format!(
                    "{fitted} ({source}): per tensor, encode {e}; each payload decoded {p} (decode); once per decode call {c} (aggregate); encode priced at {encode}, its op price the one that minimizes the mean absolute percentage error of GRACE's consistent `{name}` rows at {w} workers (ResNet-50 and VGG-19); decode and aggregate at {decode}, every compressor's decode op price and byte price (the encode's too), the pair that minimizes the error over all their rows; ties within {tie} points broken toward the base, {base_us} us per op (a kernel launch) and {bw} GB/s x {eff} ({ROWS})",
                    fitted = fitted_marker(&method.grace),
                    name = method.grace,
                    source = implementation.source,
                    e = implementation.encode.describe(),
                    p = implementation.payload.describe(),
                    c = implementation.call.describe(),
                    encode = price.encode.describe(&base),
                    decode = price.decode.describe(&base),
                    base_us = base.us_per_op,
                    bw = cal.device.memory_bandwidth_gbytes_per_s,
                    eff = crate::codec::GPU_BANDWIDTH_EFFICIENCY,
                    w = spec.fit_workers,
                    tie = fit::TIE_PCT,
                ),
            };
        }
    }
    Ok(device)
}

/// How a fitted codec curve's provenance begins, so that `--reuse-fit` reads back exactly the
/// methods the fit priced (a method without GRACE rows keeps the base curve).
pub(super) fn fitted_marker(method: &str) -> String {
    format!("GRACE's `{method}` as its TensorFlow code runs it")
}

fn cluster(spec: &GraceSpec, cal: &Calibration) -> crate::inputs::topology::Cluster {
    let mut cluster = cal.cluster.clone();
    cluster.name = "grace-v100-tcp".to_string();
    cluster.description = "GRACE's testbed: one V100 per node, TensorFlow + Horovod over MPI/TCP at 10 Gb/s, calibrated".to_string();
    cluster.device = DEVICE_FILE.to_string();
    if let Library::Mpi(p) = &mut cluster.library {
        let (tcp, overhead, reduce) = fit::GRID_SIZES;
        p.provenance = Provenance {
            status: Status::Calibrated,
            method: format!(
                "tcp_efficiency, message_overhead_us and reduce_gbytes_per_s chosen on a grid ({tcp} x {overhead} x {reduce}) to minimize the mean absolute percentage error of {}'s consistent `none` (allreduce) rows with 2 to {} workers, ties within {} points broken toward {}'s estimates ({ROWS})",
                spec.network_model, spec.fit_workers, fit::TIE_PCT, spec.base_cluster
            ),
        };
    }
    cluster
}
