//! A cluster file for a lab, fitted to what was measured on it.
//!
//! It holds the shaped rate and TCP efficiency from the goodput probe, the hop latency from the
//! round trip, MPI's host cap and per-message overhead from the allreduce sweep
//! (`syncopate_sim::calibrate::tcp_fit`), both sweeps kept as measured times, and the contention of its ranks.

use super::measure::NetworkProbe;
use super::state::LabState;
use crate::error::{ExecError, Result};
use crate::measure::records::{CollectivePoint, ContentionPoint, Pace, Spread};
use serde::Serialize;
use syncopate_sim::base::data::FORMAT_VERSION;
use syncopate_sim::calibrate::tcp_fit::{self, Timed};
use syncopate_sim::calibrate::Measurement;
use syncopate_sim::collective::{estimate, Group};
use syncopate_sim::collective_op::{Algorithm, Op};
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::model::{Provenance, Status};
use syncopate_sim::inputs::topology::{
    Cluster, ClusterContention, ClusterOverrides, Fabric, InterNode, IntraNode, Library,
    SharedCores, TcpParams, Transport,
};

/// Everything `lab up` measured.
#[derive(Clone, Debug, Serialize)]
pub struct LabMeasurements {
    /// The network probes: one stream's goodput, round trips and bursts.
    pub network: NetworkProbe,
    /// Empty when the binary was built without the `mpi` feature.
    pub allreduce: Vec<CollectivePoint>,
    /// The MPI backend's allgather at the same sizes (empty likewise): the exchange of the
    /// compressors whose payloads are gathered rather than summed (top-k, DGC, the sign family),
    /// which the cost model prices from the allreduces' fit otherwise.
    pub allgather: Vec<CollectivePoint>,
    /// Ranks of the sweeps.
    pub ranks: u32,
    /// How compute and communication slow each other on the lab's ranks (with `mpi`).
    pub contention: Option<ContentionPoint>,
}

/// Measures everything `lab up` reports on a made lab: the network probes, and with the
/// `mpi` feature the allreduce and allgather sweeps and the contention of compute and
/// communication.
pub fn measure(
    made: &LabState,
    exe: &super::measure::SelfExe,
    goodput_seconds: f64,
    repeats: usize,
    interrupted: &std::sync::atomic::AtomicBool,
) -> Result<LabMeasurements> {
    use super::measure;
    use std::time::Duration;
    let options = measure::ProbeOptions {
        goodput_seconds,
        ..measure::ProbeOptions::default()
    };
    let network = measure::network(made, exe, &options)?;
    let mpi = cfg!(feature = "mpi");
    let sweep = |op| {
        if !mpi {
            return Ok(Vec::new());
        }
        // Generous: the largest size at a tenth of the shaped rate, every repeat, plus start-up.
        let sizes = measure::sweep_sizes();
        let slowest = sizes.iter().sum::<u64>() as f64 * 8.0 / (made.gbps * 1e8);
        let timeout = Duration::from_secs_f64(60.0 + slowest * (repeats + 1) as f64);
        measure::sweep(made, exe, op, &sizes, repeats, timeout, interrupted)
    };
    let allreduce = sweep(Op::Allreduce)?;
    let allgather = sweep(Op::Allgather)?;
    let contention = if mpi {
        Some(probe_contention(made, exe, interrupted)?)
    } else {
        None
    };
    Ok(LabMeasurements {
        network,
        allreduce,
        allgather,
        ranks: made.nodes.len() as u32,
        contention,
    })
}

/// One contention probe of a made lab (`lab probe contention` on every rank, under mpirun).
pub fn probe_contention(
    made: &LabState,
    exe: &super::measure::SelfExe,
    interrupted: &std::sync::atomic::AtomicBool,
) -> Result<ContentionPoint> {
    let bytes: u64 = CONTENTION_SIZES.iter().sum();
    let timeout =
        std::time::Duration::from_secs_f64(120.0 + bytes as f64 * 8.0 / (made.gbps * 1e8) * 20.0);
    let point = super::measure::contention(
        made,
        exe,
        &CONTENTION_SIZES,
        CONTENTION_REPEATS,
        timeout,
        interrupted,
    )?;
    let draws = (0..CONTENTION_REPEATS)
        .map(|_| probe_pace(made, exe, interrupted))
        .collect::<Result<Vec<_>>>()?;
    point.with_pace(&draws)
}

/// One draw of the compute's pace on a made lab (`lab probe pace` on every rank, under
/// mpirun): a launch of its own, whose ranks calibrate and compute as a run's ranks start.
pub fn probe_pace(
    made: &LabState,
    exe: &super::measure::SelfExe,
    interrupted: &std::sync::atomic::AtomicBool,
) -> Result<Pace> {
    // Generous: a draw takes about half a second, a few on 4 ranks sharing 2 cores.
    let timeout = std::time::Duration::from_secs(60);
    super::measure::pace(made, exe, timeout, interrupted)
}

/// Repeats of each contention measurement: its slowdowns are ratios of noisy medians.
const CONTENTION_REPEATS: usize = 7;

/// The allreduces of the contention probe: a small one, whose time beside compute is mostly
/// the delay of its rounds waiting for busy cores, and a few MB, like the fused buffers of a
/// training run, whose time is mostly the slowed transfer.
const CONTENTION_SIZES: [u64; 2] = [64 << 10, 4 << 20];

/// The lab as a cluster of one-rank nodes for `device` (a device profile name or path), with
/// `command` (the `lab up` command line) and the measurements in its provenance.
pub fn cluster(
    lab: &LabState,
    measured: &LabMeasurements,
    device: &str,
    command: &str,
    cluster_path: &std::path::Path,
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
            mesh: None,
        },
        inter_node: InterNode {
            transport: Transport::Tcp,
            nics_per_node: 1,
            nic_bandwidth_gbps: lab.gbps,
            latency_us: hop_us,
        },
        library: Library::Mpi(TcpParams {
            // What the MPI backend runs (exec/src/runtime/mpi/world.rs asks libnbc for it).
            allreduce_algorithm: Some(Algorithm::Ring),
            ..TcpParams::base_costs(
                tcp_efficiency,
                0.0,
                profile.memory_bandwidth_gbytes_per_s / 3.0,
                Provenance {
                    status: Status::Estimated,
                    method: String::new(),
                },
            )
        }),
        contention: measured
            .contention
            .as_ref()
            .map(|c| contention(c, lab))
            .transpose()?,
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
        let sweep_file = sweep_path(cluster_path)
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let points = sweep_points(&measured.allreduce, Op::Allreduce, measured.ranks);
        let fitted = tcp_fit::fit(&cluster, &points)?;
        // The allgathers are not fitted (MPI's model has no parameter of their own); their
        // times stand in for the model where a plan runs the very same allgather.
        let fitted_cluster = tcp_fit::apply(&cluster, &fitted);
        cluster = tcp_fit::attach(&fitted_cluster, &all_sweep_points(measured));
        let allgathers = match measured.allgather.is_empty() {
            true => String::new(),
            false => format!(
                "; the MPI backend's allgather (sizes, then MPI_Iallgatherv) swept at the same sizes is kept in `measured` for the plans' allgathers, not fitted: {}",
                describe_against_model(&fitted_cluster, &measured.allgather, Op::Allgather)?
            ),
        };
        format!(
            "tcp_efficiency = goodput / shaped rate and inter_node.latency_us = RTT/2 measured; reduce_gbytes_per_s estimated (memory bandwidth / 3: a sum reads two buffers and writes one); {} (an allreduce sweep over Open MPI on the lab's {} ranks, median of {} repeats per size; the times are also in {sweep_file}, which `syncopate collective --cluster THIS --op allreduce --compare {sweep_file} --fit-out THIS` refits to){allgathers}. {goodput}",
            tcp_fit::describe(&cluster, &points, &fitted)?,
            measured.ranks,
            measured.allreduce.first().map_or(0, |p| p.seconds.repeats),
        )
    };
    // The rate the simulator drains the queue at.
    let goodput = syncopate_sim::collective::rank_goodput_bytes_per_us(&cluster);
    let queue = measured
        .contention
        .as_ref()
        .and_then(ContentionPoint::queue_cap_us)
        .map(|(q, span_us, cap_us)| (q, span_us, cap_us, (cap_us * goodput).round() as u64));
    let method = match queue {
        Some((q, span_us, cap_us, bytes)) => format!(
            "{method}; queue_behind_bytes {bytes}: an allreduce of {} B took {:.3} ms alone and {:.3} ms while a second stream ran allreduces of {} B (`syncopate lab probe contention`, each repeat the mean of its calls, {} repeats; pooled probes: the median of the probes' medians), {:.0} µs more on average, which the simulator's wait (the least of the cap and the transfer left) gives for starts spread over a {:.1} ms allreduce with a cap of {:.0} µs, {bytes} B at the fitted goodput",
            q.small_bytes,
            q.alone.median * 1e3,
            q.beside_large.median * 1e3,
            q.large_bytes,
            q.beside_large.repeats,
            q.wait_us(),
            span_us / 1e3,
            cap_us,
        ),
        None => method,
    };
    if let Library::Mpi(params) = &mut cluster.library {
        params.queue_behind_bytes = queue.map(|(.., bytes)| bytes);
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

/// The measured contention as the simulator takes it, with what was measured.
fn contention(c: &ContentionPoint, lab: &LabState) -> Result<ClusterContention> {
    let ms = |s: &Spread| {
        format!(
            "{:.1} ms (range {:.1}–{:.1})",
            s.median * 1e3,
            s.min * 1e3,
            s.max * 1e3
        )
    };
    let fit = c.beside_compute(lab.nodes.len() as u32)?;
    let collectives: Vec<String> = c
        .comm
        .iter()
        .map(|a| {
            format!(
                "{} of {} B {} alone, {} beside compute",
                a.op,
                a.bytes,
                ms(&a.alone),
                ms(&a.beside_compute)
            )
        })
        .collect();
    let mut contention = ClusterContention {
        compute_slowdown_with_ranks: c.compute_slowdown_with_ranks(),
        compute_slowdown_with_collective: c.compute_slowdown(),
        compute_slowdown_with_compression: c.compression_slowdown(),
        // Placeholders until the fit's figures are applied below.
        collective_slowdown_with_compute: 1.0,
        collective_delay_with_compute_us: 0.0,
        allgather_delay_with_compute_us: None,
        shared_cores: Some(SharedCores {
            cores_per_host: lab_cores(lab),
            one_host: true,
        }),
        provenance: Provenance {
            status: Status::Measured,
            method: format!(
                "measured by `syncopate lab probe contention` on every one of the {} ranks at once (one per node, sharing {} cores), the slowest rank's times, {}: {:.0} ms of the MPI backend's calibrated compute took {} alone{}, {} beside allreduces of {} B, {} beside a second computing thread; one {}; {} through them",
                lab.nodes.len(),
                lab_cores(lab),
                if c.probes > 1 {
                    format!(
                        "each timing the median over {} probes taken before, between and after the lab's runs (each the median of its {} repeats)",
                        c.probes,
                        c.compute_alone.repeats / c.probes
                    )
                } else {
                    format!("medians of {} repeats", c.compute_alone.repeats)
                },
                c.compute_ns as f64 / 1e6,
                ms(&c.compute_alone),
                c.pace.map_or_else(String::new, |pace| format!(
                    " and {} as the median of {} draws of `syncopate lab probe pace` (each a launch of its own whose ranks calibrate and then compute at once, as a run's ranks start; `syncopate experiment run` on a lab experiment draws one after every run), the pace `compute_slowdown_with_ranks` takes",
                    ms(&pace),
                    pace.repeats
                )),
                ms(&c.compute_beside_comm),
                c.bytes,
                ms(&c.compute_beside_compute),
                collectives.join(", one "),
                fit.describe(),
            ),
        },
    };
    fit.apply_to(&mut contention);
    Ok(contention)
}

/// The cores a lab's ranks share: every node's CPU set together, or every CPU this machine
/// lets the process use when the nodes are not pinned.
fn lab_cores(lab: &LabState) -> u32 {
    let pinned: std::collections::BTreeSet<u32> = lab
        .nodes
        .iter()
        .flat_map(|n| n.cpus.iter().copied())
        .collect();
    if pinned.is_empty() {
        std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
    } else {
        pinned.len() as u32
    }
}

/// The sweeps as a measurement CSV that `collective --compare` reads at its `--op`'s rows (and
/// `--fit-out` refits an MPI cluster to, from the allreduces): one row per operation and size,
/// its median time.
fn sweep_csv(measured: &LabMeasurements) -> String {
    let mut csv = String::from("op,gpus,size_bytes,time_us\n");
    for Timed { op, measured: m } in all_sweep_points(measured) {
        csv.push_str(&format!("{op},{},{},{:.1}\n", m.gpus, m.bytes, m.time_us));
    }
    csv
}

/// Every sweep's medians: the allreduces', then the allgathers'.
fn all_sweep_points(measured: &LabMeasurements) -> Vec<Timed> {
    let mut points = sweep_points(&measured.allreduce, Op::Allreduce, measured.ranks);
    points.extend(sweep_points(
        &measured.allgather,
        Op::Allgather,
        measured.ranks,
    ));
    points
}

/// Writes the sweep beside the cluster file at `cluster_path` ([`sweep_path`]); without a
/// sweep (no `mpi` feature) nothing is written.
pub fn write_sweep(cluster_path: &std::path::Path, measured: &LabMeasurements) -> Result<()> {
    if measured.allreduce.is_empty() {
        return Ok(());
    }
    let path = sweep_path(cluster_path);
    std::fs::write(&path, sweep_csv(measured)).map_err(|source| ExecError::Io {
        what: format!("cannot write {}", path.display()),
        source,
    })
}

/// Each point of an `op` sweep on all of `cluster`'s ranks against the cost model's time for
/// it, in words.
fn describe_against_model(cluster: &Cluster, sweep: &[CollectivePoint], op: Op) -> Result<String> {
    let group = Group::world(cluster);
    let sizes = sweep
        .iter()
        .map(|p| {
            let model = estimate(cluster, op, p.bytes, group)?;
            Ok(format!(
                "{op} {} ranks {} B: {:.1} µs (model {:.1})",
                group.ranks,
                p.bytes,
                p.seconds.median * 1e6,
                model.time.as_us()
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(sizes.join(", "))
}

/// Where the sweep of the cluster file at `cluster_path` goes: beside it, `NAME.sweep.csv`.
fn sweep_path(cluster_path: &std::path::Path) -> std::path::PathBuf {
    cluster_path.with_extension("sweep.csv")
}

/// A sweep of `op`'s medians as calibration measurements on `ranks` ranks.
fn sweep_points(sweep: &[CollectivePoint], op: Op, ranks: u32) -> Vec<Timed> {
    sweep
        .iter()
        .map(|p| Timed {
            op,
            measured: Measurement {
                gpus: ranks,
                bytes: p.bytes,
                time_us: p.seconds.median * 1e6,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The test lab's cluster file `t.json` for `measured` (its sweep beside it: `t.sweep.csv`).
    fn lab_cluster(measured: &LabMeasurements) -> Cluster {
        let path = std::path::Path::new("t.json");
        cluster(&lab(), measured, "host-2core", "syncopate lab up", path).unwrap()
    }

    #[test]
    fn a_sweep_is_fitted_and_written_for_refitting() {
        let mut measured = LabMeasurements {
            network: network(),
            allreduce: Vec::new(),
            allgather: Vec::new(),
            ranks: 2,
            contention: None,
        };
        let mut truth = lab_cluster(&measured);
        // A host that moves 0.6 of the 1 Gb/s line per rank.
        if let Library::Mpi(p) = &mut truth.library {
            p.message_overhead_us = 40.0;
            p.host_gbps = Some(0.6);
        }
        // The allgathers take 1.5× the model's time: measured, not fitted.
        let sweep = |op, slower: f64| -> Vec<CollectivePoint> {
            [4u64 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20]
                .iter()
                .map(|&bytes| {
                    let t = estimate(&truth, op, bytes, Group::world(&truth))
                        .unwrap()
                        .time
                        .as_us()
                        / 1e6;
                    CollectivePoint {
                        bytes,
                        seconds: Spread::of(&[t * slower]),
                        busbw_gbps: 0.0,
                    }
                })
                .collect()
        };
        measured.allreduce = sweep(Op::Allreduce, 1.0);
        measured.allgather = sweep(Op::Allgather, 1.5);
        let fitted = lab_cluster(&measured);
        let Library::Mpi(p) = &fitted.library else {
            panic!("an MPI cluster")
        };
        assert_eq!(p.provenance.status, Status::Calibrated);
        assert!((p.host_gbps.unwrap() / 0.6 - 1.0).abs() < 0.01, "{p:?}");
        assert!(p.provenance.method.contains("t.sweep.csv"));
        assert!(p.provenance.method.contains("allgather 2 ranks 4194304 B"));
        // Both sweeps stand in for the model: the allgathers at their measured times.
        let ops: Vec<Op> = p.measured.iter().map(|s| s.op).collect();
        assert_eq!(ops, [Op::Allreduce, Op::Allgather]);
        let world = Group::world(&fitted);
        let gathered = estimate(&fitted, Op::Allgather, 4 << 20, world).unwrap();
        let truth_gathered = estimate(&truth, Op::Allgather, 4 << 20, world).unwrap();
        let ratio = gathered.time.as_us() / truth_gathered.time.as_us();
        assert!((ratio - 1.5).abs() < 0.01, "{ratio}");
        // The CSV reads back as the measurements: each operation at its rows.
        let dir = std::env::temp_dir().join(format!("syncopate-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_sweep(&dir.join("lab.json"), &measured).unwrap();
        let path = dir.join("lab.sweep.csv");
        let read = |op| syncopate_sim::calibrate::read_measurements(&path, op, None, 1, &[]);
        let (allreduces, allgathers) = (read(Op::Allreduce), read(Op::Allgather));
        std::fs::remove_dir_all(&dir).unwrap();
        for read in [allreduces.unwrap(), allgathers.unwrap()] {
            assert_eq!(read.len(), 5);
            assert!(read.iter().all(|m| m.gpus == 2));
            assert_eq!(read[4].bytes, 16 << 20);
        }
    }

    #[test]
    fn a_measured_queue_is_the_bytes_its_wait_drains_at_the_goodput() {
        let measured = LabMeasurements {
            network: network(),
            allreduce: Vec::new(),
            allgather: Vec::new(),
            ranks: 2,
            contention: Some(crate::measure::records::probed(0.2, 0.016)),
        };
        let cluster = lab_cluster(&measured);
        let Library::Mpi(p) = &cluster.library else {
            panic!("an MPI cluster")
        };
        // 15.9 ms more than alone on average over a 36 ms allreduce, as a cap at the goodput.
        let goodput = syncopate_sim::collective::rank_goodput_bytes_per_us(&cluster);
        let cap_us = syncopate_sim::predict::engine::queue_cap_for_mean_wait(15_900.0, 36_000.0);
        let expected = (cap_us * goodput).round() as u64;
        assert_eq!(p.queue_behind_bytes, Some(expected));
        assert!(p
            .provenance
            .method
            .contains(&format!("queue_behind_bytes {expected}")));
    }

    #[test]
    fn without_a_sweep_the_mpi_costs_are_marked_estimated() {
        let measured = LabMeasurements {
            network: network(),
            allreduce: Vec::new(),
            allgather: Vec::new(),
            ranks: 2,
            contention: None,
        };
        let c = lab_cluster(&measured);
        let Library::Mpi(p) = &c.library else {
            panic!("an MPI cluster")
        };
        assert_eq!(p.provenance.status, Status::Estimated);
        assert!((p.tcp_efficiency - 0.92).abs() < 1e-12);
        assert!((c.inter_node.latency_us - 15.5).abs() < 1e-12);
        assert!(c.source.contains("syncopate lab up"));
    }

    #[test]
    fn pinned_nodes_share_the_cores_of_their_sets() {
        let spec = super::super::LabSpec {
            name: "t".into(),
            nodes: 4,
            gbps: 1.0,
            latency_us: 0.0,
            cores_per_node: Some(1),
            burst_bytes: None,
            command: "syncopate lab up --nodes 4 --gbps 1 --cores-per-node 1".into(),
        };
        // Four one-CPU nodes round-robin over CPUs 0 and 1: two ranks per core.
        assert_eq!(lab_cores(&spec.plan(0, &[0, 1])), 2);
        assert_eq!(lab_cores(&spec.plan(0, &[0, 1, 2, 3, 4, 5])), 4);
    }
}
