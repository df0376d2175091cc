//! The device reductions several families share (`compress/scan.rs`).
//!
//! They are the finite flag's read-back, max |x|, and the CPU's chunked sums for the scales.

use crate::error::Result;
use crate::runtime::cuda::kernels::{cuda_err, Kernels, CHUNK};
use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use std::sync::Arc;

/// The lowest index of a non-finite element the encode kernels flagged in `bad` (u32::MAX:
/// none). Synchronizes `stream`.
pub(super) fn first_non_finite(
    stream: &Arc<CudaStream>,
    bad: &CudaSlice<u32>,
) -> Result<Option<usize>> {
    let flag = stream
        .clone_dtoh(bad)
        .map_err(cuda_err("cannot read the finite flag"))?[0];
    Ok((flag != u32::MAX).then_some(flag as usize))
}

/// max |x| as f32 bits (non-negative floats order like their bits): the scale of fp8,
/// TernGrad and natural compression. The order of a maximum does not matter, so the device's
/// is the CPU's.
pub(super) struct MaxAbs {
    bits: CudaSlice<u32>,
}

impl MaxAbs {
    pub(super) fn new(stream: &Arc<CudaStream>) -> Result<MaxAbs> {
        Ok(MaxAbs {
            bits: stream
                .alloc_zeros(1)
                .map_err(cuda_err("cannot allocate the max"))?,
        })
    }

    /// Enqueues max |x| over `input`'s first n elements, noting the first non-finite one in
    /// `bad`; returns the device word that holds it for the scale kernels.
    pub(super) fn of(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        n: u32,
        bad: &mut CudaSlice<u32>,
    ) -> Result<&CudaSlice<u32>> {
        stream
            .memset_zeros(&mut self.bits)
            .map_err(cuda_err("cannot reset the max"))?;
        k.max_abs(stream, input, n, &mut self.bits, bad)?;
        Ok(&self.bits)
    }
}

/// What [`ChunkSums::write`] puts in the header: the kernels' `kind`.
#[derive(Clone, Copy, Debug)]
pub(super) enum Sums {
    /// f32 mean |x| (EF-SignSGD).
    MeanAbs = 0,
    /// f32 mean of the non-negative elements, f32 mean of the negative ones (1-bit SGD).
    SignMeans = 1,
    /// f32 square root of Σx² (QSGD's norm).
    Norm = 2,
}

/// Per-chunk partial sums for n elements. The kernels follow the CPU's order exactly
/// (`scan::sum_map`, `sign.rs`'s fused chunk): 16 f32 lanes and an in-order tail per
/// 4096-element chunk, chunks in order in f64, a correctly rounded f64 square root, then
/// round-to-nearest to f32.
pub(super) struct ChunkSums {
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    negatives: CudaSlice<u32>,
}

impl ChunkSums {
    pub(super) fn new(n: u32, stream: &Arc<CudaStream>) -> Result<ChunkSums> {
        let chunks = (n as usize).div_ceil(CHUNK).max(1);
        let alloc = cuda_err("cannot allocate the chunk sums");
        Ok(ChunkSums {
            a: stream.alloc_zeros(chunks).map_err(&alloc)?,
            b: stream.alloc_zeros(chunks).map_err(&alloc)?,
            negatives: stream.alloc_zeros(chunks).map_err(&alloc)?,
        })
    }

    /// Enqueues `sums` of `input`'s first n elements into the header at the start of `out`;
    /// for n = 0 the CPU writes zero scales, and so does this.
    pub(super) fn write(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        n: u32,
        sums: Sums,
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        if n == 0 {
            return stream
                .memset_zeros(out)
                .map_err(cuda_err("cannot clear an empty payload"));
        }
        let kind = sums as i32;
        let chunks = n.div_ceil(CHUNK as u32);
        k.sign_chunk_sums(
            stream,
            input,
            n,
            kind,
            &mut self.a,
            &mut self.b,
            &mut self.negatives,
        )?;
        k.sign_finish(
            stream,
            &self.a,
            &self.b,
            &self.negatives,
            chunks,
            n,
            kind,
            out,
        )
    }
}
