//! Which network links a collective keeps busy.
//!
//! It also says how much slower concurrent collectives run when they share those links.

/// A parameter server's link: a worker node's own, or a dedicated server machine's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerLink {
    /// The link of worker node N, which also serves.
    Node(u32),
    /// The link of dedicated server machine N.
    Dedicated(u32),
}

/// The links a collective keeps busy while it runs alone.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Links {
    /// Both directions of every node's link, all of the time (rings, trees, allgathers).
    #[default]
    Every,
    /// A push-pull round to one server from `senders` nodes: the server's link carries every
    /// sender's payload in during the push and out during the pull, each direction busy half
    /// of the round; a sender's link carries one payload each way, 1/senders of that. Rounds
    /// to different servers mix their phases on a link (one's push beside another's pull);
    /// rounds to the same server push together and pull together, so they queue.
    Server {
        /// The server whose link the round goes through.
        server: ServerLink,
        /// Nodes whose payload crosses the network to the server.
        senders: u32,
    },
}

impl Links {
    /// Whether two collectives' messages travel over some of the same connections: every
    /// collective of `Every` does with any other; push-pulls only with those to the same
    /// server (a worker's messages to another server go over another socket).
    pub fn share_connections(self, other: Links) -> bool {
        match (self, other) {
            (Links::Server { server: a, .. }, Links::Server { server: b, .. }) => a == b,
            _ => true,
        }
    }
}

/// Share of the round each direction of the server's link is busy: the push fills its inbound
/// direction, the pull its outbound one.
const SERVER_DIRECTION_SHARE: f64 = 0.5;

impl Links {
    /// Load on a sending node's link, per direction.
    fn sender_load(senders: u32) -> f64 {
        SERVER_DIRECTION_SHARE / f64::from(senders.max(1))
    }
}

/// How many times slower than alone each of the concurrent collectives `active` runs (at least
/// 1). A link whose users' loads add up beyond its capacity slows every user in proportion,
/// and a collective runs at the pace of the most loaded link it uses. Collectives on every link
/// share them equally; push-pulls to different servers overlap where the links allow (in
/// BytePS, the pieces of a model spread over every server to use all the links), and at most
/// `push_pulls_at_once` of them run at full speed together when the hosts limit it
/// (`TcpParams::p2p_rounds_at_once`: a lab's nodes share one machine's kernel and cores).
pub fn shared_slowdowns(
    active: &[Links],
    push_pulls_at_once: Option<f64>,
    slowdowns: &mut Vec<f64>,
) {
    slowdowns.clear();
    let push_pulls = active
        .iter()
        .filter(|l| matches!(l, Links::Server { .. }))
        .count() as f64;
    let crowd = push_pulls_at_once.map_or(1.0, |at_once| push_pulls / at_once);
    // Load on a worker link that serves nothing, and each server link's load beyond it and
    // its rounds.
    let mut on_every = 0.0;
    let mut servers: Vec<(ServerLink, f64, f64)> = Vec::new();
    for links in active {
        match *links {
            Links::Every => on_every += 1.0,
            Links::Server { server, senders } => {
                let sender = Links::sender_load(senders);
                on_every += sender;
                // A serving node is no sender of its own piece.
                let extra = match server {
                    ServerLink::Node(_) => SERVER_DIRECTION_SHARE - sender,
                    ServerLink::Dedicated(_) => SERVER_DIRECTION_SHARE,
                };
                match servers.iter_mut().find(|(s, ..)| *s == server) {
                    Some((_, load, rounds)) => {
                        *load += extra;
                        *rounds += 1.0;
                    }
                    None => servers.push((server, extra, 1.0)),
                }
            }
        }
    }
    let busiest_node_extra = servers
        .iter()
        .filter(|(s, ..)| matches!(s, ServerLink::Node(_)))
        .map(|&(_, load, _)| load)
        .fold(0.0, f64::max);
    let worker_links = on_every + busiest_node_extra;
    slowdowns.extend(active.iter().map(|links| {
        let load = match *links {
            Links::Every => worker_links,
            Links::Server { server, .. } => {
                let (own, rounds) = servers
                    .iter()
                    .find(|(s, ..)| *s == server)
                    .map_or((0.0, 1.0), |&(_, load, rounds)| (load, rounds));
                match server {
                    ServerLink::Node(_) => worker_links,
                    ServerLink::Dedicated(_) => worker_links.max(own),
                }
                .max(rounds)
                .max(crowd)
            }
        };
        load.max(1.0)
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rates the collectives run at (1: as fast as alone).
    fn rates(active: &[Links]) -> Vec<f64> {
        rates_at_once(active, None)
    }

    fn rates_at_once(active: &[Links], at_once: Option<f64>) -> Vec<f64> {
        let mut slowdowns = Vec::new();
        shared_slowdowns(active, at_once, &mut slowdowns);
        slowdowns.iter().map(|s| 1.0 / s).collect()
    }

    fn at_node(node: u32, senders: u32) -> Links {
        Links::Server {
            server: ServerLink::Node(node),
            senders,
        }
    }

    #[test]
    fn collectives_on_every_link_share_them_equally() {
        assert_eq!(rates(&[Links::Every]), vec![1.0]);
        assert_eq!(rates(&[Links::Every; 4]), vec![0.25; 4]);
    }

    #[test]
    fn push_pulls_to_every_server_at_once_fill_the_links_without_slowing() {
        // 4 nodes, one piece per server: each link carries its own piece's half and a sixth
        // of each of the three others', per direction.
        let all: Vec<Links> = (0..4).map(|n| at_node(n, 3)).collect();
        assert!(rates(&all).iter().all(|&r| (r - 1.0).abs() < 1e-12));
        // Rounds to one server push together and pull together: they queue.
        let crowded = rates(&[at_node(0, 3), at_node(0, 3), at_node(0, 3)]);
        assert!(crowded.iter().all(|&r| (r - 1.0 / 3.0).abs() < 1e-12));
        // On 2 nodes, a round to each server: one's push is the other's pull's direction.
        assert_eq!(rates(&[at_node(0, 1), at_node(1, 1)]), vec![1.0, 1.0]);
        assert_eq!(rates(&[at_node(0, 1), at_node(0, 1)]), vec![0.5, 0.5]);
    }

    #[test]
    fn hosts_that_run_fewer_push_pulls_at_once_slow_them_alike() {
        let all: Vec<Links> = (0..4).map(|n| at_node(n, 3)).collect();
        let limited = rates_at_once(&all, Some(1.6));
        assert!(
            limited.iter().all(|&r| (r - 0.4).abs() < 1e-12),
            "{limited:?}"
        );
        // One alone runs at full speed; rings are not counted.
        assert_eq!(rates_at_once(&[at_node(0, 3)], Some(1.6)), vec![1.0]);
        assert_eq!(rates_at_once(&[Links::Every; 2], Some(1.6)), vec![0.5; 2]);
    }

    #[test]
    fn a_push_pull_beside_a_ring_waits_for_the_ring_on_every_link() {
        let r = rates(&[Links::Every, at_node(1, 3)]);
        let load = 1.0 + 0.5;
        assert!(r.iter().all(|&x| (x - 1.0 / load).abs() < 1e-12), "{r:?}");
    }

    #[test]
    fn dedicated_servers_load_their_own_links() {
        let server = |d| Links::Server {
            server: ServerLink::Dedicated(d),
            senders: 4,
        };
        assert_eq!(rates(&[server(0), server(1)]), vec![1.0, 1.0]);
        let same = rates(&[server(0), server(0), server(0)]);
        assert!(same.iter().all(|&r| (r - 1.0 / 3.0).abs() < 1e-12));
    }
}
