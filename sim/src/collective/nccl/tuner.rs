//! NCCL's own choice of algorithm and protocol, from its tuner's latency and bandwidth tables.
//!
//! The tables are src/graph/tuning.cc's (NCCL 2.18–2.21), applied to the cluster's nominal links.
//!
//! NCCL picks the smallest `latency + bytes / bandwidth` from tables of its own, not from what
//! the hardware measures; its size correction of tree bandwidth (`treeCorrectionFactor`) and
//! the ring's "plateau" factor are part of that choice. The numbers below are NCCL's; the
//! calibrated model then prices whatever NCCL chose.

use super::{candidates, tree_levels, Group, Protocol};
use crate::collective_op::{Algorithm, Op};
use crate::inputs::topology::{
    Cluster, CpuVendor, Fabric, GpuArch, NcclSetup, NcclVersion, Transport,
};

/// NCCL's base latency (µs) per protocol [LL, LL128, Simple].
const TREE_BASE_US: [f64; 3] = [6.8, 14.0, 0.0];
const RING_BASE_US: [f64; 3] = [6.6, 14.0, 8.4];

/// NCCL's per-hop latency (`hwLat`, µs) per protocol on NVLink, PCIe and the network.
struct HopLatency {
    nvlink: [f64; 3],
    pcie: [f64; 3],
    net: [f64; 3],
}

const RING_HOPS: HopLatency = HopLatency {
    nvlink: [0.6, 1.9, 3.4],
    pcie: [1.0, 2.5, 5.7],
    net: [2.7, 4.0, 14.0],
};

/// NCCL 2.18's tree hops; from 2.19 on the Simple column is 28 µs everywhere.
const TREE_HOPS_2_18: HopLatency = HopLatency {
    nvlink: [0.6, 1.25, 4.0],
    pcie: [1.0, 1.9, 6.0],
    net: [5.0, 8.5, 14.0],
};
const TREE_SIMPLE_HOP_FROM_2_19_US: f64 = 28.0;

/// NVLS latencies: 2.18 has a 23 µs base and 19 µs per network level of its NVLS tree; later
/// versions 25 µs on NVLink plus 14 µs per level.
const NVLS_2_18: (f64, f64) = (23.0, 19.0);
const NVLS_FROM_2_19: (f64, f64) = (25.0, 14.0);

/// Column of NCCL's bandwidth caps: one node, two nodes, more.
fn node_class(nodes: u32) -> usize {
    match nodes {
        0 | 1 => 0,
        2 => 1,
        _ => 2,
    }
}

/// LL's bandwidth cap (GB/s, `llMaxBws`): on one node by GPU generation, across nodes by CPU.
fn ll_max_gbytes_per_s(setup: &NcclSetup, nodes: u32) -> f64 {
    let row = if nodes <= 1 {
        match setup.gpu_arch {
            GpuArch::Volta => 0,
            GpuArch::Ampere => 1,
            GpuArch::Hopper => 2,
        }
    } else {
        match setup.cpu_vendor {
            CpuVendor::Intel => 0,
            CpuVendor::Amd => 1,
        }
    };
    let hopper = setup.version == NcclVersion::V2_21 && row == 2;
    let table: [[f64; 3]; 3] = [
        [39.0, 39.0, 20.4],
        [87.7, 22.5, 19.0],
        if hopper {
            [141.0, 45.0, 35.0]
        } else {
            [87.7, 22.5, 19.0]
        },
    ];
    table[row][node_class(nodes)]
}

/// Per-channel bandwidth caps (GB/s): ring LL128, tree LL128, tree (`perChMax*Bws`).
fn per_channel_caps(arch: GpuArch, nodes: u32) -> (f64, f64, f64) {
    let class = node_class(nodes);
    match arch {
        GpuArch::Volta => (20.0, 20.0, [26.5, 18.5, 10.0][class]),
        GpuArch::Ampere => (20.0, 20.0, [24.0, 23.6, 17.8][class]),
        GpuArch::Hopper => (36.7, [36.7, 36.7, 29.0][class], [38.7, 41.4, 36.0][class]),
    }
}

/// NCCL's size correction of tree bandwidth per protocol, by log2(bytes / 64), 64 B to 256 MB.
const TREE_CORRECTION: [[f64; 23]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9,
        0.9, 0.9, 0.9, 1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8,
        0.7, 0.7, 0.8, 0.9, 0.9,
    ],
];

fn index(protocol: Protocol) -> usize {
    match protocol {
        Protocol::Ll => 0,
        Protocol::Ll128 => 1,
        _ => 2,
    }
}

/// What NCCL's tuner knows about one group: the nominal links and the node shape.
struct Tuner<'a> {
    setup: &'a NcclSetup,
    group: Group,
    op: Op,
    fabric: Fabric,
    /// NCCL's bandwidth of all channels together (`nChannels · bw`) inside a node and through
    /// the node's NICs, from the nominal links.
    intra_gbytes_per_s: f64,
    inter_gbytes_per_s: f64,
    /// LL128 needs NVLink inside the node and GPUDirect to the NIC across nodes.
    ll128: bool,
}

impl Tuner<'_> {
    fn latency_us(&self, algorithm: Algorithm, protocol: Protocol) -> f64 {
        let g = self.group;
        let p = index(protocol);
        let intra = |hops: &HopLatency| match self.fabric {
            Fabric::Pcie => hops.pcie[p],
            Fabric::Nvlink | Fabric::Nvswitch => hops.nvlink[p],
        };
        match algorithm {
            Algorithm::Tree => {
                let from_2_19 = self.setup.version != NcclVersion::V2_18;
                let simple = |value: f64| {
                    if from_2_19 && protocol == Protocol::Simple {
                        TREE_SIMPLE_HOP_FROM_2_19_US
                    } else {
                        value
                    }
                };
                TREE_BASE_US[p]
                    + 2.0
                        * ((g.ranks_per_node() - 1) as f64 * simple(intra(&TREE_HOPS_2_18))
                            + tree_levels(g.nodes) as f64 * simple(TREE_HOPS_2_18.net[p]))
            }
            Algorithm::Nvls => {
                let (base, level) = if self.setup.version == NcclVersion::V2_18 {
                    NVLS_2_18
                } else {
                    NVLS_FROM_2_19
                };
                base + 2.0 * tree_levels(g.nodes) as f64 * level
            }
            _ => {
                let n = g.ranks as f64;
                let (steps, inter_steps) = match self.op {
                    Op::Allreduce => (
                        2.0 * (n - 1.0),
                        if g.nodes > 1 {
                            2.0 * g.nodes as f64
                        } else {
                            0.0
                        },
                    ),
                    Op::Allgather | Op::ReduceScatter | Op::Alltoall => {
                        (n - 1.0, (g.nodes - 1) as f64)
                    }
                    Op::Broadcast | Op::Reduce => (n, g.nodes as f64),
                };
                // Multi-node rings pay the network proxy's overhead on every step (×3 for
                // Simple): 1 µs on Intel hosts, 2 µs on AMD.
                let overhead = if g.nodes > 1 {
                    let base = match self.setup.cpu_vendor {
                        CpuVendor::Intel => 1.0,
                        CpuVendor::Amd => 2.0,
                    };
                    if protocol == Protocol::Simple {
                        3.0 * base
                    } else {
                        base
                    }
                } else {
                    0.0
                };
                RING_BASE_US[p]
                    + (steps - inter_steps) * intra(&RING_HOPS).max(overhead)
                    + inter_steps * RING_HOPS.net[p]
            }
        }
    }

    /// NCCL's algorithm bandwidth (GB/s) before the size correction; 0 when disabled.
    fn bandwidth_gbytes_per_s(&self, algorithm: Algorithm, protocol: Protocol) -> f64 {
        let g = self.group;
        let setup = self.setup;
        if protocol == Protocol::Ll128 && !self.ll128 {
            return 0.0;
        }
        let channels = setup.channels as f64;
        let (ring_ll128_cap, tree_ll128_cap, tree_cap) = per_channel_caps(setup.gpu_arch, g.nodes);
        let ll_max = ll_max_gbytes_per_s(setup, g.nodes);
        let (intra, inter) = (self.intra_gbytes_per_s, self.inter_gbytes_per_s);
        // Rings and trees count the intra-node graph's bandwidth up to two nodes, the
        // network's beyond.
        let bus = if g.nodes <= 2 {
            intra
        } else {
            inter.min(intra)
        };
        match algorithm {
            Algorithm::Tree => {
                let tree = (bus * 0.92).min(channels * tree_cap);
                let bus = match protocol {
                    Protocol::Ll => (tree / 3.8).min(ll_max),
                    Protocol::Ll128 => {
                        let payload = if g.nodes == 1 {
                            7.0 / 9.0
                        } else {
                            120.0 / 128.0
                        };
                        (tree * payload).min(channels * tree_ll128_cap)
                    }
                    _ => tree,
                };
                bus * 0.5
            }
            Algorithm::Nvls if setup.version == NcclVersion::V2_18 => {
                if g.nodes > 1 {
                    let n = g.nodes as f64;
                    bus * 0.7 * n / (2.0 * (n - 1.0))
                } else {
                    bus * 5.0 / 6.0
                }
            }
            Algorithm::Nvls => {
                // From 2.19 the network bounds NVLS, at half its rate for trees beyond two
                // nodes.
                let net = match g.nodes {
                    1 => f64::INFINITY,
                    2 => inter,
                    _ => inter / 2.0,
                };
                intra.min(net) * 5.0 / 6.0
            }
            _ => {
                let bus = match protocol {
                    Protocol::Ll => {
                        let share = if setup.version == NcclVersion::V2_21 {
                            0.5
                        } else if g.nodes > 1 || matches!(self.op, Op::Allreduce | Op::Reduce) {
                            0.25
                        } else {
                            1.0 / 3.0
                        };
                        (bus * share).min(ll_max)
                    }
                    Protocol::Ll128 => {
                        let share = if g.ranks_per_node() < 2 { 0.7 } else { 0.92 };
                        (bus * share).min(channels * ring_ll128_cap)
                    }
                    _ => bus,
                };
                let n = g.ranks as f64;
                let steps = match self.op {
                    Op::Allreduce => 2.0 * (n - 1.0),
                    Op::Allgather | Op::ReduceScatter | Op::Alltoall => n - 1.0,
                    Op::Broadcast | Op::Reduce => n,
                };
                bus * n / steps
            }
        }
    }

    /// NCCL's predicted time (µs), or None when the tuner never picks this pair.
    fn time_us(&self, algorithm: Algorithm, protocol: Protocol, bytes: u64) -> Option<f64> {
        let mut bandwidth = self.bandwidth_gbytes_per_s(algorithm, protocol);
        if algorithm == Algorithm::Tree {
            let class = (bytes >> 6).max(1).ilog2() as usize;
            bandwidth *= TREE_CORRECTION[index(protocol)]
                .get(class)
                .copied()
                .unwrap_or(1.0);
        }
        if bandwidth.is_nan() || bandwidth <= 0.0 {
            return None;
        }
        let mut latency = self.latency_us(algorithm, protocol);
        let g = self.group;
        let filled = bytes / (self.setup.channels as u64 * g.ranks as u64) >= 64;
        if algorithm == Algorithm::Ring
            && protocol == Protocol::Simple
            && g.nodes > 1
            && self.op == Op::Allreduce
            && filled
        {
            // NCCL's "plateau effect of ring".
            latency *= if self.setup.gpu_arch == GpuArch::Volta {
                1.9
            } else {
                1.4
            };
        }
        Some(latency + bytes as f64 / (1e3 * bandwidth))
    }
}

/// The algorithm and protocol NCCL runs `op` of `bytes` over `group` with.
pub(super) fn choose(
    cluster: &Cluster,
    setup: &NcclSetup,
    op: Op,
    bytes: u64,
    group: Group,
) -> (Algorithm, Protocol) {
    if op == Op::Alltoall {
        return (Algorithm::P2p, Protocol::Simple);
    }
    let nics = cluster.inter_node.nics_per_node as f64;
    let tuner = Tuner {
        setup,
        group,
        op,
        fabric: cluster.intra_node.fabric,
        intra_gbytes_per_s: cluster.intra_node.ring_gbytes_per_s(group.ranks_per_node()),
        inter_gbytes_per_s: cluster.inter_node.nic_bandwidth_gbps / 8.0
            * nics.min(group.ranks_per_node() as f64),
        ll128: cluster.intra_node.fabric != Fabric::Pcie
            && (group.nodes == 1 || cluster.inter_node.transport != Transport::Tcp),
    };
    let mut best = (Algorithm::Ring, Protocol::Simple, f64::INFINITY);
    for (algorithm, protocol) in candidates(cluster, op, group) {
        if let Some(time) = tuner.time_us(algorithm, protocol, bytes) {
            if time < best.2 {
                best = (algorithm, protocol, time);
            }
        }
    }
    (best.0, best.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::topology::{ClusterOverrides, Library};

    fn choose_on(name: &str, bytes: u64, ranks: u32, nodes: u32) -> (Algorithm, Protocol) {
        let cluster = Cluster::load(name, ClusterOverrides::default()).unwrap();
        let Library::Nccl(params) = &cluster.library else {
            panic!("{name} runs NCCL")
        };
        let setup = params
            .setup
            .expect("shipped NCCL clusters state NCCL's setup");
        choose(
            &cluster,
            &setup,
            Op::Allreduce,
            bytes,
            Group { ranks, nodes },
        )
    }

    #[test]
    fn nccl_picks_ll_for_small_rings_and_simple_for_large_ones() {
        assert_eq!(
            choose_on("a100-ib200", 4096, 8, 1),
            (Algorithm::Ring, Protocol::Ll)
        );
        // Simple's full bus bandwidth beats LL128's 0.92 of it once latency is paid off.
        assert_eq!(
            choose_on("a100-ib200", 1 << 30, 8, 1),
            (Algorithm::Ring, Protocol::Simple)
        );
    }

    #[test]
    fn nccl_trees_small_messages_across_nodes_and_reduces_in_the_switch_on_hopper() {
        assert_eq!(
            choose_on("a100-ib200", 4096, 32, 4),
            (Algorithm::Tree, Protocol::Ll)
        );
        assert_eq!(
            choose_on("dgx-h100", 1 << 30, 8, 1),
            (Algorithm::Nvls, Protocol::Simple)
        );
    }

    #[test]
    fn the_tree_correction_covers_64_bytes_to_256_megabytes() {
        let setup = NcclSetup {
            version: NcclVersion::V2_18,
            gpu_arch: GpuArch::Ampere,
            cpu_vendor: CpuVendor::Amd,
            channels: 16,
        };
        let cluster = Cluster::load("a100-ib200", ClusterOverrides::default()).unwrap();
        let tuner = Tuner {
            setup: &setup,
            group: Group {
                ranks: 16,
                nodes: 2,
            },
            op: Op::Allreduce,
            fabric: Fabric::Nvswitch,
            intra_gbytes_per_s: cluster.intra_node.bandwidth_gbytes_per_s,
            inter_gbytes_per_s: 200.0,
            ll128: true,
        };
        let latency = tuner.latency_us(Algorithm::Tree, Protocol::Ll);
        let bandwidth = tuner.bandwidth_gbytes_per_s(Algorithm::Tree, Protocol::Ll);
        // NCCL 2.18: 6.8 + 2·(7·0.6 + 1·5.0) µs; 300 GB/s · 0.92 / 3.8 capped at AMD's 22.5, halved.
        assert!((latency - 25.2).abs() < 1e-9, "{latency}");
        assert!((bandwidth - 11.25).abs() < 1e-9, "{bandwidth}");
        let at = |bytes: u64| tuner.time_us(Algorithm::Tree, Protocol::Ll, bytes).unwrap();
        // 1 MiB is class 14 (LL 0.5); beyond 256 MB no correction.
        assert!((at(1 << 20) - (25.2 + 1048576.0 / (1e3 * 11.25 * 0.5))).abs() < 1e-6);
        assert!((at(1 << 30) - (25.2 + (1u64 << 30) as f64 / (1e3 * 11.25))).abs() < 1e-6);
    }
}
