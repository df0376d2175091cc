//! Parameter-server push/pull: workers send their gradient shards to servers and fetch the
//! aggregated result, limited by the worker's and the server's links (at the transport's
//! goodput, as the cluster's collectives see them) and by incast.

use super::{Algorithm, Estimate, Protocol};
use crate::error::{Result, SimError};
use crate::time::SimTime;
use crate::topology::{Cluster, Transport};

/// Where the parameter servers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerPlacement {
    /// One server process on every worker node, sharing its NICs (BytePS colocated mode).
    Colocated,
    /// `servers` dedicated machines with the cluster's NIC configuration.
    Dedicated { servers: u32 },
}

/// Goodput lost per concurrent sender into one receiver over TCP. Synchronized senders overflow
/// the switch port's buffer and time out ("TCP incast", Vasudevan et al., SIGCOMM 2009); this
/// linear loss is an estimate, not a measurement. RDMA fabrics are modeled without it.
const TCP_INCAST_LOSS_PER_SENDER: f64 = 0.01;

/// Messages per push or pull: a payload's length, then the payload (variable-size payloads
/// need their length first: `syncopate.torch`'s and the MPI backend's point-to-point pushes
/// send both, as ps-lite sends a key/value message's metadata apart from its data).
const MESSAGES_PER_TRANSFER: f64 = 2.0;

/// Push `bytes` from each of `workers` nodes to the servers and pull the aggregate back.
/// Each server owns `1/servers` of every tensor; push and pull of one tensor run back to back.
pub fn ps_push_pull(
    cluster: &Cluster,
    bytes: u64,
    workers: u32,
    placement: ServerPlacement,
) -> Result<Estimate> {
    if workers == 0 {
        return Err(SimError::bad_value(
            "parameter-server workers",
            workers,
            "need at least one worker",
        ));
    }
    let servers = match placement {
        ServerPlacement::Colocated => workers,
        ServerPlacement::Dedicated { servers } if servers > 0 => servers,
        ServerPlacement::Dedicated { servers } => {
            return Err(SimError::bad_value(
                "parameter servers",
                servers,
                "need at least one server",
            ))
        }
    };
    // One server or worker process per node drives its NICs, at the library's efficiency.
    let node_bytes_per_us = super::node_goodput_bytes_per_us(cluster, 1);
    let s = bytes as f64;
    let (k, w) = (servers as f64, workers as f64);
    // Traffic that crosses the network, per direction, for one push (pulls mirror it).
    let (worker_bytes, server_bytes) = match placement {
        // The local shard stays on the node.
        ServerPlacement::Colocated => (s * (k - 1.0) / k, s * (w - 1.0) / k),
        ServerPlacement::Dedicated { .. } => (s, s * w / k),
    };
    let incast = match cluster.inter_node.transport {
        Transport::Tcp => 1.0 + TCP_INCAST_LOSS_PER_SENDER * (w - 1.0).max(0.0),
        Transport::Ib | Transport::Roce => 1.0,
    };
    // In colocated mode a node both sends its pushes and receives others' in the same direction
    // budget of a full-duplex NIC: outgoing pushes and outgoing pulls share the uplink.
    let per_phase_us = match placement {
        ServerPlacement::Colocated => {
            (worker_bytes + server_bytes) / 2.0 / node_bytes_per_us * incast
        }
        ServerPlacement::Dedicated { .. } => {
            (worker_bytes / node_bytes_per_us).max(server_bytes / node_bytes_per_us * incast)
        }
    };
    // A server takes its peers' messages one after the other, each at the TCP library's fixed
    // costs (a call and a message); an RDMA library's are in its rate.
    let peers = match placement {
        ServerPlacement::Colocated => w - 1.0,
        ServerPlacement::Dedicated { .. } => w,
    };
    let fixed_us = cluster.library.tcp().map_or(0.0, |p| {
        (p.call_overhead_us + p.message_overhead_us) * MESSAGES_PER_TRANSFER * peers.max(1.0)
    });
    let latency_us = cluster.inter_node.latency_us;
    Ok(Estimate {
        time: SimTime::from_us(2.0 * (latency_us + fixed_us + per_phase_us)),
        algorithm: Algorithm::ParameterServer,
        protocol: match cluster.inter_node.transport {
            Transport::Tcp => Protocol::Tcp,
            Transport::Ib | Transport::Roce => Protocol::Simple,
        },
    })
}
