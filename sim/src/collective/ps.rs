//! Parameter-server push/pull of one piece to the one server that owns it: the workers' nodes
//! push their payload to the server's link and pull the result back from it, at the transport's
//! goodput (as the cluster's collectives see it), with incast and the server's per-peer costs.

use super::{Estimate, Group, Links, Protocol, ServerLink};
use crate::base::error::{Result, SimError};
use crate::base::time::SimTime;
use crate::collective_op::{Algorithm, Op};
use crate::inputs::topology::{Cluster, Transport};

/// Goodput lost per concurrent sender into one receiver over TCP. Synchronized senders overflow
/// the switch port's buffer and time out ("TCP incast", Vasudevan et al., SIGCOMM 2009); this
/// linear loss is an estimate, not a measurement. RDMA fabrics are modeled without it.
const TCP_INCAST_LOSS_PER_SENDER: f64 = 0.01;

/// Messages per push or pull: a payload's length, then the payload (variable-size payloads
/// need their length first: `syncopate.torch`'s and the MPI backend's point-to-point pushes
/// send both, as ps-lite sends a key/value message's metadata apart from its data).
const MESSAGES_PER_TRANSFER: f64 = 2.0;

/// A piece's push-pull round: the payload of `bytes` from every one of the cluster's nodes
/// (already summed inside the node) to the server at `server`, then the server's result back.
/// A piece belongs to one server whole (BytePS and ByteScheduler assign each partition's key to
/// one server); concurrent pieces on other servers share the links as `links` says.
pub fn push_pull(cluster: &Cluster, bytes: u64, server: ServerLink) -> Result<(Estimate, Links)> {
    let nodes = cluster.nodes;
    // The nodes whose payload crosses the network to the server.
    let senders = match server {
        ServerLink::Node(node) if node >= nodes => {
            return Err(SimError::bad_value(
                "parameter server",
                format!("node {node}"),
                format!("the cluster has {nodes} nodes"),
            ))
        }
        ServerLink::Node(_) => nodes - 1,
        ServerLink::Dedicated(_) => nodes,
    };
    let protocol = match cluster.inter_node.transport {
        Transport::Tcp => Protocol::Tcp,
        Transport::Ib | Transport::Roce => Protocol::Simple,
    };
    if senders == 0 {
        // A single node serves itself: nothing crosses the network.
        let estimate = Estimate {
            time: SimTime::ZERO,
            algorithm: Algorithm::ParameterServer,
            protocol,
            fixed: SimTime::ZERO,
            delay_with_compute: SimTime::ZERO,
        };
        return Ok((estimate, Links::Every));
    }
    // One server or worker process per node drives its NICs, at the library's efficiency.
    let node_bytes_per_us = super::node_goodput_bytes_per_us(cluster, 1);
    let peers = f64::from(senders);
    let incast = match cluster.inter_node.transport {
        Transport::Tcp => 1.0 + TCP_INCAST_LOSS_PER_SENDER * (peers - 1.0),
        Transport::Ib | Transport::Roce => 1.0,
    };
    // The server's link carries every sender's payload in (push), then out (pull); each
    // sender's link carries one payload, 1/senders of the server's.
    let per_phase_us = peers * bytes as f64 / node_bytes_per_us * incast;
    // A server takes its peers' messages one after the other, each at the TCP library's
    // point-to-point cost (fitted to a push-pull sweep, else a collective's call and message);
    // an RDMA library's are in its rate.
    let fixed_us = cluster.library.tcp().map_or(0.0, |p| {
        let per_message = p
            .p2p_message_overhead_us
            .unwrap_or(p.call_overhead_us + p.message_overhead_us);
        per_message * MESSAGES_PER_TRANSFER * peers
    });
    // A GPU worker's payload leaves its device before the push and the result returns after
    // the pull, as an allreduce's buffer does; no link carries the copies. The node's payload
    // is reduced inside the node first, so one rank of the node copies it.
    let staging_us = super::staging_us(cluster, Op::Allreduce, bytes, Group { ranks: 1, nodes: 1 });
    let latency_us = cluster.inter_node.latency_us;
    let estimate = Estimate {
        time: SimTime::from_us(2.0 * (latency_us + fixed_us + per_phase_us) + staging_us),
        algorithm: Algorithm::ParameterServer,
        protocol,
        fixed: SimTime::from_us(2.0 * (latency_us + fixed_us) + staging_us),
        delay_with_compute: SimTime::ZERO,
    };
    let links = Links::Server { server, senders };
    Ok((estimate, links))
}
