//! The collective model: closed-form cases by hand, monotonicity, and calibration accuracy.

use crate::common::validation_data;
use syncopate_sim::calibrate;
use syncopate_sim::collective::{self, Algorithm, Group, Op, Protocol, ServerPlacement};
use syncopate_sim::topology::{Cluster, ClusterOverrides, Library};

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
fn parameter_server_push_pull_is_bounded_by_links() {
    let c = cluster("v100-100gib");
    let bytes = 100u64 << 20;
    let Library::Nccl(params) = &c.library else {
        panic!("v100-100gib is an NCCL cluster");
    };
    // The PS prices the link with the library's goodput (line rate x NCCL's inter efficiency).
    let link_bytes_per_us = c.node_network_bytes_per_s() / 1e6 * params.inter_efficiency;
    // Dedicated servers as many as workers: each worker pushes and pulls all bytes once.
    let even = collective::ps_push_pull(&c, bytes, 16, ServerPlacement::Dedicated { servers: 16 })
        .unwrap();
    let expected = 2.0 * (c.inter_node.latency_us + bytes as f64 / link_bytes_per_us);
    assert!((even.time.as_us() - expected).abs() < 0.01);
    // Fewer servers: each server's link carries workers/servers times more (incast fan-in).
    let few =
        collective::ps_push_pull(&c, bytes, 16, ServerPlacement::Dedicated { servers: 4 }).unwrap();
    assert!(few.time.as_us() > 3.9 * even.time.as_us() - 1.0);
    assert!(collective::ps_push_pull(&c, bytes, 0, ServerPlacement::Colocated).is_err());
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
fn echo_a100_error_is_within_ten_percent_for_every_gpu_count() {
    let c = cluster("a100-ib200");
    let path = validation_data("echo_nccl_allreduce_a100_ib200.csv");
    let measurements: Vec<_> = calibrate::read_measurements(&path, Op::Allreduce, None, 8)
        .unwrap()
        .into_iter()
        .filter(|m| (4096..=4 << 30).contains(&m.bytes))
        .collect();
    let predictions = calibrate::predict(&c, Op::Allreduce, &measurements).unwrap();
    let table = calibrate::error_table(&measurements, &predictions);
    assert_eq!(
        table.iter().map(|r| r.gpus).collect::<Vec<_>>(),
        [1, 2, 4, 8, 16, 32]
    );
    for row in table {
        assert!(
            row.mean_abs_pct <= 10.0,
            "{} GPUs: {:.1}%",
            row.gpus,
            row.mean_abs_pct
        );
    }
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
            calibrate::read_measurements(&path, Op::Allreduce, Some(column), 8)
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
