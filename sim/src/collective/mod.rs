//! Cost of collective operations on a cluster: which library algorithm runs and how long it takes.

mod gloo;
mod links;
mod measured;
mod mpi;
mod nccl;
mod ps;

pub use links::{shared_slowdowns, Links, ServerLink};
pub use measured::least_ns_per_byte;
pub use mpi::staging_split_us;
pub(crate) use nccl::tree_latency as nccl_tree_latency;
pub use ps::push_pull;

use crate::base::error::{Result, SimError};
use crate::base::time::SimTime;
use crate::collective_op::{Algorithm, Op};
use crate::inputs::topology::{Cluster, Library};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The ranks taking part in a collective: `ranks` GPUs spread evenly over `nodes` nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Group {
    /// Number of GPUs (ranks) in the group.
    pub ranks: u32,
    /// Number of nodes the ranks are spread over.
    pub nodes: u32,
}

impl Group {
    /// Every GPU of the cluster.
    pub fn world(cluster: &Cluster) -> Group {
        Group {
            ranks: cluster.world_size(),
            nodes: cluster.nodes,
        }
    }

    /// The GPUs of one node.
    pub fn one_node(cluster: &Cluster) -> Group {
        Group {
            ranks: cluster.gpus_per_node,
            nodes: 1,
        }
    }

    /// One GPU on each node (the inter-node phase of a hierarchical collective).
    pub fn one_per_node(cluster: &Cluster) -> Group {
        Group {
            ranks: cluster.nodes,
            nodes: cluster.nodes,
        }
    }

    /// GPUs of the group on each node (at least one node is assumed).
    pub fn ranks_per_node(self) -> u32 {
        self.ranks / self.nodes.max(1)
    }
}

/// Which wire protocol the library uses (NCCL's LL, LL128, Simple; TCP for MPI).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// NCCL's LL (low-latency) protocol: each line carries its own flag, 8 data bytes a thread.
    Ll,
    /// NCCL's LL128 protocol: 120 data bytes per flagged 128-byte line.
    Ll128,
    /// NCCL's Simple protocol: whole steps of its buffer forwarded at a time.
    Simple,
    /// TCP sockets (the MPI and Gloo libraries, parameter servers over TCP).
    Tcp,
    /// A device-to-device copy (a single-rank collective).
    Memcpy,
}

impl Protocol {
    /// The protocol's display name ("LL", "LL128", "Simple", "TCP", "memcpy").
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Ll => "LL",
            Protocol::Ll128 => "LL128",
            Protocol::Simple => "Simple",
            Protocol::Tcp => "TCP",
            Protocol::Memcpy => "memcpy",
        }
    }
}

/// Which algorithm and protocol an estimate names. Its time is the same either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Naming {
    /// What the library runs: NCCL's tuner's choice, from its own tables (traces, tables).
    #[default]
    Library,
    /// The calibrated candidate that priced it: for callers that need the time alone (a
    /// search scoring plans), which NCCL's tuner would only slow down.
    Priced,
}

/// A predicted collective: its duration and the algorithm/protocol that achieves it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Predicted duration of the collective.
    pub time: SimTime,
    /// The algorithm the estimate names.
    pub algorithm: Algorithm,
    /// The protocol the estimate names.
    pub protocol: Protocol,
    /// The part of `time` that collectives sharing links do not stretch: per-call and
    /// per-message costs and reductions, which run beside another collective's transfer rather
    /// than in turn with it. Priced for the TCP libraries and a parameter server's hops and
    /// messages; 0 (all of it shared) for NCCL's collectives.
    #[serde(skip)]
    pub fixed: SimTime,
    /// What the collective takes beyond its slowed `time` when it starts while every rank
    /// computes on the cores its progress needs (CPU ranks: the cluster's measured
    /// `contention`); 0 for a cluster without one. Set by the cost pass.
    #[serde(skip)]
    pub delay_with_compute: SimTime,
}

impl Estimate {
    /// Bytes per second of the user's buffer (nccl-tests' algbw), in GB/s.
    pub fn algbw_gbytes_per_s(&self, bytes: u64) -> f64 {
        if self.time.as_ns() == 0 {
            return 0.0;
        }
        bytes as f64 / self.time.as_ns() as f64
    }
}

/// Predicts one collective of `bytes` over `group` on `cluster` with the cluster's library,
/// choosing algorithm and protocol the way the library's tuner does; where the cluster file
/// measured the very same collective (`library.measured`), its times stand in for the model.
pub fn estimate(cluster: &Cluster, op: Op, bytes: u64, group: Group) -> Result<Estimate> {
    estimate_named(cluster, op, bytes, group, Naming::Library)
}

/// [`estimate`], naming its algorithm and protocol as `naming` says.
pub fn estimate_named(
    cluster: &Cluster,
    op: Op,
    bytes: u64,
    group: Group,
    naming: Naming,
) -> Result<Estimate> {
    check_group(cluster, group)?;
    let estimate = modeled(cluster, op, bytes, group, naming);
    let measured = measured::stand_in(cluster, op, bytes, group, estimate.time, &|bytes| {
        modeled(cluster, op, bytes, group, Naming::Priced).time
    });
    Ok(match measured {
        // What the measured time holds beyond the model's transfer is fixed: the transfer is
        // what shares the links.
        Some(time) => Estimate {
            time,
            fixed: time.saturating_sub(estimate.time.saturating_sub(estimate.fixed)),
            ..estimate
        },
        None => estimate,
    })
}

/// The cost model's estimate alone, for a collective that the cluster's measured sweeps did not
/// time even where their operation is the same (a transport's own ring of point-to-point
/// messages rather than the library's collective). `group` must fit the cluster
/// ([`estimate`] checks it).
pub fn estimate_modeled(cluster: &Cluster, op: Op, bytes: u64, group: Group) -> Result<Estimate> {
    check_group(cluster, group)?;
    Ok(modeled(cluster, op, bytes, group, Naming::Library))
}

fn modeled(cluster: &Cluster, op: Op, bytes: u64, group: Group, naming: Naming) -> Estimate {
    match &cluster.library {
        Library::Nccl(params) => nccl::estimate(cluster, params, op, bytes, group, naming),
        Library::Mpi(params) => mpi::estimate(cluster, params, op, bytes, group),
        Library::Gloo(params) => gloo::estimate(cluster, params, op, bytes, group),
    }
}

/// What gloo's float16 sums add to one `op` over `group` of a buffer of `bytes` of float16
/// beyond the price of their bytes (`TcpParams::fp16_sum_ns_per_element`). Zero for a
/// collective that sums nothing, for NCCL (its kernels sum half floats on the GPU at the bytes'
/// rate), for MPI, and for a gloo whose float16 sums were not measured.
pub fn fp16_sum_time(cluster: &Cluster, op: Op, bytes: u64, group: Group) -> SimTime {
    SimTime::from_us(fp16_sum_us(cluster, op, bytes, group))
}

/// [`fp16_sum_time`] in µs, unrounded.
pub fn fp16_sum_us(cluster: &Cluster, op: Op, bytes: u64, group: Group) -> f64 {
    match &cluster.library {
        Library::Gloo(params) => gloo::fp16_sums_us(cluster, params, op, bytes, group),
        Library::Nccl(_) | Library::Mpi(_) => 0.0,
    }
}

/// [`fp16_sum_time`] of [`estimate_hierarchical_allreduce`]'s collectives.
pub fn fp16_sum_time_hierarchical(cluster: &Cluster, bytes: u64) -> SimTime {
    fp16_sum_time_two_level(cluster, bytes, TwoLevel::hierarchical_allreduce(cluster))
}

/// [`fp16_sum_time`] of [`estimate_hybrid_reduce_scatter`]'s collectives.
pub fn fp16_sum_time_hybrid(cluster: &Cluster, bytes: u64) -> SimTime {
    fp16_sum_time_two_level(cluster, bytes, TwoLevel::hybrid_reduce_scatter(cluster))
}

/// [`fp16_sum_time`] of a reduction of `bytes` run as `shape` says: the phases inside each
/// node and then across nodes (with its NIC's share), or the one collective.
fn fp16_sum_time_two_level(cluster: &Cluster, bytes: u64, shape: TwoLevel) -> SimTime {
    match shape {
        TwoLevel::Flat(op) => fp16_sum_time(cluster, op, bytes, Group::world(cluster)),
        TwoLevel::NodeThenAcross => {
            let [(local_op, local), (across_op, across)] = node_reduce_phases(cluster, bytes);
            fp16_sum_time(cluster, local_op, local, Group::one_node(cluster))
                + fp16_sum_time(
                    &nic_shares(cluster),
                    across_op,
                    across,
                    Group::one_per_node(cluster),
                )
        }
    }
}

/// What one rank's connections carry per µs: its node's goodput shared by the node's ranks.
/// Bytes queued on them drain at this rate (`TcpParams::queue_behind_bytes`).
pub fn rank_goodput_bytes_per_us(cluster: &Cluster) -> f64 {
    let ranks = cluster.gpus_per_node.max(1);
    node_goodput_bytes_per_us(cluster, ranks) / f64::from(ranks)
}

/// What one node's network carries per µs for `processes` sending processes of the cluster's
/// library: the NICs' line rate times the library's efficiency over them (NCCL's calibrated
/// `inter_efficiency`, a TCP library's measured `tcp_efficiency`), and over TCP at most
/// `host_gbps` per process. The TCP collectives and the parameter server price the same link
/// with it.
pub(crate) fn node_goodput_bytes_per_us(cluster: &Cluster, processes: u32) -> f64 {
    let line = cluster.node_network_bytes_per_s() / 1e6;
    match &cluster.library {
        Library::Nccl(params) => line * params.inter_efficiency,
        Library::Mpi(params) | Library::Gloo(params) => {
            let link = line * params.tcp_efficiency;
            match params.host_gbps {
                Some(host) => link.min(host * 1e3 / 8.0 * f64::from(processes.max(1))),
                None => link,
            }
        }
    }
}

/// Allgather with a different contribution per rank (`bytes_per_rank[i]` from rank i): a ring
/// moves one block per step, so each step lasts as long as its largest block.
pub fn estimate_allgatherv(
    cluster: &Cluster,
    bytes_per_rank: &[u64],
    group: Group,
) -> Result<Estimate> {
    if bytes_per_rank.len() != group.ranks as usize {
        return Err(SimError::bad_value(
            "allgatherv sizes",
            bytes_per_rank.len(),
            format!("need one size per rank ({} ranks)", group.ranks),
        ));
    }
    let largest = bytes_per_rank.iter().copied().max().unwrap_or(0);
    estimate(cluster, Op::Allgather, largest * group.ranks as u64, group)
}

/// Intra-node reduce-scatter, inter-node allreduce of each GPU's shard (all GPUs of a node
/// drive the NICs at once), then intra-node allgather; as Horovod's hierarchical allreduce.
pub fn estimate_hierarchical_allreduce(cluster: &Cluster, bytes: u64) -> Result<Estimate> {
    if let TwoLevel::Flat(op) = TwoLevel::hierarchical_allreduce(cluster) {
        return estimate(cluster, op, bytes, Group::world(cluster));
    }
    let (reduced, bare) = node_reduce_then_across(cluster, bytes)?;
    let allgather = estimate(&bare, Op::Allgather, bytes, Group::one_node(cluster))?;
    Ok(Estimate {
        time: reduced.time + allgather.time,
        fixed: reduced.fixed + allgather.fixed,
        ..reduced
    })
}

/// Hybrid sharding's reduction of `bytes` per rank: the hierarchical allreduce without its
/// final all-gather inside the node, each rank keeping the world's sum of its node shard.
pub fn estimate_hybrid_reduce_scatter(cluster: &Cluster, bytes: u64) -> Result<Estimate> {
    if let TwoLevel::Flat(op) = TwoLevel::hybrid_reduce_scatter(cluster) {
        return estimate(cluster, op, bytes, Group::world(cluster));
    }
    Ok(node_reduce_then_across(cluster, bytes)?.0)
}

/// How a reduction in two levels (inside nodes, then across them) runs on a cluster.
enum TwoLevel {
    /// One collective over every rank: where one of the levels has a single member.
    Flat(Op),
    /// [`node_reduce_phases`], inside each node and then across nodes.
    NodeThenAcross,
}

impl TwoLevel {
    /// The hierarchical allreduce's: a plain allreduce on one node or with one rank a node.
    fn hierarchical_allreduce(cluster: &Cluster) -> TwoLevel {
        match cluster.nodes == 1 || cluster.gpus_per_node == 1 {
            true => TwoLevel::Flat(Op::Allreduce),
            false => TwoLevel::NodeThenAcross,
        }
    }

    /// The hybrid reduce-scatter's: a reduce-scatter on one node; with one rank a node, that
    /// rank keeps the whole, an allreduce.
    fn hybrid_reduce_scatter(cluster: &Cluster) -> TwoLevel {
        match (cluster.nodes, cluster.gpus_per_node) {
            (1, _) => TwoLevel::Flat(Op::ReduceScatter),
            (_, 1) => TwoLevel::Flat(Op::Allreduce),
            _ => TwoLevel::NodeThenAcross,
        }
    }
}

/// A reduce-scatter of `bytes` inside each node, then each rank's shard allreduced across
/// nodes.
fn node_reduce_phases(cluster: &Cluster, bytes: u64) -> [(Op, u64); 2] {
    let shard = bytes.div_ceil(cluster.gpus_per_node as u64);
    [(Op::ReduceScatter, bytes), (Op::Allreduce, shard)]
}

/// [`node_reduce_phases`] by the ranks of the same place in their node, all of a node's rings
/// at once; the library's host copies once around both. Also the cluster without its host
/// staging, for phases that follow.
fn node_reduce_then_across(cluster: &Cluster, bytes: u64) -> Result<(Estimate, Cow<'_, Cluster>)> {
    let phases = node_reduce_phases(cluster, bytes);
    node_then_across(cluster, (Op::Allreduce, bytes), phases)
}

/// One collective inside each node, then one among the ranks of the same place in their node,
/// all of a node's at once (each with its NIC's share), each `(op, bytes)` of `phases`; a host
/// library copies the buffer of `staged` (op, bytes over every rank) off the device and back
/// once, whatever phases run on the host in between. Also the cluster without its host staging,
/// for phases that follow.
fn node_then_across(
    cluster: &Cluster,
    staged: (Op, u64),
    [(local_op, local), (across_op, across)]: [(Op, u64); 2],
) -> Result<(Estimate, Cow<'_, Cluster>)> {
    let world = Group::world(cluster);
    let staging = SimTime::from_us(staging_us(cluster, staged.0, staged.1, world));
    let bare = without_staging(cluster);
    let first = estimate(&bare, local_op, local, Group::one_node(cluster))?;
    let shared = nic_shares(&bare);
    let second = estimate(&shared, across_op, across, Group::one_per_node(cluster))?;
    let estimate = Estimate {
        time: first.time + second.time + staging,
        algorithm: Algorithm::Hierarchical,
        protocol: second.protocol,
        fixed: first.fixed + second.fixed + staging,
        delay_with_compute: SimTime::ZERO,
    };
    Ok((estimate, bare))
}

/// `cluster` as each of a node's GPUs sees it when all of them cross the network at once, one
/// per node in each of their groups: one NIC's share of the node's network bandwidth.
fn nic_shares(cluster: &Cluster) -> Cluster {
    let mut shared = cluster.clone();
    let nics = shared.inter_node.nics_per_node as f64;
    shared.inter_node.nic_bandwidth_gbps *=
        nics.min(cluster.gpus_per_node as f64) / cluster.gpus_per_node as f64;
    shared.inter_node.nics_per_node = 1;
    shared
}

/// ZeRO++'s two-hop all-to-all (qgZ, Wang et al. 2023 §3.3): `local` bytes from each rank
/// all-to-all inside its node, then `across` bytes all-to-all among the ranks of the same
/// place in their node, all of a node's at once; a host library copies once around both. On
/// one node, or with one rank a node, the single hop there is, of `local` bytes.
pub fn estimate_two_hop_alltoall(cluster: &Cluster, local: u64, across: u64) -> Result<Estimate> {
    if cluster.nodes == 1 || cluster.gpus_per_node == 1 {
        return estimate(cluster, Op::Alltoall, local, Group::world(cluster));
    }
    let phases = [(Op::Alltoall, local), (Op::Alltoall, across)];
    Ok(node_then_across(cluster, (Op::Alltoall, local), phases)?.0)
}

/// What a host library's copies of `op` on `bytes` over `group` cost (µs); 0 on a library
/// that reads the buffers where they are.
fn staging_us(cluster: &Cluster, op: Op, bytes: u64, group: Group) -> f64 {
    cluster
        .library
        .tcp()
        .map_or(0.0, |params| mpi::staging_us(params, op, bytes, group))
}

/// `cluster` with its library's host staging taken out: the phases of one exchange that a
/// host library runs between the copy off the device and the copy back.
pub fn without_staging(cluster: &Cluster) -> Cow<'_, Cluster> {
    match cluster.library.tcp() {
        Some(params) if params.host_staging_gbytes_per_s.is_some() => {
            let mut bare = cluster.clone();
            if let Some(params) = bare.library.tcp_mut() {
                params.host_staging_gbytes_per_s = None;
            }
            Cow::Owned(bare)
        }
        _ => Cow::Borrowed(cluster),
    }
}

fn check_group(cluster: &Cluster, group: Group) -> Result<()> {
    if group.ranks == 0 || group.nodes == 0 {
        return Err(SimError::bad_value(
            "collective group",
            format!("{}/{}", group.ranks, group.nodes),
            "needs at least one rank on one node",
        ));
    }
    if group.nodes > cluster.nodes
        || group.ranks > cluster.world_size()
        || !group.ranks.is_multiple_of(group.nodes)
    {
        return Err(SimError::bad_value(
            "collective group",
            format!("{} ranks on {} nodes", group.ranks, group.nodes),
            format!(
                "the cluster `{}` has {} nodes of {} GPUs and groups spread evenly over nodes",
                cluster.name, cluster.nodes, cluster.gpus_per_node
            ),
        ));
    }
    Ok(())
}
