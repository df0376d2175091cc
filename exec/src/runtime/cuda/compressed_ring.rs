//! HiPress's CaSync-Ring on the GPU: the CPU ring's hops (`runtime/compressed_ring.rs`) over NCCL.
//!
//! Each hop of the reduce-scatter receives the previous rank's compressed running sum of one shard,
//! decodes it, adds this rank's shard (the `ring_hop` kernel) and re-encodes the sum; the summed
//! shards then go round compressed and every rank decodes them. Each shard has a GPU codec of its
//! own, of the shard's length and drawing from the CPU shard codec's seed (`pieces::shard_seed`),
//! and a rank encodes each shard once per step, so every encode and decode is the call the CPU
//! ring makes and `--check` replays it bit for bit.
//!
//! Each step is one grouped send and receive (`Communicator::shift`) enqueued on the comm stream
//! behind the previous hop's kernels: the host waits only at the end of the exchange, to report a
//! running sum that overflowed. A codec whose payload length depends on the data (`threshold`)
//! would need the host to read every hop's length before its send; it is refused.

use super::codec::GpuCodec;
use super::kernels::{cuda_err, Kernels};
use super::nccl::Communicator;
use crate::error::{ExecError, Result};
use crate::runtime::ring::{chunk, step_chunks, Half};
use cudarc::driver::{CudaSlice, CudaStream};
use std::ops::Range;
use std::sync::Arc;
use syncopate_sim::compress::Compressor;

/// Why the GPU cannot run `c` round a compressed ring, if it cannot.
pub(super) fn why_not(c: &Compressor) -> Option<String> {
    (!c.fixed_length()).then(|| {
        format!("`{c}`'s payload length depends on the data, which each hop would have to read back to the host before sending")
    })
}

/// One rank's shards of one piece on the world's ring.
pub(super) struct GpuShards {
    position: usize,
    ranks: usize,
    n: usize,
    /// Shard c's codec, for its `chunk(c, ranks, n)` elements.
    codecs: Vec<GpuCodec>,
    /// This rank's encoding of each shard: its own input's, or the sum it re-encoded at its hop.
    sent: Vec<CudaSlice<u8>>,
    /// The summed shards, once the exchange ran.
    summed: Vec<CudaSlice<u8>>,
    /// Minus the running sum each hop added this rank's shard to (zero on its own shard).
    added_to: CudaSlice<f32>,
    /// A hop's running sum, as long as the longest shard.
    sum: CudaSlice<f32>,
    /// A hop's incoming payload, as long as the longest shard's.
    incoming: CudaSlice<u8>,
}

impl GpuShards {
    /// The state of rank `position` of `ranks` for a piece of `n` elements compressed by `c`,
    /// shard s's codec drawing from `seed(s)`.
    pub(super) fn new(
        c: &Compressor,
        position: usize,
        ranks: usize,
        n: usize,
        seed: impl Fn(usize) -> u64,
        stream: &Arc<CudaStream>,
    ) -> Result<GpuShards> {
        if let Some(why) = why_not(c) {
            return Err(ExecError::Cuda { message: why });
        }
        let codecs = (0..ranks)
            .map(|s| GpuCodec::new(c, chunk(s, ranks, n).len(), &[], seed(s), stream))
            .collect::<Result<Vec<_>>>()?;
        let alloc = cuda_err("cannot allocate CaSync-Ring buffers");
        let payloads = || -> Result<Vec<CudaSlice<u8>>> {
            codecs
                .iter()
                .map(|codec| stream.alloc_zeros(codec.wire_bytes().max(1)))
                .collect::<Result<_, _>>()
                .map_err(&alloc)
        };
        let longest = (0..ranks).map(|s| chunk(s, ranks, n).len()).max();
        let widest = codecs.iter().map(GpuCodec::wire_bytes).max();
        Ok(GpuShards {
            position,
            ranks,
            n,
            sent: payloads()?,
            summed: payloads()?,
            added_to: stream.alloc_zeros(n.max(1)).map_err(&alloc)?,
            sum: stream
                .alloc_zeros(longest.unwrap_or(0).max(1))
                .map_err(&alloc)?,
            incoming: stream
                .alloc_zeros(widest.unwrap_or(0).max(1))
                .map_err(&alloc)?,
            codecs,
        })
    }

    /// Shard `s`'s elements of the piece.
    fn shard(&self, s: usize) -> Range<usize> {
        chunk(s, self.ranks, self.n)
    }

    /// The encode step: this rank's own shard of `input`.
    pub(super) fn encode_own(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
    ) -> Result<()> {
        let p = self.position;
        let own = self.shard(p);
        stream
            .memset_zeros(&mut self.added_to.slice_mut(own.clone()))
            .map_err(cuda_err("cannot clear the own shard's running sum"))?;
        self.codecs[p].encode(k, stream, &input.slice(own), &mut self.sent[p])?;
        if self.ranks == 1 {
            copy(stream, &self.sent[0], &mut self.summed[0])?;
        }
        Ok(())
    }

    /// After the encode completed: the CPU's error for a non-finite element of the own shard
    /// (its index in the shard, as the CPU codec names it). Synchronizes `stream`.
    pub(super) fn check_own(&self, stream: &Arc<CudaStream>, input: &CudaSlice<f32>) -> Result<()> {
        let own = self.shard(self.position);
        self.codecs[self.position].check_finite(stream, &input.slice(own))
    }

    /// The exchange on `comm`'s stream: n − 1 hops, then n − 1 steps passing the summed shards
    /// on. `drain` waits, bounded and abortable, for the stream before the hops' finite flags
    /// are read back.
    pub(super) fn exchange(
        &mut self,
        comm: &Communicator,
        k: &Kernels,
        input: &CudaSlice<f32>,
        drain: impl Fn() -> Result<()>,
    ) -> Result<()> {
        let (w, p) = (self.ranks, self.position);
        let stream = comm.stream().clone();
        let (next, prev) = (((p + 1) % w) as u32, ((p + w - 1) % w) as u32);
        for step in 0..w - 1 {
            let (send, recv) = step_chunks(Half::ReduceScatter, p, w, step);
            let bytes = self.codecs[recv].wire_bytes();
            let mut incoming = self.incoming.slice_mut(..bytes);
            comm.shift(&self.sent[send], &mut incoming, next, prev)?;
            self.hop(k, &stream, input, recv)?;
            if step + 2 == w {
                copy(&stream, &self.sent[recv], &mut self.summed[recv])?;
            }
        }
        for step in 0..w - 1 {
            let (send, recv) = step_chunks(Half::AllGather, p, w, step);
            let (out, into) = two(&mut self.summed, send, recv);
            comm.shift(out, into, next, prev)?;
        }
        drain()?;
        for (s, codec) in self.codecs.iter().enumerate().filter(|&(s, _)| s != p) {
            if let Some(index) = codec.first_non_finite(&stream)? {
                return Err(ExecError::Protocol {
                    compressor: codec.compressor().to_string(),
                    message: format!(
                        "a CaSync-Ring hop's running sum of shard {s} is not finite at its element {index}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// One hop on shard `s`: decodes the incoming running sum, keeps it (negated), adds this
    /// rank's shard of `input` and re-encodes the sum into `sent[s]`.
    fn hop(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
        s: usize,
    ) -> Result<()> {
        let shard = self.shard(s);
        let len = shard.len();
        let codec = &mut self.codecs[s];
        let incoming = self.incoming.slice(..codec.wire_bytes());
        let mut sum = self.sum.slice_mut(..len);
        stream
            .memset_zeros(&mut sum)
            .map_err(cuda_err("cannot clear a hop's running sum"))?;
        codec.decode_add(k, stream, &incoming, &mut sum)?;
        let own = input.slice(shard.clone());
        let mut added_to = self.added_to.slice_mut(shard);
        k.ring_hop(stream, &mut sum, &own, &mut added_to, len as u32)?;
        codec.encode(k, stream, &self.sum.slice(..len), &mut self.sent[s])
    }

    /// The decode step: adds every summed shard into its elements of `acc`.
    pub(super) fn decode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        acc: &mut CudaSlice<f32>,
    ) -> Result<()> {
        decode_shards(k, stream, &mut self.codecs, &self.summed, self.n, acc)
    }

    /// What this rank's encodings carried of its own input, into `transmitted`: each decoded
    /// encoding less the running sum it was added to.
    pub(super) fn transmitted(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        transmitted: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let n = self.n;
        stream
            .memcpy_dtod(&self.added_to.slice(..n), &mut transmitted.slice_mut(..n))
            .map_err(cuda_err("cannot copy the running sums"))?;
        decode_shards(k, stream, &mut self.codecs, &self.sent, n, transmitted)
    }
}

/// Adds payload s of `payloads`, decoded by codec s, into its shard's elements of `acc` (`n`
/// elements in all).
fn decode_shards(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    codecs: &mut [GpuCodec],
    payloads: &[CudaSlice<u8>],
    n: usize,
    acc: &mut CudaSlice<f32>,
) -> Result<()> {
    let ranks = codecs.len();
    for (s, (codec, payload)) in codecs.iter_mut().zip(payloads).enumerate() {
        let mut shard = acc.slice_mut(chunk(s, ranks, n));
        codec.decode_add(k, stream, &payload.as_view(), &mut shard)?;
    }
    Ok(())
}

/// Copies the payload `from` into `to`, of the same length.
fn copy(stream: &Arc<CudaStream>, from: &CudaSlice<u8>, to: &mut CudaSlice<u8>) -> Result<()> {
    stream
        .memcpy_dtod(from, to)
        .map_err(cuda_err("cannot copy a summed shard"))
}

/// Shards `a` and `b` (distinct) of `slots`, the first to read and the second to write.
fn two<T>(slots: &mut [T], a: usize, b: usize) -> (&T, &mut T) {
    debug_assert_ne!(a, b, "a ring step sends one shard and receives another");
    if a < b {
        let (low, high) = slots.split_at_mut(b);
        (&low[a], &mut high[0])
    } else {
        let (low, high) = slots.split_at_mut(a);
        (&high[0], &mut low[b])
    }
}
