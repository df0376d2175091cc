//! Quantizers on the device: QSGD, TernGrad, natural compression and TBQ (`compress/quantize.rs`).
//!
//! QSGD, TernGrad and natural compression are the stochastic quantizers: their uniforms are the CPU
//! codec's, drawn by each thread from its element's index.
//!
//! The stochastic quantizers reproduce the CPU's bytes because the CPU codec draws from a
//! counter-based generator (`compress/rng.rs` `Counter`, seeded identically and advanced by the
//! same ceil(n/2) draws per step): a kernel gets the stream's key and the index of the step's
//! first draw, and the thread quantizing element i computes draw first + i / 2 itself, as
//! `quantize.rs` maps them. Nothing is drawn on the host or uploaded. Their scalars are computed
//! on the device because the results are provably the CPU's: TernGrad's and natural's max |x|
//! is order-independent, and QSGD's Σx² takes the chunked sums of `scan.rs`, which follow
//! `scan::sum_map`'s order exactly.

use super::scan::{ChunkSums, MaxAbs, Sums};
use super::{no_kernel, Build, Family};
use crate::compress::{quantize::draws_for, rng::Counter};
use crate::error::Result;
use crate::runtime::cuda::kernels::Kernels;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use std::sync::Arc;
use syncopate_sim::compress::{qsgd_bits, Compressor, QSGD_MAX_LEVELS};

/// Whether this family has kernels for `c`: QSGD's codes are at most 16 bits wide.
pub(super) fn supports(c: &Compressor) -> bool {
    match c {
        Compressor::Qsgd { levels } => *levels <= QSGD_MAX_LEVELS,
        Compressor::TernGrad | Compressor::Natural | Compressor::Tbq { .. } => true,
        _ => false,
    }
}

pub(super) fn new(b: &Build) -> Result<Box<dyn Family>> {
    let (c, n, stream) = (b.compressor, b.count, b.stream);
    Ok(match c {
        Compressor::Qsgd { levels } if levels <= QSGD_MAX_LEVELS => {
            Box::new(Qsgd::new(c, n, levels, b.seed, stream)?)
        }
        Compressor::TernGrad | Compressor::Natural => {
            Box::new(MaxScaled::new(c, n, b.seed, stream)?)
        }
        Compressor::Tbq { threshold } => Box::new(Tbq::new(c, n, threshold as f32)),
        other => return Err(no_kernel(&other)),
    })
}

/// A stochastic quantizer's uniforms: the CPU codec's stream, of which each step takes the
/// ceil(n/2) draws `quantize.rs` consumes for n elements; the kernels compute them.
struct Draws(Counter);

impl Draws {
    fn new(seed: u64) -> Draws {
        Draws(Counter::new(seed))
    }

    /// This step's stream key and first draw.
    fn next(&mut self, n: u32) -> (u64, u64) {
        self.0.take(draws_for(n as usize) as u64)
    }
}

/// QSGD with at most `QSGD_MAX_LEVELS` levels: the f32 norm, then codes of `bits` bits.
pub(super) struct Qsgd {
    c: Compressor,
    n: u32,
    levels: u32,
    bits: u32,
    draws: Draws,
    norm: ChunkSums,
}

impl Qsgd {
    pub(super) fn new(
        c: Compressor,
        n: u32,
        levels: u32,
        seed: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<Qsgd> {
        Ok(Qsgd {
            c,
            n,
            levels,
            bits: qsgd_bits(levels),
            draws: Draws::new(seed),
            norm: ChunkSums::new(n, stream)?,
        })
    }
}

impl Family for Qsgd {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        bad: &mut CudaSlice<u32>,
    ) -> Result<()> {
        let (key, first) = self.draws.next(self.n);
        // The norm, in the CPU's summation order, into out[0..4], where the codes' kernel
        // reads it.
        self.norm.write(k, stream, input, self.n, Sums::Norm, out)?;
        k.qsgd_encode(
            stream,
            input,
            key,
            first,
            out,
            self.n,
            self.levels,
            self.bits,
            bad,
        )
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        k.qsgd_decode_add(stream, payload, acc, self.n, self.levels, self.bits)
    }
}

/// TernGrad and natural compression: both scaled by max |x|, one uniform per element.
pub(super) struct MaxScaled {
    c: Compressor,
    n: u32,
    draws: Draws,
    max: MaxAbs,
}

impl MaxScaled {
    pub(super) fn new(
        c: Compressor,
        n: u32,
        seed: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<MaxScaled> {
        Ok(MaxScaled {
            c,
            n,
            draws: Draws::new(seed),
            max: MaxAbs::new(stream)?,
        })
    }
}

impl Family for MaxScaled {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        bad: &mut CudaSlice<u32>,
    ) -> Result<()> {
        let (key, first) = self.draws.next(self.n);
        let max = self.max.of(k, stream, input, self.n, bad)?;
        match self.c {
            Compressor::Natural => k.natural_encode(stream, input, key, first, out, self.n, max),
            _ => k.terngrad_encode(stream, input, key, first, out, self.n, max),
        }
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        match self.c {
            Compressor::Natural => k.natural_decode_add(stream, payload, acc, self.n),
            // TernGrad's scale is the f32 header (`header` 1); the τ argument goes unused.
            _ => k.two_bit_decode_add(stream, payload, acc, self.n, 1, 0.0),
        }
    }
}

/// TBQ: 2-bit codes against ±τ, no header.
pub(super) struct Tbq {
    c: Compressor,
    n: u32,
    tau: f32,
}

impl Tbq {
    pub(super) fn new(c: Compressor, n: u32, tau: f32) -> Tbq {
        Tbq { c, n, tau }
    }
}

impl Family for Tbq {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        bad: &mut CudaSlice<u32>,
    ) -> Result<()> {
        k.tbq_pack(stream, input, out, self.n, self.tau, bad)
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        k.two_bit_decode_add(stream, payload, acc, self.n, 0, self.tau)
    }
}
