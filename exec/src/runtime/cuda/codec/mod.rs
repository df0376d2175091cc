//! GPU encoders/decoders whose payload bytes equal the CPU reference codecs'.
//!
//! They have the same layout, the same rounding and the same summation order, with one compressor
//! family per file as in `compress/`.
//!
//! Each family implements [`Family`], the device side of `compress::Codec`, and [`GpuCodec`]
//! holds one with the finite flag every encoder writes. The compressor catalog's family picks
//! the file; each file's `supports` says which of its members have kernels and its `new` builds
//! them: none, fp16, bf16 and fp8:e4m3/e5m2 (`cast.rs`); signsgd, efsignsgd, onebit and signum
//! (`sign.rs`); topk, threshold and randomk (`sparse.rs`, with the device selection of
//! `select.rs`); dgc and graddrop (`sampled.rs`); qsgd up to `QSGD_MAX_LEVELS`, terngrad,
//! natural and tbq (`quantize.rs`); powersgd (`powersgd.rs`). Any other compressor (a CPU-only
//! one, a hand-built qsgd above the maximum) is refused with an error naming it.
//!
//! What the host decides, it decides with the CPU codec's own code and generators, seeded
//! identically (random-k's indices, the samplers' positions and thresholds, the quantizers'
//! uniforms, PowerSGD's initial Q), so those are the CPU's by construction; the kernels do the
//! passes over the tensor in the CPU's operation order (`exec/kernels/*.cu`).

mod cast;
mod powersgd;
mod quantize;
mod sampled;
mod scan;
mod select;
mod sign;
mod sparse;
#[cfg(test)]
mod tests;

use super::kernels::{cuda_err, Input, Kernels, Output};
use crate::error::{ExecError, Result};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use std::sync::Arc;
use syncopate_sim::compress::{catalog, Compressor, Family as CodecFamily};

/// One compressor family's codec on the device, for a piece of a fixed number of elements:
/// the device side of `compress::Codec`.
trait Family: Send {
    fn compressor(&self) -> Compressor;

    /// Enqueues the encode of `input` into `out` (`wire_bytes` long), noting the lowest index
    /// of a non-finite element of `input` in `bad`.
    fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        bad: &mut CudaSlice<u32>,
    ) -> Result<()>;

    /// Enqueues `acc += decode(payload)`, a payload whose length [`Family::takes`].
    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()>;

    /// Whether `decode_add` takes a payload of `len` bytes, `wire` being `wire_bytes`.
    fn takes(&self, len: usize, wire: usize) -> bool {
        len == wire
    }

    /// Multi-round families (PowerSGD): the bytes each rank sends in allreduce round `round`.
    /// `None`: a single round of `wire_bytes`.
    fn round_bytes(&self, _round: u32) -> Option<usize> {
        None
    }

    /// Multi-round families: this rank's payload of the next round from the previous round's
    /// reduced one in `payload`, in place; `input` is what `encode` got.
    fn next_round(
        &mut self,
        _k: &Kernels,
        _stream: &Arc<CudaStream>,
        _input: &CudaView<'_, f32>,
        _payload: &mut CudaSlice<u8>,
    ) -> Result<()> {
        Err(ExecError::Protocol {
            compressor: self.compressor().to_string(),
            message: "has a single round".into(),
        })
    }
}

/// What a family's `new` builds a device codec for.
struct Build<'a> {
    compressor: Compressor,
    /// Elements of the piece, and the same as the kernels' 32-bit count.
    n: usize,
    count: u32,
    /// The piece's tensors (PowerSGD compresses matrices); none for one flat buffer.
    shapes: &'a [&'a [u64]],
    seed: u64,
    stream: &'a Arc<CudaStream>,
}

/// Whether the GPU has a kernel for this compressor; the error names what is missing.
pub fn supported(c: &Compressor) -> Result<()> {
    let has_kernel = match c.family() {
        CodecFamily::Cast => cast::supports(c),
        CodecFamily::Sparse => sparse::supports(c),
        CodecFamily::Sampled => sampled::supports(c),
        CodecFamily::Quantize => quantize::supports(c),
        CodecFamily::Sign => sign::supports(c),
        CodecFamily::PowerSgd => powersgd::supports(c),
    };
    if has_kernel {
        Ok(())
    } else {
        Err(no_kernel(c))
    }
}

/// The refusal of a compressor without GPU kernels, naming it and those that have them.
fn no_kernel(c: &Compressor) -> ExecError {
    let with: Vec<&str> = catalog().iter().filter(|e| e.gpu).map(|e| e.form).collect();
    ExecError::Cuda {
        message: format!(
            "no GPU kernel for `{c}` in this build (GPU kernels: {}); use --backend host for it",
            with.join(", ")
        ),
    }
}

/// One rank's GPU codec for one piece of `n` elements.
pub struct GpuCodec {
    family: Box<dyn Family>,
    n: usize,
    /// Lowest index of a non-finite input element, u32::MAX when none.
    bad: CudaSlice<u32>,
}

impl GpuCodec {
    /// The codec of a piece of `n` elements; `shapes` are its tensors' (PowerSGD compresses
    /// matrices; none means one flat buffer, as `compress::codec_for_shapes` takes them).
    pub fn new(
        c: &Compressor,
        n: usize,
        shapes: &[&[u64]],
        seed: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<GpuCodec> {
        supported(c)?;
        let count = u32::try_from(n).map_err(|_| ExecError::Cuda {
            message: format!("a piece of {n} elements exceeds the kernels' 32-bit indexing"),
        })?;
        let build = Build {
            compressor: *c,
            n,
            count,
            shapes,
            seed,
            stream,
        };
        let family = match c.family() {
            CodecFamily::Cast => cast::new(&build)?,
            CodecFamily::Sparse => sparse::new(&build)?,
            CodecFamily::Sampled => sampled::new(&build)?,
            CodecFamily::Quantize => quantize::new(&build)?,
            CodecFamily::Sign => sign::new(&build)?,
            CodecFamily::PowerSgd => powersgd::new(&build)?,
        };
        Ok(GpuCodec {
            family,
            n,
            bad: stream
                .alloc_zeros(1)
                .map_err(cuda_err("cannot allocate the finite flag"))?,
        })
    }

    /// The compressor this codec implements.
    pub fn compressor(&self) -> Compressor {
        self.family.compressor()
    }

    /// Bytes of the payload buffer: the payload, or PowerSGD's larger round (both use it).
    pub fn wire_bytes(&self) -> usize {
        match self.family.round_bytes(0) {
            Some(first) => first.max(self.family.round_bytes(1).unwrap_or(0)),
            None => self.compressor().wire_bytes(self.n as u64) as usize,
        }
    }

    /// Bytes each rank sends in allreduce round `round`: PowerSGD's P, then its Q; the
    /// payload for single-round codecs.
    pub fn round_bytes(&self, round: u32) -> usize {
        self.family
            .round_bytes(round)
            .unwrap_or_else(|| self.wire_bytes())
    }

    /// Enqueues the encode of `input` (n elements) into `out` (`wire_bytes` long) on `stream`.
    pub fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &impl Input<f32>,
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        stream
            .memcpy_htod(&[u32::MAX], &mut self.bad)
            .map_err(cuda_err("cannot reset the finite flag"))?;
        self.family
            .encode(k, stream, &input.view(), out, &mut self.bad)
    }

    /// Multi-round codecs (PowerSGD): turns the previous round's reduced payload in `payload`
    /// into this rank's payload of the next round, in place; `input` is what `encode` got.
    pub fn next_round(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &impl Input<f32>,
        payload: &mut CudaSlice<u8>,
    ) -> Result<()> {
        self.family.next_round(k, stream, &input.view(), payload)
    }

    /// After the last encode completed: the index of the first non-finite element of its input,
    /// if any. Synchronizes `stream`.
    pub fn first_non_finite(&self, stream: &Arc<CudaStream>) -> Result<Option<usize>> {
        scan::first_non_finite(stream, &self.bad)
    }

    /// After the encode completed: the CPU codecs' error for non-finite input, naming the
    /// first bad element. Synchronizes `stream`.
    pub fn check_finite(&self, stream: &Arc<CudaStream>, input: &impl Input<f32>) -> Result<()> {
        let Some(index) = self.first_non_finite(stream)? else {
            return Ok(());
        };
        let value = stream
            .clone_dtoh(&input.view().slice(index..index + 1))
            .map_err(cuda_err("cannot read the non-finite element"))?[0];
        Err(ExecError::NonFinite { index, value })
    }

    /// Enqueues `acc += decode(payload)`; `payload` may be one rank's block of a gathered buffer.
    /// PowerSGD's is its last round's reduced payload (its Q), alone or at the start of the
    /// payload buffer.
    pub fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut impl Output<f32>,
    ) -> Result<()> {
        let wire = self.wire_bytes();
        if !self.family.takes(payload.len(), wire) {
            return Err(ExecError::BadPayload {
                compressor: self.compressor().to_string(),
                message: format!(
                    "{} bytes, expected {wire} for {} elements",
                    payload.len(),
                    self.n
                ),
            });
        }
        self.family
            .decode_add(k, stream, payload, &mut acc.view_mut())
    }
}
