//! NCCL's algorithm × protocol cost model: per-protocol latency and bandwidth, fastest one wins.
//!
//! The structure follows NCCL's own tuner (src/graph/tuning.cc, NCCL 2.18): every algorithm
//! (ring, tree, NVLS) and protocol (LL, LL128, Simple) has a latency built from a base cost plus
//! per-hop costs on NVLink/PCIe and the network, and a bus bandwidth that is the link bandwidth
//! times a protocol efficiency; the tuner picks the smallest `latency + bytes / bandwidth`.
//! The per-hop latencies and link efficiencies come from the cluster file, calibrated against
//! nccl-tests measurements; the protocol constants below are NCCL's.

use super::{Algorithm, Estimate, Group, Op, Protocol};
use crate::time::SimTime;
use crate::topology::{Cluster, Fabric, NcclParams, PerProtocol};

/// Per-protocol constants, in µs, from NCCL's tuning tables.
struct ProtocolConstants {
    protocol: Protocol,
    /// Per-hop cost over LL for ring and tree steps on NVLink, PCIe and the network: the
    /// differences between the protocol columns of NCCL's `hwLat` table (the cluster file gives
    /// the LL hop latency of its own fabric).
    ring_nvlink_extra_us: f64,
    ring_pcie_extra_us: f64,
    ring_net_extra_us: f64,
    tree_nvlink_extra_us: f64,
    tree_pcie_extra_us: f64,
    tree_net_extra_us: f64,
    /// NCCL's size-dependent correction of tree bandwidth (`treeCorrectionFactor`), indexed by
    /// log2(bytes / 64), 64 B to 256 MB.
    tree_correction: [f64; 23],
}

const PROTOCOLS: [ProtocolConstants; 3] = [
    ProtocolConstants {
        protocol: Protocol::Ll,
        ring_nvlink_extra_us: 0.0,
        ring_pcie_extra_us: 0.0,
        ring_net_extra_us: 0.0,
        tree_nvlink_extra_us: 0.0,
        tree_pcie_extra_us: 0.0,
        tree_net_extra_us: 2.3,
        tree_correction: [
            1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7,
            0.8, 0.9, 1.0, 1.0, 1.0, 1.0,
        ],
    },
    ProtocolConstants {
        protocol: Protocol::Ll128,
        ring_nvlink_extra_us: 1.3,
        ring_pcie_extra_us: 1.5,
        ring_net_extra_us: 1.3,
        tree_nvlink_extra_us: 0.65,
        tree_pcie_extra_us: 0.9,
        tree_net_extra_us: 5.8,
        tree_correction: [
            1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8,
            0.9, 0.9, 0.9, 0.9, 1.0, 1.0,
        ],
    },
    ProtocolConstants {
        protocol: Protocol::Simple,
        ring_nvlink_extra_us: 2.8,
        ring_pcie_extra_us: 4.7,
        ring_net_extra_us: 11.3,
        tree_nvlink_extra_us: 3.4,
        tree_pcie_extra_us: 5.0,
        tree_net_extra_us: 11.3,
        tree_correction: [
            0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7,
            0.8, 0.7, 0.7, 0.8, 0.9, 0.9,
        ],
    },
];

/// Fraction of the Simple protocol's bandwidth a protocol reaches. LL sends 4 bytes of data per
/// 8-byte store and NCCL's 2.18 tuner counts a quarter for reductions and multi-node rings;
/// LL128 carries 120 data bytes per 128-byte line (the cluster's calibrated efficiency; NCCL's
/// tuner drops it to 0.7 with one GPU per node).
fn protocol_efficiency(protocol: Protocol, op: Op, group: Group, ll128_efficiency: f64) -> f64 {
    match protocol {
        Protocol::Ll => {
            if group.nodes > 1 || matches!(op, Op::Allreduce | Op::Reduce) {
                0.25
            } else {
                1.0 / 3.0
            }
        }
        Protocol::Ll128 => {
            if group.ranks_per_node() < 2 {
                ll128_efficiency.min(0.7)
            } else {
                ll128_efficiency
            }
        }
        _ => 1.0,
    }
}

/// NCCL's ring Simple allreduce across nodes pays more per step once every channel carries data
/// ("plateau effect of ring", ×1.4 from Ampere on, ×1.9 before).
const RING_SIMPLE_MULTI_NODE_LATENCY_FACTOR: f64 = 1.4;

/// Time of a single-GPU "collective": nccl-tests' out-of-place allreduce on one rank is a
/// device-to-device copy (read and write), after a kernel launch.
const LOCAL_LAUNCH_US: f64 = 4.4;

/// Fraction of the device memory bandwidth a device-to-device copy reaches.
const LOCAL_COPY_EFFICIENCY: f64 = 0.85;

pub(super) fn estimate(
    cluster: &Cluster,
    params: &NcclParams,
    op: Op,
    bytes: u64,
    group: Group,
) -> Estimate {
    if group.ranks == 1 {
        return local_copy(cluster, bytes);
    }
    let mut best: Option<Estimate> = None;
    let mut consider = |time_us: f64, algorithm: Algorithm, protocol: Protocol| {
        let time = SimTime::from_us(time_us);
        if best.is_none_or(|b| time < b.time) {
            best = Some(Estimate {
                time,
                algorithm,
                protocol,
            });
        }
    };
    let link = Links::new(cluster, params, group);
    for constants in &PROTOCOLS {
        if op == Op::Alltoall {
            // NCCL runs alltoall as grouped send/receive with the Simple protocol.
            if constants.protocol == Protocol::Simple {
                consider(
                    alltoall_us(&link, constants, bytes, group),
                    Algorithm::P2p,
                    Protocol::Simple,
                );
            }
            continue;
        }
        consider(
            ring_us(&link, constants, op, bytes, group),
            Algorithm::Ring,
            constants.protocol,
        );
        if op == Op::Allreduce && group.nodes > 1 {
            consider(
                tree_us(&link, constants, bytes, group),
                Algorithm::Tree,
                constants.protocol,
            );
        }
    }
    if op == Op::Allreduce && cluster.intra_node.nvls && group.ranks_per_node() > 1 {
        consider(
            nvls_us(&link, params, bytes, group),
            Algorithm::Nvls,
            Protocol::Simple,
        );
    }
    best.expect("NCCL always offers a ring")
}

fn local_copy(cluster: &Cluster, bytes: u64) -> Estimate {
    // A copy reads and writes every byte once through device memory.
    let device_copy_gbytes_per_s = cluster.device_memory_gbytes_per_s / 2.0 * LOCAL_COPY_EFFICIENCY;
    Estimate {
        time: SimTime::from_us(LOCAL_LAUNCH_US + bytes as f64 / (device_copy_gbytes_per_s * 1e3)),
        algorithm: Algorithm::Local,
        protocol: Protocol::Memcpy,
    }
}

/// Link properties of one group on one cluster, after calibration.
struct Links {
    /// Bus bandwidth (GB/s) the Simple protocol reaches inside a node.
    intra_gbytes_per_s: f64,
    /// Bus bandwidth (GB/s) a node's NICs reach together.
    inter_gbytes_per_s: f64,
    intra_hop_us: f64,
    inter_hop_us: f64,
    fabric: Fabric,
    base_us: PerProtocol,
    ll128_efficiency: f64,
    ll_multi_node_gbytes_per_s: f64,
    /// Cap on LL's algorithm bandwidth per rank (LL's flag polling, not the link, bounds it).
    ll_gbytes_per_s_per_rank: f64,
}

impl Links {
    fn new(cluster: &Cluster, params: &NcclParams, group: Group) -> Links {
        let nics = cluster.inter_node.nics_per_node as f64;
        Links {
            intra_gbytes_per_s: cluster.intra_node.bandwidth_gbytes_per_s * params.intra_efficiency,
            // A group with fewer GPUs per node than NICs cannot drive every NIC.
            inter_gbytes_per_s: cluster.inter_node.nic_bandwidth_gbps / 8.0
                * nics.min(group.ranks_per_node() as f64)
                * params.inter_efficiency,
            intra_hop_us: cluster.intra_node.latency_us,
            inter_hop_us: cluster.inter_node.latency_us,
            fabric: cluster.intra_node.fabric,
            base_us: params.base_latency_us,
            ll_gbytes_per_s_per_rank: params.ll_gbytes_per_s_per_rank,
            ll128_efficiency: params.ll128_efficiency,
            ll_multi_node_gbytes_per_s: params.ll_multi_node_gbytes_per_s,
        }
    }

    /// Bus bandwidth of the slowest link a ring or tree crosses.
    fn bus_gbytes_per_s(&self, group: Group) -> f64 {
        let intra = if group.ranks_per_node() > 1 {
            self.intra_gbytes_per_s
        } else {
            f64::INFINITY
        };
        let inter = if group.nodes > 1 {
            self.inter_gbytes_per_s
        } else {
            f64::INFINITY
        };
        intra.min(inter)
    }

    /// LL's algorithm-bandwidth cap for a group: flag polling per rank, and the network proxy
    /// once the group spans nodes.
    fn ll_cap_gbytes_per_s(&self, group: Group) -> f64 {
        let per_rank = self.ll_gbytes_per_s_per_rank * group.ranks as f64;
        if group.nodes > 1 {
            per_rank.min(self.ll_multi_node_gbytes_per_s)
        } else {
            per_rank
        }
    }

    fn base_us(&self, protocol: Protocol) -> f64 {
        match protocol {
            Protocol::Ll => self.base_us.ll,
            Protocol::Ll128 => self.base_us.ll128,
            _ => self.base_us.simple,
        }
    }

    fn hop_us(&self, intra: bool, extras: (f64, f64, f64)) -> f64 {
        let (nvlink, pcie, net) = extras;
        if intra {
            self.intra_hop_us
                + match self.fabric {
                    Fabric::Pcie => pcie,
                    Fabric::Nvlink | Fabric::Nvswitch => nvlink,
                }
        } else {
            self.inter_hop_us + net
        }
    }
}

/// Ring: `steps` neighbour exchanges, of which those crossing a node boundary pay the network hop.
fn ring_us(link: &Links, constants: &ProtocolConstants, op: Op, bytes: u64, group: Group) -> f64 {
    let n = group.ranks as f64;
    let (steps, inter_steps) = match op {
        Op::Allreduce => (
            2.0 * (n - 1.0),
            if group.nodes > 1 {
                2.0 * group.nodes as f64
            } else {
                0.0
            },
        ),
        Op::Allgather | Op::ReduceScatter | Op::Broadcast | Op::Reduce | Op::Alltoall => {
            (n - 1.0, (group.nodes - 1) as f64)
        }
    };
    let inter_steps = inter_steps.min(steps);
    let extras = (
        constants.ring_nvlink_extra_us,
        constants.ring_pcie_extra_us,
        constants.ring_net_extra_us,
    );
    let mut latency = link.base_us(constants.protocol)
        + (steps - inter_steps) * link.hop_us(true, extras)
        + inter_steps * link.hop_us(false, extras);
    if constants.protocol == Protocol::Simple && group.nodes > 1 && op == Op::Allreduce {
        latency *= RING_SIMPLE_MULTI_NODE_LATENCY_FACTOR;
    }
    let bus = link.bus_gbytes_per_s(group)
        * protocol_efficiency(constants.protocol, op, group, link.ll128_efficiency);
    let mut algbw = bus / op.bus_factor(group.ranks);
    if constants.protocol == Protocol::Ll {
        algbw = algbw.min(link.ll_cap_gbytes_per_s(group));
    }
    latency + bytes as f64 / (algbw * 1e3)
}

/// Tree (multi-node allreduce): a chain inside each node and a double binary tree across nodes,
/// reduce up then broadcast down; NCCL's tuner counts its bandwidth at 92% of the ring's and
/// corrects it by message size.
fn tree_us(link: &Links, constants: &ProtocolConstants, bytes: u64, group: Group) -> f64 {
    let depth = (group.nodes as f64).log2().floor();
    let extras = (
        constants.tree_nvlink_extra_us,
        constants.tree_pcie_extra_us,
        constants.tree_net_extra_us,
    );
    let latency = link.base_us(constants.protocol)
        + 2.0
            * ((group.ranks_per_node() - 1) as f64 * link.hop_us(true, extras)
                + depth * link.hop_us(false, extras));
    let size_class = ((bytes / 64).max(1) as f64).log2().floor() as usize;
    let correction = constants
        .tree_correction
        .get(size_class)
        .copied()
        .unwrap_or(1.0);
    let bus = link.bus_gbytes_per_s(group)
        * protocol_efficiency(
            constants.protocol,
            Op::Allreduce,
            group,
            link.ll128_efficiency,
        )
        * 0.92
        * correction;
    let mut algbw = bus / 2.0;
    if constants.protocol == Protocol::Ll {
        algbw = algbw.min(link.ll_cap_gbytes_per_s(group));
    }
    latency + bytes as f64 / (algbw * 1e3)
}

/// NVLS: the NVSwitch reduces; each GPU sends its buffer once and receives the result once,
/// so its link carries about `bytes · (1 + 1/ranks_per_node)` per direction.
fn nvls_us(link: &Links, params: &NcclParams, bytes: u64, group: Group) -> f64 {
    let ppn = group.ranks_per_node() as f64;
    let intra = link.intra_gbytes_per_s / params.intra_efficiency * params.nvls_efficiency;
    let mut time = params.nvls_latency_us + bytes as f64 * (1.0 + 1.0 / ppn) / (intra * 1e3);
    if group.nodes > 1 {
        // Across nodes NVLS runs a tree over the network on the reduced shards.
        let depth = (group.nodes as f64).log2().ceil();
        time = time.max(2.0 * bytes as f64 / (link.inter_gbytes_per_s * 1e3))
            + 2.0 * depth * link.hop_us(false, (0.0, 0.0, PROTOCOLS[2].tree_net_extra_us));
    }
    time
}

/// Alltoall through grouped point-to-point: every rank sends `bytes / n` to every other rank at
/// once; the slowest of the intra-node fabric and the node's NICs bounds it.
fn alltoall_us(link: &Links, constants: &ProtocolConstants, bytes: u64, group: Group) -> f64 {
    let n = group.ranks as f64;
    let ppn = group.ranks_per_node() as f64;
    let block = bytes as f64 / n;
    let intra_bytes = block * (ppn - 1.0);
    let inter_bytes_per_node = block * ppn * (n - ppn);
    let intra_us = intra_bytes / (link.intra_gbytes_per_s * 1e3);
    let inter_us = if group.nodes > 1 {
        inter_bytes_per_node / (link.inter_gbytes_per_s * 1e3)
    } else {
        0.0
    };
    let extras = (
        constants.ring_nvlink_extra_us,
        constants.ring_pcie_extra_us,
        constants.ring_net_extra_us,
    );
    let hop = link.hop_us(group.nodes == 1, extras);
    link.base_us(constants.protocol) + hop + intra_us.max(inter_us)
}
