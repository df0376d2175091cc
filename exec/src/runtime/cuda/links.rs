//! One rank's NCCL communicators of one comm stream, and the hierarchical allreduce over them.
//!
//! Every stream has the world's communicator. Where the schedule runs a hierarchical allreduce,
//! two more are split from it: the rank's node, and the ranks at the same place in every node.
//! The allreduce is then what `cost.rs` prices and the host backend runs (`ring.rs`
//! `hierarchical_allreduce`): a reduce-scatter inside the node, an allreduce of the node's
//! share across nodes, an all-gather inside the node; only 1/per_node of the payload crosses
//! between nodes.

use super::nccl::Communicator;
use crate::error::{ExecError, Result};
use cudarc::driver::CudaViewMut;
use cudarc::nccl::NcclType;

/// The communicators of one comm stream.
pub(super) struct Links<'a> {
    /// Every rank.
    pub world: Communicator<'a>,
    /// The node's and the across-nodes communicators, when the schedule needs them.
    nodes: Option<Nodes<'a>>,
}

struct Nodes<'a> {
    /// The ranks of this rank's node, numbered by their place in it.
    inside: Communicator<'a>,
    /// The ranks at this rank's place in every node, numbered by node.
    across: Communicator<'a>,
}

impl<'a> Links<'a> {
    /// The world's communicator, and with `per_node` (nodes of that many consecutive ranks)
    /// the node's and the across-nodes ones split from it. Every rank opens its links in the
    /// same order, as splitting is collective over the world's communicator.
    pub(super) fn open(world: Communicator<'a>, per_node: Option<u32>) -> Result<Links<'a>> {
        let nodes = match per_node {
            None => None,
            Some(per_node) => {
                let (rank, ranks) = (world.rank(), world.world());
                if per_node == 0 || !ranks.is_multiple_of(per_node) {
                    return Err(ExecError::Cuda {
                        message: format!(
                            "a hierarchical allreduce needs nodes of equal size: {ranks} ranks in nodes of {per_node}"
                        ),
                    });
                }
                let inside = world.split(rank / per_node, rank % per_node, per_node)?;
                let across = world.split(rank % per_node, rank / per_node, ranks / per_node)?;
                Some(Nodes { inside, across })
            }
        };
        Ok(Links { world, nodes })
    }

    /// Ends every communicator after its last collective succeeded.
    pub(super) fn finish(self) -> Result<()> {
        if let Some(nodes) = self.nodes {
            nodes.inside.finish()?;
            nodes.across.finish()?;
        }
        self.world.finish()
    }

    /// Sums `payload` over every rank: the node reduce-scatters it, leaving this rank's share
    /// of the node's sum in `share` (1/per_node of it); the ranks holding the same share in
    /// every node allreduce it; the node all-gathers the summed shares back into `payload`.
    pub(super) fn hierarchical_allreduce<T: NcclType>(
        &self,
        payload: &mut CudaViewMut<'_, T>,
        share: &mut CudaViewMut<'_, T>,
    ) -> Result<()> {
        let Some(nodes) = &self.nodes else {
            return Err(ExecError::Cuda {
                message:
                    "a hierarchical allreduce ran on a stream opened without its node communicators"
                        .into(),
            });
        };
        nodes.inside.reduce_scatter_sum(payload, share)?;
        nodes.across.all_reduce_sum(share)?;
        nodes.inside.all_gather(share, payload)
    }
}
