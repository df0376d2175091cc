//! A cluster file for a lab, fitted to what was measured on it: the shaped rate and TCP efficiency from the goodput probe, the hop latency from the round trip, and MPI's per-message overhead and reduction rate from the allreduce sweep, scored by the simulator's own MPI cost model.

use super::measure::{AllreducePoint, NetworkProbe};
use super::state::LabState;
use crate::error::Result;
use serde::Serialize;
use syncopate_sim::calibrate::{self, Measurement};
use syncopate_sim::collective::Op;
use syncopate_sim::data::FORMAT_VERSION;
use syncopate_sim::device::DeviceProfile;
use syncopate_sim::model::{Provenance, Status};
use syncopate_sim::topology::{
    Cluster, ClusterOverrides, Fabric, InterNode, IntraNode, Library, MpiParams, Transport,
};

/// Everything `lab up` measured.
#[derive(Clone, Debug, Serialize)]
pub struct LabMeasurements {
    pub network: NetworkProbe,
    /// Empty when the binary was built without the `mpi` feature.
    pub allreduce: Vec<AllreducePoint>,
    /// Ranks of the allreduce sweep.
    pub ranks: u32,
}

/// The lab as a cluster of one-rank nodes for `device` (a device profile name or path), with
/// `command` (the `lab up` command line) and the measurements in its provenance.
pub fn cluster(
    lab: &LabState,
    measured: &LabMeasurements,
    device: &str,
    command: &str,
) -> Result<Cluster> {
    let profile = DeviceProfile::load(device)?;
    let network = &measured.network;
    let tcp_efficiency = (network.goodput_gbps / lab.gbps).min(1.0);
    // A 64-byte TCP round trip crosses the link twice and the kernel's send and receive paths
    // twice; half of it is what one small message costs beyond MPI.
    let hop_us = network.rtt_us.median / 2.0;
    let mut cluster = Cluster {
        format_version: FORMAT_VERSION,
        name: format!("lab-{}", lab.name),
        description: format!(
            "syncopate lab `{}`: {} network namespaces on a bridge, each node's veth shaped to {} Gb/s per direction (HTB, burst {} B{}), MPI over TCP",
            lab.name,
            lab.nodes.len(),
            lab.gbps,
            lab.burst_bytes,
            if lab.latency_us > 0.0 {
                format!(", netem delay {} µs", lab.latency_us)
            } else {
                String::new()
            }
        ),
        source: String::new(),
        device: device.to_string(),
        nodes: lab.nodes.len() as u32,
        gpus_per_node: 1,
        // One rank per node: nothing crosses an intra-node fabric; the host's memory stands in.
        intra_node: IntraNode {
            fabric: Fabric::Pcie,
            bandwidth_gbytes_per_s: profile.memory_bandwidth_gbytes_per_s,
            latency_us: 0.0,
            nvls: false,
        },
        inter_node: InterNode {
            transport: Transport::Tcp,
            nics_per_node: 1,
            nic_bandwidth_gbps: lab.gbps,
            latency_us: hop_us,
        },
        library: Library::Mpi(MpiParams {
            tcp_efficiency,
            message_overhead_us: 0.0,
            reduce_gbytes_per_s: profile.memory_bandwidth_gbytes_per_s / 3.0,
            provenance: Provenance {
                status: Status::Estimated,
                method: String::new(),
            },
        }),
        device_memory_gbytes_per_s: profile.memory_bandwidth_gbytes_per_s,
    };
    let goodput = format!(
        "single-stream TCP goodput {:.4} Gb/s over {:.1} s ({} B), 64-byte TCP round trip median {:.1} µs (min {:.1}, max {:.1}, {} round trips)",
        network.goodput_gbps,
        network.goodput_seconds,
        network.goodput_bytes,
        network.rtt_us.median,
        network.rtt_us.min,
        network.rtt_us.max,
        network.rtt_us.repeats
    );
    let method = if measured.allreduce.is_empty() {
        format!(
            "tcp_efficiency = goodput / shaped rate and inter_node.latency_us = RTT/2 measured; message_overhead_us (0) and reduce_gbytes_per_s (memory bandwidth / 3: a sum reads two buffers and writes one) are estimates: this syncopate was built without the `mpi` feature, so no allreduce sweep was run. {goodput}"
        )
    } else {
        let (overhead_us, reduce, error) = fit_mpi(&cluster, &measured.allreduce, measured.ranks)?;
        if let Library::Mpi(params) = &mut cluster.library {
            params.message_overhead_us = overhead_us;
            params.reduce_gbytes_per_s = reduce;
        }
        let sweep: Vec<String> = measured
            .allreduce
            .iter()
            .map(|p| format!("{} B: {:.1} µs", p.bytes, p.seconds.median * 1e6))
            .collect();
        format!(
            "tcp_efficiency = goodput / shaped rate and inter_node.latency_us = RTT/2 measured; message_overhead_us and reduce_gbytes_per_s fitted (mean |error| {error:.1} %) with syncopate-sim's MPI cost model to an fp32 allreduce sweep over Open MPI on {} ranks (median of {} repeats per size: {}). {goodput}",
            measured.ranks,
            measured.allreduce.first().map_or(0, |p| p.seconds.repeats),
            sweep.join(", ")
        )
    };
    if let Library::Mpi(params) = &mut cluster.library {
        params.provenance = Provenance {
            status: if measured.allreduce.is_empty() {
                Status::Estimated
            } else {
                Status::Calibrated
            },
            method: method.clone(),
        };
    }
    cluster.source = format!("measured by `{command}`: {method}");
    cluster.validate(&cluster.name)?;
    // The file must load as users will load it (device resolved, overrides applied).
    let mut check = cluster.clone();
    check.apply(ClusterOverrides::default())?;
    Ok(cluster)
}

/// Fits MPI's per-message overhead (µs) and reduction rate (GB/s) to the sweep: pattern
/// search in log space from a grid of starts, each candidate scored by the mean relative
/// error of `syncopate_sim::collective`'s prediction. Returns (overhead, rate, error %).
pub fn fit_mpi(start: &Cluster, sweep: &[AllreducePoint], ranks: u32) -> Result<(f64, f64, f64)> {
    let points: Vec<Measurement> = sweep
        .iter()
        .map(|p| Measurement {
            gpus: ranks,
            bytes: p.bytes,
            time_us: p.seconds.median * 1e6,
        })
        .collect();
    let score = |overhead: f64, reduce: f64| -> f64 {
        let mut candidate = start.clone();
        if let Library::Mpi(params) = &mut candidate.library {
            params.message_overhead_us = overhead;
            params.reduce_gbytes_per_s = reduce;
        }
        match calibrate::predict(&candidate, Op::Allreduce, &points) {
            Ok(predictions) => {
                let errors: f64 = points
                    .iter()
                    .zip(&predictions)
                    .map(|(m, p)| (p.time.as_us() - m.time_us).abs() / m.time_us)
                    .sum();
                errors / points.len() as f64 * 100.0
            }
            Err(_) => f64::INFINITY,
        }
    };
    let mut best = (0.0, 1.0, f64::INFINITY);
    for overhead in [1.0, 10.0, 100.0] {
        for reduce in [0.5, 2.0, 8.0] {
            let candidate = pattern_search((overhead, reduce), &score);
            if candidate.2 < best.2 {
                best = candidate;
            }
        }
    }
    Ok(best)
}

/// The floor of the fitted overhead: below a hundredth of a µs it no longer changes a
/// prediction, and log-space steps need a positive value.
const MIN_OVERHEAD_US: f64 = 0.01;

fn pattern_search(start: (f64, f64), score: &dyn Fn(f64, f64) -> f64) -> (f64, f64, f64) {
    let (mut overhead, mut reduce) = start;
    let mut best = score(overhead, reduce);
    let mut step = 1.0_f64;
    while step > 1e-3 {
        let mut improved = false;
        for (d_overhead, d_reduce) in [(step, 0.0), (-step, 0.0), (0.0, step), (0.0, -step)] {
            let o = (overhead * f64::exp(d_overhead)).max(MIN_OVERHEAD_US);
            let r = reduce * f64::exp(d_reduce);
            let s = score(o, r);
            if s < best {
                (overhead, reduce, best) = (o, r, s);
                improved = true;
            }
        }
        if !improved {
            step /= 2.0;
        }
    }
    (overhead, reduce, best)
}

#[cfg(test)]
mod tests {
    use super::super::measure::Spread;
    use super::*;
    use syncopate_sim::collective::{estimate, Group};

    fn lab() -> LabState {
        let spec = super::super::LabSpec {
            name: "t".into(),
            nodes: 2,
            gbps: 1.0,
            latency_us: 0.0,
            cores_per_node: None,
            burst_bytes: None,
            command: "syncopate lab up --nodes 2 --gbps 1".into(),
        };
        spec.plan(0, &[0, 1])
    }

    fn network() -> NetworkProbe {
        NetworkProbe {
            goodput_gbps: 0.92,
            goodput_seconds: 3.0,
            goodput_bytes: 345_000_000,
            rtt_us: Spread::of(&[30.0, 31.0, 32.0]),
            burst: Vec::new(),
        }
    }

    #[test]
    fn the_fit_recovers_the_models_own_parameters() {
        let measured = LabMeasurements {
            network: network(),
            allreduce: Vec::new(),
            ranks: 2,
        };
        let mut truth = cluster(&lab(), &measured, "host-2core", "t").unwrap();
        if let Library::Mpi(p) = &mut truth.library {
            p.message_overhead_us = 40.0;
            p.reduce_gbytes_per_s = 3.0;
        }
        let sweep: Vec<AllreducePoint> = [4u64 << 10, 64 << 10, 1 << 20, 16 << 20]
            .iter()
            .map(|&bytes| {
                let t = estimate(&truth, Op::Allreduce, bytes, Group::world(&truth))
                    .unwrap()
                    .time
                    .as_us()
                    / 1e6;
                AllreducePoint {
                    bytes,
                    seconds: Spread::of(&[t]),
                    busbw_gbps: 0.0,
                }
            })
            .collect();
        let (overhead, reduce, error) = fit_mpi(&truth, &sweep, 2).unwrap();
        assert!(error < 0.5, "{error}");
        assert!((overhead / 40.0 - 1.0).abs() < 0.05, "{overhead}");
        assert!((reduce / 3.0 - 1.0).abs() < 0.2, "{reduce}");
    }

    #[test]
    fn without_a_sweep_the_mpi_costs_are_marked_estimated() {
        let measured = LabMeasurements {
            network: network(),
            allreduce: Vec::new(),
            ranks: 2,
        };
        let c = cluster(&lab(), &measured, "host-2core", "syncopate lab up").unwrap();
        let Library::Mpi(p) = &c.library else {
            panic!("an MPI cluster")
        };
        assert_eq!(p.provenance.status, Status::Estimated);
        assert!((p.tcp_efficiency - 0.92).abs() < 1e-12);
        assert!((c.inter_node.latency_us - 15.5).abs() < 1e-12);
        assert!(c.source.contains("syncopate lab up"));
    }
}
