//! The task graph of K training iterations of one rank: forward and backward compute per tensor,
//! compression encode/decode, collectives and the optimizer step, with their dependencies.

use crate::collective::Estimate;
use crate::time::SimTime;
use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};

/// Where a task runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// The rank's compute stream: forward, backward, optimizer (program order).
    Compute,
    /// The rank's compression stream on the GPU: encode and decode kernels.
    Codec,
    /// The rank's CPU: compression on the host.
    Cpu,
    /// A communication stream: collectives span every rank and start when all are ready.
    Comm,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::Compute => "compute",
            Resource::Codec => "codec",
            Resource::Cpu => "cpu",
            Resource::Comm => "comm",
        }
    }
}

/// What a task does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskKind {
    Forward {
        tensor: u32,
    },
    Backward {
        tensor: u32,
    },
    Encode {
        group: u32,
        part: u32,
    },
    Collective {
        group: u32,
        part: u32,
        round: u32,
    },
    Decode {
        group: u32,
        part: u32,
    },
    /// The optimizer step of the whole model after every group is synchronized.
    Optimizer,
    /// The optimizer step of one group's parameters, just before their next forward
    /// (strategies that overlap synchronization with the next forward pass).
    Update {
        group: u32,
    },
}

/// One task of one iteration, before noise and contention.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub kind: TaskKind,
    pub iteration: u32,
    pub resource: Resource,
    pub duration: SimTime,
    /// Payload bytes per rank (collectives, encode output), for traces.
    pub bytes: u64,
    /// For collectives: the predicted algorithm and protocol.
    pub estimate: Option<Estimate>,
    /// For collectives: where it stands in the launch order.
    pub launch_key: LaunchKey,
}

/// Launch order of a collective. Plan order sorts by (iteration, phase, position); the priority
/// policy puts `priority` first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LaunchKey {
    pub priority: i64,
    pub iteration: u32,
    /// 0: synchronization during backward; 1: DeAR's all-gathers before the next forward.
    pub phase: u8,
    pub position: u32,
}

impl LaunchKey {
    pub fn plan_order(&self) -> (u32, u8, u32) {
        (self.iteration, self.phase, self.position)
    }
}

/// The graph and the compact successor lists the engine walks.
pub struct TaskGraph {
    pub graph: DiGraph<Task, ()>,
    pub iterations: u32,
    /// Successors of each task (CSR layout: `succ_start[i]..succ_start[i+1]` in `succ`).
    succ_start: Vec<u32>,
    succ: Vec<u32>,
    /// Number of predecessors of each task.
    pub indegree: Vec<u32>,
    /// The optimizer task of each iteration: its end closes the iteration.
    pub iteration_end: Vec<u32>,
}

impl TaskGraph {
    /// Freezes a built graph: checks it is acyclic and lays out successor lists.
    pub fn freeze(
        graph: DiGraph<Task, ()>,
        iterations: u32,
        iteration_end: Vec<NodeIndex>,
    ) -> TaskGraph {
        debug_assert!(
            toposort(&graph, None).is_ok(),
            "a task graph must be acyclic"
        );
        let n = graph.node_count();
        // Successor lists in CSR layout by counting sort over the edges: no allocation per node.
        let mut indegree = vec![0u32; n];
        let mut succ_start = vec![0u32; n + 1];
        for edge in graph.raw_edges() {
            succ_start[edge.source().index() + 1] += 1;
            indegree[edge.target().index()] += 1;
        }
        for i in 0..n {
            succ_start[i + 1] += succ_start[i];
        }
        let mut fill = succ_start.clone();
        let mut succ = vec![0u32; graph.edge_count()];
        for edge in graph.raw_edges() {
            let slot = &mut fill[edge.source().index()];
            succ[*slot as usize] = edge.target().index() as u32;
            *slot += 1;
        }
        TaskGraph {
            graph,
            iterations,
            succ_start,
            succ,
            indegree,
            iteration_end: iteration_end
                .into_iter()
                .map(|n| n.index() as u32)
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.indegree.len()
    }

    pub fn is_empty(&self) -> bool {
        self.indegree.is_empty()
    }

    pub fn task(&self, index: u32) -> &Task {
        &self.graph[NodeIndex::new(index as usize)]
    }

    pub fn successors(&self, index: u32) -> &[u32] {
        &self.succ
            [self.succ_start[index as usize] as usize..self.succ_start[index as usize + 1] as usize]
    }
}
