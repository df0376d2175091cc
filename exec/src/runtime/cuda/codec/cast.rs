//! Cast codecs on the device: fp32 as is, fp16, bf16 and fp8 e4m3/e5m2 (`compress/cast.rs`).
//!
//! fp8 takes the per-tensor scale max |x| / max-representable; fp16 and bf16 are element-wise, with
//! the CPU's rounding.

use super::scan::MaxAbs;
use super::{no_kernel, Build, Family};
use crate::error::Result;
use crate::runtime::cuda::kernels::Kernels;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use std::sync::Arc;
use syncopate_sim::compress::{Compressor, Fp8Format};

/// Whether this family has kernels for `c`.
pub(super) fn supports(c: &Compressor) -> bool {
    matches!(
        c,
        Compressor::None | Compressor::Fp16 | Compressor::Bf16 | Compressor::Fp8(_)
    )
}

pub(super) fn new(b: &Build) -> Result<Box<dyn Family>> {
    Ok(match b.compressor {
        c @ (Compressor::None | Compressor::Fp16 | Compressor::Bf16) => {
            Box::new(Cast::new(c, b.count))
        }
        c @ Compressor::Fp8(format) => Box::new(Fp8::new(c, b.count, format, b.stream)?),
        other => return Err(no_kernel(&other)),
    })
}

/// none, fp16 or bf16: the cast kernels' `kind` 0, 1 or 2.
pub(super) struct Cast {
    c: Compressor,
    n: u32,
    kind: i32,
}

impl Cast {
    pub(super) fn new(c: Compressor, n: u32) -> Cast {
        let kind = match c {
            Compressor::Fp16 => 1,
            Compressor::Bf16 => 2,
            _ => 0,
        };
        Cast { c, n, kind }
    }
}

impl Family for Cast {
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
        k.cast_encode(stream, input, out, self.n, self.kind, bad)
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        k.cast_decode_add(stream, payload, acc, self.n, self.kind)
    }
}

/// fp8: the f32 scale, then one code per element.
pub(super) struct Fp8 {
    c: Compressor,
    n: u32,
    /// The kernels' `e5m2`: 1 for e5m2, 0 for e4m3.
    e5m2: i32,
    max: MaxAbs,
}

impl Fp8 {
    pub(super) fn new(
        c: Compressor,
        n: u32,
        format: Fp8Format,
        stream: &Arc<CudaStream>,
    ) -> Result<Fp8> {
        Ok(Fp8 {
            c,
            n,
            e5m2: i32::from(format == Fp8Format::E5m2),
            max: MaxAbs::new(stream)?,
        })
    }
}

impl Family for Fp8 {
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
        let max = self.max.of(k, stream, input, self.n, bad)?;
        k.fp8_encode(stream, input, out, self.n, max, self.e5m2)
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        k.fp8_decode_add(stream, payload, acc, self.n, self.e5m2)
    }
}
