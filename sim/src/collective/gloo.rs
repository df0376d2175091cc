//! Gloo over TCP: the algorithms gloo runs, priced with the TCP library's Hockney terms.
//!
//! Gloo is reached through torch.distributed on CPUs, as `syncopate.torch` calls it; the pricing
//! adds a fixed cost per call.
//!
//! torch's ProcessGroupGloo runs `gloo::allreduce` with its default ring: the buffer is cut
//! into segments of at most 1 MiB, at least two per rank and a whole number per rank, one
//! message per segment and step of a reduce-scatter and an all-gather (gloo/allreduce.cc,
//! `kMaxSegmentSize` in gloo/allreduce.h). `gloo::allgather` is a ring that sends each block
//! in two halves (gloo/allgather.cc). torch's gloo gathers equal sizes only, so
//! `syncopate.torch` gathers variable-size payloads in two calls, the sizes and then the
//! payloads padded to the largest (python/syncopate/torch/exchange.py); `python -m
//! syncopate.torch.sweep` times its allgather the same way, so the fitted costs hold for it.
//! Reduce-scatter, broadcast, reduce and alltoall are priced by their textbook algorithms
//! (ring, binomial tree, pairwise); no sweep here measures them. gloo's allgather moves large
//! messages slower than its allreduce, so it may have a host cap of its own
//! (`allgather_host_gbps`), fitted to the allgather rows of a sweep.

use super::mpi::{pick, staging_us, Hockney};
use super::{Estimate, Group};
use crate::collective_op::{Algorithm, Op};
use crate::inputs::topology::{Cluster, TcpParams};

/// gloo's `AllreduceOptions::kMaxSegmentSize`.
const MAX_SEGMENT_BYTES: u64 = 1 << 20;

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
    // The time, and its fixed part: the same terms with no byte on the links.
    let (time, algorithm) = priced(cluster, params, op, bytes, group, 1.0);
    let (fixed, _) = priced(cluster, params, op, bytes, group, 0.0);
    let staging = staging_us(params, op, bytes, group);
    pick(vec![(time + staging, fixed + staging, algorithm)])
}

/// The algorithm gloo runs and its time (µs), with `network` times the cost per byte on the
/// links.
fn priced(
    cluster: &Cluster,
    params: &TcpParams,
    op: Op,
    bytes: u64,
    group: Group,
    network: f64,
) -> (f64, Algorithm) {
    let n = group.ranks as f64;
    let s = bytes as f64;
    let frac = (n - 1.0) / n;
    let log_n = n.log2().ceil();
    let call = params.call_overhead_us;
    let Hockney { alpha, beta, gamma } = Hockney::of(cluster, params, group);
    let beta = beta * network;
    match op {
        Op::Allreduce => {
            let per_rank = segments_per_rank(bytes, group.ranks) as f64;
            let messages = 2.0 * (n - 1.0) * per_rank;
            (
                call + messages * alpha + 2.0 * frac * s * beta + frac * s * gamma,
                Algorithm::Ring,
            )
        }
        // The sizes' call (n 8-byte counts) before the payloads' ring of half-blocks, at the
        // allgather's own cap when it has one.
        Op::Allgather => {
            let beta = params
                .allgather_host_gbps
                .map_or(beta, |cap| beta.max(8.0 / (cap * 1e3) * network));
            (
                2.0 * (call + 2.0 * (n - 1.0) * alpha) + frac * s * beta,
                Algorithm::Ring,
            )
        }
        Op::ReduceScatter => {
            let per_rank = segments_per_rank(bytes, group.ranks) as f64;
            (
                call + (n - 1.0) * per_rank * alpha + frac * s * (beta + gamma),
                Algorithm::Ring,
            )
        }
        Op::Broadcast => (call + log_n * (alpha + s * beta), Algorithm::Tree),
        Op::Reduce => (call + log_n * (alpha + s * (beta + gamma)), Algorithm::Tree),
        Op::Alltoall => (call + (n - 1.0) * alpha + frac * s * beta, Algorithm::P2p),
    }
}

/// What gloo's float16 sums add to an allreduce or reduce-scatter of `bytes` of float16 over
/// `group` (µs), at `params.fp16_sum_ns_per_element` a summed element: gloo sums float16 in
/// software, several times slower than it sums floats. Its ring sums a segment while the next
/// arrives, so on a link slower than the sums only the sums on the ring's path are left over,
/// one segment per step of the reduce-scatter; on a faster one, what the reduce-scatter's
/// transfer does not cover.
pub(super) fn fp16_sums_us(
    cluster: &Cluster,
    params: &TcpParams,
    op: Op,
    bytes: u64,
    group: Group,
) -> f64 {
    let Some(per_element) = params.fp16_sum_ns_per_element else {
        return 0.0;
    };
    if group.ranks < 2 || !matches!(op, Op::Allreduce | Op::ReduceScatter) {
        return 0.0;
    }
    let n = f64::from(group.ranks);
    let frac = (n - 1.0) / n;
    let segments = segments_per_rank(bytes, group.ranks) * u64::from(group.ranks);
    let segment_elements = bytes.div_ceil(segments).div_ceil(2) as f64;
    let on_path = (n - 1.0) * segment_elements * per_element / 1e3;
    let all = frac * (bytes / 2) as f64 * per_element / 1e3;
    let transfer = frac * bytes as f64 * Hockney::of(cluster, params, group).beta;
    on_path.max(all - transfer)
}

/// Segments per rank of gloo's ring allreduce: ⌈bytes / 1 MiB⌉, at least two per rank, rounded
/// up to a whole number per rank.
fn segments_per_rank(bytes: u64, ranks: u32) -> u64 {
    let ranks = u64::from(ranks);
    bytes
        .div_ceil(MAX_SEGMENT_BYTES)
        .max(2 * ranks)
        .div_ceil(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_follow_gloos_rule() {
        // Small buffers: two segments per rank.
        assert_eq!(segments_per_rank(4096, 2), 2);
        assert_eq!(segments_per_rank(4096, 4), 2);
        // 16 MiB over 2 ranks: 16 segments of 1 MiB, 8 per rank.
        assert_eq!(segments_per_rank(16 << 20, 2), 8);
        // 5 MiB over 4 ranks: 5 segments rounded up to 8, 2 per rank.
        assert_eq!(segments_per_rank(5 << 20, 4), 2);
        // 9 MiB over 4 ranks: 9 rounded up to 12, 3 per rank.
        assert_eq!(segments_per_rank(9 << 20, 4), 3);
    }
}
