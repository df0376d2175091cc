//! The all-to-all reduce-scatter on one rank: ZeRO++'s quantized gradients (qgZ).
//!
//! A piece's payload is one codec call per chunk of the world's ring, and chunk c is kept by
//! the rank before it on the ring (`ring::summed_chunk`), as after a ring reduce-scatter. On
//! several nodes of several ranks the payloads take two hops (Wang et al. 2023,
//! arXiv:2306.10209 §3.3): inside each node, every chunk's payload goes to the rank with its
//! keeper's place in the node, which decodes and adds the node's payloads of each chunk it
//! collects (one chunk per node) and re-encodes the sum with that chunk's codec; across nodes,
//! each re-encoded chunk goes to its keeper. Otherwise one hop takes each payload straight to
//! the keeper. Either way the keeper decodes what it received in the piece's decode step, as
//! `cost.rs` prices it (the decodes and re-encodes between the hops inside the exchange).

use super::ring::{summed_chunk, Ring, RingLink};
use crate::compress::calls::call_ranges;
use crate::compress::Codec;
use crate::error::Result;
use std::ops::Range;
use std::sync::atomic::AtomicBool;
use syncopate_sim::schedule::{chunk_keeper, Piece, World};

/// Each chunk's elements of a piece and bytes of its payload: one codec call a chunk.
pub struct Chunks {
    /// Chunk c's elements of the piece.
    pub elements: Vec<Range<usize>>,
    /// Chunk c's bytes of the payload.
    pub bytes: Vec<Range<usize>>,
}

impl Chunks {
    /// The chunks of `piece`, its codec calls one after another.
    pub fn of(piece: &Piece) -> Chunks {
        let (elements, bytes) = call_ranges(&piece.compressor, piece.codec_calls())
            .into_iter()
            .unzip();
        Chunks { elements, bytes }
    }
}

/// This rank's part of the all-to-all reduce-scatter of `payload` (every chunk's, encoded by
/// `codec`, one call a chunk) over the ranks of `world`: the payloads of the chunk it keeps,
/// every node's after two hops, every rank's after one, for the decode step.
pub fn reduce_scatter(
    link: &dyn RingLink,
    world: World,
    codec: &mut dyn Codec,
    payload: &[u8],
    calls: &Chunks,
    abort: &AtomicBool,
) -> Result<Vec<Vec<u8>>> {
    let (ranks, per_node) = (world.ranks() as usize, world.ranks_per_node as usize);
    let rank = link.rank();
    let kept = summed_chunk(rank, ranks);
    let chunk_of = |p: usize| &payload[calls.bytes[summed_chunk(p, ranks)].clone()];
    if !world.two_hop_alltoall() {
        let ring = Ring::world(rank, ranks);
        return exchange(link, &ring, chunk_of, calls.bytes[kept].len(), abort);
    }
    // Hop 1, inside the node: each chunk's payload to the rank of its keeper's place, the
    // chunks of one place one after another.
    let node = Ring::node(rank, per_node);
    let place = |c: usize| chunk_keeper(c, ranks) % per_node;
    let by_place: Vec<Vec<u8>> = (0..per_node)
        .map(|l| {
            (0..ranks)
                .filter(|&c| place(c) == l)
                .flat_map(|c| payload[calls.bytes[c].clone()].iter().copied())
                .collect()
        })
        .collect();
    let collected: Vec<usize> = (0..ranks)
        .filter(|&c| place(c) == node.position())
        .collect();
    let len = collected.iter().map(|&c| calls.bytes[c].len()).sum();
    let from_node = exchange(link, &node, |l| &by_place[l], len, abort)?;
    // The node's sum of each collected chunk, re-encoded by its call's codec.
    let numel = calls.elements.last().map_or(0, |e| e.end);
    let mut sum = vec![0.0f32; numel];
    let mut encoded: Vec<Vec<u8>> = vec![Vec::new(); ranks];
    let mut at = 0;
    for &c in &collected {
        let bytes = calls.bytes[c].len();
        for part in &from_node {
            codec.decode_call_add(c, &part[at..at + bytes], &mut sum)?;
        }
        codec.encode_call(c, &sum[calls.elements[c].clone()], &mut encoded[c])?;
        at += bytes;
    }
    // Hop 2, across nodes: each collected chunk to its keeper.
    let across = Ring::across_nodes(rank, per_node, ranks);
    let to_keeper = |n: usize| encoded[summed_chunk(across.member(n), ranks)].as_slice();
    exchange(link, &across, to_keeper, calls.bytes[kept].len(), abort)
}

/// An all-to-all over `ring`: this rank sends `part(p)` to the ring's rank at position p and
/// receives a part of `len` bytes from each, in p − 1 pairwise steps (step s: to the position s
/// ahead, from the one s behind). Returns the parts received by the sender's position, this
/// rank's own among them.
fn exchange<'p>(
    link: &dyn RingLink,
    ring: &Ring,
    part: impl Fn(usize) -> &'p [u8],
    len: usize,
    abort: &AtomicBool,
) -> Result<Vec<Vec<u8>>> {
    let (w, p) = (ring.ranks(), ring.position());
    let mut received = vec![Vec::new(); w];
    received[p] = part(p).to_vec();
    for step in 1..w {
        let (to, from) = ((p + step) % w, (p + w - step) % w);
        let what = "an all-to-all part";
        let (to_rank, from_rank) = (ring.member(to), ring.member(from));
        link.shift(part(to), to_rank, from_rank, len, what, abort, &mut |got| {
            received[from] = got.to_vec();
            Ok(())
        })?;
    }
    Ok(received)
}
