//! MPI over TCP (Horovod's MPI backend, GRACE's testbed): Hockney α–β–γ costs of the classic
//! MPI collective algorithms, the fastest of which is taken.
//!
//! OpenMPI's `tuned` component switches between these algorithms by message size and rank
//! count with fixed rules; taking the cheapest predicted one follows the same switch points
//! wherever its rules are close to optimal (Thakur, Rabenseifner & Gropp, IJHPCA 2005).

use super::{Estimate, Group, Protocol};
use crate::base::time::SimTime;
use crate::collective_op::{Algorithm, Op, MPI_ALLREDUCE_ALGORITHMS};
use crate::inputs::topology::{Cluster, TcpParams};

/// The Hockney terms of a TCP library's collective over `group`, in µs.
#[derive(Clone, Copy)]
pub(super) struct Hockney {
    /// Per message: software overhead plus one network hop.
    pub alpha: f64,
    /// Per byte sent by one rank.
    pub beta: f64,
    /// Per byte reduced.
    pub gamma: f64,
}

/// Bytes of host-memory traffic per byte: a copy between ranks reads the sender's buffer and
/// writes the receiver's; a reduction reads two operands and writes one; a staging copy is
/// the DMA's read or write plus the host fusion buffer's memcpy (a read and a write).
const COPY_TRAFFIC: f64 = 2.0;
const REDUCE_TRAFFIC: f64 = 3.0;
const STAGING_TRAFFIC: f64 = 3.0;

/// µs per byte when each of `ranks` moves bytes at `own` GB/s and all of them together
/// `traffic` bytes of host memory per byte through `host` GB/s.
fn shared_us_per_byte(own: f64, ranks: u32, traffic: f64, host: f64) -> f64 {
    (1.0 / own).max(f64::from(ranks) * traffic / host) / 1e3
}

impl Hockney {
    pub(super) fn of(cluster: &Cluster, params: &TcpParams, group: Group) -> Hockney {
        // Ranks of one node exchange through shared memory where the library does.
        if let (1, Some(shared)) = (group.nodes, params.shared_memory) {
            let host = shared.host_memory_gbytes_per_s;
            return Hockney {
                alpha: params.message_overhead_us,
                beta: shared_us_per_byte(shared.copy_gbytes_per_s, group.ranks, COPY_TRAFFIC, host),
                gamma: shared_us_per_byte(
                    params.reduce_gbytes_per_s,
                    group.ranks,
                    REDUCE_TRAFFIC,
                    host,
                ),
            };
        }
        // Every rank of a node shares the node's NICs; a rank's TCP path may move less.
        let ranks_per_node = group.ranks_per_node().max(1);
        Hockney {
            alpha: params.message_overhead_us + cluster.inter_node.latency_us,
            beta: f64::from(ranks_per_node)
                / super::node_goodput_bytes_per_us(cluster, ranks_per_node),
            gamma: 1.0 / (params.reduce_gbytes_per_s * 1e3),
        }
    }
}

/// What a GPU host's copies between device and host memory add to `op` on `bytes` over `group`
/// (µs): the busiest rank's input copied off the device before the call and its output copied
/// back after it (`host_staging_gbytes_per_s`); 0 where the library reads the buffers in place.
/// Neither copy uses the network, so it is part of the collective's fixed time. Where the
/// node's ranks share its host memory (`shared_memory`), they stage at once and share it.
pub(super) fn staging_us(params: &TcpParams, op: Op, bytes: u64, group: Group) -> f64 {
    let (off, back) = staging_split_us(params, op, bytes, group);
    off + back
}

/// The host staging of `op` on `bytes` over `group` (µs): the copy off the device before the
/// call and the copy back after it, apart.
pub fn staging_split_us(params: &TcpParams, op: Op, bytes: u64, group: Group) -> (f64, f64) {
    let Some(rate) = params.host_staging_gbytes_per_s else {
        return (0.0, 0.0);
    };
    let us_per_byte = match params.shared_memory {
        Some(shared) => shared_us_per_byte(
            rate,
            group.ranks_per_node(),
            STAGING_TRAFFIC,
            shared.host_memory_gbytes_per_s,
        ),
        None => 1.0 / (rate * 1e3),
    };
    let s = bytes as f64;
    let block = s / f64::from(group.ranks.max(1));
    // Sizes as `Op` reads them: the per-rank buffer, or the gathered one for allgather and
    // reduce-scatter.
    let (off, back) = match op {
        Op::Allreduce | Op::Reduce | Op::Alltoall => (s, s),
        Op::Allgather => (block, s),
        Op::ReduceScatter => (s, block),
        Op::Broadcast => (0.0, s),
    };
    (off * us_per_byte, back * us_per_byte)
}

pub(super) fn estimate(
    cluster: &Cluster,
    params: &TcpParams,
    op: Op,
    bytes: u64,
    group: Group,
) -> Estimate {
    if group.ranks == 1 {
        return pick(vec![(0.0, 0.0, Algorithm::Local)]);
    }
    let hockney = Hockney::of(cluster, params, group);
    // Each algorithm's time, and its fixed part: the same terms with no byte on the links.
    let priced = |network: f64| {
        let Hockney { alpha, beta, gamma } = hockney;
        candidates(op, group, bytes, alpha, beta * network, gamma)
    };
    let call = params.call_overhead_us + staging_us(params, op, bytes, group);
    // The allreduce a cluster pins runs at every size; otherwise the cheapest runs.
    let pinned = match op {
        // (A pin that is not one of them, which validation refuses, is ignored, not a panic.)
        Op::Allreduce => params
            .allreduce_algorithm
            .filter(|a| MPI_ALLREDUCE_ALGORITHMS.contains(a)),
        _ => None,
    };
    pick(
        priced(1.0)
            .into_iter()
            .zip(priced(0.0))
            .filter(|((_, algorithm), _)| pinned.is_none_or(|p| p == *algorithm))
            .map(|((time, algorithm), (fixed, _))| (call + time, call + fixed, algorithm))
            .collect(),
    )
}

/// Every algorithm's time (µs) for `op` on `bytes` over `group` with these Hockney terms.
fn candidates(
    op: Op,
    group: Group,
    bytes: u64,
    alpha: f64,
    beta: f64,
    gamma: f64,
) -> Vec<(f64, Algorithm)> {
    let n = group.ranks as f64;
    let s = bytes as f64;
    let log_n = n.log2().ceil();
    let frac = (n - 1.0) / n;
    match op {
        Op::Allreduce => vec![
            (
                log_n * (alpha + s * beta + s * gamma),
                Algorithm::RecursiveDoubling,
            ),
            (
                2.0 * (n - 1.0) * alpha + 2.0 * frac * s * beta + frac * s * gamma,
                Algorithm::Ring,
            ),
            // Non-power-of-two counts pay one extra exchange to fold the remainder ranks.
            (
                2.0 * log_n * alpha
                    + 2.0 * frac * s * beta
                    + frac * s * gamma
                    + fold_cost(n, alpha, s, beta),
                Algorithm::Rabenseifner,
            ),
        ],
        Op::Allgather => vec![
            ((n - 1.0) * alpha + frac * s * beta, Algorithm::Ring),
            (
                log_n * alpha + frac * s * beta,
                Algorithm::RecursiveDoubling,
            ),
        ],
        Op::ReduceScatter => vec![(
            (n - 1.0) * alpha + frac * s * (beta + gamma),
            Algorithm::Ring,
        )],
        Op::Broadcast => vec![
            (log_n * (alpha + s * beta), Algorithm::Tree),
            // Scatter then ring allgather, for large messages.
            (
                (log_n + n - 1.0) * alpha + 2.0 * frac * s * beta,
                Algorithm::Ring,
            ),
        ],
        Op::Reduce => vec![(log_n * (alpha + s * beta + s * gamma), Algorithm::Tree)],
        Op::Alltoall => vec![((n - 1.0) * alpha + frac * s * beta, Algorithm::P2p)],
    }
}

fn fold_cost(n: f64, alpha: f64, s: f64, beta: f64) -> f64 {
    let power_of_two = (n as u64).is_power_of_two();
    if power_of_two {
        0.0
    } else {
        2.0 * (alpha + s * beta)
    }
}

/// The fastest of `candidates` (µs, its fixed part in µs, algorithm), over TCP.
pub(super) fn pick(candidates: Vec<(f64, f64, Algorithm)>) -> Estimate {
    let (time_us, fixed_us, algorithm) = candidates
        .into_iter()
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .expect("every operation has at least one algorithm");
    Estimate {
        time: SimTime::from_us(time_us),
        algorithm,
        protocol: Protocol::Tcp,
        fixed: SimTime::from_us(fixed_us),
        delay_with_compute: SimTime::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use crate::calibrate::tcp_fit::parametric;
    use crate::collective::{estimate, Estimate, Group};
    use crate::collective_op::{Algorithm, Op};
    use crate::inputs::topology::{Cluster, ClusterOverrides};

    #[test]
    fn a_pinned_allreduce_runs_at_every_size_and_only_on_mpi() {
        let mut cluster = Cluster::load("v100-tcp", ClusterOverrides::default()).unwrap();
        let world = Group::world(&cluster);
        let chosen = |cluster: &Cluster, bytes| {
            estimate(cluster, Op::Allreduce, bytes, world)
                .unwrap()
                .algorithm
        };
        // Unpinned, small messages take fewer rounds than the ring's.
        assert_ne!(chosen(&cluster, 4 << 10), Algorithm::Ring);
        cluster.library.tcp_mut().unwrap().allreduce_algorithm = Some(Algorithm::Ring);
        assert!(cluster.validate("c.json").is_ok());
        for bytes in [4 << 10, 1 << 20, 256 << 20] {
            assert_eq!(chosen(&cluster, bytes), Algorithm::Ring, "{bytes}");
        }
        // Other operations keep their cheapest algorithm.
        let allgather = estimate(&cluster, Op::Allgather, 4 << 10, world).unwrap();
        assert_eq!(allgather.algorithm, Algorithm::RecursiveDoubling);
        let mut tree = cluster.clone();
        tree.library.tcp_mut().unwrap().allreduce_algorithm = Some(Algorithm::Tree);
        let err = tree.validate("c.json").unwrap_err().to_string();
        assert!(err.contains("library.allreduce_algorithm"), "{err}");
        let params = cluster.library.tcp().unwrap().clone();
        cluster.library = crate::inputs::topology::Library::Gloo(params);
        let err = cluster.validate("c.json").unwrap_err().to_string();
        assert!(err.contains("library.allreduce_algorithm"), "{err}");
    }

    #[test]
    fn the_fixed_part_is_what_a_faster_link_leaves() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../experiments/lab-validation/clusters/lab-4n-1g.json"
        );
        let mut lab = parametric(&Cluster::load(path, ClusterOverrides::default()).unwrap());
        lab.library.tcp_mut().unwrap().host_gbps = None;
        let mut faster = lab.clone();
        faster.inter_node.nic_bandwidth_gbps *= 10.0;
        let world = Group::world(&lab);
        for op in [Op::Allreduce, Op::Allgather, Op::ReduceScatter, Op::Reduce] {
            let slow = estimate(&lab, op, 4 << 20, world).unwrap();
            let fast = estimate(&faster, op, 4 << 20, world).unwrap();
            assert_eq!(slow.algorithm, fast.algorithm, "{op}");
            assert!(
                slow.fixed > crate::base::time::SimTime::ZERO,
                "{op}: {slow:?}"
            );
            assert!(slow.fixed < slow.time && fast.time < slow.time, "{op}");
            assert_eq!(slow.fixed, fast.fixed, "{op}");
        }
    }

    #[test]
    fn host_staging_adds_its_copies_to_the_fixed_part_of_collectives_and_push_pulls() {
        let mut mpi = Cluster::load("v100-tcp", ClusterOverrides::default()).unwrap();
        let world = Group::world(&mpi);
        let mut gloo = mpi.clone();
        gloo.library = crate::inputs::topology::Library::Gloo(mpi.library.tcp().unwrap().clone());
        let bytes: u64 = 64 << 20;
        let n = f64::from(world.ranks);
        // Per byte of the buffer: the input off the device and the output back at 4 GB/s.
        let copied = [
            (Op::Allreduce, 2.0),
            (Op::Allgather, 1.0 + 1.0 / n),
            (Op::ReduceScatter, 1.0 + 1.0 / n),
            (Op::Broadcast, 1.0),
        ];
        // What staging added to an estimate's time and to its fixed part: both the copies.
        let adds = |without: Estimate, with: Estimate, per_byte: f64, what: &str| {
            let expected_us = per_byte * bytes as f64 / 4e3;
            for (after, before) in [(with.time, without.time), (with.fixed, without.fixed)] {
                let added_us = (after.as_ns() - before.as_ns()) as f64 / 1e3;
                assert!(
                    (added_us / expected_us - 1.0).abs() < 1e-6,
                    "{what}: {added_us}"
                );
            }
        };
        for cluster in [&mut mpi, &mut gloo] {
            let plain = cluster.clone();
            cluster.library.tcp_mut().unwrap().host_staging_gbytes_per_s = Some(4.0);
            assert!(cluster.validate("c.json").is_ok());
            for (op, per_byte) in copied {
                let without = estimate(&plain, op, bytes, world).unwrap();
                let with = estimate(cluster, op, bytes, world).unwrap();
                adds(without, with, per_byte, op.name());
            }
            // A parameter server's push-pull copies like an allreduce.
            let server = crate::collective::ServerLink::Node(0);
            let (without, _) = crate::collective::ps::push_pull(&plain, bytes, server).unwrap();
            let (with, _) = crate::collective::ps::push_pull(cluster, bytes, server).unwrap();
            adds(without, with, 2.0, "push-pull");
            for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
                cluster.library.tcp_mut().unwrap().host_staging_gbytes_per_s = Some(bad);
                let err = cluster.validate("c.json").unwrap_err().to_string();
                assert!(err.contains("library.host_staging_gbytes_per_s"), "{err}");
            }
        }
    }

    #[test]
    fn ranks_of_one_node_share_its_host_memory_not_its_nics() {
        let cluster = Cluster::load("v100-pcie-mpi", ClusterOverrides::default()).unwrap();
        let params = cluster.library.tcp().unwrap().clone();
        let shared = params.shared_memory.unwrap();
        let host = shared.host_memory_gbytes_per_s;
        // Each rank copies at most at one core's pace, and all of them together at most at
        // what the host moves (2 bytes of traffic per byte copied, 3 per byte reduced).
        for ranks in [2, 4, 8] {
            let n = f64::from(ranks);
            let terms = super::Hockney::of(&cluster, &params, Group { ranks, nodes: 1 });
            let copy = (1.0 / shared.copy_gbytes_per_s).max(n * 2.0 / host) / 1e3;
            let reduce = (1.0 / params.reduce_gbytes_per_s).max(n * 3.0 / host) / 1e3;
            assert!((terms.beta - copy).abs() < 1e-12, "{ranks}");
            assert!((terms.gamma - reduce).abs() < 1e-12, "{ranks}");
        }
        let eight = super::Hockney::of(&cluster, &params, Group { ranks: 8, nodes: 1 });
        assert!(eight.beta > 1.0 / (shared.copy_gbytes_per_s * 1e3));
        // No network hop inside the node, and a faster NIC changes nothing there.
        assert_eq!(eight.alpha, params.message_overhead_us);
        let mut faster = cluster.clone();
        faster.inter_node.nic_bandwidth_gbps *= 100.0;
        let world = Group::world(&cluster);
        for op in [Op::Allreduce, Op::Allgather] {
            let slow = estimate(&cluster, op, 64 << 20, world).unwrap();
            assert_eq!(
                slow,
                estimate(&faster, op, 64 << 20, world).unwrap(),
                "{op}"
            );
        }
        // The node's ranks stage together, so each moves its copies slower than one alone.
        let staged =
            |ranks| super::staging_us(&params, Op::Allreduce, 1 << 20, Group { ranks, nodes: 1 });
        assert!(staged(8) > staged(2));
    }

    #[test]
    fn shared_memory_is_an_mpi_transport_with_positive_rates() {
        let cluster = Cluster::load("v100-pcie-mpi", ClusterOverrides::default()).unwrap();
        let mut gloo = cluster.clone();
        gloo.library =
            crate::inputs::topology::Library::Gloo(cluster.library.tcp().unwrap().clone());
        let err = gloo.validate("c.json").unwrap_err().to_string();
        assert!(err.contains("library.shared_memory"), "{err}");
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut broken = cluster.clone();
            let shared = broken
                .library
                .tcp_mut()
                .unwrap()
                .shared_memory
                .as_mut()
                .unwrap();
            shared.host_memory_gbytes_per_s = bad;
            let err = broken.validate("c.json").unwrap_err().to_string();
            assert!(
                err.contains("library.shared_memory.host_memory_gbytes_per_s"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_hierarchical_allreduce_stages_its_buffer_once() {
        let overrides = ClusterOverrides {
            nodes: Some(2),
            gpus_per_node: Some(4),
            inter_gbps: None,
        };
        let cluster = Cluster::load("v100-pcie-mpi", overrides).unwrap();
        let bare = crate::collective::without_staging(&cluster);
        let bytes: u64 = 64 << 20;
        let with = crate::collective::estimate_hierarchical_allreduce(&cluster, bytes).unwrap();
        let without = crate::collective::estimate_hierarchical_allreduce(&bare, bytes).unwrap();
        let params = cluster.library.tcp().unwrap();
        let once = super::staging_us(params, Op::Allreduce, bytes, Group::world(&cluster));
        for (after, before) in [(with.time, without.time), (with.fixed, without.fixed)] {
            let added_us = (after.as_ns() - before.as_ns()) as f64 / 1e3;
            assert!((added_us / once - 1.0).abs() < 1e-6, "{added_us} vs {once}");
        }
    }
}
