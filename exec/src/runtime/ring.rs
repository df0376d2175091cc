//! Ring collectives over any point-to-point transport and any ordered subset of the ranks.
//!
//! They are the reduce-scatter and all-gather halves of a ring allreduce, and the hierarchical
//! allreduce built from them (reduce-scatter inside each node, allreduce across nodes, all-gather
//! inside), as `cost.rs` prices them.

use crate::compress::Codec;
use crate::error::Result;
use std::ops::Range;
use std::sync::atomic::AtomicBool;

/// One rank's end of a transport on which rings run.
pub trait RingLink {
    /// This rank's index among the transport's ranks.
    fn rank(&self) -> usize;

    /// Sends `out` to rank `to` while receiving one message of `len` bytes from rank `from`
    /// (one step of a ring, both at once so that no rank waits on another's send), and hands
    /// the received bytes to `take`.
    #[allow(clippy::too_many_arguments)]
    fn shift(
        &self,
        out: &[u8],
        to: usize,
        from: usize,
        len: usize,
        what: &str,
        abort: &AtomicBool,
        take: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()>;
}

/// The ranks of one ring in ring order, and this rank's position on it. Every ring here is
/// evenly spaced ranks (all of them, a node's, one per node), so it is its first rank, the
/// stride between ranks and their count.
pub struct Ring {
    first: usize,
    stride: usize,
    ranks: usize,
    position: usize,
}

impl Ring {
    /// Every rank of a transport of `world` ranks, in rank order.
    pub fn world(rank: usize, world: usize) -> Ring {
        Ring {
            first: 0,
            stride: 1,
            ranks: world,
            position: rank,
        }
    }

    /// Rank `rank`'s node's ranks (`per_node` consecutive ranks make a node).
    pub fn node(rank: usize, per_node: usize) -> Ring {
        Ring {
            first: rank - rank % per_node,
            stride: 1,
            ranks: per_node,
            position: rank % per_node,
        }
    }

    /// The ranks with rank `rank`'s place in their node, one per node.
    pub fn across_nodes(rank: usize, per_node: usize, world: usize) -> Ring {
        Ring {
            first: rank % per_node,
            stride: per_node,
            ranks: world / per_node,
            position: rank / per_node,
        }
    }

    /// How many ranks the ring has (at least one: this rank).
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// This rank's position on the ring.
    pub fn position(&self) -> usize {
        self.position
    }

    /// The rank after this one on the ring (wrapping around).
    pub fn next(&self) -> usize {
        self.member(self.position + 1)
    }

    /// The rank before this one on the ring (wrapping around).
    pub fn prev(&self) -> usize {
        self.member(self.position + self.ranks - 1)
    }

    /// The rank at `position` (mod the ring's size).
    pub(super) fn member(&self, position: usize) -> usize {
        self.first + self.stride * (position % self.ranks)
    }
}

/// Chunk `c` of `chunks` over `elements` elements, as an element range: the chunks every ring
/// (and the CUDA backend's NCCL calls) splits a payload into.
pub fn chunk(c: usize, chunks: usize, elements: usize) -> Range<usize> {
    elements * c / chunks..elements * (c + 1) / chunks
}

/// Chunk `c` of the ring's as a byte range of elements of `element` bytes.
fn chunk_bytes(c: usize, chunks: usize, elements: usize, element: usize) -> Range<usize> {
    let elements = chunk(c, chunks, elements);
    elements.start * element..elements.end * element
}

/// The two halves of a ring allreduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// Each step merges the received chunk into this rank's: after p − 1 steps the rank at
    /// position r holds the sum of chunk (r + 1) mod p.
    ReduceScatter,
    /// Each step passes on the chunk received last, starting from the summed one.
    AllGather,
}

/// The chunk that step `step` of `half` sends at `position` on a ring of `ranks`, and the one
/// it receives.
pub fn step_chunks(half: Half, position: usize, ranks: usize, step: usize) -> (usize, usize) {
    let (w, p) = (ranks, position);
    match half {
        Half::ReduceScatter => ((p + w - step) % w, (p + 2 * w - step - 1) % w),
        Half::AllGather => ((summed_chunk(p, w) + w - step) % w, (p + w - step) % w),
    }
}

/// The chunk the rank at `position` on a ring of `ranks` holds summed after [`reduce_scatter`],
/// and sends first in [`allgather_chunks`]: in a sharded plan, the shard of each unit it owns.
pub fn summed_chunk(position: usize, ranks: usize) -> usize {
    (position + 1) % ranks
}

/// Zeroes every chunk of `payload` (elements of `element` bytes) but the one this rank holds
/// summed after [`reduce_scatter`]: what a reduce-scatter that ends a synchronization delivers
/// (a sharded plan's), the rank's shard of the sum; the other chunks hold the partial sums it
/// passed on, which are no result.
pub fn keep_summed_chunk(ring: &Ring, payload: &mut [u8], element: usize) {
    let elements = payload.len() / element;
    let (w, r) = (ring.ranks(), ring.position());
    let kept = chunk_bytes(summed_chunk(r, w), w, elements, element);
    payload[..kept.start].fill(0);
    payload[kept.end..].fill(0);
}

/// After it, the rank at position r holds the full sum over the ring of chunk (r + 1) mod p;
/// the other chunks hold partial sums. p − 1 steps of one chunk each, summed in the wire type
/// with the codec's `sum_into`.
pub fn reduce_scatter(
    link: &dyn RingLink,
    ring: &Ring,
    payload: &mut [u8],
    element: usize,
    codec: &dyn Codec,
    abort: &AtomicBool,
) -> Result<()> {
    let sum = |mine: &mut [u8], other: &[u8]| codec.sum_into(mine, other);
    let (half, what) = (Half::ReduceScatter, "a reduce-scatter chunk");
    run_half(link, ring, half, payload, element, what, abort, sum)
}

/// The all-gather half: the rank at position r starts with chunk (r + 1) summed and passes on
/// what it received last, p − 1 steps of one chunk each.
pub fn allgather_chunks(
    link: &dyn RingLink,
    ring: &Ring,
    payload: &mut [u8],
    element: usize,
    abort: &AtomicBool,
) -> Result<()> {
    let keep = |mine: &mut [u8], other: &[u8]| {
        mine.copy_from_slice(other);
        Ok(())
    };
    let (half, what) = (Half::AllGather, "an all-gather chunk");
    run_half(link, ring, half, payload, element, what, abort, keep)
}

/// The p − 1 steps of `half` over `payload`'s chunks of elements of `element` bytes, each
/// received chunk handed to `merge` with this rank's.
#[allow(clippy::too_many_arguments)]
fn run_half(
    link: &dyn RingLink,
    ring: &Ring,
    half: Half,
    payload: &mut [u8],
    element: usize,
    what: &str,
    abort: &AtomicBool,
    merge: impl Fn(&mut [u8], &[u8]) -> Result<()>,
) -> Result<()> {
    let (w, r) = (ring.ranks(), ring.position());
    let elements = payload.len() / element;
    for step in 0..w.saturating_sub(1) {
        let (send, recv) = step_chunks(half, r, w, step);
        let send = chunk_bytes(send, w, elements, element);
        let recv = chunk_bytes(recv, w, elements, element);
        let (out, mine) = split(payload, send, recv.clone());
        let (next, prev) = (ring.next(), ring.prev());
        link.shift(out, next, prev, recv.len(), what, abort, &mut |other| {
            merge(mine, other)
        })?;
    }
    Ok(())
}

/// Ring allreduce: reduce-scatter, then all-gather, 2(p − 1) steps of 1/p of the payload.
pub fn allreduce(
    link: &dyn RingLink,
    ring: &Ring,
    payload: &mut [u8],
    element: usize,
    codec: &dyn Codec,
    abort: &AtomicBool,
) -> Result<()> {
    reduce_scatter(link, ring, payload, element, codec, abort)?;
    allgather_chunks(link, ring, payload, element, abort)
}

/// Hierarchical allreduce of `world` ranks in nodes of `per_node`: a ring reduce-scatter
/// inside each node leaves each rank the node's sum of one chunk; the ranks holding the same
/// chunk (one per node) allreduce it across nodes on a ring of their own; a ring all-gather
/// inside each node spreads the chunks. Only 1/per_node of the payload crosses the network
/// from each rank, as `collective::estimate_hierarchical_allreduce` prices it.
#[allow(clippy::too_many_arguments)]
pub fn hierarchical_allreduce(
    link: &dyn RingLink,
    world: usize,
    per_node: usize,
    payload: &mut [u8],
    element: usize,
    codec: &dyn Codec,
    abort: &AtomicBool,
) -> Result<()> {
    hybrid_reduce_scatter(link, world, per_node, payload, element, codec, abort)?;
    allgather_chunks(
        link,
        &Ring::node(link.rank(), per_node),
        payload,
        element,
        abort,
    )
}

/// Hybrid sharding's reduction (HSDP), the first two phases of [`hierarchical_allreduce`]:
/// after it the rank holds the whole world's sum of the chunk its node ring leaves it
/// ([`summed_chunk`] of its place in the node), as
/// `collective::estimate_hybrid_reduce_scatter` prices it; the other chunks hold partial sums.
#[allow(clippy::too_many_arguments)]
pub fn hybrid_reduce_scatter(
    link: &dyn RingLink,
    world: usize,
    per_node: usize,
    payload: &mut [u8],
    element: usize,
    codec: &dyn Codec,
    abort: &AtomicBool,
) -> Result<()> {
    let rank = link.rank();
    let local = Ring::node(rank, per_node);
    reduce_scatter(link, &local, payload, element, codec, abort)?;
    let elements = payload.len() / element;
    let held = chunk_bytes(
        summed_chunk(local.position(), per_node),
        per_node,
        elements,
        element,
    );
    let across = Ring::across_nodes(rank, per_node, world);
    allreduce(link, &across, &mut payload[held], element, codec, abort)
}

/// The bytes `send` to read and the bytes `recv` to write of one payload (distinct chunks).
fn split(payload: &mut [u8], send: Range<usize>, recv: Range<usize>) -> (&[u8], &mut [u8]) {
    if send.start < recv.start {
        let (low, high) = payload.split_at_mut(recv.start);
        (&low[send], &mut high[..recv.len()])
    } else {
        let (low, high) = payload.split_at_mut(send.start);
        (&high[..send.len()], &mut low[recv])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::codec_for;
    use crate::runtime::host::comm::{on_host, Mesh};
    use std::cell::RefCell;
    use syncopate_sim::compress::Compressor;

    /// Counts the bytes one rank's end sends to each rank.
    struct Counting<'m> {
        mesh: &'m Mesh,
        sent: RefCell<Vec<usize>>,
    }

    impl RingLink for Counting<'_> {
        fn rank(&self) -> usize {
            self.mesh.rank()
        }

        fn shift(
            &self,
            out: &[u8],
            to: usize,
            from: usize,
            len: usize,
            what: &str,
            abort: &AtomicBool,
            take: &mut dyn FnMut(&[u8]) -> Result<()>,
        ) -> Result<()> {
            self.sent.borrow_mut()[to] += out.len();
            self.mesh.shift(out, to, from, len, what, abort, take)
        }
    }

    /// Runs `body` on every rank of an in-process mesh of `world` ranks, each summing the
    /// values `rank + 1` times their index, and returns each rank's result and the bytes it
    /// sent to each rank.
    #[allow(clippy::type_complexity)]
    fn on_mesh(
        world: usize,
        numel: usize,
        body: impl Fn(&dyn RingLink, &mut [u8], &dyn Codec, &AtomicBool) -> Result<()> + Sync,
    ) -> (Vec<Vec<f32>>, Vec<Vec<usize>>) {
        let ranks = on_host(world as u32, |mesh, abort| {
            let link = Counting {
                mesh,
                sent: RefCell::new(vec![0; world]),
            };
            let codec = codec_for(&Compressor::None, 0);
            let values: Vec<f32> = (0..numel)
                .map(|i| (i * (mesh.rank as usize + 1)) as f32)
                .collect();
            let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            body(&link, &mut bytes, &*codec, abort)?;
            let result = bytes
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            Ok((result, link.sent.into_inner()))
        });
        ranks.unwrap().into_iter().unzip()
    }

    fn expected_sum(world: usize, numel: usize) -> Vec<f32> {
        let factor = world * (world + 1) / 2;
        (0..numel).map(|i| (i * factor) as f32).collect()
    }

    #[test]
    fn ring_allreduce_sums_uneven_chunks() {
        let (results, _) = on_mesh(3, 7, |link, payload, codec, abort| {
            allreduce(link, &Ring::world(link.rank(), 3), payload, 4, codec, abort)
        });
        for result in results {
            assert_eq!(result, expected_sum(3, 7));
        }
    }

    #[test]
    fn a_reduce_scatter_that_ends_leaves_each_rank_its_summed_chunk_only() {
        let (world, numel) = (3, 8);
        let (results, _) = on_mesh(world, numel, |link, payload, codec, abort| {
            let ring = Ring::world(link.rank(), world);
            reduce_scatter(link, &ring, payload, 4, codec, abort)?;
            keep_summed_chunk(&ring, payload, 4);
            Ok(())
        });
        let sum = expected_sum(world, numel);
        for (r, result) in results.iter().enumerate() {
            let kept = chunk(summed_chunk(r, world), world, numel);
            assert!(!kept.is_empty());
            for (i, (&x, &s)) in result.iter().zip(&sum).enumerate() {
                let expected = if kept.contains(&i) { s } else { 0.0 };
                assert_eq!(x, expected, "rank {r}, element {i}");
            }
        }
    }

    #[test]
    fn hierarchical_allreduce_sums_and_crosses_nodes_with_a_shard() {
        // 3 nodes of 2 ranks; 60 elements of 4 bytes.
        let (world, per_node, numel) = (6, 2, 60);
        let (results, sent) = on_mesh(world, numel, |link, payload, codec, abort| {
            hierarchical_allreduce(link, world, per_node, payload, 4, codec, abort)
        });
        for result in results {
            assert_eq!(result, expected_sum(world, numel));
        }
        let bytes = numel * 4;
        for (from, to_each) in sent.iter().enumerate() {
            let (node, next) = (from / per_node, (from + per_node) % world);
            for (to, &count) in to_each.iter().enumerate() {
                let expected = if to / per_node == node && to != from {
                    // Reduce-scatter and all-gather inside the node: (per_node − 1) chunks of
                    // 1/per_node each way.
                    2 * (per_node - 1) * bytes / per_node
                } else if to == next {
                    // The node's chunk of 1/per_node, allreduced on a ring of the 3 nodes.
                    2 * 2 * (bytes / per_node) / 3
                } else {
                    0
                };
                assert_eq!(count, expected, "rank {from} to rank {to}");
            }
        }
    }

    #[test]
    fn hybrid_reduce_scatter_leaves_each_rank_the_world_sum_of_its_node_chunk() {
        // 3 nodes of 2 ranks; 60 elements of 4 bytes.
        let (world, per_node, numel) = (6, 2, 60);
        let (results, sent) = on_mesh(world, numel, |link, payload, codec, abort| {
            hybrid_reduce_scatter(link, world, per_node, payload, 4, codec, abort)?;
            keep_summed_chunk(&Ring::node(link.rank(), per_node), payload, 4);
            Ok(())
        });
        let sum = expected_sum(world, numel);
        for (rank, result) in results.iter().enumerate() {
            let held = chunk(summed_chunk(rank % per_node, per_node), per_node, numel);
            let expected: Vec<f32> = (0..numel)
                .map(|i| if held.contains(&i) { sum[i] } else { 0.0 })
                .collect();
            assert_eq!(*result, expected, "rank {rank}");
        }
        // Inside the node only the reduce-scatter's (per_node − 1) chunks: no all-gather.
        let bytes = numel * 4;
        for (from, to_each) in sent.iter().enumerate() {
            let partner = from - from % per_node + (from + 1) % per_node;
            assert_eq!(
                to_each[partner],
                (per_node - 1) * bytes / per_node,
                "rank {from}"
            );
        }
    }

    #[test]
    fn one_rank_per_node_or_one_node_is_the_flat_ring() {
        for (world, per_node) in [(4, 1), (4, 4)] {
            let (results, _) = on_mesh(world, 9, |link, payload, codec, abort| {
                hierarchical_allreduce(link, world, per_node, payload, 4, codec, abort)
            });
            for result in results {
                assert_eq!(result, expected_sum(world, 9));
            }
        }
    }
}
