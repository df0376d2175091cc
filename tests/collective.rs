//! The collective model: closed-form cases by hand, monotonicity, and calibration accuracy.

use crate::common::{read_json, root, scratch, stderr, stdout, syncopate, validation_data};
use syncopate_sim::base::data::DataKind;
use syncopate_sim::calibrate::{self, Measurement, RowFilter};
use syncopate_sim::collective::{self, Group, Links, Protocol, ServerLink};
use syncopate_sim::collective_op::{Algorithm, Op};
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides, Library, TcpParams};

fn cluster(name: &str) -> Cluster {
    Cluster::load(name, ClusterOverrides::default()).unwrap()
}

#[test]
fn one_rank_allreduce_is_a_device_copy() {
    // a100-sxm4-40gb: 1555 GB/s; a copy reads and writes: 4.4 µs + S / (1555/2 · 0.85 GB/s).
    let c = cluster("a100-ib200");
    let bytes = 1u64 << 30;
    let estimate =
        collective::estimate(&c, Op::Allreduce, bytes, Group { ranks: 1, nodes: 1 }).unwrap();
    let expected_us = 4.4 + bytes as f64 / (1555.0 / 2.0 * 0.85 * 1e3);
    assert_eq!(estimate.algorithm, Algorithm::Local);
    assert!(
        (estimate.time.as_us() - expected_us).abs() < 0.01,
        "{} vs {expected_us}",
        estimate.time.as_us()
    );
}

#[test]
fn mpi_ring_allreduce_matches_the_hockney_formula() {
    // v100-tcp: 8 ranks, 10 Gb/s at 80% efficiency, α = 30 µs overhead + 25 µs hop, γ = 1/(5 GB/s).
    let c = cluster("v100-tcp");
    let Library::Mpi(p) = &c.library else {
        panic!("v100-tcp runs MPI")
    };
    let (n, s) = (8.0, 256.0 * 1024.0 * 1024.0);
    let alpha = p.message_overhead_us + c.inter_node.latency_us;
    let beta = 1.0 / (10e9 / 8.0 * p.tcp_efficiency / 1e6);
    let gamma = 1.0 / (p.reduce_gbytes_per_s * 1e3);
    let ring = 2.0 * (n - 1.0) * alpha + 2.0 * (n - 1.0) / n * s * beta + (n - 1.0) / n * s * gamma;
    let rabenseifner =
        2.0 * 3.0 * alpha + 2.0 * (n - 1.0) / n * s * beta + (n - 1.0) / n * s * gamma;
    let estimate = collective::estimate(&c, Op::Allreduce, s as u64, Group::world(&c)).unwrap();
    // For 8 ranks (a power of two) Rabenseifner's log-step latency beats the ring's.
    assert_eq!(estimate.algorithm, Algorithm::Rabenseifner);
    assert!((estimate.time.as_us() - rabenseifner.min(ring)).abs() < 0.01);
    // A tiny message takes recursive doubling: log2(8) rounds of α + Sβ + Sγ.
    let small = collective::estimate(&c, Op::Allreduce, 64, Group::world(&c)).unwrap();
    assert_eq!(small.algorithm, Algorithm::RecursiveDoubling);
    assert!((small.time.as_us() - 3.0 * (alpha + 64.0 * beta + 64.0 * gamma)).abs() < 0.01);
}

#[test]
fn nccl_large_single_node_ring_matches_link_bandwidth() {
    // At 8 GiB the bandwidth term dominates: busbw = fabric × intra efficiency (Simple).
    let c = cluster("a100-ib200");
    let Library::Nccl(p) = &c.library else {
        panic!("NCCL")
    };
    let group = Group { ranks: 8, nodes: 1 };
    let bytes = 8u64 << 30;
    let estimate = collective::estimate(&c, Op::Allreduce, bytes, group).unwrap();
    let busbw = estimate.algbw_gbytes_per_s(bytes) * Op::Allreduce.bus_factor(8);
    let link = c.intra_node.bandwidth_gbytes_per_s * p.intra_efficiency;
    assert_eq!(estimate.algorithm, Algorithm::Ring);
    assert_eq!(estimate.protocol, Protocol::Simple);
    assert!(
        busbw < link && busbw > 0.97 * link,
        "busbw {busbw} vs link {link}"
    );
}

#[test]
fn small_messages_use_ll_and_large_ones_switch_protocol() {
    let c = cluster("a100-ib200");
    let group = Group { ranks: 8, nodes: 1 };
    let small = collective::estimate(&c, Op::Allreduce, 4096, group).unwrap();
    let large = collective::estimate(&c, Op::Allreduce, 1 << 30, group).unwrap();
    assert_eq!(small.protocol, Protocol::Ll);
    assert_ne!(large.protocol, Protocol::Ll);
    // Across nodes, small allreduces take the tree (logarithmic network depth).
    let multi = collective::estimate(
        &c,
        Op::Allreduce,
        4096,
        Group {
            ranks: 32,
            nodes: 4,
        },
    )
    .unwrap();
    assert_eq!(multi.algorithm, Algorithm::Tree);
}

#[test]
fn nvls_wins_large_allreduce_on_hopper() {
    let c = cluster("dgx-h100");
    let estimate = collective::estimate(&c, Op::Allreduce, 1 << 30, Group::world(&c)).unwrap();
    assert_eq!(estimate.algorithm, Algorithm::Nvls);
    let a100 = cluster("dgx-a100");
    let ring = collective::estimate(&a100, Op::Allreduce, 1 << 30, Group::world(&a100)).unwrap();
    assert_ne!(ring.algorithm, Algorithm::Nvls);
}

#[test]
fn time_never_decreases_with_size() {
    for name in [
        "a100-ib200",
        "dgx-h100",
        "v100-pcie",
        "v100-10gbe",
        "v100-tcp",
    ] {
        let mut c = cluster(name);
        c.apply(ClusterOverrides {
            nodes: Some(4),
            ..Default::default()
        })
        .unwrap();
        for op in Op::ALL {
            let mut previous = 0;
            for shift in 3..=33 {
                let t = collective::estimate(&c, op, 1u64 << shift, Group::world(&c))
                    .unwrap()
                    .time
                    .as_ns();
                assert!(t >= previous, "{name} {op} at 2^{shift}: {t} < {previous}");
                previous = t;
            }
        }
    }
}

#[test]
fn time_never_decreases_between_powers_of_two_on_any_shipped_cluster() {
    // Sizes 7 % apart cross every channel threshold and every switch of NCCL's tuner, where a
    // rounded channel count or pricing the tuner's choice made a larger message faster.
    let sizes: Vec<u64> = (0..)
        .map(|k| (4.0 * 1.07f64.powi(k)) as u64)
        .take_while(|&b| b <= 16 << 30)
        .collect();
    for name in DataKind::Cluster.shipped_names() {
        for nodes in [1, 2, 3, 4, 16, 128] {
            let mut c = cluster(name);
            c.apply(ClusterOverrides {
                nodes: Some(nodes),
                ..Default::default()
            })
            .unwrap();
            for op in Op::ALL {
                let mut previous = (0, 0);
                for &bytes in &sizes {
                    let t = collective::estimate(&c, op, bytes, Group::world(&c))
                        .unwrap()
                        .time
                        .as_ns();
                    assert!(
                        t >= previous.1,
                        "{name}, {nodes} nodes, {op}: {bytes} B take {t} ns, {} B {} ns",
                        previous.0,
                        previous.1
                    );
                    previous = (bytes, t);
                }
            }
        }
    }
}

#[test]
fn slower_network_is_never_faster() {
    let fast = cluster("v100-100gib");
    let mut slow = fast.clone();
    slow.apply(ClusterOverrides {
        inter_gbps: Some(10.0),
        ..Default::default()
    })
    .unwrap();
    for op in Op::ALL {
        for shift in [12, 20, 28] {
            let f = collective::estimate(&fast, op, 1 << shift, Group::world(&fast)).unwrap();
            let s = collective::estimate(&slow, op, 1 << shift, Group::world(&slow)).unwrap();
            assert!(s.time >= f.time, "{op} 2^{shift}");
        }
    }
}

#[test]
fn hierarchical_allreduce_composes_its_phases() {
    let c = cluster("v100-10gbe");
    let bytes = 100 << 20;
    let h = collective::estimate_hierarchical_allreduce(&c, bytes).unwrap();
    let rs = collective::estimate(&c, Op::ReduceScatter, bytes, Group::one_node(&c)).unwrap();
    let ag = collective::estimate(&c, Op::Allgather, bytes, Group::one_node(&c)).unwrap();
    assert_eq!(h.algorithm, Algorithm::Hierarchical);
    assert!(h.time > rs.time + ag.time);
}

#[test]
fn a_push_pull_carries_every_senders_payload_through_its_servers_link() {
    let c = cluster("v100-100gib");
    let bytes = 100u64 << 20;
    let Library::Nccl(params) = &c.library else {
        panic!("v100-100gib is an NCCL cluster");
    };
    assert_eq!(c.nodes, 16);
    // The PS prices the link with the library's goodput (line rate x NCCL's inter efficiency).
    let link_bytes_per_us = c.node_network_bytes_per_s() / 1e6 * params.inter_efficiency;
    let round = |server| collective::push_pull(&c, bytes, server).unwrap();
    // A dedicated server takes all 16 nodes' payloads in, then sends the result to each.
    let (dedicated, links) = round(ServerLink::Dedicated(0));
    let expected = 2.0 * (c.inter_node.latency_us + 16.0 * bytes as f64 / link_bytes_per_us);
    assert!((dedicated.time.as_us() - expected).abs() < 0.01);
    assert_eq!(
        links,
        Links::Server {
            server: ServerLink::Dedicated(0),
            senders: 16
        }
    );
    // A server on a worker node has its own node's payload already.
    let (colocated, _) = round(ServerLink::Node(3));
    let expected = 2.0 * (c.inter_node.latency_us + 15.0 * bytes as f64 / link_bytes_per_us);
    assert!((colocated.time.as_us() - expected).abs() < 0.01);
    let err = collective::push_pull(&c, bytes, ServerLink::Node(16)).unwrap_err();
    assert!(err.to_string().contains("node 16"), "{err}");
}

#[test]
fn allgatherv_is_bounded_by_the_largest_block() {
    let c = cluster("dgx1-v100");
    let group = Group::world(&c);
    let sizes = [
        1 << 20,
        1 << 10,
        1 << 10,
        1 << 10,
        1 << 10,
        1 << 10,
        1 << 10,
        1 << 10,
    ];
    let v = collective::estimate_allgatherv(&c, &sizes, group).unwrap();
    let even = collective::estimate(&c, Op::Allgather, 8 << 20, group).unwrap();
    assert_eq!(v.time, even.time);
    assert!(collective::estimate_allgatherv(&c, &sizes[..3], group).is_err());
}

#[test]
fn azure_hopper_nvls_curves_are_within_ten_percent() {
    for (name, column) in [
        ("dgx-h100", "h100_80gb_x8_busbw_gbs"),
        ("dgx-h200", "h200_x8_busbw_gbs"),
    ] {
        let c = cluster(name);
        let path = validation_data("azure_nccl_allreduce_busbw_8gpu.csv");
        let measurements: Vec<_> =
            calibrate::read_measurements(&path, Op::Allreduce, Some(column), 8, &[])
                .unwrap()
                .into_iter()
                .filter(|m| m.bytes >= 4096)
                .collect();
        let predictions = calibrate::predict(&c, Op::Allreduce, &measurements).unwrap();
        let table = calibrate::error_table(&measurements, &predictions);
        assert!(
            table[0].mean_abs_pct <= 10.0,
            "{name}: {:.1}%",
            table[0].mean_abs_pct
        );
    }
}

#[test]
fn fitting_recovers_a_known_cluster() {
    // Predictions of a known cluster are data; refitting a perturbed copy must get close again.
    let truth = cluster("a100-ib200");
    let measurements: Vec<_> = [1u32, 2, 4, 8, 16, 32]
        .iter()
        .flat_map(|&gpus| (12..=32).step_by(2).map(move |shift| (gpus, 1u64 << shift)))
        .map(|(gpus, bytes)| {
            let mut sized = truth.clone();
            sized.nodes = gpus.div_ceil(8);
            let group = calibrate::group_for(&truth, gpus);
            let time_us = collective::estimate(&sized, Op::Allreduce, bytes, group)
                .unwrap()
                .time
                .as_us();
            calibrate::Measurement {
                gpus,
                bytes,
                time_us,
            }
        })
        .collect();
    let mut start = truth.clone();
    if let Library::Nccl(p) = &mut start.library {
        p.intra_efficiency *= 0.8;
        p.base_latency_us.ll *= 1.5;
    }
    let (fitted, _) = calibrate::fit(&start, Op::Allreduce, &measurements, None).unwrap();
    let predictions = calibrate::predict(&fitted, Op::Allreduce, &measurements).unwrap();
    for row in calibrate::error_table(&measurements, &predictions) {
        assert!(
            row.mean_abs_pct < 2.0,
            "{} GPUs: {:.2}%",
            row.gpus,
            row.mean_abs_pct
        );
    }
}

/// Echo's A100 allreduce from 4 KiB to 4 GiB.
fn echo() -> Vec<Measurement> {
    let path = validation_data("echo_nccl_allreduce_a100_ib200.csv");
    calibrate::read_measurements(&path, Op::Allreduce, None, 8, &[])
        .unwrap()
        .into_iter()
        .filter(|m| (4096..=4 << 30).contains(&m.bytes))
        .collect()
}

fn mean_error_at(cluster: &Cluster, measurements: &[Measurement], gpus: u32) -> f64 {
    let predictions = calibrate::predict(cluster, Op::Allreduce, measurements).unwrap();
    calibrate::error_table(measurements, &predictions)
        .into_iter()
        .find(|r| r.gpus == gpus)
        .unwrap_or_else(|| panic!("no measurements at {gpus} GPUs"))
        .mean_abs_pct
}

// Errors measured when the shipped cluster files were fitted (profiles/validation/README.md),
// with a little room: a change to the model that makes them worse fails here. Issue 13 asks for
// a mean of at most 8 % at Echo's 32 GPUs (7.8 % since the fit prices the cheapest candidate).
const ECHO_HELD_OUT_MEDIAN_PCT: f64 = 8.5;
const ECHO_HELD_OUT_MEAN_PCT: f64 = 8.0;
const ECHO_FIT_MEAN_PCT: f64 = 9.5;
const POLARIS_256_NODES_MEDIAN_PCT: f64 = 12.5;
const POLARIS_540_NODES_MEDIAN_PCT: f64 = 18.5;
const POLARIS_TCP_128_NODES_MEDIAN_PCT: f64 = 31.0;
const H100_8_NODES_MEDIAN_PCT: f64 = 24.5;
/// DGX-1 (V100) at 2, 3, 4, 6 and 7 GPUs, held out of the 8-GPU fit: medians 1.7–5.4 %.
const DGX1_HELD_OUT_MEDIAN_PCT: f64 = 6.5;
/// DGX-1 at 5 GPUs, whose relayed rings are priced as direct ones: median 17.8 %.
const DGX1_FIVE_GPUS_MEDIAN_PCT: f64 = 19.0;

/// Median of the absolute percentage errors of the predictions of `measurements` at `gpus`.
fn median_error_at(cluster: &Cluster, measurements: &[Measurement], gpus: u32) -> f64 {
    let at: Vec<Measurement> = measurements
        .iter()
        .filter(|m| m.gpus == gpus)
        .copied()
        .collect();
    let predictions = calibrate::predict(cluster, Op::Allreduce, &at).unwrap();
    let mut errors: Vec<f64> = at
        .iter()
        .zip(&predictions)
        .map(|(m, p)| (p.time.as_us() - m.time_us).abs() / m.time_us * 100.0)
        .collect();
    assert!(!errors.is_empty(), "no measurements at {gpus} GPUs");
    errors.sort_by(f64::total_cmp);
    let mid = errors.len() / 2;
    if errors.len() % 2 == 1 {
        errors[mid]
    } else {
        (errors[mid - 1] + errors[mid]) / 2.0
    }
}

#[test]
fn echo_a100_fitted_up_to_sixteen_gpus_predicts_thirty_two() {
    // The shipped a100-ib200 was fitted on 1-16 GPUs only (its provenance names the command).
    let c = cluster("a100-ib200");
    let data = echo();
    let median = median_error_at(&c, &data, 32);
    let mean = mean_error_at(&c, &data, 32);
    assert!(
        median <= ECHO_HELD_OUT_MEDIAN_PCT,
        "held-out 32 GPUs: median {median:.1}%"
    );
    assert!(
        mean <= ECHO_HELD_OUT_MEAN_PCT,
        "held-out 32 GPUs: mean {mean:.1}%"
    );
    for gpus in [1, 2, 4, 8, 16] {
        let fitted = mean_error_at(&c, &data, gpus);
        assert!(
            fitted <= ECHO_FIT_MEAN_PCT,
            "{gpus} GPUs (fitted): {fitted:.1}%"
        );
    }
}

#[test]
fn the_echo_fit_without_thirty_two_gpus_puts_no_parameter_on_a_bound() {
    let c = cluster("a100-ib200");
    let fit_set = calibrate::fit_set(&echo(), &[32]);
    let report = calibrate::fit_report(&c, Op::Allreduce, &fit_set, None).unwrap();
    assert!(report.at_bounds.is_empty(), "{:?}", report.at_bounds);
    // Two nodes are one tree depth: the fit moves the per-level cost and leaves the tree's
    // intercept to the ring's.
    assert!(
        report.fitted.contains(&"library.tree.level_latency_us.ll"),
        "{:?}",
        report.fitted
    );
    let kept: Vec<&str> = report.kept.iter().map(|k| k.name).collect();
    assert!(
        kept.contains(&"library.tree.base_latency_us.ll"),
        "{kept:?}"
    );
    assert!(
        kept.contains(&"library.inter_efficiency_loss_per_doubling"),
        "{kept:?}"
    );
    // Refitting the shipped cluster on its own data leaves the held-out error where it was.
    let shipped = mean_error_at(&c, &echo(), 32);
    let refit = mean_error_at(&report.cluster, &echo(), 32);
    assert!((refit - shipped).abs() < 1.0, "{refit:.2} vs {shipped:.2}");
}

#[test]
fn one_node_data_keeps_the_network_and_the_fit_is_deterministic() {
    let one_node: Vec<Measurement> = echo().into_iter().filter(|m| m.gpus <= 8).collect();
    let c = cluster("a100-ib200");
    let only: Vec<String> = [
        "intra_node.latency_us",
        "inter_node.latency_us",
        "library.intra_efficiency",
    ]
    .map(String::from)
    .to_vec();
    let first = calibrate::fit_report(&c, Op::Allreduce, &one_node, Some(&only)).unwrap();
    let second = calibrate::fit_report(&c, Op::Allreduce, &one_node, Some(&only)).unwrap();
    assert_eq!(first.cluster, second.cluster);
    assert_eq!(first.objective.to_bits(), second.objective.to_bits());
    assert_eq!(
        first.fitted,
        ["intra_node.latency_us", "library.intra_efficiency"]
    );
    assert_eq!(first.kept.len(), 1);
    assert_eq!(first.kept[0].name, "inter_node.latency_us");
    assert_eq!(first.cluster.inter_node, c.inter_node);
}

#[test]
fn nccls_tuner_chooses_and_the_calibrated_model_prices() {
    let c = cluster("a100-ib200");
    let two_nodes = Group {
        ranks: 16,
        nodes: 2,
    };
    // NCCL 2.18's tables rate a two-node tree below the ring for large messages.
    let large = collective::estimate(&c, Op::Allreduce, 1 << 30, two_nodes).unwrap();
    assert_eq!(
        (large.algorithm, large.protocol),
        (Algorithm::Ring, Protocol::Simple)
    );
    let four_nodes = Group {
        ranks: 32,
        nodes: 4,
    };
    let small = collective::estimate(&c, Op::Allreduce, 4096, four_nodes).unwrap();
    assert_eq!(
        (small.algorithm, small.protocol),
        (Algorithm::Tree, Protocol::Ll)
    );
    // Without NCCL's setup the fastest calibrated algorithm runs instead.
    let mut no_setup = c.clone();
    if let Library::Nccl(p) = &mut no_setup.library {
        p.setup = None;
    }
    let fastest = collective::estimate(&no_setup, Op::Allreduce, 1 << 30, two_nodes).unwrap();
    assert!(fastest.time <= large.time);
}

#[test]
fn compare_reports_the_held_out_error_apart() {
    let data = validation_data("echo_nccl_allreduce_a100_ib200.csv");
    let out = syncopate(&[
        "collective",
        "--cluster",
        "a100-ib200",
        "--compare",
        data.to_str().unwrap(),
        "--holdout-gpus",
        "32",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["held_out_error"]["gpus"], serde_json::json!([32]));
    assert_eq!(
        report["fit_error"]["gpus"],
        serde_json::json!([1, 2, 4, 8, 16])
    );
    assert!(
        report["held_out_error"]["mean_abs_error_pct"]
            .as_f64()
            .unwrap()
            <= ECHO_HELD_OUT_MEAN_PCT
    );
}

#[test]
fn a_fit_holds_the_largest_scale_out_and_says_what_it_kept() {
    let dir = scratch("fit-holdout");
    let data = validation_data("azure_nccl_allreduce_busbw_8gpu.csv");
    let out_file = dir.join("fitted.json");
    let out = syncopate(&[
        "collective",
        "--cluster",
        "dgx-h100",
        "--compare",
        data.to_str().unwrap(),
        "--column",
        "h100_80gb_x8_busbw_gbs",
        "--fit-out",
        out_file.to_str().unwrap(),
        "--fit-only",
        "library.nvls_latency_us,inter_node.latency_us",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    // One GPU count: nothing can be held out, and one node says nothing about the network.
    assert!(err.contains("nothing held out"), "{err}");
    assert!(
        err.contains("kept inter_node.latency_us: no multi-node data"),
        "{err}"
    );
    assert!(Cluster::load(out_file.to_str().unwrap(), ClusterOverrides::default()).is_ok());
}

#[test]
fn row_filters_select_one_run_of_a_multi_run_file() {
    let path = validation_data("polaris_nccl_a100_slingshot11.csv");
    let filters: Vec<RowFilter> = ["collective=all_reduce", "nccl_series=2.21", "env_setup=5"]
        .iter()
        .map(|f| f.parse().unwrap())
        .collect();
    let rows = calibrate::read_measurements(
        &path,
        Op::Allreduce,
        Some("time_us_out_of_place"),
        8,
        &filters,
    )
    .unwrap();
    // Nodes 2, 8, 256 and 540 at 29 sizes from 4 B to 1 GiB.
    assert_eq!(rows.len(), 4 * 29);
    let unknown = ["no_such_column=1".parse::<RowFilter>().unwrap()];
    let err = calibrate::read_measurements(&path, Op::Allreduce, None, 8, &unknown)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--where") && err.contains("no_such_column"),
        "{err}"
    );
}

/// Out-of-place allreduce rows of a vendored multi-run file from 4 KiB to `max_bytes`;
/// `filters` pick the runs.
fn allreduce_rows(file: &str, filters: &[&str], max_bytes: u64) -> Vec<Measurement> {
    allreduce_column(file, "time_us_out_of_place", filters, max_bytes)
}

/// `allreduce_rows` of another time column.
fn allreduce_column(
    file: &str,
    column: &str,
    filters: &[&str],
    max_bytes: u64,
) -> Vec<Measurement> {
    let filters: Vec<RowFilter> = filters.iter().map(|f| f.parse().unwrap()).collect();
    calibrate::read_measurements(
        &validation_data(file),
        Op::Allreduce,
        Some(column),
        8,
        &filters,
    )
    .unwrap()
    .into_iter()
    .filter(|m| (4096..=max_bytes).contains(&m.bytes))
    .collect()
}

/// `cluster` resized to `nodes` nodes.
fn with_nodes(cluster: &Cluster, nodes: u32) -> Cluster {
    let mut sized = cluster.clone();
    sized.nodes = nodes;
    sized
}

#[test]
fn polaris_fitted_on_two_and_eight_nodes_predicts_256_and_540_nodes() {
    // NCCL 2.21 over libfabric CXI (setup 5); the cluster file was fitted on 8 and 32 GPUs.
    let data = allreduce_rows(
        "polaris_nccl_a100_slingshot11.csv",
        &["collective=all_reduce", "nccl_series=2.21", "env_setup=5"],
        1 << 30,
    );
    let c = cluster("polaris-a100-ss11");
    for (gpus, bound) in [
        (1024, POLARIS_256_NODES_MEDIAN_PCT),
        (2160, POLARIS_540_NODES_MEDIAN_PCT),
    ] {
        let median = median_error_at(&c, &data, gpus);
        assert!(median <= bound, "held-out {gpus} GPUs: median {median:.1}%");
    }
    // Across 540 nodes NCCL's tuner trees small messages (a ring would pay 2 x 2159 hops).
    let group = Group {
        ranks: 2160,
        nodes: 540,
    };
    let small = collective::estimate(&with_nodes(&c, 540), Op::Allreduce, 64 << 10, group).unwrap();
    assert_eq!(
        (small.algorithm, small.protocol),
        (Algorithm::Tree, Protocol::Ll)
    );
}

#[test]
fn polaris_over_tcp_sockets_fitted_on_two_and_eight_nodes_predicts_128_nodes() {
    let data = allreduce_rows(
        "polaris_nccl_a100_slingshot11.csv",
        &["collective=all_reduce", "nccl_series=2.18", "env_setup=1"],
        1 << 30,
    );
    let c = cluster("polaris-a100-tcp");
    let median = median_error_at(&c, &data, 512);
    assert!(
        median <= POLARIS_TCP_128_NODES_MEDIAN_PCT,
        "held-out 512 GPUs: median {median:.1}%"
    );
}

#[test]
fn h100_issue_309_fitted_on_two_and_four_nodes_predicts_eight() {
    // Cluster C of NVIDIA/nccl-tests#309: runs C2 (2 nodes) and C3 (4 nodes) fitted, C1 held out.
    let data = allreduce_rows(
        "h100_ib400_nccl_allreduce_issue309.csv",
        &["run_id=C1", "run_id=C2", "run_id=C3"],
        4 << 30,
    );
    let c = cluster("h100-ib400");
    let median = median_error_at(&c, &data, 64);
    assert!(
        median <= H100_8_NODES_MEDIAN_PCT,
        "held-out 64 GPUs: median {median:.1}%"
    );
}

#[test]
fn dgx1_fitted_on_eight_gpus_predicts_the_rings_of_two_to_seven() {
    // vTrain's V100 node: the 8-GPU rows fitted the efficiencies, the others are held out.
    let data = allreduce_column(
        "vtrain_v100_allreduce_dgx1.csv",
        "time_us_col1",
        &[],
        1 << 30,
    );
    let c = cluster("dgx1-v100");
    for gpus in [2, 3, 4, 6, 7] {
        let median = median_error_at(&c, &data, gpus);
        assert!(
            median <= DGX1_HELD_OUT_MEDIAN_PCT,
            "held-out {gpus} GPUs: median {median:.1}%"
        );
    }
    // Five GPUs relay through GPU 0 (NCCL's PATH_NVB), which the rings price as two direct
    // links: faster than measured.
    let median = median_error_at(&c, &data, 5);
    assert!(
        median <= DGX1_FIVE_GPUS_MEDIAN_PCT,
        "5 GPUs: median {median:.1}%"
    );
    // Two GPUs share one link of 25 GB/s: a 1 GiB allreduce takes over 40 ms, not the 8.5 ms
    // that all six links of a GPU would give.
    let pair = Group { ranks: 2, nodes: 1 };
    let gib = collective::estimate(&c, Op::Allreduce, 1 << 30, pair).unwrap();
    assert!(gib.time.as_us() > 40_000.0, "{:?}", gib.time);
    // One GPU per node crosses no link of the mesh: its collectives are the mesh-less file's.
    let mut bare = with_nodes(&c, 4);
    bare.intra_node.mesh = None;
    let spread = Group { ranks: 4, nodes: 4 };
    for bytes in [64 << 10, 64 << 20] {
        let with = collective::estimate(&with_nodes(&c, 4), Op::Allreduce, bytes, spread).unwrap();
        let without = collective::estimate(&bare, Op::Allreduce, bytes, spread).unwrap();
        assert_eq!(with, without, "{bytes} B");
    }
}

/// A gloo sweep file (`python -m syncopate.torch.sweep`'s columns) that `truth` prices.
/// Writes a lab cluster file to `path` in a scratch directory, its device named by its
/// absolute path (the lab's files name it relative to their own folder).
fn write_lab_cluster(path: &std::path::Path, mut cluster: serde_json::Value) {
    let device = root().join("experiments/lab-validation/device.json");
    cluster["device"] = device.to_string_lossy().into_owned().into();
    std::fs::write(path, cluster.to_string()).unwrap();
}

/// A gloo sweep of `truth` as `python -m syncopate.torch.sweep` writes it: allreduce and
/// allgather rows, and push-pull rows when `truth` has a point-to-point cost.
fn gloo_sweep(truth: &Cluster, path: &std::path::Path) {
    let mut csv = String::from("op,gpus,size_bytes,time_us\n");
    for op in [Op::Allreduce, Op::Allgather] {
        for bytes in [4u64 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20] {
            let t = collective::estimate(truth, op, bytes, Group::world(truth)).unwrap();
            csv.push_str(&format!("{op},2,{bytes},{:.3}\n", t.time.as_us()));
        }
    }
    if truth
        .library
        .tcp()
        .unwrap()
        .p2p_message_overhead_us
        .is_some()
    {
        for bytes in [4u64 << 10, 64 << 10, 1 << 20] {
            let (t, _) = collective::push_pull(truth, bytes, ServerLink::Node(0)).unwrap();
            csv.push_str(&format!("push-pull,2,{bytes},{:.3}\n", t.time.as_us()));
            // Both servers' rounds at once take 1.5 rounds' time: 4/3 rounds at once.
            let all = 1.5 * t.time.as_us();
            csv.push_str(&format!("push-pull-all,2,{bytes},{all:.3}\n"));
        }
    }
    std::fs::write(path, csv).unwrap();
}

/// The 2-node lab's cluster file, and gloo on its links with a call costing 700 µs and what
/// `costs` sets: the truth a sweep is written from.
fn gloo_truth(costs: impl FnOnce(&mut TcpParams)) -> (std::path::PathBuf, Cluster) {
    let lab = root().join("experiments/lab-validation/clusters/lab-2n-1g.json");
    let mut truth = Cluster::load(lab.to_str().unwrap(), ClusterOverrides::default()).unwrap();
    let mut params = truth.library.tcp().unwrap().clone();
    // The MPI sweep the file carries measured MPI, not these costs.
    params.measured.clear();
    params.call_overhead_us = 700.0;
    costs(&mut params);
    truth.library = Library::Gloo(params);
    (lab, truth)
}

#[test]
fn a_labs_mpi_file_is_refitted_to_a_gloo_sweep() {
    let dir = scratch("gloo-fit");
    let (lab, truth) = gloo_truth(|params| {
        params.message_overhead_us = 50.0;
        params.p2p_message_overhead_us = Some(80.0);
    });
    let sweep = dir.join("gloo-sweep.csv");
    gloo_sweep(&truth, &sweep);
    let fitted_file = dir.join("lab-gloo.json");
    let args = |library: &str, out: &std::path::Path| {
        syncopate(&[
            "collective",
            "--cluster",
            lab.to_str().unwrap(),
            "--library",
            library,
            "--compare",
            sweep.to_str().unwrap(),
            "--fit-out",
            out.to_str().unwrap(),
        ])
    };
    let out = args("gloo", &fitted_file);
    assert!(out.status.success(), "{}", stderr(&out));
    // The input file with its library replaced (its device stays named relative to the input).
    let fitted: serde_json::Value = read_json(&fitted_file);
    let library = &fitted["library"];
    assert_eq!(library["kind"], "gloo", "{library}");
    let call = library["call_overhead_us"].as_f64().unwrap();
    assert!((call / 700.0 - 1.0).abs() < 0.05, "{library}");
    let method = library["provenance"]["method"].as_str().unwrap();
    assert!(method.contains("allreduce and allgather"), "{method}");
    // The push-pull rows give the parameter server's cost per message on the fitted links.
    let p2p = library["p2p_message_overhead_us"].as_f64().unwrap();
    assert!((p2p / 80.0 - 1.0).abs() < 0.05, "{library}");
    assert!(method.contains("p2p_message_overhead_us"), "{method}");
    let at_once = library["p2p_rounds_at_once"].as_f64().unwrap();
    assert!((at_once - 4.0 / 3.0).abs() < 1e-3, "{library}");
    // The comparison reads only --op's rows of the file.
    assert!(stdout(&out).contains("5 points"), "{}", stdout(&out));
    // Fitting as MPI reads the allreduce rows alone.
    let out = args("mpi", &dir.join("lab-mpi.json"));
    assert!(out.status.success(), "{}", stderr(&out));
    // Refitting the gloo file to a sweep without push-pulls keeps its point-to-point costs and
    // says so.
    let mut without = truth.clone();
    if let Some(p) = without.library.tcp_mut() {
        p.p2p_message_overhead_us = None;
    }
    let collectives_only = dir.join("collectives-only.csv");
    gloo_sweep(&without, &collectives_only);
    let input_file = dir.join("gloo-input.json");
    write_lab_cluster(&input_file, fitted.clone());
    let refitted_file = dir.join("gloo-refit.json");
    let out = syncopate(&[
        "collective",
        "--cluster",
        input_file.to_str().unwrap(),
        "--compare",
        collectives_only.to_str().unwrap(),
        "--fit-out",
        refitted_file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let refitted: serde_json::Value = read_json(&refitted_file);
    assert_eq!(
        refitted["library"]["p2p_message_overhead_us"],
        library["p2p_message_overhead_us"]
    );
    let method = refitted["library"]["provenance"]["method"]
        .as_str()
        .unwrap();
    assert!(method.contains("kept from the input file"), "{method}");
    // A gloo fit needs the op column.
    let no_ops = dir.join("no-ops.csv");
    std::fs::write(
        &no_ops,
        "gpus,size_bytes,time_us\n2,4096,900\n2,1048576,9000\n",
    )
    .unwrap();
    let out = syncopate(&[
        "collective",
        "--cluster",
        lab.to_str().unwrap(),
        "--library",
        "gloo",
        "--compare",
        no_ops.to_str().unwrap(),
        "--fit-out",
        dir.join("x.json").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--compare") && stderr(&out).contains("op"));
    // NCCL clusters are not TCP libraries.
    let out = syncopate(&["collective", "--cluster", "dgx-a100", "--library", "gloo"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--library"), "{}", stderr(&out));
}

#[test]
fn a_gloo_refit_keeps_fsdps_reduce_scatters_as_measured_without_fitting_to_them() {
    let dir = scratch("gloo-fit-reduce-scatter");
    let (lab, truth) = gloo_truth(|_| {});
    let collectives = dir.join("collectives.csv");
    gloo_sweep(&truth, &collectives);
    // `python -m syncopate.torch.sweep --ops reduce-scatter` rows, ten times slower than the
    // model: were they fitted to, the fit would move.
    let mut with_scatters = std::fs::read_to_string(&collectives).unwrap();
    let sizes = [64u64 << 10, 1 << 20, 16 << 20];
    for bytes in sizes {
        let t =
            collective::estimate(&truth, Op::ReduceScatter, bytes, Group::world(&truth)).unwrap();
        with_scatters.push_str(&format!(
            "reduce-scatter,2,{bytes},{:.3}\n",
            10.0 * t.time.as_us()
        ));
    }
    let scatters = dir.join("with-scatters.csv");
    std::fs::write(&scatters, with_scatters).unwrap();
    let fit = |sweep: &std::path::Path, out: &std::path::Path| {
        let out_arg = out.to_str().unwrap();
        let args = [
            "collective",
            "--cluster",
            lab.to_str().unwrap(),
            "--library",
            "gloo",
        ];
        let run = syncopate(
            &[
                &args[..],
                &["--compare", sweep.to_str().unwrap(), "--fit-out", out_arg],
            ]
            .concat(),
        );
        assert!(run.status.success(), "{}", stderr(&run));
        read_json(out)
    };
    let without: serde_json::Value = fit(&collectives, &dir.join("without.json"));
    let with: serde_json::Value = fit(&scatters, &dir.join("with.json"));
    for field in ["call_overhead_us", "message_overhead_us", "host_gbps"] {
        assert_eq!(with["library"][field], without["library"][field], "{field}");
    }
    let measured = with["library"]["measured"].as_array().unwrap();
    let scattered: Vec<u64> = measured
        .iter()
        .find(|m| m["op"] == "reduce-scatter")
        .expect("the reduce-scatter rows kept")["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(scattered, sizes);
    // Kept, they price a plan's reduce-scatter of a measured size.
    let loadable = dir.join("with-device.json");
    write_lab_cluster(&loadable, with.clone());
    let cluster = Cluster::load(loadable.to_str().unwrap(), ClusterOverrides::default()).unwrap();
    let priced =
        collective::estimate(&cluster, Op::ReduceScatter, 1 << 20, Group::world(&cluster)).unwrap();
    let model =
        collective::estimate(&truth, Op::ReduceScatter, 1 << 20, Group::world(&truth)).unwrap();
    assert!(
        (priced.time.as_us() / model.time.as_us() - 10.0).abs() < 0.05,
        "{priced:?} {model:?}"
    );
}

#[test]
fn gloos_allreduce_pays_a_message_per_segment_and_its_allgather_a_second_call() {
    let lab = root().join("experiments/lab-validation/clusters/lab-2n-1g.json");
    let mut cluster = Cluster::load(lab.to_str().unwrap(), ClusterOverrides::default()).unwrap();
    let mut params = cluster.library.tcp().unwrap().clone();
    // The MPI sweep the file carries measured MPI, not these costs.
    params.measured.clear();
    params.call_overhead_us = 100.0;
    params.message_overhead_us = 10.0;
    params.host_gbps = None;
    cluster.library = Library::Gloo(params.clone());
    let world = Group::world(&cluster);
    let alpha = 10.0 + cluster.inter_node.latency_us;
    let beta = 1.0 / (cluster.inter_node.nic_bandwidth_gbps * 1e3 / 8.0 * params.tcp_efficiency);
    // 16 MiB over 2 ranks: 8 segments per rank, 2 × 8 messages, 16 MiB sent per rank.
    let s = (16u64 << 20) as f64;
    let gamma = 1.0 / (params.reduce_gbytes_per_s * 1e3);
    let allreduce = collective::estimate(&cluster, Op::Allreduce, 16 << 20, world).unwrap();
    let expected = 100.0 + 16.0 * alpha + s * beta + 0.5 * s * gamma;
    assert!(
        (allreduce.time.as_us() / expected - 1.0).abs() < 1e-6,
        "{allreduce:?} vs {expected}"
    );
    let allgather = collective::estimate(&cluster, Op::Allgather, 16 << 20, world).unwrap();
    let expected = 2.0 * (100.0 + 2.0 * alpha) + 0.5 * s * beta;
    assert!(
        (allgather.time.as_us() / expected - 1.0).abs() < 1e-6,
        "{allgather:?} vs {expected}"
    );
}

#[test]
fn a_tcp_parameter_server_pays_its_fixed_costs_per_peer_message() {
    let lab = root().join("experiments/lab-validation/clusters/lab-4n-1g.json");
    let mut cluster = Cluster::load(lab.to_str().unwrap(), ClusterOverrides::default()).unwrap();
    let mut params = cluster.library.tcp().unwrap().clone();
    // The MPI sweep the file carries measured MPI, not these costs.
    params.measured.clear();
    params.call_overhead_us = 0.0;
    params.message_overhead_us = 0.0;
    cluster.library = Library::Gloo(params.clone());
    let round = |cluster: &Cluster| collective::push_pull(cluster, 1 << 20, ServerLink::Node(0));
    let (bare, _) = round(&cluster).unwrap();
    params.call_overhead_us = 300.0;
    params.message_overhead_us = 20.0;
    cluster.library = Library::Gloo(params);
    let (paid, _) = round(&cluster).unwrap();
    // Push and pull: each server takes a length and a payload from each of 3 peers.
    let extra = paid.time.as_us() - bare.time.as_us();
    assert!((extra - 2.0 * 2.0 * 3.0 * 320.0).abs() < 1e-6, "{extra}");
}

#[test]
fn a_sweep_beside_compute_sets_the_gloo_fits_collective_slowdown() {
    let dir = scratch("gloo-beside-compute");
    let lab = root().join("experiments/lab-validation/clusters/lab-2n-1g.json");
    let mut truth = Cluster::load(lab.to_str().unwrap(), ClusterOverrides::default()).unwrap();
    let mut params = truth.library.tcp().unwrap().clone();
    params.measured.clear();
    truth.library = Library::Gloo(params);
    let sweep = dir.join("alone.csv");
    gloo_sweep(&truth, &sweep);
    // Every row 1.25 times slower beside compute.
    let busy = dir.join("beside.csv");
    let slower: String = std::fs::read_to_string(&sweep)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, line)| match line.rsplit_once(',') {
            Some((row, t)) if i > 0 => format!("{row},{}\n", t.parse::<f64>().unwrap() * 1.25),
            _ => format!("{line}\n"),
        })
        .collect();
    std::fs::write(&busy, slower).unwrap();
    let fit = |cluster: &str, out: &std::path::Path| {
        syncopate(&[
            "collective",
            "--cluster",
            cluster,
            "--library",
            "gloo",
            "--compare",
            sweep.to_str().unwrap(),
            "--beside-compute",
            busy.to_str().unwrap(),
            "--fit-out",
            out.to_str().unwrap(),
        ])
    };
    let out_file = dir.join("lab-gloo.json");
    let out = fit(lab.to_str().unwrap(), &out_file);
    assert!(out.status.success(), "{}", stderr(&out));
    let fitted: serde_json::Value = read_json(&out_file);
    let contention = &fitted["contention"];
    let factor = contention["collective_slowdown_with_compute"]
        .as_f64()
        .unwrap();
    assert!((factor - 1.25).abs() < 1e-3, "{contention}");
    // Slower by a factor alone: no delay, for the allgathers neither (a delay of 0 may be
    // left out of the file: absent means 0).
    for delay in [
        "collective_delay_with_compute_us",
        "allgather_delay_with_compute_us",
    ] {
        let us = contention[delay].as_f64().unwrap_or(0.0);
        assert!(us.abs() < 1e-6, "{contention}");
    }
    let method = contention["provenance"]["method"].as_str().unwrap();
    assert!(method.contains("beside compute (x1.25)"), "{method}");
    // A sweep without the compute's slowdown leaves the one measured before.
    let before: serde_json::Value = read_json(&lab);
    assert_eq!(
        contention["compute_slowdown_with_collective"],
        before["contention"]["compute_slowdown_with_collective"]
    );
    // One that measured it sets it: the median over the allreduces from 1 MiB (1.2, 1.3, 1.4).
    let timed = std::fs::read_to_string(&busy).unwrap();
    let mut slowdowns = [1.2, 1.3, 1.4].into_iter();
    let with_compute: String = timed
        .lines()
        .enumerate()
        .map(|(i, line)| match i {
            0 => format!("{line},compute_slowdown\n"),
            _ if line.starts_with("allreduce,")
                && line.split(',').nth(2).unwrap().parse::<u64>().unwrap() >= 1 << 20 =>
            {
                format!("{line},{}\n", slowdowns.next().unwrap_or(9.0))
            }
            _ => format!("{line},1.05\n"),
        })
        .collect();
    std::fs::write(&busy, with_compute).unwrap();
    let measured = dir.join("measured.json");
    let out = fit(lab.to_str().unwrap(), &measured);
    assert!(out.status.success(), "{}", stderr(&out));
    let contention = &read_json(&measured)["contention"];
    assert_eq!(
        contention["compute_slowdown_with_collective"], 1.3,
        "{contention}"
    );
    let method = contention["provenance"]["method"].as_str().unwrap();
    assert!(
        method.contains("compute_slowdown_with_collective 1.300"),
        "{method}"
    );
    std::fs::write(&busy, timed).unwrap();
    // Refitting the refitted file replaces the note rather than stacking a second one.
    write_lab_cluster(&out_file, fitted.clone());
    let again = dir.join("again.json");
    let out = fit(out_file.to_str().unwrap(), &again);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&again).unwrap();
    assert_eq!(
        text.matches("Since measured with the library's own sweeps")
            .count(),
        1
    );
    // A cluster file without a contention section has nothing to refine.
    let mut bare = before.clone();
    bare.as_object_mut().unwrap().remove("contention");
    let bare_file = dir.join("bare.json");
    write_lab_cluster(&bare_file, bare);
    let out = fit(bare_file.to_str().unwrap(), &dir.join("x.json"));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--beside-compute") && stderr(&out).contains("contention"),
        "{}",
        stderr(&out)
    );
}
