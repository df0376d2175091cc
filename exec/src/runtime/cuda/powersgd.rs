//! PowerSGD's GPU state and rounds: P = M·Q, the reduced P's Gram–Schmidt and Q = MᵀP̂, then M̂ = P̂·Qᵀ, each in the CPU reference's operation order (`compress/powersgd.rs`), so both payloads and the decoded result are its bytes.
//!
//! Every buffer holds wire-format f32s: Q as round 2's payload (every low-rank matrix's
//! cols × r in group order), the kept P̂ as round 1's. The kernels read them as floats at
//! offsets that are multiples of 4 bytes in device allocations (256-byte aligned).

use super::kernels::{cuda_err, grid, Kernels};
use crate::compress::powersgd::{initial_q, numel_of, Phase};
use crate::error::{ExecError, Result};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use syncopate_sim::compress::{powersgd_layout, Compressor, PowerSgdTensor};

/// Lanes of `powersgd_p` per output element (its `P_LANES`).
const P_LANES: usize = 8;

pub struct GpuPowerSgd {
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
    pub fn new(
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

    /// Bytes each worker sends in `round`: P's and raw values, then Q's.
    pub fn round_bytes(&self, round: u32) -> usize {
        round_bytes(&self.layout, round)
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
            self.round_bytes(round),
        )
    }

    /// Round 1's payload of `input` into `out`: each matrix's P = M·Q, each raw tensor's values.
    /// The caller checks `input` for non-finite values.
    pub fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        self.phase = Phase::Idle;
        self.check_round(input.len(), out.len(), 0)?;
        let launch = cuda_err("PowerSGD's P kernel launch failed");
        // SAFETY: f32s are valid bytes; the view covers the input's own allocation.
        let bytes =
            unsafe { input.transmute::<u8>(4 * input.len()) }.expect("an f32 buffer as bytes");
        let (mut at, mut qat, mut offset) = (0usize, 0usize, 0usize);
        for t in &self.layout {
            match *t {
                PowerSgdTensor::Raw { numel } => {
                    let n = numel as usize;
                    if n > 0 {
                        stream
                            .memcpy_dtod(
                                &bytes.slice(4 * offset..4 * (offset + n)),
                                &mut out.slice_mut(at..at + 4 * n),
                            )
                            .map_err(cuda_err("cannot copy a raw tensor into the payload"))?;
                    }
                    at += 4 * n;
                }
                PowerSgdTensor::LowRank { rows, cols, rank } => {
                    let (rows, cols, r) = (rows as usize, cols as usize, rank as usize);
                    let m = input.slice(offset..offset + rows * cols);
                    let q = self.q.slice(qat..qat + 4 * cols * r);
                    let mut p = out.slice_mut(at..at + 4 * rows * r);
                    let (rows32, cols32, r32) = (rows as u32, cols as u32, r as u32);
                    // SAFETY: powersgd_p(m, q, p, rows, cols, r) reads rows·cols f32 of m and
                    // cols·r of q and writes rows·r of p: the views' lengths.
                    unsafe {
                        stream
                            .launch_builder(&k.powersgd_p)
                            .arg(&m)
                            .arg(&q)
                            .arg(&mut p)
                            .arg(&rows32)
                            .arg(&cols32)
                            .arg(&r32)
                            .launch(grid(rows * r * P_LANES))
                    }
                    .map_err(&launch)?;
                    at += 4 * rows * r;
                    qat += 4 * cols * r;
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
    pub fn next_round(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
        payload: &mut CudaSlice<u8>,
    ) -> Result<()> {
        self.phase.require(Phase::SentP, &self.c)?;
        self.check_round(input.len(), payload.len(), 0)?;
        self.check_round(input.len(), payload.len(), 1)?;
        let p_bytes = self.round_bytes(0);
        if p_bytes > 0 {
            stream
                .memcpy_dtod(&payload.slice(..p_bytes), &mut self.p.slice_mut(..p_bytes))
                .map_err(cuda_err("cannot keep the reduced P"))?;
        }
        let launch = cuda_err("PowerSGD's round-2 kernel launch failed");
        let (mut at, mut qat, mut offset) = (0usize, 0usize, 0usize);
        for t in &self.layout {
            if let PowerSgdTensor::LowRank { rows, cols, rank } = *t {
                let (rows, cols, r) = (rows as usize, cols as usize, rank as usize);
                let (rows32, cols32, r32) = (rows as u32, cols as u32, r as u32);
                let mut p = self.p.slice_mut(at..at + 4 * rows * r);
                // SAFETY: powersgd_orthogonalize(p, rows, r) touches rows·r f32 of p, the
                // view's length, from one warp.
                unsafe {
                    stream
                        .launch_builder(&k.powersgd_orthogonalize)
                        .arg(&mut p)
                        .arg(&rows32)
                        .arg(&r32)
                        .launch(LaunchConfig {
                            grid_dim: (1, 1, 1),
                            block_dim: (32, 1, 1),
                            shared_mem_bytes: 0,
                        })
                }
                .map_err(&launch)?;
                let m = input.slice(offset..offset + rows * cols);
                let p = self.p.slice(at..at + 4 * rows * r);
                let mut q = payload.slice_mut(qat..qat + 4 * cols * r);
                // SAFETY: powersgd_q(m, p, q, rows, cols, r) reads rows·cols f32 of m and
                // rows·r of p and writes cols·r of q: the views' lengths.
                unsafe {
                    stream
                        .launch_builder(&k.powersgd_q)
                        .arg(&m)
                        .arg(&p)
                        .arg(&mut q)
                        .arg(&rows32)
                        .arg(&cols32)
                        .arg(&r32)
                        .launch(grid(cols * r))
                }
                .map_err(&launch)?;
                qat += 4 * cols * r;
            }
            at += t.p_bytes() as usize;
            offset += numel_of(t) as usize;
        }
        self.phase = Phase::SentQ;
        Ok(())
    }

    /// `acc += M̂` from round 2's reduced `payload` (its first `round_bytes(1)` bytes): P̂·Qᵀ
    /// per matrix, the reduced values per raw tensor; the reduced Q becomes the next step's.
    pub fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaSlice<f32>,
    ) -> Result<()> {
        self.phase.require(Phase::SentQ, &self.c)?;
        self.check_round(acc.len(), payload.len(), 1)?;
        let launch = cuda_err("PowerSGD's decode kernel launch failed");
        let (mut at, mut qat, mut offset) = (0usize, 0usize, 0usize);
        for t in &self.layout {
            let numel = numel_of(t) as usize;
            let mut out = acc.slice_mut(offset..offset + numel);
            match *t {
                PowerSgdTensor::Raw { .. } => {
                    let (values, n, kind) = (self.p.slice(at..at + 4 * numel), numel as u32, 0i32);
                    // SAFETY: cast_decode_add(p, acc, n, 0) reads n f32 of p and adds them
                    // into n of acc: the views' lengths.
                    unsafe {
                        stream
                            .launch_builder(&k.cast_decode_add)
                            .arg(&values)
                            .arg(&mut out)
                            .arg(&n)
                            .arg(&kind)
                            .launch(grid(numel))
                    }
                    .map_err(&launch)?;
                }
                PowerSgdTensor::LowRank { rows, cols, rank } => {
                    let (rows, cols, r) = (rows as usize, cols as usize, rank as usize);
                    let (rows32, cols32, r32) = (rows as u32, cols as u32, r as u32);
                    let p = self.p.slice(at..at + 4 * rows * r);
                    let q = payload.slice(qat..qat + 4 * cols * r);
                    // SAFETY: powersgd_decode_add(p, q, acc, rows, cols, r) reads rows·r f32
                    // of p and cols·r of q and updates rows·cols of acc: the views' lengths.
                    unsafe {
                        stream
                            .launch_builder(&k.powersgd_decode_add)
                            .arg(&p)
                            .arg(&q)
                            .arg(&mut out)
                            .arg(&rows32)
                            .arg(&cols32)
                            .arg(&r32)
                            .launch(grid(numel))
                    }
                    .map_err(&launch)?;
                    qat += 4 * cols * r;
                }
            }
            at += t.p_bytes() as usize;
            offset += numel;
        }
        if qat > 0 {
            // Warm start: the reduced Q seeds the next step's power iteration.
            stream
                .memcpy_dtod(&payload.slice(..qat), &mut self.q.slice_mut(..qat))
                .map_err(cuda_err("cannot keep the reduced Q"))?;
        }
        self.phase = Phase::Idle;
        Ok(())
    }
}

fn round_bytes(layout: &[PowerSgdTensor], round: u32) -> usize {
    let bytes = match round {
        0 => layout.iter().map(PowerSgdTensor::p_bytes).sum::<u64>(),
        _ => layout.iter().map(PowerSgdTensor::q_bytes).sum(),
    };
    bytes as usize
}
