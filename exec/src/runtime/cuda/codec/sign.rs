//! The sign family on the device: signSGD, EF-SignSGD, 1-bit SGD and Signum (`compress/sign.rs`).
//!
//! signSGD, EF-SignSGD and 1-bit SGD have their scales summed in the CPU's order; Signum's momentum
//! is kept on the device, updated in the CPU's operation order.

use super::scan::{ChunkSums, Sums};
use super::{no_kernel, Build, Family};
use crate::error::{ExecError, Result};
use crate::runtime::cuda::kernels::{cuda_err, Kernels};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use std::sync::Arc;
use syncopate_sim::compress::Compressor;

/// Whether this family has kernels for `c`.
pub(super) fn supports(c: &Compressor) -> bool {
    matches!(
        c,
        Compressor::SignSgd
            | Compressor::EfSignSgd
            | Compressor::OneBit
            | Compressor::Signum { .. }
    )
}

pub(super) fn new(b: &Build) -> Result<Box<dyn Family>> {
    let (c, n, stream) = (b.compressor, b.count, b.stream);
    Ok(match c {
        Compressor::SignSgd | Compressor::EfSignSgd | Compressor::OneBit => {
            Box::new(Sign::new(c, n, stream)?)
        }
        Compressor::Signum { momentum } => Box::new(Signum::new(c, n, momentum as f32, stream)?),
        other => return Err(no_kernel(&other)),
    })
}

/// signsgd, efsignsgd or onebit: sign bits after 0, 1 or 2 f32 scales.
pub(super) struct Sign {
    c: Compressor,
    n: u32,
    /// Scales in the header: the kernels' `header_kind`.
    scales: i32,
    /// What the header holds and the sums it comes from (efsignsgd, onebit).
    header: Option<(Sums, ChunkSums)>,
}

impl Sign {
    pub(super) fn new(c: Compressor, n: u32, stream: &Arc<CudaStream>) -> Result<Sign> {
        let (scales, sums) = match c {
            Compressor::EfSignSgd => (1, Some(Sums::MeanAbs)),
            Compressor::OneBit => (2, Some(Sums::SignMeans)),
            _ => (0, None),
        };
        Ok(Sign {
            c,
            n,
            scales,
            header: match sums {
                Some(sums) => Some((sums, ChunkSums::new(n, stream)?)),
                None => None,
            },
        })
    }
}

impl Family for Sign {
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
        if let Some((sums, chunks)) = &mut self.header {
            chunks.write(k, stream, input, self.n, *sums, out)?;
        }
        let header = 4 * self.scales as usize;
        let len = out.len();
        let mut bits = out
            .try_slice_mut(header..)
            .ok_or_else(|| ExecError::BadPayload {
                compressor: self.c.to_string(),
                message: format!(
                    "a buffer of {len} bytes has no room after the {header}-byte header"
                ),
            })?;
        k.sign_pack(stream, input, &mut bits, self.n, bad)
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        k.sign_decode_add(stream, payload, acc, self.n, self.scales)
    }
}

/// Signum: sign bits of the momentum m ← β·m + (1 − β)·g, m kept on the device.
pub(super) struct Signum {
    c: Compressor,
    n: u32,
    beta: f32,
    momentum: CudaSlice<f32>,
}

impl Signum {
    pub(super) fn new(
        c: Compressor,
        n: u32,
        beta: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<Signum> {
        Ok(Signum {
            c,
            n,
            beta,
            momentum: stream
                .alloc_zeros((n as usize).max(1))
                .map_err(cuda_err("cannot allocate Signum's momentum"))?,
        })
    }
}

impl Family for Signum {
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
        k.signum_pack(
            stream,
            input,
            &mut self.momentum,
            out,
            self.n,
            self.beta,
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
        k.sign_decode_add(stream, payload, acc, self.n, 0)
    }
}
