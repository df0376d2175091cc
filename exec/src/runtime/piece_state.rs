//! One rank's CPU codec state of one piece and the synchronization primitives on it.
//!
//! It is shared by the CPU backends and the Python extension.

use super::alltoall::Chunks;
use super::compressed_ring::Shards;
use super::pieces;
use super::ring::{summed_chunk, Half, Ring, RingLink};
use crate::compress::{Codec, MemoryState};
use crate::error::{ExecError, Result};
use syncopate_sim::compress::{Aggregation, Memory};
use syncopate_sim::schedule::{Piece, Schedule};

/// One rank's buffers and codec state for one piece. The transports move `payload` (and fill
/// `gathered` for allgathers); the primitives below do everything else.
pub struct PieceState {
    /// This rank's codec for the piece.
    pub codec: Box<dyn Codec>,
    /// The parameter server's re-encoding codec.
    pub server_codec: Box<dyn Codec>,
    memory: MemoryState,
    compensated: Vec<f32>,
    /// The encoded payload the transports move.
    pub payload: Vec<u8>,
    /// This rank's own payload, kept for error feedback when the collective overwrites it.
    own: Vec<u8>,
    /// Every rank's payload, filled by the transports for allgathers.
    pub gathered: Vec<Vec<u8>>,
    result: Vec<f32>,
    transmitted: Vec<f32>,
    /// A CaSync-Ring piece's shards: the piece is encoded, exchanged and decoded shard by shard.
    shards: Option<Shards>,
    /// For a piece reduce-scattered by an all-to-all: the chunk (codec call) it leaves this
    /// rank, whose payloads it decodes (`gathered`), and every chunk's layout; none otherwise.
    pub alltoall: Option<(usize, Chunks)>,
}

impl PieceState {
    /// Rank `rank`'s state of piece `index`, its codecs drawing from `seed`.
    pub fn new(schedule: &Schedule, seed: u64, index: usize, rank: u32) -> PieceState {
        let spec = &schedule.pieces[index];
        let n = spec.numel as usize;
        let ranks = schedule.world.ranks() as usize;
        PieceState {
            codec: pieces::codec(schedule, seed, index, Some(rank)),
            server_codec: pieces::codec(schedule, seed, index, None),
            memory: pieces::memory(&schedule.pieces[index]),
            compensated: Vec::with_capacity(n),
            payload: Vec::new(),
            own: Vec::new(),
            gathered: Vec::new(),
            result: vec![0.0; n],
            transmitted: vec![0.0; n],
            shards: spec.compressed_ring().then(|| {
                let codecs = pieces::shard_codecs(schedule, seed, index, rank);
                Shards::new(rank as usize, ranks, n, codecs)
            }),
            alltoall: spec
                .alltoall_scattered()
                .then(|| (summed_chunk(rank as usize, ranks), Chunks::of(spec))),
        }
    }

    /// The compression input of this step (the piece's gradient plus error feedback).
    pub fn compensated(&self) -> &[f32] {
        &self.compensated
    }

    /// The aggregated result of the last decode.
    pub fn result(&self) -> &[f32] {
        &self.result
    }

    /// Reads the piece from its group buffer and adds the error feedback.
    pub fn compensate(&mut self, spec: &Piece, group_buffer: &[f32]) -> Result<()> {
        self.memory
            .compensate(&group_buffer[pieces::range(spec)], &mut self.compensated)
    }

    /// Encodes the compression input into the payload (round 0's, for multi-round codecs; this
    /// rank's own shard, for a CaSync-Ring piece).
    pub fn encode(&mut self, spec: &Piece) -> Result<()> {
        if let Some(shards) = &mut self.shards {
            return shards.encode_own(&self.compensated);
        }
        self.codec.encode(&self.compensated, &mut self.payload)?;
        if spec.memory != Memory::None {
            self.own.clone_from(&self.payload);
        }
        Ok(())
    }

    /// Encodes into `out`, an exchange's buffer of exactly the payload's length, so that the
    /// payload is exchanged where it was written. The input is `group_buffer`'s piece when given
    /// (a piece without memory: its gradient is its compression input, no copy needed; the
    /// codec's finiteness check still runs), else the compensated input.
    pub fn encode_into(
        &mut self,
        spec: &Piece,
        group_buffer: Option<&[f32]>,
        out: &mut [u8],
    ) -> Result<()> {
        self.whole("encode into an exchange's buffer", spec)?;
        let input = match group_buffer {
            Some(buffer) => {
                if spec.memory != Memory::None {
                    return Err(ExecError::Protocol {
                        compressor: spec.compressor.to_string(),
                        message: format!(
                            "memory {} needs the compensated input, not the group buffer's",
                            spec.memory
                        ),
                    });
                }
                &buffer[pieces::range(spec)]
            }
            None => &self.compensated,
        };
        self.codec.encode_into(input, out, &mut self.payload)?;
        if spec.memory != Memory::None {
            self.own.clear();
            self.own.extend_from_slice(out);
        }
        Ok(())
    }

    /// HiPress's CaSync-Ring of this piece over `link`: hops of decode, add and re-encode, then
    /// the summed shards passed round (`compressed_ring`).
    pub fn compressed_ring(
        &mut self,
        spec: &Piece,
        link: &dyn RingLink,
        ring: &Ring,
        abort: &std::sync::atomic::AtomicBool,
    ) -> Result<()> {
        let Some(shards) = &mut self.shards else {
            return Err(not_a_ring(spec));
        };
        shards.exchange(link, ring, &self.compensated, abort)
    }

    /// What step `step` of a CaSync-Ring's `half` sends to the next rank (for a transport that
    /// drives the ring itself, as `syncopate.torch` does).
    pub fn ring_outgoing(&self, spec: &Piece, half: Half, step: usize) -> Result<&[u8]> {
        match &self.shards {
            Some(shards) => Ok(shards.outgoing(half, step)),
            None => Err(not_a_ring(spec)),
        }
    }

    /// Takes what step `step` of a CaSync-Ring's `half` received from the previous rank.
    pub fn ring_take(
        &mut self,
        spec: &Piece,
        half: Half,
        step: usize,
        incoming: &[u8],
    ) -> Result<()> {
        let Some(shards) = &mut self.shards else {
            return Err(not_a_ring(spec));
        };
        shards.take(&self.compensated, half, step, incoming)
    }

    /// Refuses `what` on a CaSync-Ring piece, which has no whole payload.
    fn whole(&self, what: &str, spec: &Piece) -> Result<()> {
        match self.shards {
            Some(_) => Err(ExecError::Protocol {
                compressor: spec.compressor.to_string(),
                message: format!(
                    "cannot {what}: a compressed ring's piece is encoded shard by shard"
                ),
            }),
            None => Ok(()),
        }
    }

    /// The next round's payload from the reduced one (PowerSGD's Q from P).
    pub fn next_round(&mut self) -> Result<()> {
        let reduced = std::mem::take(&mut self.payload);
        self.codec.next_round(&reduced, &mut self.payload)
    }

    /// Decodes what the exchanges delivered into the result: `delivered` when given (the
    /// exchange's buffer of a summed or pulled payload, read where it arrived), else the payload.
    pub fn decode(&mut self, spec: &Piece, delivered: Option<&[u8]>) -> Result<()> {
        self.result.fill(0.0);
        if let Some(shards) = &mut self.shards {
            return shards.decode(&mut self.result);
        }
        let delivered = Delivered {
            payload: delivered.unwrap_or(&self.payload),
            gathered: &self.gathered,
            kept_call: self.alltoall.as_ref().map(|(kept, _)| *kept),
        };
        decode_delivered(&mut *self.codec, spec, delivered, &mut self.result)
    }

    /// Decodes a summed or pulled payload straight into `out`, the piece's elements of its
    /// result buffer, leaving the result alone: for pieces without memory, where nothing else
    /// reads the result.
    pub fn decode_into(&mut self, spec: &Piece, delivered: &[u8], out: &mut [f32]) -> Result<()> {
        self.whole("decode an exchange's buffer", spec)?;
        if spec.memory != Memory::None {
            return Err(ExecError::Protocol {
                compressor: spec.compressor.to_string(),
                message: format!("memory {} keeps the decoded result", spec.memory),
            });
        }
        out.fill(0.0);
        let delivered = Delivered {
            payload: delivered,
            gathered: &self.gathered,
            kept_call: self.alltoall.as_ref().map(|(kept, _)| *kept),
        };
        decode_delivered(&mut *self.codec, spec, delivered, out)
    }

    /// Keeps in the memory what this rank's own payload did not transmit.
    pub fn update_memory(&mut self, spec: &Piece, world: u32) -> Result<()> {
        // A multi-round codec (PowerSGD) has no payload of its own to decode: its transmitted
        // part is the averaged low-rank result, as in PyTorch's hook.
        if let Some(shards) = &mut self.shards {
            shards.transmitted(&mut self.transmitted)?;
        } else if spec.compressor.allreduce_rounds() > 1 {
            let world = world as f32;
            for (t, &r) in self.transmitted.iter_mut().zip(&self.result) {
                *t = r / world;
            }
        } else {
            self.transmitted.fill(0.0);
            self.codec.decode_add(&self.own, &mut self.transmitted)?;
        }
        self.memory.update(&self.compensated, &self.transmitted)
    }

    /// Scales the result by the memory's output factor (EF-SignSGD divides by its lr again).
    pub fn scale_output(&mut self) {
        let scale = self.memory.output_scale();
        self.result.iter_mut().for_each(|x| *x *= scale);
    }

    /// The parameter server's part: decodes every pushed payload (in rank order) with this
    /// rank's codec, sums them and re-encodes the sum with the server codec into `payload`.
    pub fn serve(&mut self, spec: &Piece, pushed: &[&[u8]]) -> Result<()> {
        self.whole("serve a push-pull", spec)?;
        let mut sum = vec![0.0f32; spec.numel as usize];
        for payload in pushed {
            self.codec.decode_add(payload, &mut sum)?;
        }
        self.server_codec.encode(&sum, &mut self.payload)
    }
}

fn not_a_ring(spec: &Piece) -> ExecError {
    ExecError::Protocol {
        compressor: spec.compressor.to_string(),
        message: format!(
            "piece {}.{} does not go round a compressed ring",
            spec.group, spec.part
        ),
    }
}

/// What a piece's exchanges delivered: the summed or pulled payload, or every rank's
/// (gathered; of the kept chunk alone after an all-to-all reduce-scatter).
struct Delivered<'a> {
    payload: &'a [u8],
    gathered: &'a [Vec<u8>],
    kept_call: Option<usize>,
}

/// Adds what the exchanges delivered into `acc`.
fn decode_delivered(
    codec: &mut dyn Codec,
    spec: &Piece,
    delivered: Delivered,
    acc: &mut [f32],
) -> Result<()> {
    match (spec.aggregation, delivered.kept_call) {
        (Aggregation::Allreduce | Aggregation::ParameterServer, _) => {
            codec.decode_add(delivered.payload, acc)
        }
        // After an all-to-all reduce-scatter: every rank's payload of the kept chunk.
        (Aggregation::Allgather, Some(call)) => {
            for part in delivered.gathered {
                codec.decode_call_add(call, part, acc)?;
            }
            Ok(())
        }
        (Aggregation::Allgather, None) => {
            for payload in delivered.gathered {
                codec.decode_add(payload, acc)?;
            }
            Ok(())
        }
    }
}
