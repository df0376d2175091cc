//! HiPress's CaSync-Ring on one rank: a ring allreduce over compressed shards.
//!
//! Each hop of the reduce-scatter decodes the incoming compressed shard, adds this rank's own shard
//! and re-encodes the sum; the summed shards then go round compressed and every rank decodes them.
//! Error feedback keeps what each of this rank's encodings lost.
//!
//! Each shard has a codec of its own (`pieces::shard_codecs`): shard c's encodes and decodes on a
//! rank are the same calls, on a codec of the shard's own length and seed, whichever backend
//! runs the ring, so a stochastic codec draws the same numbers on the CPU and on the GPU.
//!
//! A rank encodes each shard exactly once per step: its own shard at the piece's encode step
//! and every other shard at its hop, as `cost.rs` prices it (an encode of one shard, then
//! n − 1 hops of a decode and an encode of one shard each inside the exchange). The summed
//! shard c ends on the rank before c on the ring, as after a ring reduce-scatter.

use super::ring::{chunk, step_chunks, Half, Ring, RingLink};
use crate::compress::Codec;
use crate::error::{ExecError, Result};
use std::sync::atomic::AtomicBool;
use syncopate_sim::compress::Compressor;

/// What a step of `half` moves, for errors.
fn what(half: Half) -> &'static str {
    match half {
        Half::ReduceScatter => "a CaSync-Ring hop",
        Half::AllGather => "a CaSync-Ring summed shard",
    }
}

/// One rank's shards of one piece on a ring of `ranks`.
pub struct Shards {
    position: usize,
    ranks: usize,
    /// Shard c's codec.
    codecs: Vec<Box<dyn Codec>>,
    /// This rank's encoding of each shard: its own input's, or the sum it re-encoded at its hop.
    sent: Vec<Vec<u8>>,
    /// Minus the running sum each hop added this rank's shard to (zero on its own shard): with
    /// the decoded `sent`, what this rank's encodings carried of its own input.
    added_to: Vec<f32>,
    /// The summed shards, in shard order, once the exchange ran.
    summed: Vec<Vec<u8>>,
}

impl Shards {
    /// The state of the rank at `position` on a ring of `ranks`, for a piece of `numel` elements
    /// with one codec per shard.
    pub fn new(position: usize, ranks: usize, numel: usize, codecs: Vec<Box<dyn Codec>>) -> Shards {
        debug_assert_eq!(codecs.len(), ranks, "one codec per shard");
        Shards {
            position,
            ranks,
            codecs,
            sent: vec![Vec::new(); ranks],
            added_to: vec![0.0; numel],
            summed: vec![Vec::new(); ranks],
        }
    }

    /// The encode step: this rank's own shard of `input`.
    pub fn encode_own(&mut self, input: &[f32]) -> Result<()> {
        let p = self.position;
        let own = chunk(p, self.ranks, input.len());
        self.added_to[own.clone()].fill(0.0);
        self.codecs[p].encode(&input[own], &mut self.sent[p])?;
        if self.ranks == 1 {
            self.summed[0].clone_from(&self.sent[0]);
        }
        Ok(())
    }

    /// The exchange: n − 1 hops of decode, add and re-encode, then n − 1 steps passing the summed
    /// shards on.
    pub fn exchange(
        &mut self,
        link: &dyn RingLink,
        ring: &Ring,
        input: &[f32],
        abort: &AtomicBool,
    ) -> Result<()> {
        let (w, p) = (self.ranks, self.position);
        let c = self.compressor();
        if ring.ranks() != w || ring.position() != p {
            return Err(ExecError::Protocol {
                compressor: c.to_string(),
                message: format!(
                    "a compressed ring of {w} ranks at position {p} run on a ring of {} at {}",
                    ring.ranks(),
                    ring.position()
                ),
            });
        }
        for half in [Half::ReduceScatter, Half::AllGather] {
            for step in 0..w - 1 {
                let (send, recv) = self.shards(half, step);
                // Taken out for the step: the received shard is another one.
                let out = std::mem::take(&mut self.slots(half)[send]);
                let len = chunk(recv, w, input.len()).len();
                let taken = shift(
                    link,
                    ring,
                    c,
                    len,
                    &out,
                    what(half),
                    abort,
                    &mut |incoming| self.take(input, half, step, incoming),
                );
                self.slots(half)[send] = out;
                taken?;
            }
        }
        Ok(())
    }

    /// The compressor every shard's codec runs.
    pub fn compressor(&self) -> Compressor {
        self.codecs[0].compressor()
    }

    /// The shard that step `step` of `half` sends, and the one it receives: the chunks of a
    /// ring allreduce's step.
    fn shards(&self, half: Half, step: usize) -> (usize, usize) {
        step_chunks(half, self.position, self.ranks, step)
    }

    /// Where `half` keeps its shards: this rank's encodings while hopping, the summed ones
    /// while passing them on.
    fn slots(&mut self, half: Half) -> &mut [Vec<u8>] {
        match half {
            Half::ReduceScatter => &mut self.sent,
            Half::AllGather => &mut self.summed,
        }
    }

    /// What step `step` of `half` sends to the next rank.
    pub fn outgoing(&self, half: Half, step: usize) -> &[u8] {
        let (send, _) = self.shards(half, step);
        match half {
            Half::ReduceScatter => &self.sent[send],
            Half::AllGather => &self.summed[send],
        }
    }

    /// Takes what step `step` of `half` received from the previous rank: a hop decodes it, adds
    /// this rank's shard of `input` and re-encodes the sum; a pass keeps the summed shard. The
    /// last hop leaves this rank's summed shard to pass on.
    pub fn take(&mut self, input: &[f32], half: Half, step: usize, incoming: &[u8]) -> Result<()> {
        let (_, recv) = self.shards(half, step);
        match half {
            Half::ReduceScatter => {
                let shard = chunk(recv, self.ranks, input.len());
                hop(
                    &mut *self.codecs[recv],
                    incoming,
                    &input[shard.clone()],
                    &mut self.added_to[shard],
                    &mut self.sent[recv],
                )?;
                if step + 2 == self.ranks {
                    self.summed[recv].clone_from(&self.sent[recv]);
                }
            }
            Half::AllGather => {
                self.summed[recv].clear();
                self.summed[recv].extend_from_slice(incoming);
            }
        }
        Ok(())
    }

    /// The decode step: adds every summed shard into its elements of `acc`.
    pub fn decode(&mut self, acc: &mut [f32]) -> Result<()> {
        decode_shards(&mut self.codecs, &self.summed, acc)
    }

    /// What this rank's encodings carried of its own input, into `transmitted`: each decoded
    /// encoding less the running sum it was added to.
    pub fn transmitted(&mut self, transmitted: &mut [f32]) -> Result<()> {
        transmitted.copy_from_slice(&self.added_to);
        decode_shards(&mut self.codecs, &self.sent, transmitted)
    }
}

/// Adds shard c of `shards`, decoded by codec c, into its elements of `acc`.
fn decode_shards(codecs: &mut [Box<dyn Codec>], shards: &[Vec<u8>], acc: &mut [f32]) -> Result<()> {
    let n = acc.len();
    for (c, (codec, shard)) in codecs.iter_mut().zip(shards).enumerate() {
        codec.decode_add(shard, &mut acc[chunk(c, shards.len(), n)])?;
    }
    Ok(())
}

/// One hop: decodes the incoming running sum, keeps it (negated) in `added_to`, adds `own` and
/// re-encodes the sum into `out`.
fn hop(
    codec: &mut dyn Codec,
    incoming: &[u8],
    own: &[f32],
    added_to: &mut [f32],
    out: &mut Vec<u8>,
) -> Result<()> {
    let mut sum = vec![0.0f32; own.len()];
    codec.decode_add(incoming, &mut sum)?;
    for ((a, s), &x) in added_to.iter_mut().zip(&mut sum).zip(own) {
        *a = -*s;
        *s += x;
    }
    codec.encode(&sum, out)
}

/// Sends `out` to the next rank on the ring and hands what the previous one sent, a payload of
/// `c` on `numel` elements, to `take`. A payload of data-dependent length goes as its length
/// first, then its bytes.
#[allow(clippy::too_many_arguments)]
fn shift(
    link: &dyn RingLink,
    ring: &Ring,
    c: Compressor,
    numel: usize,
    out: &[u8],
    what: &str,
    abort: &AtomicBool,
    take: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let (next, prev) = (ring.next(), ring.prev());
    let len = if c.fixed_length() {
        c.wire_bytes(numel as u64)
    } else {
        let mut len = 0u64;
        let length = (out.len() as u64).to_le_bytes();
        link.shift(&length, next, prev, 8, what, abort, &mut |bytes| {
            len = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            Ok(())
        })?;
        len
    };
    let len = usize::try_from(len).map_err(|_| ExecError::Rank {
        rank: prev as u32,
        message: format!("{what} of {len} bytes"),
    })?;
    link.shift(out, next, prev, len, what, abort, take)
}

/// The ring's result replayed centrally for `--check`: every rank's shards (in rank order, each
/// with its codecs) make the same calls in the same order as on its rank, so the result is the
/// ring's bit for bit.
pub fn reference(ranks: &mut [Shards], inputs: &[Vec<f32>]) -> Result<Vec<f32>> {
    let w = inputs.len();
    let n = inputs.first().map_or(0, Vec::len);
    for (shards, input) in ranks.iter_mut().zip(inputs) {
        shards.encode_own(input)?;
    }
    for step in 0..w.saturating_sub(1) {
        for r in 0..w {
            let incoming = ranks[(r + w - 1) % w]
                .outgoing(Half::ReduceScatter, step)
                .to_vec();
            ranks[r].take(&inputs[r], Half::ReduceScatter, step, &incoming)?;
        }
    }
    // After the hops the rank before shard c on the ring holds it summed; rank 0 decodes them
    // all, as after the all-gather half.
    let summed: Vec<Vec<u8>> = (0..w)
        .map(|c| ranks[(c + w - 1) % w].summed[c].clone())
        .collect();
    let mut result = vec![0.0; n];
    if let Some(first) = ranks.first_mut() {
        first.summed = summed;
        first.decode(&mut result)?;
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::codec_for;
    use crate::runtime::host::comm::on_host;

    /// Rank `rank`'s shards of a ring of `world`, each shard's codec seeded by rank and shard.
    fn shards(c: Compressor, rank: usize, world: usize, n: usize) -> Shards {
        let codecs = (0..world)
            .map(|s| codec_for(&c, (rank * world + s) as u64))
            .collect();
        Shards::new(rank, world, n, codecs)
    }

    fn input(rank: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + rank * 13) % 17) as f32 - 8.0)
            .collect()
    }

    /// Every rank's decoded result and transmitted part after one CaSync-Ring over a mesh.
    fn run(c: Compressor, world: usize, n: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
        let ranks = on_host(world as u32, |mesh, abort| {
            let rank = mesh.rank as usize;
            let x = input(rank, n);
            let mut shards = shards(c, rank, world, n);
            shards.encode_own(&x)?;
            shards.exchange(mesh, &Ring::world(rank, world), &x, abort)?;
            let (mut result, mut transmitted) = (vec![0.0; n], vec![0.0; n]);
            shards.decode(&mut result)?;
            shards.transmitted(&mut transmitted)?;
            Ok((result, transmitted))
        });
        ranks.unwrap()
    }

    #[test]
    fn uncompressed_the_ring_sums_exactly() {
        let (world, n) = (3, 10);
        let sum: Vec<f32> = (0..n)
            .map(|i| (0..world).map(|r| input(r, n)[i]).sum())
            .collect();
        for (rank, (result, transmitted)) in run(Compressor::None, world, n).iter().enumerate() {
            assert_eq!(result, &sum);
            // Without loss each rank's encodings carried exactly its own input.
            assert_eq!(transmitted, &input(rank, n));
        }
    }

    #[test]
    fn what_the_ranks_carried_sums_to_the_result() {
        // Each hop re-encodes a running sum: the parts of it each rank's encodings carried
        // telescope to the decoded result, whatever each encoding lost.
        let (world, n) = (4, 37);
        let ranks = run(Compressor::OneBit, world, n);
        let carried: Vec<f32> = (0..n)
            .map(|i| ranks.iter().map(|(_, t)| t[i]).sum())
            .collect();
        for (result, _) in &ranks {
            assert_eq!(result, &ranks[0].0, "every rank decodes the same shards");
            for (c, r) in carried.iter().zip(result) {
                assert!((c - r).abs() <= 1e-4 * r.abs().max(1.0), "{c} vs {r}");
            }
        }
    }

    #[test]
    fn the_reference_replays_the_ring_bit_for_bit() {
        // Fixed-length payloads and `threshold`'s, sent with their length.
        let (world, n) = (3, 25);
        for name in [
            "onebit",
            "dgc:0.2",
            "threshold:3",
            "tbq:2",
            "terngrad",
            "fp16",
        ] {
            let c: Compressor = name.parse().unwrap();
            let ranks = run(c, world, n);
            let mut replayed: Vec<Shards> = (0..world).map(|r| shards(c, r, world, n)).collect();
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, n)).collect();
            let reference = reference(&mut replayed, &inputs).unwrap();
            for (result, _) in &ranks {
                assert_eq!(result, &reference, "{name}");
            }
        }
    }
}
