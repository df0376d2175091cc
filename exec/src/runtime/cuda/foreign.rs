//! One rank's device codecs driven op by op on buffers and streams another library owns (PyTorch's).
//!
//! `syncopate.torch` on CUDA keeps the fusion buffers, payloads and results in PyTorch tensors
//! and runs the collectives through torch.distributed's NCCL; each op here borrows the tensors'
//! device memory and the stream it is called on for that call only, and runs the same
//! [`DevicePiece`] ops as the CUDA backend, so payloads are byte-identical to the CPU codecs'.

use super::device_piece::DevicePiece;
use super::kernels::{cuda_err, Kernels};
use crate::error::{ExecError, Result};
use crate::runtime::pieces;
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DeviceRepr};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use syncopate_sim::compress::{Compressor, Memory};
use syncopate_sim::schedule::{Exchange, Piece, Schedule};

/// A device buffer its owner lends for one call: its address and its length in elements.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    /// The device address (a tensor's `data_ptr()`).
    pub address: u64,
    /// Its length in elements of the type the op reads or writes.
    pub len: usize,
}

/// A region seen as a cudarc slice; dropping it leaves the memory to its owner.
struct Borrowed<T>(Option<CudaSlice<T>>);

impl<T: DeviceRepr> Borrowed<T> {
    /// # Safety
    /// `region` must be `len` elements of `T` of device memory in `stream`'s context that stay
    /// allocated, and are not used by other work that is not ordered with `stream`, for as long
    /// as the result lives.
    unsafe fn new(stream: &Arc<CudaStream>, region: Region, what: &str) -> Result<Borrowed<T>> {
        if region.address == 0 || region.len == 0 {
            return Err(ExecError::Cuda {
                message: format!("{what}: an empty or null device buffer"),
            });
        }
        // SAFETY: the caller's contract above.
        Ok(Borrowed(Some(unsafe {
            stream.upgrade_device_ptr(region.address as sys::CUdeviceptr, region.len)
        })))
    }
}

impl<T> Deref for Borrowed<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.0.as_ref().expect("a borrowed slice until dropped")
    }
}

impl<T> DerefMut for Borrowed<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.0.as_mut().expect("a borrowed slice until dropped")
    }
}

impl<T> Drop for Borrowed<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.0.take() {
            // The owner frees it.
            slice.leak();
        }
    }
}

/// Whether piece `index` has no codec work: no compressor and no memory, one round summed in
/// place, its wire format the float32 elements themselves (syncopate.torch's `is_identity`).
pub fn is_identity(piece: &Piece) -> bool {
    piece.compressor == Compressor::None
        && piece.memory == Memory::None
        && piece.rounds.len() == 1
        && matches!(
            piece.rounds[0].exchange,
            Exchange::Allreduce | Exchange::HierarchicalAllreduce
        )
}

/// Why syncopate.torch cannot run `schedule` on a CUDA device, or None when it can: every
/// compressor needs its GPU kernels and every exchange must be a collective torch.distributed
/// runs on NCCL (`syncopate exec --backend cuda` runs the CaSync-Ring and parameter servers).
pub fn refusal(schedule: &Schedule) -> Option<String> {
    schedule
        .pieces
        .iter()
        .enumerate()
        .find_map(|(index, piece)| piece_refusal(index, piece).err())
        .map(|err| err.to_string())
}

fn piece_refusal(index: usize, piece: &Piece) -> Result<()> {
    DevicePiece::runs(index, piece)?;
    for round in &piece.rounds {
        if matches!(
            round.exchange,
            Exchange::CompressedRing | Exchange::PushPull { .. }
        ) {
            return Err(ExecError::Cuda {
                message: format!(
                    "pieces[{index}] (group {}) is exchanged by {:?}, which syncopate.torch runs on the CPU only; `syncopate exec --backend cuda` runs it on GPUs",
                    piece.group, round.exchange
                ),
            });
        }
    }
    Ok(())
}

/// One rank's device state of every piece with codec work.
pub struct ForeignRank {
    ctx: Arc<CudaContext>,
    kernels: Kernels,
    /// The schedule as it runs now (`set_compressor` changes it).
    schedule: Schedule,
    /// None for identity pieces.
    pieces: Vec<Option<Mutex<DevicePiece>>>,
}

impl ForeignRank {
    /// Rank `rank`'s state of `schedule` on GPU `device`, seeded as every backend seeds it.
    /// Compiles the kernels for the device (NVRTC).
    pub fn new(schedule: &Schedule, seed: u64, rank: u32, device: usize) -> Result<ForeignRank> {
        if let Some(why) = refusal(schedule) {
            return Err(ExecError::Cuda { message: why });
        }
        let ctx = CudaContext::new(device).map_err(cuda_err("cannot open the GPU"))?;
        // SAFETY: every op is ordered by its caller on the stream it passes (PyTorch's events),
        // and the borrowed buffers are the caller's; cudarc's per-buffer events would order
        // nothing more.
        unsafe { ctx.disable_event_tracking() };
        let kernels = Kernels::load(&ctx)?;
        let setup = ctx
            .new_stream()
            .map_err(cuda_err("cannot create a stream"))?;
        let mut pieces = Vec::with_capacity(schedule.pieces.len());
        for (index, piece) in schedule.pieces.iter().enumerate() {
            pieces.push(match is_identity(piece) {
                true => None,
                false => Some(Mutex::new(DevicePiece::new(
                    schedule, seed, index, rank, &setup,
                )?)),
            });
        }
        setup
            .synchronize()
            .map_err(cuda_err("the codecs' set-up failed"))?;
        Ok(ForeignRank {
            ctx,
            kernels,
            schedule: schedule.clone(),
            pieces,
        })
    }

    /// Gives piece `index` a fresh codec for `compressor` (DGC's warm-up ratio of an epoch),
    /// seeded as before; its memory is kept.
    pub fn set_compressor(
        &mut self,
        index: usize,
        compressor: Compressor,
        seed: u64,
        rank: u32,
    ) -> Result<()> {
        self.schedule.pieces[index].compressor = compressor;
        let setup = self
            .ctx
            .new_stream()
            .map_err(cuda_err("cannot create a stream"))?;
        let fresh = DevicePiece::new(&self.schedule, seed, index, rank, &setup)?;
        setup
            .synchronize()
            .map_err(cuda_err("the codec's set-up failed"))?;
        if let Some(piece) = &mut self.pieces[index] {
            let piece = piece.get_mut().expect("a piece lock");
            piece.codec = fresh.codec;
            piece.own = fresh.own;
        }
        Ok(())
    }

    fn piece(&self, index: usize) -> Result<(&Piece, MutexGuard<'_, DevicePiece>)> {
        match (self.schedule.pieces.get(index), self.pieces.get(index)) {
            (Some(spec), Some(Some(state))) => Ok((spec, state.lock().expect("a piece lock"))),
            (Some(_), Some(None)) => Err(ExecError::Cuda {
                message: format!("piece {index} has no codec work (the identity codec)"),
            }),
            _ => Err(ExecError::Cuda {
                message: format!(
                    "piece {index} does not exist (the schedule has {})",
                    self.pieces.len()
                ),
            }),
        }
    }

    /// The caller's stream, borrowed.
    ///
    /// # Safety
    /// `stream` must be a live CUDA stream of this device's primary context.
    unsafe fn stream(&self, stream: u64) -> Arc<CudaStream> {
        // SAFETY: the caller's contract.
        unsafe { self.ctx.wrap_borrowed_stream(stream as sys::CUstream) }
    }

    /// Bytes of the payload buffer the piece's encode writes (PowerSGD's larger round).
    pub fn wire_bytes(&self, index: usize) -> Result<usize> {
        Ok(self.piece(index)?.1.codec.wire_bytes())
    }

    /// The schedule as it runs now: the lowered one with the compressors `set_compressor` gave.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Enqueues the compression input from the piece's elements of its group buffer `group`.
    ///
    /// # Safety
    /// `stream` is a live stream of this device and `group` a live float32 device buffer
    /// (see [`Region`]), both ordered by the caller with every other use of the buffer.
    pub unsafe fn compensate(&self, index: usize, stream: u64, group: Region) -> Result<()> {
        let (spec, mut piece) = self.piece(index)?;
        let range = pieces::range(spec);
        if range.end > group.len {
            return Err(short(index, "group buffer", group.len, range.end));
        }
        // SAFETY: the caller's contract.
        let stream = unsafe { self.stream(stream) };
        // SAFETY: the caller's contract, for the buffer.
        let grad = unsafe { Borrowed::<f32>::new(&stream, group, "group buffer") }?;
        piece.compensate(&self.kernels, &stream, &grad.slice(range))
    }

    /// Enqueues the encode into `out` (bytes, at least the piece's wire bytes); returns the
    /// first round's length in bytes.
    ///
    /// # Safety
    /// As [`ForeignRank::compensate`], for `out`.
    pub unsafe fn encode(&self, index: usize, stream: u64, out: Region) -> Result<usize> {
        let (spec, mut piece) = self.piece(index)?;
        let wire = piece.codec.wire_bytes();
        if out.len < wire {
            return Err(short(index, "payload buffer", out.len, wire));
        }
        // SAFETY: the caller's contract.
        let stream = unsafe { self.stream(stream) };
        // SAFETY: the caller's contract, for the buffer.
        let mut payload = unsafe { Borrowed::<u8>::new(&stream, out, "payload buffer") }?;
        piece.encode(&self.kernels, &stream, spec, &mut payload)?;
        Ok(piece.codec.round_bytes(0))
    }

    /// Turns the reduced payload of the last round in `payload` into this rank's payload of
    /// the next round, in place; returns its length in bytes.
    ///
    /// # Safety
    /// As [`ForeignRank::compensate`], for `payload` (the buffer the encode wrote).
    pub unsafe fn next_round(&self, index: usize, stream: u64, payload: Region) -> Result<usize> {
        let (_, mut piece) = self.piece(index)?;
        let wire = piece.codec.wire_bytes();
        if payload.len < wire {
            return Err(short(index, "payload buffer", payload.len, wire));
        }
        // SAFETY: the caller's contract.
        let stream = unsafe { self.stream(stream) };
        // SAFETY: the caller's contract, for the buffer.
        let mut bytes = unsafe { Borrowed::<u8>::new(&stream, payload, "payload buffer") }?;
        piece.next_round(&self.kernels, &stream, &mut bytes)?;
        Ok(piece.codec.round_bytes(piece.round))
    }

    /// Enqueues the result as the sum of the `blocks` equal payloads in `delivered` (one summed
    /// payload, or every rank's gathered one in rank order).
    ///
    /// # Safety
    /// As [`ForeignRank::compensate`], for `delivered`.
    pub unsafe fn decode(
        &self,
        index: usize,
        stream: u64,
        delivered: Region,
        blocks: usize,
    ) -> Result<()> {
        let (_, mut piece) = self.piece(index)?;
        if blocks == 0 || !delivered.len.is_multiple_of(blocks) {
            return Err(ExecError::Cuda {
                message: format!(
                    "piece {index}: {} delivered bytes are not {blocks} equal payloads",
                    delivered.len
                ),
            });
        }
        // SAFETY: the caller's contract.
        let stream = unsafe { self.stream(stream) };
        // SAFETY: the caller's contract, for the buffer.
        let bytes = unsafe { Borrowed::<u8>::new(&stream, delivered, "delivered payload") }?;
        let each = delivered.len / blocks;
        let views: Vec<_> = (0..blocks)
            .map(|b| bytes.slice(b * each..(b + 1) * each))
            .collect();
        piece.decode(&self.kernels, &stream, &views)
    }

    /// Enqueues the memory's update from what this rank's payload carried.
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    pub unsafe fn update_memory(&self, index: usize, stream: u64) -> Result<()> {
        let (spec, mut piece) = self.piece(index)?;
        // SAFETY: the caller's contract.
        let stream = unsafe { self.stream(stream) };
        piece.update_memory(&self.kernels, &stream, spec, self.schedule.world.ranks())
    }

    /// Enqueues EF-SignSGD's division of the result by its learning rate.
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    pub unsafe fn scale_output(&self, index: usize, stream: u64) -> Result<()> {
        let (spec, mut piece) = self.piece(index)?;
        // SAFETY: the caller's contract.
        let stream = unsafe { self.stream(stream) };
        piece.scale_output(&self.kernels, &stream, spec)
    }

    /// Enqueues the result times `scale` into the piece's elements of `group` (float32: the
    /// group's result buffer).
    ///
    /// # Safety
    /// As [`ForeignRank::compensate`], for `group`.
    pub unsafe fn write_result(
        &self,
        index: usize,
        stream: u64,
        group: Region,
        scale: f32,
    ) -> Result<()> {
        let (spec, piece) = self.piece(index)?;
        let range = pieces::range(spec);
        if range.end > group.len {
            return Err(short(index, "result buffer", group.len, range.end));
        }
        // SAFETY: the caller's contract.
        let stream = unsafe { self.stream(stream) };
        // SAFETY: the caller's contract, for the buffer.
        let mut out = unsafe { Borrowed::<f32>::new(&stream, group, "result buffer") }?;
        let n = range.len();
        let mut span = out.slice_mut(range);
        stream
            .memcpy_dtod(&piece.result.slice(..n), &mut span)
            .map_err(cuda_err("cannot write the result"))?;
        if scale != 1.0 {
            self.kernels
                .scale_in_place(&stream, &mut span, n as u32, scale)?;
        }
        Ok(())
    }

    /// Enqueues a copy of the last compression input (`which` false) or decoded sum (true)
    /// into `out` (float32, the piece's length): what `check` compares.
    ///
    /// # Safety
    /// As [`ForeignRank::compensate`], for `out`.
    pub unsafe fn copy_values(
        &self,
        index: usize,
        stream: u64,
        out: Region,
        result: bool,
    ) -> Result<()> {
        let (spec, piece) = self.piece(index)?;
        let n = spec.numel as usize;
        if out.len != n {
            return Err(short(index, "values buffer", out.len, n));
        }
        // SAFETY: the caller's contract.
        let stream = unsafe { self.stream(stream) };
        // SAFETY: the caller's contract, for the buffer.
        let mut values = unsafe { Borrowed::<f32>::new(&stream, out, "values buffer") }?;
        let source = if result {
            &piece.result
        } else {
            &piece.compensated
        };
        stream
            .memcpy_dtod(&source.slice(..n), &mut *values)
            .map_err(cuda_err("cannot copy a piece's values"))
    }

    /// After the piece's last encode was enqueued: the CPU codecs' error for a non-finite
    /// input, naming the element. Synchronizes `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    pub unsafe fn check_finite(&self, index: usize, stream: u64) -> Result<()> {
        let (_, piece) = self.piece(index)?;
        // SAFETY: the caller's contract.
        let stream = unsafe { self.stream(stream) };
        piece.check_finite(&stream)
    }
}

fn short(index: usize, what: &str, len: usize, needed: usize) -> ExecError {
    ExecError::Cuda {
        message: format!("piece {index}: the {what} has {len} elements, the piece needs {needed}"),
    }
}
