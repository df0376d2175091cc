//! Where each tensor lives in its group's fusion buffer, how groups split into pieces, each piece's codec seed, and the seeded synthetic gradients.

use crate::compress::{codec_for_shapes, rng::Rng, Codec, MemoryState};
use std::ops::Range;
use syncopate_sim::compress::{Aggregation, Compressor, Memory};
use syncopate_sim::graph::TaskKind;
use syncopate_sim::plan::Scheme;
use syncopate_sim::scenario::Scenario;

/// One partition of one group: the unit every encode, collective and decode task works on.
#[derive(Clone, Debug)]
pub struct Piece {
    pub group: usize,
    pub part: u32,
    /// Elements of the group's fusion buffer this piece covers.
    pub range: Range<usize>,
    pub compressor: Compressor,
    pub memory: Memory,
    pub aggregation: Aggregation,
    pub scheme: Scheme,
    /// Whether the task graph has an encode / decode task for this piece (the builder leaves
    /// them out for uncompressed groups; the collective task then casts to and from bytes itself).
    pub has_encode: bool,
    pub has_decode: bool,
    /// Tensor shapes when the piece is a whole group (PowerSGD compresses matrices); a
    /// partitioned group is a flat slice, which PowerSGD sends raw.
    shapes: Option<Vec<Vec<u64>>>,
}

impl Piece {
    /// Collectives per synchronization: DeAR's reduce-scatter and all-gather, PowerSGD's P and
    /// Q, one otherwise (as the builder lays them out).
    pub fn rounds(&self) -> u32 {
        match self.scheme {
            Scheme::ReduceScatterAllgather => 2,
            _ => self.compressor.allreduce_rounds(),
        }
    }
}

/// The fusion layout of a scenario's plan.
#[derive(Clone, Debug)]
pub struct Layout {
    pub pieces: Vec<Piece>,
    /// First piece of each group; pieces of a group are consecutive.
    group_first_piece: Vec<usize>,
    pub group_numel: Vec<usize>,
    /// For each tensor: its group, its offset in the group's buffer and its element count.
    pub tensor_slot: Vec<(usize, usize, usize)>,
    pub seed: u64,
}

impl Layout {
    pub fn new(scenario: &Scenario, seed: u64) -> Layout {
        let model = &scenario.model;
        let mut tensor_slot = vec![(0, 0, 0); model.num_tensors()];
        let mut pieces = Vec::new();
        let mut group_first_piece = Vec::new();
        let mut group_numel = Vec::new();
        for (g, group) in scenario.plan.groups.iter().enumerate() {
            let mut offset = 0usize;
            for &t in &group.tensors {
                let numel = model.tensors[t].numel as usize;
                tensor_slot[t] = (g, offset, numel);
                offset += numel;
            }
            let numel = offset;
            let parts = group.partitions as usize;
            group_first_piece.push(pieces.len());
            group_numel.push(numel);
            let compressing = group.compressor != Compressor::None;
            for p in 0..parts {
                // The builder's split: equal pieces, the remainder spread over the first ones.
                let range = numel * p / parts..numel * (p + 1) / parts;
                pieces.push(Piece {
                    group: g,
                    part: p as u32,
                    range,
                    compressor: group.compressor,
                    memory: group.memory,
                    aggregation: group.aggregation(),
                    scheme: group.scheme,
                    has_encode: compressing || group.memory != Memory::None,
                    has_decode: compressing,
                    shapes: (parts == 1).then(|| {
                        group
                            .tensors
                            .iter()
                            .map(|&t| model.tensors[t].shape.clone())
                            .collect()
                    }),
                });
            }
        }
        Layout {
            pieces,
            group_first_piece,
            group_numel,
            tensor_slot,
            seed,
        }
    }

    /// The piece an encode, decode or collective task works on.
    pub fn piece_of(&self, kind: &TaskKind) -> usize {
        match *kind {
            TaskKind::Encode { group, part }
            | TaskKind::Decode { group, part }
            | TaskKind::Collective { group, part, .. } => {
                self.group_first_piece[group as usize] + part as usize
            }
            _ => unreachable!("only compression tasks and collectives work on a piece"),
        }
    }

    /// The codec of `rank` for piece `index`. Random-k's indices and PowerSGD's initial Q must
    /// agree across workers, so they share a seed; other stochastic codecs draw independently.
    /// `rank == None` is the parameter server's codec.
    pub fn codec(&self, index: usize, rank: Option<u32>) -> Box<dyn Codec> {
        let seed = self.codec_seed(index, rank);
        codec_for_shapes(&self.pieces[index].compressor, &self.shapes(index), seed)
    }

    /// The tensor shapes of piece `index` as the codecs take them: none for a partitioned
    /// group's flat slice.
    pub fn shapes(&self, index: usize) -> Vec<&[u64]> {
        self.pieces[index]
            .shapes
            .iter()
            .flatten()
            .map(Vec::as_slice)
            .collect()
    }

    /// The seed of [`Layout::codec`]'s codec, for the GPU codecs that must draw the same.
    pub fn codec_seed(&self, index: usize, rank: Option<u32>) -> u64 {
        let piece = &self.pieces[index];
        let shared = matches!(
            piece.compressor,
            Compressor::RandomK { .. } | Compressor::PowerSgd { .. }
        );
        let who = match (shared, rank) {
            (true, _) => 0,
            (false, Some(r)) => u64::from(r) + 1,
            (false, None) => u64::MAX,
        };
        mix(
            mix(mix(self.seed, piece.group as u64), u64::from(piece.part)),
            who,
        )
    }

    pub fn memory(&self, index: usize) -> MemoryState {
        let piece = &self.pieces[index];
        MemoryState::new(piece.memory, piece.range.len())
    }
}

/// Bytes of one element of a summable payload: the ring reduces whole elements.
pub fn wire_element_bytes(c: &Compressor) -> usize {
    match c {
        Compressor::Fp16 | Compressor::Bf16 => 2,
        _ => 4,
    }
}

/// SplitMix64 step over a pair, so that seeds of neighbouring pieces and ranks are unrelated.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b
        .wrapping_add(0x9e37_79b9_7f4a_7c15)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Seeded synthetic gradients: one standard-normal vector per rank, generated once so that the
/// backward tasks only copy (as frameworks copy into the fusion buffer), scaled per iteration
/// so that successive iterations differ.
pub struct Gradients {
    per_rank: Vec<Vec<f32>>,
    tensor_offset: Vec<usize>,
}

impl Gradients {
    pub fn new(scenario: &Scenario, ranks: u32, seed: u64) -> Gradients {
        let mut tensor_offset = Vec::with_capacity(scenario.model.num_tensors());
        let mut total = 0usize;
        for tensor in &scenario.model.tensors {
            tensor_offset.push(total);
            total += tensor.numel as usize;
        }
        let per_rank = (0..ranks)
            .map(|rank| {
                let mut rng = Rng::for_stream(seed, u64::from(rank));
                (0..total).map(|_| rng.normal() as f32).collect()
            })
            .collect();
        Gradients {
            per_rank,
            tensor_offset,
        }
    }

    /// Rank `rank`'s unscaled gradients of every tensor, one after another.
    pub fn rank_values(&self, rank: u32) -> &[f32] {
        &self.per_rank[rank as usize]
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
        let source = &self.per_rank[rank as usize][start..start + out.len()];
        for (o, &g) in out.iter_mut().zip(source) {
            *o = g * scale;
        }
    }
}
