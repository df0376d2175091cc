//! What a collective is: its operation, and the algorithms libraries run it with.
//!
//! Cluster files name them (an MPI cluster's pinned allreduce, the operation a lab's sweep
//! measured), so they sit below `topology`; `collective` prices them.

use crate::base::error::{Result, SimError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A collective operation. Sizes follow nccl-tests: allreduce, broadcast and reduce take the
/// per-rank buffer; allgather, reduce-scatter and alltoall take the total (gathered) buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Every rank ends with the elementwise sum of all ranks' buffers.
    Allreduce,
    /// Every rank ends with the concatenation of all ranks' buffers.
    Allgather,
    /// Every rank ends with its own shard of the elementwise sum.
    ReduceScatter,
    /// One root's buffer is copied to every rank.
    Broadcast,
    /// The elementwise sum of all ranks' buffers lands on one root.
    Reduce,
    /// Every rank sends a distinct shard to every other rank.
    Alltoall,
}

impl Op {
    /// Every operation, in the order names are listed and parsed.
    pub const ALL: [Op; 6] = [
        Op::Allreduce,
        Op::Allgather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::Reduce,
        Op::Alltoall,
    ];

    /// The operation's kebab-case name, as parsed and serialized ("reduce-scatter").
    pub fn name(self) -> &'static str {
        match self {
            Op::Allreduce => "allreduce",
            Op::Allgather => "allgather",
            Op::ReduceScatter => "reduce-scatter",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::Alltoall => "alltoall",
        }
    }

    /// nccl-tests' factor from algorithm bandwidth to bus bandwidth, which makes the bus
    /// bandwidth comparable with the hardware's link speed whatever the rank count.
    pub fn bus_factor(self, ranks: u32) -> f64 {
        let n = ranks as f64;
        if ranks <= 1 {
            return 0.0;
        }
        match self {
            Op::Allreduce => 2.0 * (n - 1.0) / n,
            Op::Allgather | Op::ReduceScatter | Op::Alltoall => (n - 1.0) / n,
            Op::Broadcast | Op::Reduce => 1.0,
        }
    }
}

impl std::str::FromStr for Op {
    type Err = SimError;
    fn from_str(text: &str) -> Result<Op> {
        Op::ALL
            .into_iter()
            .find(|op| op.name() == text)
            .ok_or_else(|| {
                SimError::bad_value(
                    "collective operation",
                    text,
                    format!("valid operations: {}", Op::ALL.map(Op::name).join(", ")),
                )
            })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which algorithm the library runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// A single rank: a device-local copy.
    Local,
    /// A ring through every rank.
    Ring,
    /// A tree of ranks (for NCCL, a chain in each node and a double binary tree across nodes).
    Tree,
    /// NVLink SHARP: reduction inside the NVSwitch.
    Nvls,
    /// Grouped point-to-point sends and receives (alltoall).
    P2p,
    /// MPI recursive doubling.
    RecursiveDoubling,
    /// MPI reduce-scatter + allgather (Rabenseifner).
    Rabenseifner,
    /// Intra-node reduce-scatter, inter-node allreduce, intra-node allgather.
    Hierarchical,
    /// Parameter-server push and pull.
    ParameterServer,
}

impl Algorithm {
    /// The algorithm's short name ("rec-doubling", "ps").
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Local => "local",
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Nvls => "nvls",
            Algorithm::P2p => "p2p",
            Algorithm::RecursiveDoubling => "rec-doubling",
            Algorithm::Rabenseifner => "rabenseifner",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::ParameterServer => "ps",
        }
    }
}

/// The allreduce algorithms the MPI cost model prices, which a cluster may pin one of
/// (`library.allreduce_algorithm`).
pub const MPI_ALLREDUCE_ALGORITHMS: [Algorithm; 3] = [
    Algorithm::Ring,
    Algorithm::RecursiveDoubling,
    Algorithm::Rabenseifner,
];
