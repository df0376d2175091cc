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
use crate::topology::{Cluster, Fabric, NcclParams};

/// Per-protocol constants, in µs, from NCCL's tuning tables.
struct ProtocolConstants {
    protocol: Protocol,
    /// Fixed cost of a ring collective (NCCL `baseLat`, ring row).
    ring_base_us: f64,
    /// Fixed cost of a tree collective (NCCL `baseLat`, tree row).
    tree_base_us: f64,
    /// Extra per-hop cost over LL on NVLink, PCIe and the network (differences between the
    /// protocol columns of NCCL's `hwLat` table, ring rows).
    nvlink_extra_us: f64,
    pcie_extra_us: f64,
    net_extra_us: f64,
}

const PROTOCOLS: [ProtocolConstants; 3] = [
    ProtocolConstants {
        protocol: Protocol::Ll,
        ring_base_us: 6.6,
        tree_base_us: 6.8,
        nvlink_extra_us: 0.0,
        pcie_extra_us: 0.0,
        net_extra_us: 0.0,
    },
    ProtocolConstants {
        protocol: Protocol::Ll128,
        ring_base_us: 14.0,
        tree_base_us: 14.0,
        nvlink_extra_us: 1.3,
        pcie_extra_us: 1.5,
        net_extra_us: 1.3,
    },
    ProtocolConstants {
        protocol: Protocol::Simple,
        ring_base_us: 8.4,
        tree_base_us: 8.4,
        nvlink_extra_us: 2.8,
        pcie_extra_us: 4.7,
        net_extra_us: 11.3,
    },
];

/// Fraction of the Simple protocol's bandwidth a protocol reaches. LL sends 4 bytes of data per
/// 8-byte line and NCCL's tuner further halves it for reductions and multi-node rings; LL128
/// carries 120 data bytes per 128-byte line (0.92 in NCCL's tuner, 0.7 with one GPU per node).
fn protocol_efficiency(protocol: Protocol, op: Op, group: Group) -> f64 {
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
                0.7
            } else {
                0.92
            }
        }
        _ => 1.0,
    }
}

/// Time of a single-GPU "collective": nccl-tests' out-of-place allreduce on one rank is a
/// device-to-device copy (read and write), after a kernel launch.
const LOCAL_LAUNCH_US: f64 = 4.4;

pub(super) fn estimate(cluster: &Cluster, params: &NcclParams, op: Op, bytes: u64, group: Group) -> Estimate {
    if group.ranks == 1 {
        return local_copy(cluster, params, bytes);
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
        let efficiency = protocol_efficiency(constants.protocol, op, group);
        if op == Op::Alltoall {
            // NCCL runs alltoall as grouped send/receive with the Simple protocol.
            if constants.protocol == Protocol::Simple {
                consider(alltoall_us(&link, constants, bytes, group), Algorithm::P2p, Protocol::Simple);
            }
            continue;
        }
        consider(ring_us(&link, constants, efficiency, op, bytes, group), Algorithm::Ring, constants.protocol);
        if op == Op::Allreduce && group.nodes > 1 {
            consider(tree_us(&link, constants, efficiency, bytes, group), Algorithm::Tree, constants.protocol);
        }
    }
    if op == Op::Allreduce && cluster.intra_node.nvls && group.ranks_per_node() > 1 {
        consider(nvls_us(&link, params, bytes, group), Algorithm::Nvls, Protocol::Simple);
    }
    best.expect("NCCL always offers a ring")
}

/// Fraction of the device memory bandwidth a device-to-device copy reaches.
const LOCAL_COPY_EFFICIENCY: f64 = 0.85;

fn local_copy(cluster: &Cluster, params: &NcclParams, bytes: u64) -> Estimate {
    // A copy reads and writes every byte once through device memory.
    let device_copy_gbytes_per_s = cluster.device_memory_gbytes_per_s / 2.0 * LOCAL_COPY_EFFICIENCY;
    Estimate {
        time: SimTime::from_us(LOCAL_LAUNCH_US * params.latency_scale + bytes as f64 / (device_copy_gbytes_per_s * 1e3)),
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
    latency_scale: f64,
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
            latency_scale: params.latency_scale,
        }
    }

    /// Bus bandwidth of the slowest link a ring or tree crosses.
    fn bus_gbytes_per_s(&self, group: Group) -> f64 {
        let intra = if group.ranks_per_node() > 1 { self.intra_gbytes_per_s } else { f64::INFINITY };
        let inter = if group.nodes > 1 { self.inter_gbytes_per_s } else { f64::INFINITY };
        intra.min(inter)
    }

    fn intra_hop(&self, constants: &ProtocolConstants) -> f64 {
        let extra = match self.fabric {
            Fabric::Pcie => constants.pcie_extra_us,
            Fabric::Nvlink | Fabric::Nvswitch => constants.nvlink_extra_us,
        };
        self.intra_hop_us + extra
    }

    fn inter_hop(&self, constants: &ProtocolConstants) -> f64 {
        self.inter_hop_us + constants.net_extra_us
    }
}

/// Ring: `steps` neighbour exchanges, of which those crossing a node boundary pay the network hop.
fn ring_us(link: &Links, constants: &ProtocolConstants, efficiency: f64, op: Op, bytes: u64, group: Group) -> f64 {
    let n = group.ranks as f64;
    let (steps, inter_steps) = match op {
        Op::Allreduce => (2.0 * (n - 1.0), if group.nodes > 1 { 2.0 * group.nodes as f64 } else { 0.0 }),
        Op::Allgather | Op::ReduceScatter => (n - 1.0, (group.nodes - 1) as f64),
        Op::Broadcast | Op::Reduce | Op::Alltoall => (n - 1.0, (group.nodes - 1) as f64),
    };
    let inter_steps = inter_steps.min(steps);
    let latency = constants.ring_base_us
        + (steps - inter_steps) * link.intra_hop(constants)
        + inter_steps * link.inter_hop(constants);
    let bus = link.bus_gbytes_per_s(group) * efficiency;
    latency * link.latency_scale + bytes as f64 * op.bus_factor(group.ranks) / (bus * 1e3)
}

/// Tree (multi-node allreduce): a chain inside each node and a double binary tree across nodes,
/// reduce up then broadcast down; NCCL's tuner counts its bandwidth at 92% of the ring's.
fn tree_us(link: &Links, constants: &ProtocolConstants, efficiency: f64, bytes: u64, group: Group) -> f64 {
    let depth = (group.nodes as f64).log2().ceil();
    let latency = constants.tree_base_us
        + 2.0 * ((group.ranks_per_node() - 1) as f64 * link.intra_hop(constants) + depth * link.inter_hop(constants));
    let bus = link.bus_gbytes_per_s(group) * efficiency * 0.92;
    latency * link.latency_scale + 2.0 * bytes as f64 / (bus * 1e3)
}

/// NVLS: the NVSwitch reduces; each GPU sends its buffer once and receives the result once,
/// so its link carries about `bytes · (1 + 1/ranks_per_node)` per direction.
fn nvls_us(link: &Links, params: &NcclParams, bytes: u64, group: Group) -> f64 {
    let ppn = group.ranks_per_node() as f64;
    let intra = link.intra_gbytes_per_s / params.intra_efficiency * params.nvls_efficiency;
    let mut time = params.nvls_latency_us * link.latency_scale + bytes as f64 * (1.0 + 1.0 / ppn) / (intra * 1e3);
    if group.nodes > 1 {
        // Across nodes NVLS runs a tree over the network on the reduced shards.
        let depth = (group.nodes as f64).log2().ceil();
        time = time.max(2.0 * bytes as f64 / (link.inter_gbytes_per_s * 1e3))
            + 2.0 * depth * link.inter_hop(&PROTOCOLS[2]) * link.latency_scale;
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
    let inter_us = if group.nodes > 1 { inter_bytes_per_node / (link.inter_gbytes_per_s * 1e3) } else { 0.0 };
    let hop = if group.nodes > 1 { link.inter_hop(constants) } else { link.intra_hop(constants) };
    (constants.ring_base_us + hop) * link.latency_scale + intra_us.max(inter_us)
}
