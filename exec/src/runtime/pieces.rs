//! What every backend derives from a schedule's pieces in the same way.
//!
//! That is codecs and their seeds, memories, parameter-server ranks, and the seeded synthetic
//! gradients.

use crate::compress::calls::PerTensor;
use crate::compress::{codec_for, codec_for_shapes, rng::Rng, Codec, MemoryState};
use syncopate_sim::compress::{Compressor, Element};
use syncopate_sim::schedule::{Exchange, Piece, Schedule, World};

/// Elements `offset..offset + numel` of the piece's group buffer, as indices.
pub fn range(piece: &Piece) -> std::ops::Range<usize> {
    piece.offset as usize..(piece.offset + piece.numel) as usize
}

/// The seed of rank `rank`'s codec for piece `index` (`None`: the parameter server's).
/// Codecs whose payloads must agree across workers (`Compressor::shared_seed`: random-k's
/// indices, PowerSGD's initial Q) share a seed; other stochastic codecs draw independently.
/// GPU codecs draw from the same seeds.
pub fn codec_seed(schedule: &Schedule, seed: u64, index: usize, rank: Option<u32>) -> u64 {
    let piece = &schedule.pieces[index];
    let who = match (piece.compressor.shared_seed(), rank) {
        (true, _) => 0,
        (false, Some(r)) => u64::from(r) + 1,
        (false, None) => u64::MAX,
    };
    mix(
        mix(mix(seed, u64::from(piece.group)), u64::from(piece.part)),
        who,
    )
}

/// Rank `rank`'s CPU codec for piece `index` (`None`: the parameter server's).
pub fn codec(schedule: &Schedule, seed: u64, index: usize, rank: Option<u32>) -> Box<dyn Codec> {
    let piece = &schedule.pieces[index];
    piece_codec(
        piece.compressor,
        &piece.shapes(),
        &piece.calls,
        codec_seed(schedule, seed, index, rank),
    )
}

/// The seed of shard `shard`'s codec of a CaSync-Ring piece on rank `rank`
/// (`compressed_ring::Shards`): a CPU codec and a GPU one of the shard draw from the same.
pub fn shard_seed(schedule: &Schedule, seed: u64, index: usize, rank: u32, shard: usize) -> u64 {
    mix(codec_seed(schedule, seed, index, Some(rank)), shard as u64)
}

/// Rank `rank`'s codecs of CaSync-Ring piece `index`, one per shard of the world's ring.
pub fn shard_codecs(
    schedule: &Schedule,
    seed: u64,
    index: usize,
    rank: u32,
) -> Vec<Box<dyn Codec>> {
    let c = schedule.pieces[index].compressor;
    (0..schedule.world.ranks() as usize)
        .map(|shard| codec_for(&c, shard_seed(schedule, seed, index, rank, shard)))
        .collect()
}

/// A piece's codec drawing from `seed`: one call on the piece (over PowerSGD's matrices
/// `shapes`), or one per element count of `calls` when the plan compresses each tensor on its
/// own, each drawing from a seed of its own (shared across ranks where `seed` is).
pub fn piece_codec(c: Compressor, shapes: &[&[u64]], calls: &[u64], seed: u64) -> Box<dyn Codec> {
    if calls.is_empty() {
        return codec_for_shapes(&c, shapes, seed);
    }
    Box::new(PerTensor::new(c, calls, |call| {
        codec_for(&c, mix(seed, call as u64))
    }))
}

/// A fresh error-feedback memory for a piece.
pub fn memory(piece: &Piece) -> MemoryState {
    MemoryState::new(piece.memory, piece.numel as usize)
}

/// The rank that decodes, sums and re-encodes a piece's payloads: the server of its push-pull
/// round (the group's turn-taking server when it has none).
pub fn server_rank(piece: &Piece, world: u32) -> u32 {
    piece
        .rounds
        .iter()
        .find_map(|r| match r.exchange {
            Exchange::PushPull { server } => Some(server),
            _ => None,
        })
        .unwrap_or(piece.group % world.max(1))
}

/// Whether a piece's synchronization ends with a reduce-scatter (a sharded plan's unit, FSDP's,
/// hybrid sharding's, or ZeRO++'s all-to-all of quantized chunks): each rank then holds only
/// its chunk of the sum (`ring::keep_summed_chunk`, `ring::summed_chunk`).
pub fn ends_scattered(piece: &Piece) -> bool {
    piece.rounds.last().is_some_and(|r| {
        matches!(
            r.exchange,
            Exchange::ReduceScatter
                | Exchange::HybridReduceScatter
                | Exchange::AlltoallReduceScatter
        )
    })
}

/// The ranks of the ring whose reduce-scatter leaves a scattered piece's chunks
/// ([`ends_scattered`]): every rank's, or each node's under hybrid sharding.
pub fn scatter_ranks(piece: &Piece, world: &World) -> usize {
    match piece.rounds.last().map(|r| r.exchange) {
        Some(Exchange::HybridReduceScatter) => world.ranks_per_node as usize,
        _ => world.ranks() as usize,
    }
}

/// Bytes of one element of a summable payload: the ring reduces whole elements.
pub fn wire_element_bytes(c: &Compressor) -> usize {
    c.summed_as().unwrap_or(Element::F32).bytes()
}

/// SplitMix64 step over a pair, so that seeds of neighbouring pieces and ranks are unrelated.
pub(super) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b
        .wrapping_add(0x9e37_79b9_7f4a_7c15)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Seeded synthetic gradients: one standard-normal vector per rank over every tensor, generated
/// once so that the backward steps only copy (as frameworks copy into the fusion buffer),
/// scaled per iteration so that successive iterations differ.
pub struct Gradients {
    /// The first rank of `per_rank`.
    first: u32,
    per_rank: Vec<Vec<f32>>,
    tensor_offset: Vec<usize>,
}

impl Gradients {
    /// Gradients of the ranks `ranks` (those this process drives) for the schedule's tensors.
    pub fn new(schedule: &Schedule, ranks: std::ops::Range<u32>, seed: u64) -> Gradients {
        let tensors = schedule.buffers.iter().map(|b| b.slots.len()).sum();
        let mut numel = vec![0usize; tensors];
        for slot in schedule.buffers.iter().flat_map(|b| &b.slots) {
            numel[slot.tensor as usize] = slot.numel as usize;
        }
        let mut tensor_offset = Vec::with_capacity(tensors);
        let mut total = 0usize;
        for n in numel {
            tensor_offset.push(total);
            total += n;
        }
        let first = ranks.start;
        let per_rank = ranks
            .map(|rank| {
                let mut rng = Rng::for_stream(seed, u64::from(rank));
                (0..total).map(|_| rng.normal() as f32).collect()
            })
            .collect();
        Gradients {
            first,
            per_rank,
            tensor_offset,
        }
    }

    /// Rank `rank`'s unscaled gradients of every tensor, one after another.
    pub fn rank_values(&self, rank: u32) -> &[f32] {
        &self.per_rank[(rank - self.first) as usize]
    }

    /// Where tensor `tensor` starts in [`Gradients::rank_values`].
    pub fn offset(&self, tensor: usize) -> usize {
        self.tensor_offset[tensor]
    }

    /// The factor of iteration `iteration`'s gradients.
    pub fn scale(iteration: u32) -> f32 {
        1.0 + 0.25 * iteration as f32
    }

    /// Writes rank `rank`'s gradient of tensor `tensor` in `iteration` into `out`.
    pub fn fill(&self, rank: u32, iteration: u32, tensor: usize, out: &mut [f32]) {
        let start = self.tensor_offset[tensor];
        let scale = Gradients::scale(iteration);
        let source = &self.rank_values(rank)[start..start + out.len()];
        for (o, &g) in out.iter_mut().zip(source) {
            *o = g * scale;
        }
    }
}
