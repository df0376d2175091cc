//! PowerSGD's GPU state and rounds: payloads and decoded result are the CPU reference's bytes.
//!
//! The rounds compute P = M·Q, the reduced P's Gram–Schmidt and Q = MᵀP̂, then M̂ = P̂·Qᵀ, each in
//! the CPU reference's operation order (`compress/powersgd.rs`).
//!
//! Every buffer holds wire-format f32s: Q as round 2's payload (every low-rank matrix's
//! cols × r in group order), the kept P̂ as round 1's. The kernels read them as floats at
//! offsets that are multiples of 4 bytes in device allocations (256-byte aligned).

use super::{no_kernel, Build, Family};
use crate::compress::powersgd::{initial_q, numel_of, Phase};
use crate::error::{ExecError, Result};
use crate::runtime::cuda::kernels::{cuda_err, f32s, f32s_mut, Kernels};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use std::sync::Arc;
use syncopate_sim::compress::{powersgd_layout, powersgd_rounds, Compressor, PowerSgdTensor};

/// Whether this family has kernels for `c`.
pub(super) fn supports(c: &Compressor) -> bool {
    matches!(c, Compressor::PowerSgd { .. })
}

pub(super) fn new(b: &Build) -> Result<Box<dyn Family>> {
    match b.compressor {
        Compressor::PowerSgd { rank } => Ok(Box::new(GpuPowerSgd::new(
            rank, b.n, b.shapes, b.seed, b.stream,
        )?)),
        other => Err(no_kernel(&other)),
    }
}

pub(super) struct GpuPowerSgd {
    c: Compressor,
    /// Elements of the group.
    n: usize,
    layout: Vec<PowerSgdTensor>,
    /// Q of every low-rank matrix: the seeded start, then the last reduced Q (warm start).
    q: CudaSlice<u8>,
    /// Round 1's reduced payload with its P's orthonormalized: decode's P̂ and raw sums.
    p: CudaSlice<u8>,
    phase: Phase,
}

impl GpuPowerSgd {
    /// The codec for a group of `shapes` (none: one flat buffer, sent raw) of `n` elements in
    /// all; Q starts as the CPU codec's for the same seed.
    pub(super) fn new(
        rank: u32,
        n: usize,
        shapes: &[&[u64]],
        seed: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<GpuPowerSgd> {
        let layout = if shapes.is_empty() {
            vec![PowerSgdTensor::Raw { numel: n as u64 }]
        } else {
            powersgd_layout(shapes, rank)
        };
        let c = Compressor::PowerSgd { rank };
        let expected: u64 = layout.iter().map(numel_of).sum();
        if expected != n as u64 {
            return Err(ExecError::LengthMismatch {
                compressor: c.to_string(),
                expected: expected as usize,
                got: n,
            });
        }
        let q: Vec<u8> = initial_q(&layout, seed)
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let alloc = cuda_err("cannot allocate PowerSGD's state");
        let mut state = GpuPowerSgd {
            c,
            n,
            q: stream.alloc_zeros(q.len().max(1)).map_err(&alloc)?,
            p: stream
                .alloc_zeros(round_bytes(&layout, 0).max(1))
                .map_err(&alloc)?,
            layout,
            phase: Phase::Idle,
        };
        if !q.is_empty() {
            stream
                .memcpy_htod(&q, &mut state.q)
                .map_err(cuda_err("cannot upload PowerSGD's initial Q"))?;
        }
        Ok(state)
    }

    /// An error, rather than an out-of-bounds view, for a buffer shorter than a step needs.
    fn check_len(&self, what: &str, len: usize, want: usize) -> Result<()> {
        if len >= want {
            return Ok(());
        }
        Err(ExecError::BadPayload {
            compressor: self.c.to_string(),
            message: format!("{what} holds {len}, this group needs {want}"),
        })
    }

    /// Checks the gradient and the payload buffer of a round.
    fn check_round(&self, input: usize, payload: usize, round: u32) -> Result<()> {
        self.check_len("the f32 buffer (elements)", input, self.n)?;
        self.check_len(
            &format!("the payload buffer of round {} (bytes)", round + 1),
            payload,
            round_bytes(&self.layout, round),
        )
    }
}

// Offsets below count f32s: `at` into the P payload (round 1), `qat` into the Q payload
// (round 2) and the Q state, `offset` into the gradient.
impl Family for GpuPowerSgd {
    fn compressor(&self) -> Compressor {
        self.c
    }

    /// Round 1's payload of `input` into `out`: each matrix's P = M·Q, each raw tensor's
    /// values. The CPU checks every element it reads; its first bad one is the lowest index.
    fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        bad: &mut CudaSlice<u32>,
    ) -> Result<()> {
        self.phase = Phase::Idle;
        self.check_round(input.len(), out.len(), 0)?;
        k.check_finite(stream, input, self.n as u32, bad)?;
        let q = f32s(&self.q.as_view())?;
        let mut bytes = out.as_view_mut();
        let mut payload = f32s_mut(&mut bytes)?;
        let (mut at, mut qat, mut offset) = (0usize, 0usize, 0usize);
        for t in &self.layout {
            match *t {
                PowerSgdTensor::Raw { numel } => {
                    let n = numel as usize;
                    if n > 0 {
                        stream
                            .memcpy_dtod(
                                &input.slice(offset..offset + n),
                                &mut payload.slice_mut(at..at + n),
                            )
                            .map_err(cuda_err("cannot copy a raw tensor into the payload"))?;
                    }
                    at += n;
                }
                PowerSgdTensor::LowRank { rows, cols, rank } => {
                    let (rows, cols, r) = (rows as usize, cols as usize, rank as usize);
                    k.powersgd_p(
                        stream,
                        &input.slice(offset..offset + rows * cols),
                        &q.slice(qat..qat + cols * r),
                        &mut payload.slice_mut(at..at + rows * r),
                        rows as u32,
                        cols as u32,
                        r as u32,
                    )?;
                    at += rows * r;
                    qat += cols * r;
                }
            }
            offset += numel_of(t) as usize;
        }
        self.phase = Phase::SentP;
        Ok(())
    }

    /// From round 1's reduced payload in `payload`, this worker's round 2 payload in its place:
    /// P̂ = Gram–Schmidt of each reduced P (kept for decode), Q = MᵀP̂ from `input`, the
    /// gradient `encode` got.
    fn next_round(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        payload: &mut CudaSlice<u8>,
    ) -> Result<()> {
        self.phase.require(Phase::SentP, &self.c)?;
        self.check_round(input.len(), payload.len(), 0)?;
        self.check_round(input.len(), payload.len(), 1)?;
        let p_bytes = round_bytes(&self.layout, 0);
        if p_bytes > 0 {
            stream
                .memcpy_dtod(&payload.slice(..p_bytes), &mut self.p.slice_mut(..p_bytes))
                .map_err(cuda_err("cannot keep the reduced P"))?;
        }
        let mut p_state = self.p.as_view_mut();
        let mut p = f32s_mut(&mut p_state)?;
        let mut bytes = payload.as_view_mut();
        let mut q = f32s_mut(&mut bytes)?;
        let (mut at, mut qat, mut offset) = (0usize, 0usize, 0usize);
        for t in &self.layout {
            if let PowerSgdTensor::LowRank { rows, cols, rank } = *t {
                let (rows, cols, r) = (rows as usize, cols as usize, rank as usize);
                let (rows32, cols32, r32) = (rows as u32, cols as u32, r as u32);
                k.powersgd_orthogonalize(stream, &mut p.slice_mut(at..at + rows * r), rows32, r32)?;
                k.powersgd_q(
                    stream,
                    &input.slice(offset..offset + rows * cols),
                    &p.slice(at..at + rows * r),
                    &mut q.slice_mut(qat..qat + cols * r),
                    rows32,
                    cols32,
                    r32,
                )?;
                qat += cols * r;
            }
            at += t.p_bytes() as usize / 4;
            offset += numel_of(t) as usize;
        }
        self.phase = Phase::SentQ;
        Ok(())
    }

    /// `acc += M̂` from round 2's reduced `payload` (its first `round_bytes(1)` bytes): P̂·Qᵀ
    /// per matrix, the reduced values per raw tensor; the reduced Q becomes the next step's.
    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        if self.phase == Phase::SentP && powersgd_rounds(&self.layout) == 1 {
            // No Q round: `payload` is the reduced first round, kept as the next round keeps it.
            let p_bytes = round_bytes(&self.layout, 0);
            self.check_round(acc.len(), payload.len(), 0)?;
            if p_bytes > 0 {
                stream
                    .memcpy_dtod(&payload.slice(..p_bytes), &mut self.p.slice_mut(..p_bytes))
                    .map_err(cuda_err("cannot keep the reduced values"))?;
            }
            self.phase = Phase::SentQ;
        }
        self.phase.require(Phase::SentQ, &self.c)?;
        self.check_round(acc.len(), payload.len(), 1)?;
        let p = f32s(&self.p.as_view())?;
        let q = f32s(payload)?;
        let (mut at, mut qat, mut offset) = (0usize, 0usize, 0usize);
        for t in &self.layout {
            let numel = numel_of(t) as usize;
            let mut out = acc.slice_mut(offset..offset + numel);
            match *t {
                PowerSgdTensor::Raw { .. } => {
                    // The reduced values as they came: an f32 payload's decode.
                    let values = self.p.slice(4 * at..4 * (at + numel));
                    k.cast_decode_add(stream, &values, &mut out, numel as u32, 0)?;
                }
                PowerSgdTensor::LowRank { rows, cols, rank } => {
                    let (rows, cols, r) = (rows as usize, cols as usize, rank as usize);
                    k.powersgd_decode_add(
                        stream,
                        &p.slice(at..at + rows * r),
                        &q.slice(qat..qat + cols * r),
                        &mut out,
                        rows as u32,
                        cols as u32,
                        r as u32,
                    )?;
                    qat += cols * r;
                }
            }
            at += t.p_bytes() as usize / 4;
            offset += numel;
        }
        if qat > 0 {
            // Warm start: the reduced Q seeds the next step's power iteration.
            stream
                .memcpy_dtod(&payload.slice(..4 * qat), &mut self.q.slice_mut(..4 * qat))
                .map_err(cuda_err("cannot keep the reduced Q"))?;
        }
        self.phase = Phase::Idle;
        Ok(())
    }

    /// The reduced Q alone or at the start of the payload buffer.
    fn takes(&self, len: usize, wire: usize) -> bool {
        (round_bytes(&self.layout, 1)..=wire).contains(&len)
    }

    /// P's and raw values, then Q's.
    fn round_bytes(&self, round: u32) -> Option<usize> {
        Some(round_bytes(&self.layout, round))
    }
}

fn round_bytes(layout: &[PowerSgdTensor], round: u32) -> usize {
    let bytes = match round {
        0 => layout.iter().map(PowerSgdTensor::p_bytes).sum::<u64>(),
        _ => layout.iter().map(PowerSgdTensor::q_bytes).sum(),
    };
    bytes as usize
}
