//! The calibrated cost of one NCCL algorithm × protocol on a cluster.
//!
//! It is latency plus bytes over bandwidth, with trees as chunk pipelines.

use super::{per_protocol, tree_levels, Estimate, Group, Protocol};
use crate::base::time::SimTime;
use crate::collective_op::{Algorithm, Op};
use crate::inputs::topology::{Cluster, Fabric, NcclParams, PerProtocol};

/// Extra per-hop cost of LL128 and Simple over LL, in µs, on NVLink, PCIe and the network: the
/// differences between the protocol columns of NCCL 2.18's `hwLat` table (src/graph/tuning.cc);
/// the cluster file gives the LL hop of its own fabric.
struct HopExtras {
    nvlink: f64,
    pcie: f64,
    net: f64,
}

const RING_EXTRAS: [HopExtras; 3] = [
    HopExtras {
        nvlink: 0.0,
        pcie: 0.0,
        net: 0.0,
    },
    HopExtras {
        nvlink: 1.3,
        pcie: 1.5,
        net: 1.3,
    },
    HopExtras {
        nvlink: 2.8,
        pcie: 4.7,
        net: 11.3,
    },
];

const TREE_EXTRAS: [HopExtras; 3] = [
    HopExtras {
        nvlink: 0.0,
        pcie: 0.0,
        net: 2.3,
    },
    HopExtras {
        nvlink: 0.65,
        pcie: 0.9,
        net: 5.8,
    },
    HopExtras {
        nvlink: 3.4,
        pcie: 5.0,
        net: 11.3,
    },
];

fn index(protocol: Protocol) -> usize {
    match protocol {
        Protocol::Ll => 0,
        Protocol::Ll128 => 1,
        _ => 2,
    }
}

/// Threads of one channel and the bytes each must have before NCCL adds a channel (NCCL's
/// `maxThreads` and `threadThresholds`, src/include/comm.h and device.h): LL 512 × 8, LL128
/// 640 × 8, Simple 512 × 64. A ring's LL threshold is per rank.
fn bytes_per_channel(algorithm: Algorithm, protocol: Protocol, ranks: u32) -> u64 {
    match protocol {
        Protocol::Ll if algorithm == Algorithm::Ring => 512 * 8 * ranks as u64,
        Protocol::Ll => 512 * 8,
        Protocol::Ll128 => 640 * 8,
        _ => 512 * 64,
    }
}

/// Data bytes a tree forwards at a time per channel. LL and LL128 forward each line as soon as
/// its flag arrives, so their pipeline moves one warp's lines at a time: 32 threads × 8 data
/// bytes (LL), 32 threads × 120 data bytes (LL128). Simple forwards whole steps of its 4 MiB
/// buffer (8 steps of 512 KiB), which NCCL halves down to 32 KiB so that a message fills the
/// pipeline `depth` deep (src/enqueue.cc, computeColl).
fn tree_chunk_bytes(protocol: Protocol, bytes_per_channel: f64, depth: u32) -> f64 {
    match protocol {
        Protocol::Ll => 32.0 * 8.0,
        Protocol::Ll128 => 32.0 * 120.0,
        _ => {
            let depth = depth.max(1) as f64;
            let mut chunk = 512.0 * 1024.0;
            for (fill, floor) in [(8.0, 131_072.0), (4.0, 65_536.0), (1.0, 32_768.0)] {
                while bytes_per_channel / chunk < depth * fill && chunk > floor {
                    chunk /= 2.0;
                }
            }
            chunk
        }
    }
}

/// Time of a single-GPU "collective": nccl-tests' out-of-place allreduce on one rank is a
/// device-to-device copy (read and write), after a kernel launch.
const LOCAL_LAUNCH_US: f64 = 4.4;

/// Fraction of the device memory bandwidth a device-to-device copy reaches.
const LOCAL_COPY_EFFICIENCY: f64 = 0.85;

pub(super) fn local_copy(cluster: &Cluster, bytes: u64) -> Estimate {
    // A copy reads and writes every byte once through device memory.
    let device_copy_gbytes_per_s = cluster.device_memory_gbytes_per_s / 2.0 * LOCAL_COPY_EFFICIENCY;
    Estimate {
        time: SimTime::from_us(LOCAL_LAUNCH_US + bytes as f64 / (device_copy_gbytes_per_s * 1e3)),
        algorithm: Algorithm::Local,
        protocol: Protocol::Memcpy,
        fixed: SimTime::ZERO,
        delay_with_compute: SimTime::ZERO,
    }
}

/// The tree's intercept and per-level cost per protocol: the cluster's own, or NCCL's relation
/// to the ring's (the ring's intercept; a level costs the network hop plus NCCL's extra for the
/// protocol).
pub(crate) fn tree_latency(network_hop_us: f64, params: &NcclParams) -> (PerProtocol, PerProtocol) {
    let base = params
        .tree
        .and_then(|tree| tree.base_latency_us)
        .unwrap_or(params.base_latency_us);
    let level = match &params.tree {
        Some(tree) => tree.level_latency_us,
        None => {
            let level = |p: Protocol| network_hop_us + TREE_EXTRAS[index(p)].net;
            PerProtocol {
                ll: level(Protocol::Ll),
                ll128: level(Protocol::Ll128),
                simple: level(Protocol::Simple),
            }
        }
    };
    (base, level)
}

/// The calibrated link properties of one group on one cluster.
pub(super) struct Costs<'a> {
    params: &'a NcclParams,
    group: Group,
    fabric: Fabric,
    /// Bandwidth (GB/s) the Simple protocol reaches out of one GPU inside a node, over the
    /// rings its group's links carry.
    intra_gbytes_per_s: f64,
    /// Bandwidth (GB/s) the group's ranks on one node reach through its NICs together, at this
    /// node count.
    inter_gbytes_per_s: f64,
    intra_hop_us: f64,
    inter_hop_us: f64,
    /// Channels of a large collective (1 without NCCL's setup: every size gets all bandwidth).
    channels: u32,
}

impl<'a> Costs<'a> {
    pub(super) fn new(cluster: &Cluster, params: &'a NcclParams, group: Group) -> Costs<'a> {
        let nics = cluster.inter_node.nics_per_node as f64;
        // Larger fabrics lose a share of the efficiency per doubling beyond two nodes.
        let doublings = (group.nodes as f64 / 2.0).log2().max(0.0);
        let inter_efficiency =
            params.inter_efficiency / (1.0 + params.inter_efficiency_loss_per_doubling * doublings);
        Costs {
            params,
            group,
            fabric: cluster.intra_node.fabric,
            intra_gbytes_per_s: cluster.intra_node.ring_gbytes_per_s(group.ranks_per_node())
                * params.intra_efficiency,
            // A group with fewer GPUs per node than NICs cannot drive every NIC.
            inter_gbytes_per_s: cluster.inter_node.nic_bandwidth_gbps / 8.0
                * nics.min(group.ranks_per_node() as f64)
                * inter_efficiency,
            intra_hop_us: cluster.intra_node.latency_us,
            inter_hop_us: cluster.inter_node.latency_us,
            channels: params.setup.map_or(1, |s| s.channels),
        }
    }

    /// Time of `op` over `bytes` with `algorithm` and `protocol`, in µs.
    pub(super) fn time_us(
        &self,
        op: Op,
        algorithm: Algorithm,
        protocol: Protocol,
        bytes: u64,
    ) -> f64 {
        match algorithm {
            Algorithm::Tree => self.tree_us(protocol, bytes),
            Algorithm::Nvls => self.nvls_us(bytes),
            Algorithm::P2p => self.alltoall_us(bytes),
            _ => self.ring_us(op, protocol, bytes),
        }
    }

    /// Fraction of the Simple protocol's bandwidth a protocol reaches. LL sends 4 bytes of data
    /// per 8-byte store and NCCL's 2.18 tuner counts a quarter for reductions and multi-node
    /// rings; LL128 carries 120 data bytes per 128-byte line (the cluster's calibrated
    /// efficiency; NCCL's tuner drops it to 0.7 with one GPU per node).
    fn protocol_efficiency(&self, protocol: Protocol, op: Op) -> f64 {
        match protocol {
            Protocol::Ll => {
                if self.group.nodes > 1 || matches!(op, Op::Allreduce | Op::Reduce) {
                    0.25
                } else {
                    1.0 / 3.0
                }
            }
            Protocol::Ll128 => {
                if self.group.ranks_per_node() < 2 {
                    self.params.ll128_efficiency.min(0.7)
                } else {
                    self.params.ll128_efficiency
                }
            }
            _ => 1.0,
        }
    }

    /// Bus bandwidth of the slowest link a ring crosses.
    fn bus_gbytes_per_s(&self) -> f64 {
        let intra = if self.group.ranks_per_node() > 1 {
            self.intra_gbytes_per_s
        } else {
            f64::INFINITY
        };
        let inter = if self.group.nodes > 1 {
            self.inter_gbytes_per_s
        } else {
            f64::INFINITY
        };
        intra.min(inter)
    }

    /// LL's algorithm-bandwidth cap for a group: flag polling per rank, and the network proxy
    /// once the group spans nodes.
    fn ll_cap_gbytes_per_s(&self) -> f64 {
        let per_rank = self.params.ll_gbytes_per_s_per_rank * self.group.ranks as f64;
        if self.group.nodes > 1 {
            per_rank.min(self.params.ll_multi_node_gbytes_per_s)
        } else {
            per_rank
        }
    }

    /// Share of the full bandwidth a collective of `bytes` gets: NCCL runs only as many
    /// channels as the message fills. The share grows in proportion to the bytes rather than
    /// by whole channels: with a rounded count, the byte that starts one more channel would
    /// halve every channel's work and make a larger message faster than a smaller one (while
    /// channels are added, each carries one threshold's worth and the time stays level).
    fn channel_share(&self, algorithm: Algorithm, protocol: Protocol, bytes: u64) -> f64 {
        let per_channel = bytes_per_channel(algorithm, protocol, self.group.ranks);
        let channels = self.channels as f64;
        (bytes as f64 / per_channel as f64).clamp(1.0, channels) / channels
    }

    fn hop_us(&self, intra: bool, extras: &HopExtras) -> f64 {
        if intra {
            self.intra_hop_us
                + match self.fabric {
                    Fabric::Pcie => extras.pcie,
                    Fabric::Nvlink | Fabric::Nvswitch => extras.nvlink,
                }
        } else {
            self.inter_hop_us + extras.net
        }
    }

    /// Ring: `steps` neighbour exchanges, of which those crossing a node boundary pay the
    /// network hop.
    fn ring_us(&self, op: Op, protocol: Protocol, bytes: u64) -> f64 {
        let group = self.group;
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
        let extras = &RING_EXTRAS[index(protocol)];
        let latency = per_protocol(&self.params.base_latency_us, protocol)
            + (steps - inter_steps) * self.hop_us(true, extras)
            + inter_steps * self.hop_us(false, extras);
        let bus = self.bus_gbytes_per_s()
            * self.protocol_efficiency(protocol, op)
            * self.channel_share(Algorithm::Ring, protocol, bytes);
        let mut algbw = bus / op.bus_factor(group.ranks);
        if protocol == Protocol::Ll {
            algbw = algbw.min(self.ll_cap_gbytes_per_s());
        }
        latency + bytes as f64 / (algbw * 1e3)
    }

    fn tree_latency(&self) -> (PerProtocol, PerProtocol) {
        tree_latency(self.inter_hop_us, self.params)
    }

    /// Tree allreduce: a chain inside each node and a double binary tree across nodes, reduced
    /// up and broadcast down. Each channel's share of the message flows through the tree in
    /// chunks: the first chunk crosses every hop up and down before the pipeline streams at
    /// the rate of its slowest stage.
    fn tree_us(&self, protocol: Protocol, bytes: u64) -> f64 {
        let group = self.group;
        let chain_hops = (group.ranks_per_node() - 1) as f64;
        let levels = tree_levels(group.nodes);
        let (base, level) = self.tree_latency();
        let latency = per_protocol(&base, protocol)
            + 2.0
                * (chain_hops * self.hop_us(true, &TREE_EXTRAS[index(protocol)])
                    + levels as f64 * per_protocol(&level, protocol));
        let efficiency = self.protocol_efficiency(protocol, Op::Allreduce);
        let channels = self.channels as f64;
        // Inside a node every GPU sends each chunk up the chain and the result down it.
        let intra_rate = self.intra_gbytes_per_s * efficiency / (2.0 * channels);
        // Across two nodes each node sends its half of each of the two trees once; deeper
        // trees have nodes that serve two children.
        let net_traffic = if group.nodes <= 2 { 1.0 } else { 2.0 };
        let net_rate = self.inter_gbytes_per_s * efficiency / (net_traffic * channels);
        let share = self.channel_share(Algorithm::Tree, protocol, bytes);
        let per_channel = bytes as f64 / (share * channels);
        let depth = group.ranks_per_node() - 1 + levels;
        let chunk = tree_chunk_bytes(protocol, per_channel, depth).min(per_channel);
        // A tree channel's block receives, reduces and sends every byte on the way up and
        // copies it on the way down, the work a ring channel does per byte over the same
        // links: a tree streams no faster than a ring of the group (Echo's two-node A100 data:
        // tree LL128 levels off below ring LL128, though the chain alone would allow more).
        let ring_rate = self.bus_gbytes_per_s() * efficiency
            / (Op::Allreduce.bus_factor(group.ranks) * channels);
        let slowest = match (chain_hops > 0.0, group.nodes > 1) {
            (true, true) => intra_rate.min(net_rate),
            (true, false) => intra_rate,
            _ => net_rate,
        }
        .min(ring_rate);
        let fill = 2.0 * chunk * (chain_hops / intra_rate + levels as f64 / net_rate);
        let mut transfer = (per_channel - chunk) / slowest + fill;
        if protocol == Protocol::Ll {
            transfer = transfer.max(bytes as f64 / self.ll_cap_gbytes_per_s());
        }
        latency + transfer / 1e3
    }

    /// NVLS: the NVSwitch reduces; each GPU sends its buffer once and receives the result once,
    /// so its link carries about `bytes · (1 + 1/ranks_per_node)` per direction. Across nodes a
    /// tree over the network joins the nodes' reduced shards.
    fn nvls_us(&self, bytes: u64) -> f64 {
        let group = self.group;
        let ppn = group.ranks_per_node() as f64;
        let intra =
            self.intra_gbytes_per_s / self.params.intra_efficiency * self.params.nvls_efficiency;
        let mut time =
            self.params.nvls_latency_us + bytes as f64 * (1.0 + 1.0 / ppn) / (intra * 1e3);
        if group.nodes > 1 {
            let net_traffic = if group.nodes <= 2 { 1.0 } else { 2.0 };
            let (_, level) = self.tree_latency();
            time = time.max(net_traffic * bytes as f64 / (self.inter_gbytes_per_s * 1e3))
                + 2.0 * tree_levels(group.nodes) as f64 * level.simple;
        }
        time
    }

    /// Alltoall through grouped point-to-point: every rank sends `bytes / n` to every other
    /// rank at once; the slowest of the intra-node fabric and the node's NICs bounds it.
    fn alltoall_us(&self, bytes: u64) -> f64 {
        let group = self.group;
        let n = group.ranks as f64;
        let ppn = group.ranks_per_node() as f64;
        let block = bytes as f64 / n;
        let intra_bytes = block * (ppn - 1.0);
        let inter_bytes_per_node = block * ppn * (n - ppn);
        let intra_us = intra_bytes / (self.intra_gbytes_per_s * 1e3);
        let inter_us = if group.nodes > 1 {
            inter_bytes_per_node / (self.inter_gbytes_per_s * 1e3)
        } else {
            0.0
        };
        let hop = self.hop_us(group.nodes == 1, &RING_EXTRAS[2]);
        self.params.base_latency_us.simple + hop + intra_us.max(inter_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::topology::{ClusterOverrides, Library};

    fn a100() -> (Cluster, NcclParams) {
        let cluster = Cluster::load("a100-ib200", ClusterOverrides::default()).unwrap();
        let Library::Nccl(params) = cluster.library.clone() else {
            panic!("a100-ib200 runs NCCL")
        };
        (cluster, params)
    }

    #[test]
    fn a_large_tree_streams_at_its_slowest_stage() {
        let (cluster, params) = a100();
        let bytes = 8u64 << 30;
        for (ranks, nodes) in [(16, 2), (32, 4), (4, 4)] {
            let group = Group { ranks, nodes };
            let costs = Costs::new(&cluster, &params, group);
            let algbw = bytes as f64 / (costs.tree_us(Protocol::Simple, bytes) * 1e3);
            // Inside a node each GPU sends every byte up and down the chain; across two nodes
            // each node sends every byte once, deeper trees have nodes serving two children;
            // and no tree outruns a ring over the same links.
            let chain = if ranks > nodes {
                costs.intra_gbytes_per_s / 2.0
            } else {
                f64::INFINITY
            };
            let network = costs.inter_gbytes_per_s / if nodes > 2 { 2.0 } else { 1.0 };
            let ring = costs.bus_gbytes_per_s() / Op::Allreduce.bus_factor(ranks);
            let slowest = chain.min(network).min(ring);
            assert!(
                algbw < slowest && algbw > 0.98 * slowest,
                "{ranks} ranks: {algbw} vs {slowest}"
            );
        }
    }

    #[test]
    fn a_single_chunk_crosses_every_hop_of_the_tree() {
        let (cluster, params) = a100();
        let two = Costs::new(
            &cluster,
            &params,
            Group {
                ranks: 16,
                nodes: 2,
            },
        );
        let four = Costs::new(
            &cluster,
            &params,
            Group {
                ranks: 32,
                nodes: 4,
            },
        );
        let bytes = 4096;
        // One Simple channel and one chunk: the extra level adds its latency both ways and the
        // chunk's crossing of that level both ways (at half the rate beyond two nodes).
        let (_, level) = four.tree_latency();
        let channels = four.channels as f64;
        let net_rate_two = two.inter_gbytes_per_s / channels;
        let net_rate_four = four.inter_gbytes_per_s / (2.0 * channels);
        let extra = 2.0 * level.simple
            + 2.0 * bytes as f64 * (2.0 / net_rate_four - 1.0 / net_rate_two) / 1e3;
        let measured = four.tree_us(Protocol::Simple, bytes) - two.tree_us(Protocol::Simple, bytes);
        assert!((measured - extra).abs() < 1e-9, "{measured} vs {extra}");
    }

    #[test]
    fn small_messages_run_on_fewer_channels() {
        let (cluster, params) = a100();
        let costs = Costs::new(&cluster, &params, Group { ranks: 8, nodes: 1 });
        let channels = costs.channels as f64;
        // A ring's LL channel takes 512 threads × 8 bytes per rank.
        let per_channel = 512 * 8 * 8;
        assert_eq!(
            costs.channel_share(Algorithm::Ring, Protocol::Ll, 1),
            1.0 / channels
        );
        assert_eq!(
            costs.channel_share(Algorithm::Ring, Protocol::Ll, 3 * per_channel),
            3.0 / channels
        );
        // Between thresholds the share grows with the bytes, so the time stays level.
        assert_eq!(
            costs.channel_share(Algorithm::Ring, Protocol::Ll, 3 * per_channel / 2),
            1.5 / channels
        );
        assert_eq!(
            costs.channel_share(Algorithm::Ring, Protocol::Ll, 1 << 30),
            1.0
        );
        assert_eq!(
            costs.channel_share(Algorithm::Tree, Protocol::Simple, 32768 * 2),
            2.0 / channels
        );
    }

    #[test]
    fn the_simple_tree_chunk_shrinks_to_fill_the_pipeline() {
        assert_eq!(tree_chunk_bytes(Protocol::Simple, 1e9, 8), 512.0 * 1024.0);
        // 8 deep: 128 KiB chunks need 8 x 8 of them (8 MiB) before halving stops there, and
        // 4 x 8 (4 MiB) to stay; 2 MiB holds only 16, so it gets 64 KiB chunks.
        assert_eq!(
            tree_chunk_bytes(Protocol::Simple, 8.0 * 1048576.0, 8),
            131_072.0
        );
        assert_eq!(
            tree_chunk_bytes(Protocol::Simple, 4.0 * 1048576.0, 8),
            131_072.0
        );
        assert_eq!(
            tree_chunk_bytes(Protocol::Simple, 2.0 * 1048576.0, 8),
            65_536.0
        );
        assert_eq!(tree_chunk_bytes(Protocol::Simple, 1024.0, 8), 32_768.0);
        assert_eq!(tree_chunk_bytes(Protocol::Ll, 1024.0, 8), 256.0);
    }
}
