//! Parameter-server aggregation on NCCL: a send/recv push, decode–sum–re-encode, a broadcast pull.
//!
//! The push is a grouped send/recv to the group's server rank, and the server decodes, sums and
//! re-encodes on its GPU.
//!
//! The whole exchange is one collective task, as on the host backend (`Mesh::push_pull`): the
//! task graph has no server task, and the pull cannot begin before the server re-encoded.

use super::codec::GpuCodec;
use super::kernels::{cuda_err, Kernels};
use super::nccl::Communicator;
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;
use syncopate_sim::compress::Compressor;

/// What the server rank of one piece keeps.
pub(super) struct Server {
    /// The server's codec (the layout's server seed), which re-encodes the sum.
    codec: GpuCodec,
    /// Every rank's pushed payload, in rank order (the server's own copied in).
    pushed: CudaSlice<u8>,
    sum: CudaSlice<f32>,
}

impl Server {
    pub(super) fn new(
        compressor: &Compressor,
        n: usize,
        shapes: &[&[u64]],
        seed: u64,
        world: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<Server> {
        let codec = GpuCodec::new(compressor, n, shapes, seed, stream)?;
        let alloc = cuda_err("cannot allocate parameter-server buffers");
        Ok(Server {
            pushed: stream
                .alloc_zeros((codec.wire_bytes() * world).max(1))
                .map_err(&alloc)?,
            sum: stream.alloc_zeros(n.max(1)).map_err(&alloc)?,
            codec,
        })
    }
}

/// Enqueues on `comm`'s stream the push of this rank's payload (the first `wire_bytes` of
/// `payload`) to rank `server` and the pull of the server's payload into the same bytes.
/// `server_state` is `Some` exactly on the server: it decodes every payload in rank order with
/// its worker codec `codec`, as the CPU reference does, and re-encodes the sum. `drain` waits,
/// bounded and abortable, for the stream's work so far: the server calls it once the pushes
/// arrived, since its codecs read results back to the host, and a blocking read-back behind a
/// receive from a dead worker would hang beyond any timeout.
pub(super) fn push_pull(
    comm: &Communicator,
    k: &Kernels,
    server: u32,
    codec: &mut GpuCodec,
    server_state: Option<&mut Server>,
    payload: &mut CudaSlice<u8>,
    drain: impl Fn() -> Result<()>,
) -> Result<()> {
    let (rank, world, stream) = (comm.rank(), comm.world() as usize, comm.stream());
    let bytes = codec.wire_bytes();
    let own = payload.slice(..bytes);
    match server_state {
        None => comm.gather_bytes(&own, None, server)?,
        Some(s) => {
            let block = |r: usize| r * bytes..(r + 1) * bytes;
            comm.gather_bytes(&own, Some(&mut s.pushed), server)?;
            drain()?;
            stream
                .memcpy_dtod(&own, &mut s.pushed.slice_mut(block(rank as usize)))
                .map_err(cuda_err("cannot copy the server's own payload"))?;
            stream
                .memset_zeros(&mut s.sum)
                .map_err(cuda_err("cannot clear the server's sum"))?;
            for from in 0..world {
                codec.decode_add(k, stream, &s.pushed.slice(block(from)), &mut s.sum)?;
            }
            s.codec.encode(k, stream, &s.sum, payload)?;
            s.codec.check_finite(stream, &s.sum)?;
        }
    }
    comm.broadcast(&mut payload.slice_mut(..bytes), server)
}
