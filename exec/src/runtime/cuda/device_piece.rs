//! One rank's codec state of one piece on the device, and its ops on the payload buffers it is given.
//!
//! The CUDA backend (`run.rs`) and `syncopate.torch` on CUDA (`foreign.rs`) both run a piece's
//! compensate, encode, next-round, decode, update-memory and scale-output ops through it, so
//! the two agree on what an op does; each owns its exchange's buffers.

use super::codec::{supported, GpuCodec};
use super::kernels::{cuda_err, Kernels};
use super::memory::GpuMemory;
use crate::error::{ExecError, Result};
use crate::runtime::pieces;
use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use std::sync::Arc;
use syncopate_sim::compress::Memory;
use syncopate_sim::schedule::{Piece, Schedule};

pub(super) struct DevicePiece {
    pub(super) codec: GpuCodec,
    pub(super) memory: GpuMemory,
    /// The vector compressed this step: the gradient plus the error feedback.
    pub(super) compensated: CudaSlice<f32>,
    /// This rank's own payload, kept for the memory's update (one byte without memory).
    pub(super) own: CudaSlice<u8>,
    /// The decoded sum.
    pub(super) result: CudaSlice<f32>,
    /// What the payload carried of this rank's own vector (one element without memory).
    pub(super) transmitted: CudaSlice<f32>,
    /// The allreduce round the payload is of: 0 after an encode, one more after each next round.
    pub(super) round: u32,
}

impl DevicePiece {
    /// Refuses piece `index` when this build has no kernel for its compressor, or when it is
    /// compressed tensor by tensor (the kernels compress a piece in one call).
    pub(super) fn runs(index: usize, piece: &Piece) -> Result<()> {
        supported(&piece.compressor)?;
        if !piece.calls.is_empty() {
            return Err(ExecError::Cuda {
                message: format!(
                    "pieces[{index}] (group {}) is compressed tensor by tensor (the plan's codec_calls `tensor`); the CUDA kernels compress a piece in one call: run it with --backend host or mpi, or make the plan with codec_calls `group`",
                    piece.group
                ),
            });
        }
        Ok(())
    }

    /// Rank `rank`'s state of piece `index`, its codec seeded as every backend seeds it.
    pub(super) fn new(
        schedule: &Schedule,
        seed: u64,
        index: usize,
        rank: u32,
        stream: &Arc<CudaStream>,
    ) -> Result<DevicePiece> {
        let spec = &schedule.pieces[index];
        let n = spec.numel as usize;
        let codec = GpuCodec::new(
            &spec.compressor,
            n,
            &spec.shapes(),
            pieces::codec_seed(schedule, seed, index, Some(rank)),
            stream,
        )?;
        let remembers = spec.memory != Memory::None;
        let alloc = cuda_err("cannot allocate a piece's codec buffers");
        let sized = |used: bool, len: usize| if used { len.max(1) } else { 1 };
        Ok(DevicePiece {
            own: stream
                .alloc_zeros(sized(remembers, codec.wire_bytes()))
                .map_err(&alloc)?,
            codec,
            memory: GpuMemory::new(spec.memory, n, stream)?,
            compensated: stream.alloc_zeros(n.max(1)).map_err(&alloc)?,
            result: stream.alloc_zeros(n.max(1)).map_err(&alloc)?,
            transmitted: stream.alloc_zeros(sized(remembers, n)).map_err(&alloc)?,
            round: 0,
        })
    }

    /// Enqueues the vector to compress from the piece's elements `grad`.
    pub(super) fn compensate(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        grad: &CudaView<'_, f32>,
    ) -> Result<()> {
        self.memory
            .compensate(k, stream, grad, &mut self.compensated)
    }

    /// Enqueues the encode into `payload` (at least `wire_bytes` long), keeping a copy for the
    /// memory's update.
    pub(super) fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        spec: &Piece,
        payload: &mut CudaSlice<u8>,
    ) -> Result<()> {
        self.codec.encode(k, stream, &self.compensated, payload)?;
        self.round = 0;
        if spec.memory != Memory::None {
            let bytes = self.codec.wire_bytes();
            stream
                .memcpy_dtod(&payload.slice(..bytes), &mut self.own)
                .map_err(cuda_err("cannot keep the own payload"))?;
        }
        Ok(())
    }

    /// A later round of a multi-round codec (PowerSGD's Q), in place from the reduced payload
    /// of the last one.
    pub(super) fn next_round(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &mut CudaSlice<u8>,
    ) -> Result<()> {
        self.codec
            .next_round(k, stream, &self.compensated, payload)?;
        self.round += 1;
        Ok(())
    }

    /// Enqueues the result as the sum of the decoded `blocks` (one summed payload, or every
    /// rank's gathered one).
    pub(super) fn decode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        blocks: &[CudaView<'_, u8>],
    ) -> Result<()> {
        stream
            .memset_zeros(&mut self.result)
            .map_err(cuda_err("cannot clear the result"))?;
        for block in blocks {
            self.codec.decode_add(k, stream, block, &mut self.result)?;
        }
        Ok(())
    }

    /// Enqueues the memory's update from what this rank's payload carried: its own payload
    /// decoded, or for a multi-round codec (PowerSGD, which has no payload of its own to
    /// decode) the averaged low-rank result, as the host backend does.
    pub(super) fn update_memory(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        spec: &Piece,
        world: u32,
    ) -> Result<()> {
        if spec.memory == Memory::None {
            return Ok(());
        }
        if spec.compressor.allreduce_rounds() > 1 {
            let n = spec.numel as u32;
            k.powersgd_average(stream, &self.result, &mut self.transmitted, n, world as f32)?;
        } else {
            let bytes = self.codec.wire_bytes();
            stream
                .memset_zeros(&mut self.transmitted)
                .map_err(cuda_err("cannot clear the transmitted part"))?;
            self.codec
                .decode_add(k, stream, &self.own.slice(..bytes), &mut self.transmitted)?;
        }
        self.remember(k, stream)
    }

    /// Enqueues the memory's update from `transmitted` as it stands.
    pub(super) fn remember(&mut self, k: &Kernels, stream: &Arc<CudaStream>) -> Result<()> {
        self.memory
            .update(k, stream, &self.compensated, &self.transmitted)
    }

    /// EF-SignSGD's result is divided by its learning rate (the CPU codecs' `scale_output`).
    pub(super) fn scale_output(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        spec: &Piece,
    ) -> Result<()> {
        let Memory::EfSignSgd { lr } = spec.memory else {
            return Ok(());
        };
        let (n, scale) = (spec.numel as u32, (1.0 / lr) as f32);
        k.scale_in_place(stream, &mut self.result, n, scale)
    }

    /// After the encode completed: the CPU codecs' error for a non-finite input.
    /// Synchronizes `stream`.
    pub(super) fn check_finite(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.codec.check_finite(stream, &self.compensated)
    }
}
