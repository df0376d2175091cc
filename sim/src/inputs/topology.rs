//! Clusters: nodes, GPUs per node, the intra-node fabric, the NICs, and the collective library.

use crate::base::data::{self, DataKind};
use crate::base::error::{Result, SimError};
use crate::base::limits;
use crate::collective_op::{Algorithm, Op, MPI_ALLREDUCE_ALGORITHMS};
use crate::inputs::device::DeviceProfile;
use crate::inputs::model::Provenance;
use serde::{Deserialize, Serialize};

/// The fabric that connects the GPUs of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fabric {
    /// Point-to-point NVLink (DGX-1's hybrid cube mesh).
    Nvlink,
    /// NVLink through NVSwitch: every GPU reaches every other at full bandwidth.
    Nvswitch,
    /// PCIe through the host's switches.
    Pcie,
}

/// How the GPUs of one node are connected.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntraNode {
    /// The fabric that joins them.
    pub fabric: Fabric,
    /// Unidirectional bandwidth one GPU can drive into the fabric, all its links together.
    pub bandwidth_gbytes_per_s: f64,
    /// One hop's latency (GPU to GPU through the fabric).
    pub latency_us: f64,
    /// Whether the NVSwitch can reduce in the switch (NVLink SHARP, "NVLS"): Hopper NVSwitch and later.
    #[serde(default)]
    pub nvls: bool,
    /// The links between the GPUs of a switchless NVLink mesh. Absent: every GPU reaches every
    /// other at `bandwidth_gbytes_per_s` (a switch or one shared bus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<Mesh>,
}

impl IntraNode {
    /// Bandwidth (GB/s) a ring over the node's first `gpus` GPUs reaches out of each of them:
    /// on a mesh, one link's for every ring NCCL lays over their links; otherwise the fabric's.
    /// One GPU per node crosses no link inside the node: the fabric's rate stands.
    pub fn ring_gbytes_per_s(&self, gpus: u32) -> f64 {
        match &self.mesh {
            Some(mesh) if gpus > 1 => mesh.link_gbytes_per_s * f64::from(mesh.rings(gpus)),
            _ => self.bandwidth_gbytes_per_s,
        }
    }
}

/// A switchless NVLink mesh (DGX-1's hybrid cube mesh): how many links join each pair of GPUs.
/// A job of g GPUs per node runs on GPUs 0..g (CUDA's default device order).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "MeshFile", into = "MeshFile")]
pub struct Mesh {
    /// One link's bandwidth in each direction.
    pub link_gbytes_per_s: f64,
    /// `links[i][j]`: links between GPU i and GPU j (symmetric, 0 on the diagonal).
    pub links: Vec<Vec<u32>>,
    /// Rings over GPUs 0..g, for g = 0..=GPUs (computed once when the file is read).
    rings: Vec<u32>,
}

impl Mesh {
    /// GPUs the mesh joins.
    pub fn gpus(&self) -> u32 {
        self.links.len() as u32
    }

    /// Rings NCCL lays over GPUs 0..gpus (0 past the mesh's GPUs).
    pub fn rings(&self, gpus: u32) -> u32 {
        self.rings.get(gpus as usize).copied().unwrap_or(0)
    }
}

/// A mesh as its file writes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MeshFile {
    link_gbytes_per_s: f64,
    links: Vec<Vec<u32>>,
}

/// Most links one pair of GPUs can have (NVLink 4 gives an H100 18).
const MAX_LINKS_PER_PAIR: u32 = 18;

impl TryFrom<MeshFile> for Mesh {
    type Error = String;

    fn try_from(file: MeshFile) -> std::result::Result<Mesh, String> {
        let links = file.links;
        let n = links.len();
        if !(2..=crate::inputs::rings::MAX_MESH_GPUS).contains(&n) {
            return Err(format!(
                "intra_node.mesh.links: a mesh joins 2 to {} GPUs, got {n}",
                crate::inputs::rings::MAX_MESH_GPUS
            ));
        }
        for (i, row) in links.iter().enumerate() {
            if row.len() != n {
                return Err(format!(
                    "intra_node.mesh.links[{i}]: has {} entries, the mesh {n} GPUs",
                    row.len()
                ));
            }
            for (j, &count) in row.iter().enumerate() {
                let problem = if i == j && count != 0 {
                    "a GPU has no links to itself"
                } else if count != links[j][i] {
                    "links run both ways: links[i][j] equals links[j][i]"
                } else if count > MAX_LINKS_PER_PAIR {
                    "is more links than one pair of GPUs has"
                } else {
                    continue;
                };
                return Err(format!(
                    "intra_node.mesh.links[{i}][{j}] = {count}: {problem}"
                ));
            }
        }
        let rings: Vec<u32> = (0..=n)
            .map(|g| crate::inputs::rings::rings(&links, g))
            .collect();
        if let Some(g) = (2..=n).find(|&g| rings[g] == 0) {
            return Err(format!(
                "intra_node.mesh.links: GPUs 0 to {} have no ring over their links, even through one another",
                g - 1
            ));
        }
        Ok(Mesh {
            link_gbytes_per_s: file.link_gbytes_per_s,
            links,
            rings,
        })
    }
}

impl From<Mesh> for MeshFile {
    fn from(mesh: Mesh) -> MeshFile {
        MeshFile {
            link_gbytes_per_s: mesh.link_gbytes_per_s,
            links: mesh.links,
        }
    }
}

/// How nodes reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// InfiniBand verbs (GPUDirect RDMA where available).
    Ib,
    /// RDMA over Converged Ethernet.
    Roce,
    /// Kernel TCP sockets.
    Tcp,
}

/// How the nodes are connected: their NICs and the network between them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterNode {
    /// How NICs move bytes: InfiniBand, RoCE or kernel TCP.
    pub transport: Transport,
    /// NICs on each node.
    pub nics_per_node: u32,
    /// Line rate of one NIC in gigabits per second.
    pub nic_bandwidth_gbps: f64,
    /// One network hop's latency, NIC to NIC.
    pub latency_us: f64,
}

/// Parameters of the NCCL cost model. Defaults in `collective::nccl` follow NCCL's own tuning
/// tables; a cluster file states the calibrated ones.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NcclParams {
    /// Fraction of the intra-node fabric bandwidth NCCL's Simple protocol reaches per GPU.
    pub intra_efficiency: f64,
    /// Fraction of the NIC line rate NCCL reaches across nodes.
    pub inter_efficiency: f64,
    /// Fixed cost of one collective per protocol (kernel launch, pipeline fill). NCCL's tuner
    /// uses 6.6 / 14 / 8.4 µs (ring LL / LL128 / Simple); measured clusters are slower.
    pub base_latency_us: PerProtocol,
    /// Fraction of the Simple protocol's bandwidth LL128 reaches (NCCL's tuner assumes 0.92 from
    /// its 120-of-128-byte lines). Simple may itself reach well below a link's line rate, so
    /// this may exceed 1; LL128 on a link never carries more than 120/128 of its line rate
    /// ([`NcclParams::ll128_ceiling`]).
    pub ll128_efficiency: f64,
    /// Cap on the LL protocol's algorithm bandwidth, per rank, in GB/s: LL's flag polling rather
    /// than the link bounds it.
    pub ll_gbytes_per_s_per_rank: f64,
    /// Cap on LL's algorithm bandwidth when the group spans nodes, in GB/s: LL traffic across
    /// nodes goes through NCCL's CPU network proxy in small messages.
    pub ll_multi_node_gbytes_per_s: f64,
    /// Fraction of the NVLink bandwidth an NVLS (in-switch reduction) allreduce reaches;
    /// required when the fabric has NVLS.
    #[serde(default)]
    pub nvls_efficiency: f64,
    /// Fixed cost of an NVLS allreduce.
    #[serde(default)]
    pub nvls_latency_us: f64,
    /// The tree's own latencies (multi-node allreduce). Absent: NCCL's tuner relation to the
    /// ring's (the ring's base cost, the network hop per tree level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeLatency>,
    /// Share of the network efficiency lost per doubling of the node count beyond two (adaptive
    /// routing and congestion on larger fabrics): `inter_efficiency / (1 + loss · log2(nodes / 2))`.
    #[serde(default)]
    pub inter_efficiency_loss_per_doubling: f64,
    /// What NCCL decides from the hardware before any collective runs. Absent: the fastest of the
    /// calibrated algorithms runs, on all channels at every size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<NcclSetup>,
    /// Where these parameters come from (measured, estimated or calibrated) and how.
    pub provenance: Provenance,
}

/// Latency of NCCL's tree allreduce: a chain inside each node (priced by the intra-node hop)
/// and a double binary tree across nodes, reduced up and broadcast down.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeLatency {
    /// Fixed cost of one tree allreduce per protocol (launch, the root's turnaround). Absent:
    /// the ring's (`library.base_latency_us`): data at one tree depth cannot tell an intercept
    /// of the tree's own from its per-level cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_latency_us: Option<PerProtocol>,
    /// Cost of one network level of the tree per protocol, paid once up and once down.
    pub level_latency_us: PerProtocol,
}

/// NCCL's configuration on a cluster: which tuner tables choose the algorithm and protocol, and
/// how many channels (CUDA blocks, each with its own ring or tree and network connection) run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NcclSetup {
    /// Release series whose tuner tables apply.
    pub version: NcclVersion,
    /// GPU generation (NCCL's tuner tables are per compute capability).
    pub gpu_arch: GpuArch,
    /// Host CPU vendor (NCCL's LL bandwidth across nodes depends on it).
    pub cpu_vendor: CpuVendor,
    /// Channels of a large collective; smaller ones use fewer, as NCCL's thread thresholds decide.
    pub channels: u32,
}

/// NCCL release series with distinct tuner tables (src/graph/tuning.cc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NcclVersion {
    /// 2.18: tree Simple hop latencies 4/6/14 µs (NVLink/PCIe/network), LL ring at a quarter
    /// of the bus bandwidth.
    #[serde(rename = "2.18")]
    V2_18,
    /// 2.19–2.20: tree Simple hop latencies raised to 28 µs.
    #[serde(rename = "2.19")]
    V2_19,
    /// 2.21 and later: as 2.19, and the LL ring at half the bus bandwidth.
    #[serde(rename = "2.21")]
    V2_21,
}

/// GPU generation, whose rows of NCCL's tuner tables apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuArch {
    /// Volta (V100).
    Volta,
    /// Ampere (A100).
    Ampere,
    /// Hopper (H100, H200).
    Hopper,
}

/// Host CPU vendor, on which NCCL's tuner prices multi-node collectives (LL cap, proxy cost).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuVendor {
    /// Intel CPUs.
    Intel,
    /// AMD CPUs.
    Amd,
}

/// The most channels NCCL runs (MAXCHANNELS in NCCL 2.18–2.21).
pub const MAX_NCCL_CHANNELS: u32 = 32;

/// Parameters of a collective library over TCP sockets: MPI (Horovod's MPI backend, GRACE's
/// setup, `syncopate lab`'s sweep) or gloo (torch.distributed on CPUs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpParams {
    /// Fraction of the NIC line rate a TCP stream reaches.
    pub tcp_efficiency: f64,
    /// Software overhead of one message (MPI matching, kernel send/receive path).
    pub message_overhead_us: f64,
    /// Fixed cost of one collective call whatever its messages: for gloo through
    /// torch.distributed, the launch from Python, the hand-off to gloo's worker thread and the
    /// completion's return. Fitted where calls of two algorithms tell it from the per-message
    /// cost (gloo's allreduce and allgather sweep); 0 for the MPI fits, which time one.
    #[serde(default, skip_serializing_if = "crate::base::data::is_zero")]
    pub call_overhead_us: f64,
    /// Bytes per second the CPU reduces (sums) in an allreduce step, in GB/s.
    pub reduce_gbytes_per_s: f64,
    /// MPI only: the allreduce algorithm the library is told to run at every size. Syncopate's
    /// MPI backend asks Open MPI's non-blocking allreduce (libnbc) for its ring
    /// (`OMPI_MCA_coll_libnbc_iallreduce_algorithm=1`), and a lab's cluster file says so.
    /// None: the cheapest of ring, recursive doubling and Rabenseifner at each size (close to
    /// Open MPI `tuned`'s rules for the blocking MPI_Allreduce, which Horovod calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allreduce_algorithm: Option<Algorithm>,
    /// The most one rank's MPI-over-TCP path moves per second and direction on these hosts,
    /// in Gb/s (the CPU's cost per byte of the kernel's TCP stack and of MPI's progress),
    /// measured; a link is used at min(line rate × tcp_efficiency, this). None: the NIC limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_gbps: Option<f64>,
    /// GPU hosts whose library works on host memory (Horovod built without GPU operations,
    /// over MPI or gloo): each collective and push-pull copies its input off the GPU and its
    /// output back, through Horovod's host fusion buffer, at this many GB/s per direction (the
    /// PCIe copy and the host memcpy in turn). None: the library reads the buffers where they
    /// are (CPU hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_staging_gbytes_per_s: Option<f64>,
    /// MPI only: a collective among the ranks of one node runs through shared memory (Open
    /// MPI's `vader` transport), not through the node's NICs; one across nodes is priced by
    /// the NICs as before. None: every collective is (one rank per node, as on a lab or
    /// GRACE's testbed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_memory: Option<SharedMemory>,
    /// gloo only: the most one rank's allgather moves per second and direction, in Gb/s, when
    /// it is less than `host_gbps` allows. gloo's allgather ring moves large messages slower
    /// than its allreduce (0.6 against 0.93 of a 1 Gb/s lab link, docs/LAB.md); fitted to an
    /// allgather sweep. None: the same limits as every collective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allgather_host_gbps: Option<f64>,
    /// What a parameter server pays per point-to-point message it takes or sends (a payload's
    /// length or the payload) beside its bytes, in µs; fitted to a sweep's push-pull rows
    /// (`syncopate_sim::calibrate::p2p_fit`). None: a collective call's and message's costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_message_overhead_us: Option<f64>,
    /// How many push-pull rounds to different servers run at full speed together: measured
    /// where the hosts limit them (a lab's nodes share one machine's kernel and cores), from a
    /// sweep's rounds to every server at once against one at a time. None: as many as the
    /// links allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_rounds_at_once: Option<f64>,
    /// MPI only: bytes at most that a collective's messages wait behind, queued on the same
    /// connections by other streams' collectives. Open MPI's TCP transport carries every
    /// communicator between two processes over the same sockets, in order, so a small
    /// allreduce started beside a large one waits for what the large one has queued. The
    /// simulator charges the least of this and the others' transfers left. Measured by
    /// `syncopate lab up`: a small allreduce's mean time beside another stream's large ones less
    /// its time alone, turned into the cap under which that charge gives the same mean, at the
    /// link's goodput. None: concurrent collectives share the links fairly from their start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_behind_bytes: Option<u64>,
    /// gloo only: what summing one half-precision (IEEE float16) element takes a rank, in ns,
    /// beyond what `reduce_gbytes_per_s` prices for its bytes. gloo sums float16 one element at
    /// a time through software conversions to float and back (gloo/types.h: `float16`'s
    /// operators call `cpu_half2float` and `cpu_float2half_rn`); its ring hides the sums behind
    /// the next segment's transfer where the link is slower (`collective::fp16_sum_time`).
    /// Fitted to a sweep's `allreduce-fp16` rows against its `allreduce` rows of the same sizes
    /// (`calibrate::fp16_sum_fit`). None: float16 sums are priced by their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp16_sum_ns_per_element: Option<f64>,
    /// The sweeps the parameters were fitted to (`syncopate lab up`, `collective --fit-out`):
    /// where a plan runs the very collective a sweep measured, its times stand in for the
    /// model's (`collective::measured`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<MeasuredSweep>,
    /// Where these parameters come from (measured, estimated or calibrated) and how.
    pub provenance: Provenance,
}

impl TcpParams {
    /// A library priced by its line-rate fraction, message overhead and reduction rate alone:
    /// no call overhead, no refinement measured (host path, staging, shared memory,
    /// point-to-point, queues, an algorithm pinned) and no measured sweep. What a fit of those
    /// three costs builds.
    pub fn base_costs(
        tcp_efficiency: f64,
        message_overhead_us: f64,
        reduce_gbytes_per_s: f64,
        provenance: Provenance,
    ) -> TcpParams {
        TcpParams {
            tcp_efficiency,
            message_overhead_us,
            call_overhead_us: 0.0,
            reduce_gbytes_per_s,
            allreduce_algorithm: None,
            host_gbps: None,
            host_staging_gbytes_per_s: None,
            shared_memory: None,
            allgather_host_gbps: None,
            p2p_message_overhead_us: None,
            p2p_rounds_at_once: None,
            queue_behind_bytes: None,
            fp16_sum_ns_per_element: None,
            measured: Vec::new(),
            provenance,
        }
    }
}

/// One operation's measured times on one cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredSweep {
    /// The collective measured.
    pub op: Op,
    /// Ranks and nodes the operation spanned.
    pub ranks: u32,
    /// Nodes the operation spanned.
    pub nodes: u32,
    /// Each node's NICs and their rate when it was measured, in Gb/s.
    pub nics_per_node: u32,
    /// Each NIC's rate when it was measured, Gb/s.
    pub nic_bandwidth_gbps: f64,
    /// Sizes in increasing order (nccl-tests' convention: the per-rank buffer of an
    /// allreduce, the gathered buffer of an allgather).
    pub points: Vec<SweepPoint>,
}

/// One measured size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepPoint {
    /// Size in bytes, by nccl-tests' convention (see [`MeasuredSweep::points`]).
    pub bytes: u64,
    /// Measured time of the collective at that size, µs.
    pub time_us: f64,
}

impl MeasuredSweep {
    /// Checks the sweep of `field` in the file `label`.
    pub fn validate(&self, label: &str, field: &str) -> Result<()> {
        if self.ranks < 2 || self.nodes == 0 || !self.ranks.is_multiple_of(self.nodes) {
            return Err(SimError::invalid(
                label,
                format!("{field}.ranks"),
                format!(
                    "a measured collective spans at least 2 ranks spread evenly over its nodes, got {} ranks on {} nodes",
                    self.ranks, self.nodes
                ),
            ));
        }
        if self.nics_per_node == 0 {
            return Err(SimError::invalid(
                label,
                format!("{field}.nics_per_node"),
                "a node needs at least one NIC",
            ));
        }
        limits::check_rate(
            label,
            &format!("{field}.nic_bandwidth_gbps"),
            self.nic_bandwidth_gbps,
            "Gb/s",
        )?;
        if self.points.len() < 2 {
            return Err(SimError::invalid(
                label,
                format!("{field}.points"),
                format!(
                    "interpolating needs at least 2 sizes, got {}",
                    self.points.len()
                ),
            ));
        }
        for (i, point) in self.points.iter().enumerate() {
            let at = format!("{field}.points[{i}]");
            if point.bytes == 0 {
                return Err(SimError::invalid(
                    label,
                    format!("{at}.bytes"),
                    "a measured size is at least 1 byte",
                ));
            }
            if i > 0 && point.bytes <= self.points[i - 1].bytes {
                return Err(SimError::invalid(
                    label,
                    format!("{at}.bytes"),
                    format!(
                        "sizes increase from one point to the next, got {} after {}",
                        point.bytes,
                        self.points[i - 1].bytes
                    ),
                ));
            }
            limits::check_duration_us(label, &format!("{at}.time_us"), point.time_us)?;
            if point.time_us <= 0.0 {
                return Err(SimError::invalid(
                    label,
                    format!("{at}.time_us"),
                    "a measured collective takes some time",
                ));
            }
        }
        Ok(())
    }

    /// What it measured: the operation, its ranks and nodes, and the nodes' links.
    pub(crate) fn conditions(&self) -> (Op, u32, u32, u32, f64) {
        (
            self.op,
            self.ranks,
            self.nodes,
            self.nics_per_node,
            self.nic_bandwidth_gbps,
        )
    }

    /// Whether `other` measured what this sweep did (a file holds one sweep of each).
    pub fn same_conditions(&self, other: &MeasuredSweep) -> bool {
        self.conditions() == other.conditions()
    }
}

/// LL128 carries 120 data bytes in every 128-byte line, so it can reach at most this share of
/// the link (NCCL src/include/devcomm.h).
pub const LL128_PAYLOAD_FRACTION: f64 = 120.0 / 128.0;

/// How the MPI ranks of one node move bytes through host memory: each at one core's pace,
/// all of them together at most at the node's memory bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedMemory {
    /// GB/s at which one rank copies a message into another's buffer (one core's memcpy; Open
    /// MPI's single-copy path for large messages reads the sender's buffer once).
    pub copy_gbytes_per_s: f64,
    /// GB/s of memory traffic the node's host memory carries for all its ranks at once: their
    /// copies, their reductions and their staging copies to and from the GPUs.
    pub host_memory_gbytes_per_s: f64,
}

impl NcclParams {
    /// The largest `ll128_efficiency` (a share of Simple's bandwidth) that keeps LL128 within
    /// its payload share of the line rate on the link where Simple is most efficient.
    pub fn ll128_ceiling(&self) -> f64 {
        LL128_PAYLOAD_FRACTION / self.intra_efficiency.max(self.inter_efficiency)
    }
}

/// One number per NCCL protocol.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerProtocol {
    /// The value for NCCL's LL protocol.
    pub ll: f64,
    /// The value for NCCL's LL128 protocol.
    pub ll128: f64,
    /// The value for NCCL's Simple protocol.
    pub simple: f64,
}

/// The collective-communication library a cluster runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Library {
    /// NCCL, with its cost-model parameters.
    Nccl(NcclParams),
    /// MPI over TCP sockets.
    Mpi(TcpParams),
    /// torch.distributed's gloo backend: ring allreduce in segments, ring allgather.
    Gloo(TcpParams),
}

impl Library {
    /// The TCP parameters of an MPI or gloo library.
    pub fn tcp(&self) -> Option<&TcpParams> {
        match self {
            Library::Nccl(_) => None,
            Library::Mpi(p) | Library::Gloo(p) => Some(p),
        }
    }

    /// The TCP parameters of an MPI or gloo library, to change them.
    pub fn tcp_mut(&mut self) -> Option<&mut TcpParams> {
        match self {
            Library::Nccl(_) => None,
            Library::Mpi(p) | Library::Gloo(p) => Some(p),
        }
    }

    /// How `collective` names the library.
    pub fn label(&self) -> &'static str {
        match self {
            Library::Nccl(_) => "NCCL",
            Library::Mpi(_) => "MPI/TCP",
            Library::Gloo(_) => "gloo/TCP",
        }
    }
}

/// A cluster as stored in `topologies/*.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    /// Version of the data file format; this build reads only its own.
    pub format_version: u32,
    /// Short name of the cluster, as given on the command line (`dgx-a100`).
    pub name: String,
    /// What the cluster is, in prose (GPUs, fabric, NICs).
    pub description: String,
    /// Where the figures come from: datasheets, measurements, calibrations.
    pub source: String,
    /// Device profile name of the GPUs.
    pub device: String,
    /// Number of nodes.
    pub nodes: u32,
    /// GPUs (ranks) on each node.
    pub gpus_per_node: u32,
    /// How the GPUs of a node are connected.
    pub intra_node: IntraNode,
    /// How the nodes are connected.
    pub inter_node: InterNode,
    /// The collective library and its cost-model parameters.
    pub library: Library,
    /// How compute and communication slow each other on this cluster's ranks, measured on it
    /// (`syncopate lab up`): for CPU ranks it depends on how ranks share cores, which the
    /// device profile cannot know. Overrides the device's contention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<ClusterContention>,
    /// Device memory bandwidth of the GPUs (from the device profile, filled in by `load`): a
    /// one-rank collective is a device-local copy.
    #[serde(skip)]
    pub device_memory_gbytes_per_s: f64,
}

/// Contention between a rank's compute, compression and communication on one cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterContention {
    /// Compute time multiplier with every rank computing at once and nothing else running
    /// beside it, against the rate its profile (or a CPU rank's calibrated loop) gives: a
    /// synchronous job runs at its slowest rank's pace, and ranks sharing a host's cores do not
    /// share them evenly. Files written before it was measured lack it: 1. A model profile
    /// recorded with as many ranks computing at once (its `rank_skew`) holds that pace already,
    /// and the simulator leaves this factor out for it.
    #[serde(default = "no_slowdown")]
    pub compute_slowdown_with_ranks: f64,
    /// Compute time multiplier while a collective runs (on top of the one with every rank).
    /// `syncopate lab probe contention` measures it beside MPI's allreduces; a gloo refit
    /// with a sweep beside compute that timed the compute too (`compute_slowdown`) takes it
    /// from gloo's own.
    pub compute_slowdown_with_collective: f64,
    /// Compute time multiplier while the rank's compression runs (on top of the one with every
    /// rank).
    pub compute_slowdown_with_compression: f64,
    /// Collective time multiplier while every rank computes (scaled by the share of ranks
    /// whose cores are busy computing or compressing: both are CPU threads beside MPI's).
    pub collective_slowdown_with_compute: f64,
    /// Microseconds an allreduce that starts while every rank computes takes beyond
    /// `collective_slowdown_with_compute` times its time alone (scaled by the share of
    /// computing ranks): on CPU ranks whose cores are busy, each round of a collective waits
    /// for its progress thread to be scheduled, a cost of every collective whatever its size.
    /// Operations with no delay of their own pay this one. Files written before it was
    /// measured lack it: 0.
    #[serde(default, skip_serializing_if = "crate::base::data::is_zero")]
    pub collective_delay_with_compute_us: f64,
    /// The same for an allgather, when it was measured (its rounds are fewer than an
    /// allreduce's; a reduce-scatter, with as many, pays it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allgather_delay_with_compute_us: Option<f64>,
    /// The cores CPU ranks share, when they are fewer than the ranks' busy threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_cores: Option<SharedCores>,
    /// Where these factors come from (measured, estimated or calibrated) and how.
    pub provenance: Provenance,
}

fn no_slowdown() -> f64 {
    1.0
}

/// The cores CPU ranks share: a compression thread runs at `cores / busy threads` of a core
/// when the host's ranks keep more threads busy than it has cores. Compute is not scaled by
/// the share: a CPU rank's compute is calibrated with every rank of its host computing at once,
/// and what that calibration misses is `compute_slowdown_with_ranks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedCores {
    /// Cores of one host.
    pub cores_per_host: u32,
    /// Whether every node of the cluster is on one host (a `syncopate lab`), rather than each
    /// node being a host of its own.
    pub one_host: bool,
}

impl SharedCores {
    /// Ranks that share one host's cores on `cluster`.
    pub fn ranks(&self, cluster: &Cluster) -> u32 {
        if self.one_host {
            cluster.nodes.saturating_mul(cluster.gpus_per_node)
        } else {
            cluster.gpus_per_node
        }
    }
}

/// Command-line changes to a cluster (`--nodes`, `--gpus-per-node`, `--inter-gbps`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ClusterOverrides {
    /// Number of nodes instead of the file's (`--nodes`).
    pub nodes: Option<u32>,
    /// GPUs per node instead of the file's (`--gpus-per-node`).
    pub gpus_per_node: Option<u32>,
    /// Line rate of one NIC instead of the file's, in Gb/s (`--inter-gbps`).
    pub inter_gbps: Option<f64>,
}

impl Cluster {
    /// Loads a shipped cluster by name or a cluster file from a path, applies the overrides and
    /// validates the result.
    pub fn load(name_or_path: &str, overrides: ClusterOverrides) -> Result<Cluster> {
        let source = data::locate(DataKind::Cluster, name_or_path)?;
        let mut cluster: Cluster = data::parse_json(&source.label, &source.text)?;
        cluster.validate(&source.label)?;
        // A device given by relative path belongs next to the cluster file that names it
        // (experiments ship both), not in whatever directory the command runs from.
        let device_path = std::path::Path::new(&cluster.device);
        let names_path = cluster.device.ends_with(".json") || cluster.device.contains('/');
        if names_path && device_path.is_relative() && name_or_path == source.label {
            if let Some(dir) = std::path::Path::new(name_or_path).parent() {
                cluster.device = dir.join(device_path).to_string_lossy().into_owned();
            }
        }
        let device = DeviceProfile::load(&cluster.device).map_err(|err| {
            SimError::invalid(
                &source.label,
                "device",
                format!("`{}`: {err}", cluster.device),
            )
        })?;
        cluster.device_memory_gbytes_per_s = device.memory_bandwidth_gbytes_per_s;
        cluster.apply(overrides)?;
        Ok(cluster)
    }

    /// A mesh's link rate, that no GPU has more links than the fabric's bandwidth carries, and
    /// that the node's GPUs are the mesh's.
    fn check_mesh(&self, label: &str, mesh: &Mesh) -> Result<()> {
        let field = "intra_node.mesh.link_gbytes_per_s";
        limits::check_rate(label, field, mesh.link_gbytes_per_s, "GB/s")?;
        let most_links = mesh.links.iter().map(|row| row.iter().sum::<u32>()).max();
        let most = f64::from(most_links.unwrap_or(0)) * mesh.link_gbytes_per_s;
        if most > self.intra_node.bandwidth_gbytes_per_s * (1.0 + 1e-9) {
            return Err(SimError::invalid(
                label,
                field,
                format!(
                    "a GPU's links carry {most} GB/s, more than intra_node.bandwidth_gbytes_per_s ({})",
                    self.intra_node.bandwidth_gbytes_per_s
                ),
            ));
        }
        if self.gpus_per_node > mesh.gpus() {
            return Err(SimError::invalid(
                label,
                "gpus_per_node",
                format!(
                    "{} GPUs per node, but intra_node.mesh joins {}",
                    self.gpus_per_node,
                    mesh.gpus()
                ),
            ));
        }
        Ok(())
    }

    /// Applies command-line overrides, rejecting values that make no cluster.
    pub fn apply(&mut self, overrides: ClusterOverrides) -> Result<()> {
        if let Some(nodes) = overrides.nodes {
            if nodes == 0 {
                return Err(SimError::bad_value(
                    "--nodes",
                    nodes,
                    "a cluster needs at least one node",
                ));
            }
            self.nodes = nodes;
        }
        if let Some(gpus) = overrides.gpus_per_node {
            if gpus == 0 {
                return Err(SimError::bad_value(
                    "--gpus-per-node",
                    gpus,
                    "a node needs at least one GPU",
                ));
            }
            if let Some(mesh) = self.intra_node.mesh.as_ref().filter(|m| gpus > m.gpus()) {
                return Err(SimError::bad_value(
                    "--gpus-per-node",
                    gpus,
                    format!("the cluster's NVLink mesh joins {} GPUs", mesh.gpus()),
                ));
            }
            self.gpus_per_node = gpus;
        }
        if let Some(gbps) = overrides.inter_gbps {
            self.inter_node.nic_bandwidth_gbps = limits::flag_rate("--inter-gbps", gbps, "Gb/s")?;
        }
        limits::ranks(self.nodes, self.gpus_per_node, "--nodes × --gpus-per-node")?;
        Ok(())
    }

    /// Checks the format version and that every count, rate and parameter is in range.
    pub fn validate(&self, label: &str) -> Result<()> {
        data::check_format_version(label, self.format_version)?;
        if self.nodes == 0 {
            return Err(SimError::invalid(
                label,
                "nodes",
                "a cluster needs at least one node",
            ));
        }
        if self.gpus_per_node == 0 {
            return Err(SimError::invalid(
                label,
                "gpus_per_node",
                "a node needs at least one GPU",
            ));
        }
        limits::ranks(self.nodes, self.gpus_per_node, "nodes × gpus_per_node")
            .map_err(|e| SimError::invalid(label, "nodes", e.to_string()))?;
        if self.inter_node.nics_per_node == 0 {
            return Err(SimError::invalid(
                label,
                "inter_node.nics_per_node",
                "a node needs at least one NIC",
            ));
        }
        limits::check_rate(
            label,
            "intra_node.bandwidth_gbytes_per_s",
            self.intra_node.bandwidth_gbytes_per_s,
            "GB/s",
        )?;
        limits::check_duration_us(label, "intra_node.latency_us", self.intra_node.latency_us)?;
        if let Some(mesh) = &self.intra_node.mesh {
            self.check_mesh(label, mesh)?;
        }
        limits::check_rate(
            label,
            "inter_node.nic_bandwidth_gbps",
            self.inter_node.nic_bandwidth_gbps,
            "Gb/s",
        )?;
        limits::check_duration_us(label, "inter_node.latency_us", self.inter_node.latency_us)?;
        if let Some(c) = &self.contention {
            for (field, value) in [
                (
                    "contention.compute_slowdown_with_ranks",
                    c.compute_slowdown_with_ranks,
                ),
                (
                    "contention.compute_slowdown_with_collective",
                    c.compute_slowdown_with_collective,
                ),
                (
                    "contention.compute_slowdown_with_compression",
                    c.compute_slowdown_with_compression,
                ),
                (
                    "contention.collective_slowdown_with_compute",
                    c.collective_slowdown_with_compute,
                ),
            ] {
                if !(value.is_finite() && (1.0..=limits::MAX_SLOWDOWN).contains(&value)) {
                    return Err(SimError::invalid(
                        label,
                        field,
                        format!(
                            "a slowdown is a factor from 1 to {}, got {}",
                            limits::MAX_SLOWDOWN,
                            limits::num(value)
                        ),
                    ));
                }
            }
            limits::check_duration_us(
                label,
                "contention.collective_delay_with_compute_us",
                c.collective_delay_with_compute_us,
            )?;
            if let Some(delay) = c.allgather_delay_with_compute_us {
                limits::check_duration_us(
                    label,
                    "contention.allgather_delay_with_compute_us",
                    delay,
                )?;
            }
            if let Some(shared) = &c.shared_cores {
                if shared.cores_per_host == 0 || shared.cores_per_host > limits::MAX_CORES {
                    return Err(SimError::invalid(
                        label,
                        "contention.shared_cores.cores_per_host",
                        format!(
                            "a host has from 1 to {} cores, got {}",
                            limits::MAX_CORES,
                            shared.cores_per_host
                        ),
                    ));
                }
            }
        }
        match &self.library {
            Library::Nccl(p) => {
                limits::check_fraction(label, "library.intra_efficiency", p.intra_efficiency)?;
                limits::check_fraction(label, "library.inter_efficiency", p.inter_efficiency)?;
                for (field, value) in [
                    ("library.base_latency_us.ll", p.base_latency_us.ll),
                    ("library.base_latency_us.ll128", p.base_latency_us.ll128),
                    ("library.base_latency_us.simple", p.base_latency_us.simple),
                ] {
                    limits::check_duration_us(label, field, value)?;
                }
                limits::check_rate(
                    label,
                    "library.ll_gbytes_per_s_per_rank",
                    p.ll_gbytes_per_s_per_rank,
                    "GB/s",
                )?;
                limits::check_rate(
                    label,
                    "library.ll_multi_node_gbytes_per_s",
                    p.ll_multi_node_gbytes_per_s,
                    "GB/s",
                )?;
                let ceiling = p.ll128_ceiling();
                if !(p.ll128_efficiency > 0.0 && p.ll128_efficiency <= ceiling) {
                    return Err(SimError::invalid(
                        label,
                        "library.ll128_efficiency",
                        format!(
                            "must be in (0, {}] (LL128 carries at most {LL128_PAYLOAD_FRACTION} of a link's line rate; Simple reaches {} of it inside a node and {} across), got {}",
                            limits::num(ceiling),
                            limits::num(p.intra_efficiency),
                            limits::num(p.inter_efficiency),
                            limits::num(p.ll128_efficiency)
                        ),
                    ));
                }
                if self.intra_node.nvls {
                    limits::check_fraction(label, "library.nvls_efficiency", p.nvls_efficiency)?;
                    limits::check_duration_us(label, "library.nvls_latency_us", p.nvls_latency_us)?;
                }
                if let Some(tree) = &p.tree {
                    let level = &tree.level_latency_us;
                    let mut fields = vec![
                        ("library.tree.level_latency_us.ll", level.ll),
                        ("library.tree.level_latency_us.ll128", level.ll128),
                        ("library.tree.level_latency_us.simple", level.simple),
                    ];
                    if let Some(base) = &tree.base_latency_us {
                        fields.extend([
                            ("library.tree.base_latency_us.ll", base.ll),
                            ("library.tree.base_latency_us.ll128", base.ll128),
                            ("library.tree.base_latency_us.simple", base.simple),
                        ]);
                    }
                    for (field, value) in fields {
                        limits::check_duration_us(label, field, value)?;
                    }
                }
                let loss = p.inter_efficiency_loss_per_doubling;
                if !(loss.is_finite() && (0.0..=1.0).contains(&loss)) {
                    return Err(SimError::invalid(
                        label,
                        "library.inter_efficiency_loss_per_doubling",
                        format!("must be in [0, 1], got {}", limits::num(loss)),
                    ));
                }
                if let Some(setup) = &p.setup {
                    if !(1..=MAX_NCCL_CHANNELS).contains(&setup.channels) {
                        return Err(SimError::invalid(
                            label,
                            "library.setup.channels",
                            format!(
                                "NCCL runs 1 to {MAX_NCCL_CHANNELS} channels, got {}",
                                setup.channels
                            ),
                        ));
                    }
                }
            }
            Library::Mpi(p) | Library::Gloo(p) => {
                limits::check_fraction(label, "library.tcp_efficiency", p.tcp_efficiency)?;
                limits::check_duration_us(
                    label,
                    "library.message_overhead_us",
                    p.message_overhead_us,
                )?;
                limits::check_duration_us(label, "library.call_overhead_us", p.call_overhead_us)?;
                limits::check_rate(
                    label,
                    "library.reduce_gbytes_per_s",
                    p.reduce_gbytes_per_s,
                    "GB/s",
                )?;
                if let Some(host) = p.host_gbps {
                    limits::check_rate(label, "library.host_gbps", host, "Gb/s")?;
                }
                if let Some(staging) = p.host_staging_gbytes_per_s {
                    limits::check_rate(
                        label,
                        "library.host_staging_gbytes_per_s",
                        staging,
                        "GB/s",
                    )?;
                }
                if let Some(shared) = p.shared_memory {
                    if matches!(self.library, Library::Gloo(_)) {
                        return Err(SimError::invalid(
                            label,
                            "library.shared_memory",
                            "gloo sends through sockets inside a node too: only an MPI cluster has it",
                        ));
                    }
                    limits::check_rate(
                        label,
                        "library.shared_memory.copy_gbytes_per_s",
                        shared.copy_gbytes_per_s,
                        "GB/s",
                    )?;
                    limits::check_rate(
                        label,
                        "library.shared_memory.host_memory_gbytes_per_s",
                        shared.host_memory_gbytes_per_s,
                        "GB/s",
                    )?;
                }
                if let Some(algorithm) = p.allreduce_algorithm {
                    let why = match self.library {
                        Library::Gloo(_) => Some("gloo chooses its own allreduce: only an MPI cluster pins one".to_string()),
                        _ if !MPI_ALLREDUCE_ALGORITHMS.contains(&algorithm) => Some(format!(
                            "`{}` is not an allreduce an MPI library runs (ring, rec-doubling or rabenseifner)",
                            algorithm.name()
                        )),
                        _ => None,
                    };
                    if let Some(why) = why {
                        return Err(SimError::invalid(label, "library.allreduce_algorithm", why));
                    }
                }
                if let Some(host) = p.allgather_host_gbps {
                    limits::check_rate(label, "library.allgather_host_gbps", host, "Gb/s")?;
                }
                if let Some(p2p) = p.p2p_message_overhead_us {
                    limits::check_duration_us(label, "library.p2p_message_overhead_us", p2p)?;
                }
                if let Some(sum) = p.fp16_sum_ns_per_element {
                    limits::check_ns_per_element(label, "library.fp16_sum_ns_per_element", sum)?;
                    if matches!(self.library, Library::Mpi(_)) {
                        return Err(SimError::invalid(
                            label,
                            "library.fp16_sum_ns_per_element",
                            "measured for gloo's ring, which sums float16 in software: only a gloo cluster has it",
                        ));
                    }
                }
                for (i, sweep) in p.measured.iter().enumerate() {
                    let field = format!("library.measured[{i}]");
                    sweep.validate(label, &field)?;
                    if p.measured[..i].iter().any(|s| s.same_conditions(sweep)) {
                        return Err(SimError::invalid(
                            label,
                            field,
                            "a second sweep of the same collective on the same ranks and links: keep one",
                        ));
                    }
                }
                if let Some(queue) = p.queue_behind_bytes {
                    let why = match self.library {
                        Library::Gloo(_) => Some(
                            "measured for Open MPI's shared sockets: only an MPI cluster has it"
                                .to_string(),
                        ),
                        _ if queue > limits::MAX_QUEUE_BYTES => Some(format!(
                            "at most {} bytes queue ahead on a connection, got {queue}",
                            limits::MAX_QUEUE_BYTES
                        )),
                        _ => None,
                    };
                    if let Some(why) = why {
                        return Err(SimError::invalid(label, "library.queue_behind_bytes", why));
                    }
                }
                if let Some(at_once) = p.p2p_rounds_at_once {
                    if !(at_once.is_finite() && (1.0..=limits::MAX_RANKS as f64).contains(&at_once))
                    {
                        return Err(SimError::invalid(
                            label,
                            "library.p2p_rounds_at_once",
                            format!(
                                "must be 1 to {} rounds, got {}",
                                limits::MAX_RANKS,
                                limits::num(at_once)
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Total ranks: nodes × GPUs per node.
    pub fn world_size(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }

    /// Network bandwidth one node can send, all NICs together, in bytes per second.
    pub fn node_network_bytes_per_s(&self) -> f64 {
        self.inter_node.nic_bandwidth_gbps * 1e9 / 8.0 * self.inter_node.nics_per_node as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_shared_cores(cores_per_host: u32) -> Cluster {
        let mut cluster = Cluster::load("dgx-a100", ClusterOverrides::default()).unwrap();
        cluster.contention = Some(ClusterContention {
            compute_slowdown_with_ranks: 1.0,
            compute_slowdown_with_collective: 1.0,
            compute_slowdown_with_compression: 1.0,
            collective_slowdown_with_compute: 1.0,
            collective_delay_with_compute_us: 0.0,
            allgather_delay_with_compute_us: None,
            shared_cores: Some(SharedCores {
                cores_per_host,
                one_host: true,
            }),
            provenance: Provenance {
                status: crate::inputs::model::Status::Measured,
                method: "t".into(),
            },
        });
        cluster
    }

    #[test]
    fn a_host_without_cores_is_refused_by_name() {
        let err = with_shared_cores(0)
            .validate("c.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("contention.shared_cores.cores_per_host"),
            "{err}"
        );
        assert!(with_shared_cores(2).validate("c.json").is_ok());
    }

    #[test]
    fn a_negative_or_absurd_delay_beside_compute_is_refused_by_name() {
        for (value, allgather) in [(-1.0, None), (f64::NAN, None), (0.0, Some(1e30))] {
            let mut cluster = with_shared_cores(2);
            let contention = cluster.contention.as_mut().unwrap();
            contention.collective_delay_with_compute_us = value;
            contention.allgather_delay_with_compute_us = allgather;
            let err = cluster.validate("c.json").unwrap_err().to_string();
            let field = match allgather {
                Some(_) => "contention.allgather_delay_with_compute_us",
                None => "contention.collective_delay_with_compute_us",
            };
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn ranks_sharing_a_host_follow_the_node_count_on_one_host() {
        let mut cluster = with_shared_cores(2);
        let shared = cluster.contention.as_ref().unwrap().shared_cores.unwrap();
        assert_eq!(
            shared.ranks(&cluster),
            cluster.nodes * cluster.gpus_per_node
        );
        cluster.nodes = 4;
        cluster.gpus_per_node = 1;
        assert_eq!(shared.ranks(&cluster), 4);
        let per_node = SharedCores {
            one_host: false,
            ..shared
        };
        assert_eq!(per_node.ranks(&cluster), 1);
    }

    #[test]
    fn a_queue_larger_than_any_connection_holds_is_rejected_by_name() {
        let mut cluster = Cluster::load("v100-tcp", ClusterOverrides::default()).unwrap();
        cluster.library.tcp_mut().unwrap().queue_behind_bytes = Some(2 << 20);
        assert!(cluster.validate("t").is_ok());
        cluster.library.tcp_mut().unwrap().queue_behind_bytes = Some(limits::MAX_QUEUE_BYTES + 1);
        let err = cluster.validate("t").unwrap_err().to_string();
        assert!(err.contains("library.queue_behind_bytes"), "{err}");
    }
}
