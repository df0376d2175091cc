//! PowerSGD: rank-r approximation P = MQ, Gram–Schmidt on the reduced P, Q = MᵀP.
//!
//! Q is warm-started; 1-D tensors are sent raw.
//!
//! Wire format, two allreduce rounds of f32 arrays over the group's tensors in order: round 1
//! holds each low-rank matrix's P (rows × r, row-major) or a raw tensor's values; round 2 holds
//! each low-rank matrix's Q (cols × r, row-major). Which tensors are low-rank follows
//! `syncopate_sim::compress::powersgd_layout` (PyTorch's hook rule).

use super::rng::Rng;
use super::scan::{check_all, check_finite};
use super::wire::{bad_payload, f32s, put_f32s, sum_f32_payloads};
use super::{not_in_family, Build, Codec};
use crate::error::{ExecError, Result};
use syncopate_sim::compress::{powersgd_layout, powersgd_rounds, Compressor, PowerSgdTensor};

pub(crate) fn codec(build: &Build) -> Box<dyn Codec> {
    match build.compressor {
        Compressor::PowerSgd { rank } => Box::new(PowerSgd::new(rank, build.shapes, build.seed)),
        other => not_in_family(other, "powersgd"),
    }
}

pub(crate) struct PowerSgd {
    c: Compressor,
    /// Explicit group layout; empty means "one flat 1-D buffer", sized at encode.
    layout: Vec<PowerSgdTensor>,
    /// Per low-rank tensor: Q (cols × r), warm-started from the last step's reduced Q.
    qs: Vec<Vec<f32>>,
    /// This step's gradient (Q = MᵀP needs it in round 2).
    grad: Vec<f32>,
    /// Round-1 results: orthonormal P per low-rank tensor, reduced raw values per raw tensor.
    ps: Vec<Vec<f32>>,
    phase: Phase,
}

/// Where a worker is in a step; the GPU codec keeps the same.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Idle,
    SentP,
    SentQ,
}

impl Phase {
    /// The protocol error of a step out of order: round 2 needs `SentP`, decode `SentQ`.
    pub(crate) fn require(self, want: Phase, c: &Compressor) -> Result<()> {
        if self == want {
            return Ok(());
        }
        let message = match want {
            Phase::SentP => "round 2 needs this worker's encode (round 1) first",
            _ => "decode needs both rounds (encode, then next_round) first",
        };
        Err(ExecError::Protocol {
            compressor: c.to_string(),
            message: message.into(),
        })
    }
}

/// Each low-rank tensor's initial Q (cols × r, row-major; empty for raw tensors): standard
/// normal draws from `seed`, matrix after matrix. The GPU codec uploads the same.
pub(crate) fn initial_q(layout: &[PowerSgdTensor], seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(seed);
    layout
        .iter()
        .map(|t| match *t {
            PowerSgdTensor::LowRank { cols, rank, .. } => {
                (0..cols * rank).map(|_| rng.normal() as f32).collect()
            }
            PowerSgdTensor::Raw { .. } => Vec::new(),
        })
        .collect()
}

impl PowerSgd {
    /// Q starts as a seeded standard normal matrix; workers must share the seed so that their
    /// P = MQ are summable.
    pub(crate) fn new(rank: u32, shapes: &[&[u64]], seed: u64) -> PowerSgd {
        let layout = powersgd_layout(shapes, rank);
        PowerSgd {
            c: Compressor::PowerSgd { rank },
            qs: initial_q(&layout, seed),
            layout,
            grad: Vec::new(),
            ps: Vec::new(),
            phase: Phase::Idle,
        }
    }

    fn layout_for(&self, numel: usize) -> Result<Vec<PowerSgdTensor>> {
        if self.layout.is_empty() {
            return Ok(vec![PowerSgdTensor::Raw {
                numel: numel as u64,
            }]);
        }
        let expected: u64 = self.layout.iter().map(numel_of).sum();
        if expected != numel as u64 {
            return Err(ExecError::LengthMismatch {
                compressor: self.c.to_string(),
                expected: expected as usize,
                got: numel,
            });
        }
        Ok(self.layout.clone())
    }
}

pub(crate) fn numel_of(t: &PowerSgdTensor) -> u64 {
    match *t {
        PowerSgdTensor::Raw { numel } => numel,
        PowerSgdTensor::LowRank { rows, cols, .. } => rows * cols,
    }
}

/// Lanes of [`column_dot`]: a GPU warp's width, so that the CUDA kernel (one warp per matrix,
/// exec/kernels/powersgd.cu) adds in this order and gets the same bits with chains 32 times
/// shorter than one sequential sum over the rows.
const DOT_LANES: usize = 32;

/// Σᵢ p[i][a]·p[i][b] over a rows × r row-major matrix: lane k sums the rows i ≡ k (mod 32) in
/// order, then the lanes are summed in order.
fn column_dot(p: &[f32], r: usize, a: usize, b: usize) -> f32 {
    let mut lanes = [0.0f32; DOT_LANES];
    for (i, row) in p.chunks_exact(r).enumerate() {
        lanes[i % DOT_LANES] += row[a] * row[b];
    }
    lanes.iter().sum()
}

/// Orthonormalizes the r columns of a rows × r row-major matrix in place (modified Gram–Schmidt).
/// A column that vanishes stays zero rather than dividing by zero.
fn orthogonalize(p: &mut [f32], rows: usize, r: usize) {
    for j in 0..r {
        for l in 0..j {
            let dot = column_dot(p, r, j, l);
            for i in 0..rows {
                p[i * r + j] -= dot * p[i * r + l];
            }
        }
        let norm = column_dot(p, r, j, j).sqrt();
        if norm > 0.0 {
            for i in 0..rows {
                p[i * r + j] /= norm;
            }
        }
    }
}

/// Moves a non-finite error found in a piece to its index in the whole buffer.
fn shift(e: ExecError, offset: usize) -> ExecError {
    match e {
        ExecError::NonFinite { index, value } => ExecError::NonFinite {
            index: index + offset,
            value,
        },
        other => other,
    }
}

/// Dot products of `row` with R rows of Qᵀ in one pass over `row` (in L1), 8 f32 lanes per
/// product so the loop vectorizes and the additions do not form one long chain.
#[inline(always)]
fn dots<const R: usize>(row: &[f32], q: [&[f32]; R]) -> [f32; R] {
    const L: usize = 8;
    let mut acc = [[0.0f32; L]; R];
    let whole = row.len() / L * L;
    for (b, x) in row[..whole].chunks_exact(L).enumerate() {
        for j in 0..R {
            let qj = &q[j][b * L..b * L + L];
            for l in 0..L {
                acc[j][l] += x[l] * qj[l];
            }
        }
    }
    let mut out = [0.0f32; R];
    for j in 0..R {
        let tail: f32 = row[whole..]
            .iter()
            .zip(&q[j][whole..])
            .map(|(a, b)| a * b)
            .sum();
        out[j] = acc[j].iter().sum::<f32>() + tail;
    }
    out
}

/// One row of P = M·Q from Qᵀ (r rows of `cols`), four columns of P at a time.
#[inline(always)]
fn p_row(row: &[f32], qt: &[f32], cols: usize, r: usize, p: &mut [f32]) {
    let q = |j: usize| &qt[j * cols..(j + 1) * cols];
    let mut j = 0;
    while j + 4 <= r {
        p[j..j + 4].copy_from_slice(&dots(row, [q(j), q(j + 1), q(j + 2), q(j + 3)]));
        j += 4;
    }
    while j < r {
        p[j] = dots(row, [q(j)])[0];
        j += 1;
    }
}

/// Qᵀ += P[i]ᵀ·M[i] for one row i: for each of the r columns of P a contiguous axpy over the
/// row (vectorized), so Qᵀ (r × cols, in L2) is streamed rather than gathered.
#[inline(always)]
fn q_accumulate(row: &[f32], pi: &[f32], qt: &mut [f32], cols: usize) {
    for (j, &pj) in pi.iter().enumerate() {
        for (q, &v) in qt[j * cols..(j + 1) * cols].iter_mut().zip(row) {
            *q += v * pj;
        }
    }
}

/// [`q_accumulate`] for four consecutive rows at once: each Qᵀ element is loaded and stored
/// once per four rows, and the four additions happen in row order, so every rounding is the
/// one the row-at-a-time loop makes.
#[inline(always)]
fn q_accumulate4(rows: &[f32], ps: &[f32], qt: &mut [f32], cols: usize, r: usize) {
    let (m0, rest) = rows.split_at(cols);
    let (m1, rest) = rest.split_at(cols);
    let (m2, m3) = rest.split_at(cols);
    for j in 0..r {
        let (a, b, c, d) = (ps[j], ps[r + j], ps[2 * r + j], ps[3 * r + j]);
        let q = &mut qt[j * cols..(j + 1) * cols];
        for ((((q, &x0), &x1), &x2), &x3) in q.iter_mut().zip(m0).zip(m1).zip(m2).zip(&m3[..cols]) {
            *q = *q + x0 * a + x1 * b + x2 * c + x3 * d;
        }
    }
}

/// Qᵀ = Mᵀ·P over all rows (Qᵀ starts at zero), rows in order.
#[inline(always)]
fn q_product(m: &[f32], p: &[f32], qt: &mut [f32], cols: usize, r: usize) {
    let mut rows = m.chunks_exact(4 * cols);
    let mut ps = p.chunks_exact(4 * r);
    for (m4, p4) in (&mut rows).zip(&mut ps) {
        q_accumulate4(m4, p4, qt, cols, r);
    }
    for (row, pi) in rows
        .remainder()
        .chunks_exact(cols)
        .zip(ps.remainder().chunks_exact(r))
    {
        q_accumulate(row, pi, qt, cols);
    }
}

/// [`q_product`] compiled for AVX2 (no FMA: the same roundings, the same Q).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q_product_avx2(m: &[f32], p: &[f32], qt: &mut [f32], cols: usize, r: usize) {
    q_product(m, p, qt, cols, r)
}

/// P = M·Q row by row from Qᵀ, checking each row and copying it into `kept` while it is in L1.
#[inline(always)]
fn p_product(
    m: &[f32],
    qt: &[f32],
    kept: &mut [f32],
    p: &mut [f32],
    cols: usize,
    r: usize,
    offset: usize,
) -> Result<()> {
    for (i, ((row, keep), pi)) in m
        .chunks_exact(cols)
        .zip(kept.chunks_exact_mut(cols))
        .zip(p.chunks_exact_mut(r))
        .enumerate()
    {
        check_finite(row, offset + i * cols)?;
        p_row(row, qt, cols, r, pi);
        keep.copy_from_slice(row);
    }
    Ok(())
}

/// [`p_product`] compiled for AVX2 (no FMA: the same lanes and roundings, the same P).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn p_product_avx2(
    m: &[f32],
    qt: &[f32],
    kept: &mut [f32],
    p: &mut [f32],
    cols: usize,
    r: usize,
    offset: usize,
) -> Result<()> {
    p_product(m, qt, kept, p, cols, r, offset)
}

impl Codec for PowerSgd {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        let layout = self.layout_for(grad.len())?;
        // Checked piece by piece as it is read; a failed encode leaves no round to continue.
        self.phase = Phase::Idle;
        // The gradient is kept for round 2; low-rank rows are copied while they are in L1.
        self.grad.resize(grad.len(), 0.0);
        let bytes: u64 = layout.iter().map(PowerSgdTensor::p_bytes).sum();
        out.clear();
        out.resize(bytes as usize, 0);
        let (mut at, mut offset, mut lr) = (0usize, 0usize, 0usize);
        let mut qt = Vec::new();
        let mut p = Vec::new();
        for t in &layout {
            match *t {
                PowerSgdTensor::Raw { numel } => {
                    let n = numel as usize;
                    check_all(&grad[offset..offset + n]).map_err(|e| shift(e, offset))?;
                    put_f32s(
                        &mut out[at..at + 4 * n],
                        grad[offset..offset + n].iter().copied(),
                    );
                    self.grad[offset..offset + n].copy_from_slice(&grad[offset..offset + n]);
                    at += 4 * n;
                }
                PowerSgdTensor::LowRank { rows, cols, rank } => {
                    let (rows, cols, r) = (rows as usize, cols as usize, rank as usize);
                    let q = &self.qs[lr];
                    qt.clear();
                    qt.resize(cols * r, 0.0);
                    for (c, qc) in q.chunks_exact(r).enumerate() {
                        for (j, &v) in qc.iter().enumerate() {
                            qt[j * cols + c] = v;
                        }
                    }
                    p.clear();
                    p.resize(rows * r, 0.0);
                    let m = &grad[offset..offset + rows * cols];
                    let kept = &mut self.grad[offset..offset + rows * cols];
                    #[cfg(target_arch = "x86_64")]
                    let done = if std::arch::is_x86_feature_detected!("avx2") {
                        // SAFETY: the CPU supports AVX2.
                        unsafe { p_product_avx2(m, &qt, kept, &mut p, cols, r, offset)? };
                        true
                    } else {
                        false
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    let done = false;
                    if !done {
                        p_product(m, &qt, kept, &mut p, cols, r, offset)?;
                    }
                    put_f32s(&mut out[at..at + 4 * rows * r], p.iter().copied());
                    at += 4 * rows * r;
                }
            }
            offset += numel_of(t) as usize;
            lr += 1;
        }
        self.phase = Phase::SentP;
        Ok(())
    }

    fn sum_into(&self, acc: &mut [u8], other: &[u8]) -> Result<()> {
        sum_f32_payloads(&self.c, acc, other)
    }

    fn next_round(&mut self, reduced: &[u8], out: &mut Vec<u8>) -> Result<()> {
        self.phase.require(Phase::SentP, &self.c)?;
        let layout = self.layout_for(self.grad.len())?;
        let want: u64 = layout.iter().map(PowerSgdTensor::p_bytes).sum();
        if reduced.len() as u64 != want {
            return Err(bad_payload(
                &self.c,
                format!("round 1 holds {} bytes, expected {want}", reduced.len()),
            ));
        }
        let q_bytes: u64 = layout.iter().map(PowerSgdTensor::q_bytes).sum();
        out.clear();
        out.resize(q_bytes as usize, 0);
        self.ps.clear();
        let (mut at, mut qat, mut offset) = (0usize, 0usize, 0usize);
        for t in &layout {
            let mut p: Vec<f32> = f32s(&reduced[at..at + t.p_bytes() as usize]).collect();
            at += t.p_bytes() as usize;
            if let PowerSgdTensor::LowRank { rows, cols, rank } = *t {
                let (rows, cols, r) = (rows as usize, cols as usize, rank as usize);
                orthogonalize(&mut p, rows, r);
                let m = &self.grad[offset..offset + rows * cols];
                let mut qt = vec![0.0f32; cols * r];
                #[cfg(target_arch = "x86_64")]
                let done = if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2.
                    unsafe { q_product_avx2(m, &p, &mut qt, cols, r) };
                    true
                } else {
                    false
                };
                #[cfg(not(target_arch = "x86_64"))]
                let done = false;
                if !done {
                    q_product(m, &p, &mut qt, cols, r);
                }
                let q = (0..cols).flat_map(|c| (0..r).map(move |j| (c, j)));
                put_f32s(
                    &mut out[qat..qat + 4 * cols * r],
                    q.map(|(c, j)| qt[j * cols + c]),
                );
                qat += 4 * cols * r;
            }
            offset += numel_of(t) as usize;
            self.ps.push(p);
        }
        self.phase = Phase::SentQ;
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        let layout = self.layout_for(acc.len())?;
        if self.phase == Phase::SentP && powersgd_rounds(&layout) == 1 {
            // No Q round: `payload` is the reduced first round, kept as the next round keeps it.
            self.next_round(payload, &mut Vec::new())?;
            return self.decode_add(&[], acc);
        }
        self.phase.require(Phase::SentQ, &self.c)?;
        let want: u64 = layout.iter().map(PowerSgdTensor::q_bytes).sum();
        if payload.len() as u64 != want {
            return Err(bad_payload(
                &self.c,
                format!("round 2 holds {} bytes, expected {want}", payload.len()),
            ));
        }
        let (mut qat, mut offset) = (0usize, 0usize);
        for (lr, t) in layout.iter().enumerate() {
            let p = &self.ps[lr];
            match *t {
                PowerSgdTensor::Raw { numel } => {
                    for (a, &v) in acc[offset..offset + numel as usize].iter_mut().zip(p) {
                        *a += v;
                    }
                }
                PowerSgdTensor::LowRank { rows, cols, rank } => {
                    let (rows, cols, r) = (rows as usize, cols as usize, rank as usize);
                    let q: Vec<f32> = f32s(&payload[qat..qat + 4 * cols * r]).collect();
                    qat += 4 * cols * r;
                    for i in 0..rows {
                        let pi = &p[i * r..(i + 1) * r];
                        for (c, a) in acc[offset + i * cols..offset + (i + 1) * cols]
                            .iter_mut()
                            .enumerate()
                        {
                            *a += pi
                                .iter()
                                .zip(&q[c * r..(c + 1) * r])
                                .map(|(x, y)| x * y)
                                .sum::<f32>();
                        }
                    }
                    // Warm start: the reduced Q seeds the next step's power iteration.
                    self.qs[lr] = q;
                }
            }
            offset += numel_of(t) as usize;
        }
        self.phase = Phase::Idle;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::roundtrip;

    #[test]
    fn rank_one_matrix_is_recovered_exactly_enough() {
        // M = u vᵀ has rank 1, so a rank-1 PowerSGD step reproduces it.
        let (rows, cols) = (16usize, 24usize);
        let m: Vec<f32> = (0..rows * cols)
            .map(|k| ((k / cols) as f32 + 1.0) * ((k % cols) as f32 - 7.5))
            .collect();
        let shape: &[u64] = &[16, 24];
        let mut codec = PowerSgd::new(1, &[shape], 9);
        let mut payload = Vec::new();
        let mut out = vec![0.0; m.len()];
        roundtrip(&mut codec, &m, &mut payload, &mut out).unwrap();
        for (x, y) in m.iter().zip(&out) {
            assert!((x - y).abs() < 1e-3 * x.abs().max(1.0), "{x} {y}");
        }
    }

    #[test]
    fn orthogonalize_makes_orthonormal_columns_and_keeps_zero_ones() {
        // 70 rows: two full rounds of the 32 dot lanes and a partial one.
        let (rows, r) = (70usize, 4usize);
        let mut rng = Rng::new(3);
        let mut p: Vec<f32> = (0..rows * r).map(|_| rng.normal() as f32).collect();
        for i in 0..rows {
            p[i * r + 2] = 0.0;
        }
        orthogonalize(&mut p, rows, r);
        for a in 0..r {
            for b in 0..r {
                let dot: f64 = (0..rows)
                    .map(|i| f64::from(p[i * r + a]) * f64::from(p[i * r + b]))
                    .sum();
                let want = if a == b && a != 2 { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-5, "columns {a}, {b}: {dot}");
            }
        }
    }

    #[test]
    fn phases_are_enforced() {
        let mut codec = PowerSgd::new(2, &[], 0);
        assert!(codec.decode_add(&[], &mut [0.0]).is_err());
        assert!(codec.next_round(&[], &mut Vec::new()).is_err());
        let shape: &[u64] = &[8, 8];
        let mut grouped = PowerSgd::new(1, &[shape], 0);
        assert!(grouped.encode(&[0.0; 5], &mut Vec::new()).is_err());
    }
}
