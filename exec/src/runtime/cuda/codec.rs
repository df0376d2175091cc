//! GPU encoders/decoders whose payload bytes equal the CPU reference codecs' (same layout, same rounding, same summation order for the scales).
//!
//! Supported: none, fp16, bf16, fp8:e4m3/e5m2, signsgd, efsignsgd, onebit, randomk (its
//! indices come from the CPU's seeded Floyd sampler on the host, so they are identical by
//! construction), topk (device radix selection, `select.rs`), dgc and graddrop (sample
//! positions drawn on the host with the CPU's seeded generator, the sample's threshold and
//! DGC's adaptation decided on the host from device counts, so each step synchronizes the
//! stream a few times), tbq, signum (its momentum kept on the device, updated with the CPU's
//! operation order), and the stochastic quantizers qsgd (up to `QSGD_MAX_LEVELS`), terngrad and
//! natural, and threshold (a device count, read back once, then the top-k compaction kernels;
//! its count-prefixed payload sits at the start of a worst-case `wire_bytes` block), and
//! powersgd (two rounds, `powersgd.rs`: its initial Q drawn on the host by the CPU's generator,
//! both rounds' products and the Gram–Schmidt in the CPU's operation order). Any other
//! compressor (a hand-built qsgd above the maximum) is refused with an error naming it.
//!
//! The stochastic quantizers reproduce the CPU's bytes by drawing the same xoshiro256++ stream
//! on the host with the CPU codec's own `Rng` (seeded identically, advanced by the same
//! ceil(n/2) draws per step) and uploading it; the kernels map draw i / 2 to element i as
//! `quantize.rs` does. That upload costs PCIe bandwidth every step, 8 bytes per two elements
//! (as many bytes as the gradient itself), the price of byte-exactness over speed. Their scalars are
//! computed on the device because the results are provably the CPU's: terngrad's and natural's
//! max |x| is order-independent, and QSGD's Σx² reuses the sign scales' kernels, which follow
//! `scan::sum_map`'s order exactly (16 f32 lanes and an in-order tail per 4096-element chunk,
//! f64 across chunks, correctly rounded f64 sqrt, then round-to-nearest to f32).

use super::kernels::{cuda_err, grid, Kernels};
use super::powersgd::GpuPowerSgd;
use super::select::Selector;
use crate::compress::sampled::{
    dgc_adapt_with, dgc_band, dgc_positions, graddrop_positions, sample_threshold, Estimate,
};
use crate::compress::{quantize::draws_for, rng::Rng, sparse::random_subset};
use crate::error::{ExecError, Result};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, LaunchConfig, PushKernelArg};
use std::cell::RefCell;
use std::sync::Arc;
use syncopate_sim::compress::{qsgd_bits, sparse_count, Compressor, Fp8Format, QSGD_MAX_LEVELS};

/// `sign_finish`'s kind for QSGD's norm: the sum of squares.
const SUM_OF_SQUARES: i32 = 2;

/// The first non-finite element the encode kernels flagged in `bad` (u32::MAX: none).
/// Synchronizes `stream`.
fn first_non_finite(stream: &Arc<CudaStream>, bad: &CudaSlice<u32>) -> Result<Option<usize>> {
    let flag = stream
        .clone_dtoh(bad)
        .map_err(cuda_err("cannot read the finite flag"))?[0];
    Ok((flag != u32::MAX).then_some(flag as usize))
}

/// Elements per scan chunk of the CPU kernels (`compress::scan::CHUNK`).
const CHUNK: usize = 4096;

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Element-wise cast: 0 = f32, 1 = fp16, 2 = bf16 (the kernel's `kind`).
    Cast(i32),
    Fp8 {
        e5m2: bool,
    },
    /// 0 = signsgd (no header), 1 = efsignsgd (mean |x|), 2 = onebit (two means).
    Sign(i32),
    RandomK {
        ratio: f64,
        seed: u64,
    },
    TopK {
        ratio: f64,
    },
    /// DGC (adapted strided sample) or GradDrop (random sample).
    Sampled {
        ratio: f64,
        dgc: bool,
    },
    /// TBQ: 2-bit codes against ±τ.
    Tbq(f32),
    /// Signum: the momentum lives on the device; the payload is its sign bits.
    Signum(f32),
    /// QSGD with `levels` ≤ `QSGD_MAX_LEVELS`, `bits` per code.
    Qsgd {
        levels: u32,
        bits: u32,
    },
    TernGrad,
    Natural,
    /// Every |x| ≥ the value (its f32 bits): a variable count, in a block of `wire_bytes`.
    Threshold(u32),
    /// PowerSGD: its state and rounds are `GpuCodec::powersgd`.
    PowerSgd,
}

/// What a sampled sparsifier sends this step, as `sampled.rs` decides it.
enum Choice {
    /// Every |x| ≥ t: `selected` of them, at most k.
    AtLeast { t: u32, selected: usize },
    /// Exactly the k largest, ties by index.
    TopK,
}

/// One rank's GPU codec for one piece of `n` elements.
pub struct GpuCodec {
    c: Compressor,
    kind: Kind,
    n: usize,
    /// Lowest index of a non-finite input element, u32::MAX when none.
    bad: CudaSlice<u32>,
    /// fp8: max |x| bits; sign scales: per-chunk f32 sums and negative counts.
    max_bits: CudaSlice<u32>,
    chunk_a: CudaSlice<f32>,
    chunk_b: CudaSlice<f32>,
    chunk_neg: CudaSlice<u32>,
    /// Random-k: this step's indices, on the host and on the device.
    step: u64,
    host_indices: Vec<u32>,
    indices: CudaSlice<u32>,
    /// Sparsifiers: selection scratch, and the sampling generator (seeded as the CPU codec's).
    select: Option<Selector>,
    rng: Rng,
    /// Signum's momentum (n elements; one otherwise).
    momentum: CudaSlice<f32>,
    /// QSGD, TernGrad, natural: this step's raw xoshiro256++ draws (ceil(n/2) of them), made on
    /// the host by `rng` (seeded as the CPU codec's) and uploaded.
    host_draws: Vec<u64>,
    draws: CudaSlice<u64>,
    /// PowerSGD's Q, kept P and round protocol.
    powersgd: Option<GpuPowerSgd>,
}

/// Whether the GPU has a kernel for this compressor; the error names what is missing.
pub fn supported(c: &Compressor) -> Result<()> {
    match c {
        Compressor::None
        | Compressor::Fp16
        | Compressor::Bf16
        | Compressor::Fp8(_)
        | Compressor::SignSgd
        | Compressor::EfSignSgd
        | Compressor::OneBit
        | Compressor::RandomK { .. }
        | Compressor::TopK { .. }
        | Compressor::Dgc { .. }
        | Compressor::GradDrop { .. }
        | Compressor::Tbq { .. }
        | Compressor::Signum { .. }
        | Compressor::TernGrad
        | Compressor::Natural
        | Compressor::Threshold { .. }
        | Compressor::PowerSgd { .. } => Ok(()),
        Compressor::Qsgd { levels } if *levels <= QSGD_MAX_LEVELS => Ok(()),
        other => Err(ExecError::Cuda {
            message: format!(
                "compressor `{other}` has no GPU kernel in this build (GPU kernels: none, fp16, bf16, fp8:e4m3, fp8:e5m2, signsgd, efsignsgd, onebit, signum, tbq, threshold, qsgd up to {QSGD_MAX_LEVELS} levels, terngrad, natural, randomk, topk, dgc, graddrop, powersgd); use --backend host for it"
            ),
        }),
    }
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
        if n > u32::MAX as usize {
            return Err(ExecError::Cuda {
                message: format!("a piece of {n} elements exceeds the kernels' 32-bit indexing"),
            });
        }
        let kind = match *c {
            Compressor::Fp16 => Kind::Cast(1),
            Compressor::Bf16 => Kind::Cast(2),
            Compressor::Fp8(format) => Kind::Fp8 {
                e5m2: format == Fp8Format::E5m2,
            },
            Compressor::SignSgd => Kind::Sign(0),
            Compressor::EfSignSgd => Kind::Sign(1),
            Compressor::OneBit => Kind::Sign(2),
            Compressor::RandomK { ratio } => Kind::RandomK { ratio, seed },
            Compressor::TopK { ratio } => Kind::TopK { ratio },
            Compressor::Dgc { ratio } => Kind::Sampled { ratio, dgc: true },
            Compressor::GradDrop { ratio } => Kind::Sampled { ratio, dgc: false },
            Compressor::Tbq { threshold } => Kind::Tbq(threshold as f32),
            Compressor::Signum { momentum } => Kind::Signum(momentum as f32),
            Compressor::Qsgd { levels } => Kind::Qsgd {
                levels,
                bits: qsgd_bits(levels),
            },
            Compressor::TernGrad => Kind::TernGrad,
            Compressor::Natural => Kind::Natural,
            Compressor::Threshold { value } => Kind::Threshold((value as f32).to_bits()),
            Compressor::PowerSgd { .. } => Kind::PowerSgd,
            _ => Kind::Cast(0),
        };
        let chunks = if matches!(kind, Kind::Sign(1 | 2) | Kind::Qsgd { .. }) {
            n.div_ceil(CHUNK).max(1)
        } else {
            1
        };
        let k = match kind {
            Kind::RandomK { ratio, .. } => sparse_count(n as u64, ratio) as usize,
            _ => 0,
        };
        let alloc = cuda_err("cannot allocate codec scratch");
        Ok(GpuCodec {
            c: *c,
            kind,
            n,
            bad: stream.alloc_zeros(1).map_err(&alloc)?,
            max_bits: stream.alloc_zeros(1).map_err(&alloc)?,
            chunk_a: stream.alloc_zeros(chunks).map_err(&alloc)?,
            chunk_b: stream.alloc_zeros(chunks).map_err(&alloc)?,
            chunk_neg: stream.alloc_zeros(chunks).map_err(&alloc)?,
            step: 0,
            host_indices: Vec::new(),
            indices: stream.alloc_zeros(k.max(1)).map_err(&alloc)?,
            select: match kind {
                Kind::TopK { .. } | Kind::Sampled { .. } | Kind::Threshold(_) => {
                    Some(Selector::new(n, stream)?)
                }
                _ => None,
            },
            rng: Rng::new(seed),
            momentum: stream
                .alloc_zeros(if matches!(kind, Kind::Signum(_)) {
                    n.max(1)
                } else {
                    1
                })
                .map_err(&alloc)?,
            host_draws: Vec::new(),
            draws: stream
                .alloc_zeros(match kind {
                    Kind::Qsgd { .. } | Kind::TernGrad | Kind::Natural => n.div_ceil(2).max(1),
                    _ => 1,
                })
                .map_err(&alloc)?,
            powersgd: match *c {
                Compressor::PowerSgd { rank } => {
                    Some(GpuPowerSgd::new(rank, n, shapes, seed, stream)?)
                }
                _ => None,
            },
        })
    }

    pub fn compressor(&self) -> Compressor {
        self.c
    }

    /// Bytes of the payload buffer: the payload, or PowerSGD's larger round (both use it).
    pub fn wire_bytes(&self) -> usize {
        match &self.powersgd {
            Some(p) => p.round_bytes(0).max(p.round_bytes(1)),
            None => self.c.wire_bytes(self.n as u64) as usize,
        }
    }

    /// Bytes each rank sends in allreduce round `round`: PowerSGD's P, then its Q; the
    /// payload for single-round codecs.
    pub fn round_bytes(&self, round: u32) -> usize {
        match &self.powersgd {
            Some(p) => p.round_bytes(round),
            None => self.wire_bytes(),
        }
    }

    fn powersgd(&mut self) -> &mut GpuPowerSgd {
        self.powersgd
            .as_mut()
            .expect("a PowerSGD codec has its state")
    }

    /// Enqueues the encode of `input` (n elements) into `out` (`wire_bytes` long) on `stream`.
    pub fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let launch = cuda_err("encode kernel launch failed");
        let n = self.n as u32;
        stream
            .memcpy_htod(&[u32::MAX], &mut self.bad)
            .map_err(cuda_err("cannot reset the finite flag"))?;
        // SAFETY (every launch below): the argument lists match the kernels' signatures in
        // exec/kernels/compress.cu, and every buffer holds at least the elements the kernel
        // touches (input n f32, out `wire_bytes`, scratch sized in `new`).
        match self.kind {
            Kind::Cast(kind) => unsafe {
                stream
                    .launch_builder(&k.cast_encode)
                    .arg(input)
                    .arg(&mut *out)
                    .arg(&n)
                    .arg(&kind)
                    .arg(&mut self.bad)
                    .launch(grid(self.n))
            }
            .map(drop)
            .map_err(&launch),
            Kind::Fp8 { e5m2 } => {
                let e5m2 = i32::from(e5m2);
                stream
                    .memset_zeros(&mut self.max_bits)
                    .map_err(cuda_err("cannot reset the max"))?;
                unsafe {
                    stream
                        .launch_builder(&k.max_abs)
                        .arg(input)
                        .arg(&n)
                        .arg(&mut self.max_bits)
                        .arg(&mut self.bad)
                        .launch(grid(self.n))
                }
                .map_err(&launch)?;
                unsafe {
                    stream
                        .launch_builder(&k.fp8_encode)
                        .arg(input)
                        .arg(&mut *out)
                        .arg(&n)
                        .arg(&self.max_bits)
                        .arg(&e5m2)
                        .launch(grid(self.n))
                }
                .map(drop)
                .map_err(&launch)
            }
            Kind::Sign(header) => {
                let offset = [0usize, 4, 8][header as usize];
                if header > 0 && self.n > 0 {
                    self.chunk_sums(k, stream, input, header - 1, out)?;
                } else if header > 0 {
                    // n = 0: the CPU writes zero scales.
                    stream
                        .memset_zeros(out)
                        .map_err(cuda_err("cannot clear an empty payload"))?;
                }
                let mut bits = out.slice_mut(offset..);
                unsafe {
                    stream
                        .launch_builder(&k.sign_pack)
                        .arg(input)
                        .arg(&mut bits)
                        .arg(&n)
                        .arg(&mut self.bad)
                        .launch(grid(self.n.div_ceil(8)))
                }
                .map(drop)
                .map_err(&launch)
            }
            Kind::RandomK { ratio, seed } => {
                let count = sparse_count(self.n as u64, ratio) as usize;
                let mut rng = Rng::for_stream(seed, self.step);
                self.step += 1;
                random_subset(&mut rng, self.n, count, &mut self.host_indices);
                if count > 0 {
                    stream
                        .memcpy_htod(&self.host_indices, &mut self.indices)
                        .map_err(cuda_err("cannot upload the random-k indices"))?;
                }
                self.flag_non_finite(k, stream, input)?;
                let scale = if count > 0 {
                    self.n as f32 / count as f32
                } else {
                    0.0
                };
                let k32 = count as u32;
                unsafe {
                    stream
                        .launch_builder(&k.gather_scaled)
                        .arg(input)
                        .arg(&self.indices)
                        .arg(&k32)
                        .arg(&scale)
                        .arg(&mut *out)
                        .launch(grid(count))
                }
                .map(drop)
                .map_err(&launch)
            }
            Kind::TopK { ratio } => {
                self.flag_non_finite(k, stream, input)?;
                let count = sparse_count(self.n as u64, ratio) as usize;
                if count == 0 {
                    return Ok(());
                }
                let select = self.select.as_mut().expect("top-k has a selector");
                select.kth_largest(k, stream, input, count)?;
                select.emit(k, stream, input, out, 0, 4 * count, count)
            }
            Kind::Sampled { ratio, dgc } => self.encode_sampled(k, stream, input, out, ratio, dgc),
            Kind::Threshold(t) => self.encode_threshold(k, stream, input, out, t),
            Kind::Tbq(tau) => unsafe {
                stream
                    .launch_builder(&k.tbq_pack)
                    .arg(input)
                    .arg(&mut *out)
                    .arg(&n)
                    .arg(&tau)
                    .arg(&mut self.bad)
                    .launch(grid(self.n.div_ceil(4)))
            }
            .map(drop)
            .map_err(&launch),
            Kind::Signum(beta) => unsafe {
                stream
                    .launch_builder(&k.signum_pack)
                    .arg(input)
                    .arg(&mut self.momentum)
                    .arg(&mut *out)
                    .arg(&n)
                    .arg(&beta)
                    .arg(&mut self.bad)
                    .launch(grid(self.n.div_ceil(8)))
            }
            .map(drop)
            .map_err(&launch),
            Kind::TernGrad | Kind::Natural => {
                self.upload_draws(stream)?;
                stream
                    .memset_zeros(&mut self.max_bits)
                    .map_err(cuda_err("cannot reset the max"))?;
                unsafe {
                    stream
                        .launch_builder(&k.max_abs)
                        .arg(input)
                        .arg(&n)
                        .arg(&mut self.max_bits)
                        .arg(&mut self.bad)
                        .launch(grid(self.n))
                }
                .map_err(&launch)?;
                if matches!(self.kind, Kind::TernGrad) {
                    unsafe {
                        stream
                            .launch_builder(&k.terngrad_encode)
                            .arg(input)
                            .arg(&self.draws)
                            .arg(&mut *out)
                            .arg(&n)
                            .arg(&self.max_bits)
                            .launch(grid(self.n.div_ceil(4)))
                    }
                } else {
                    unsafe {
                        stream
                            .launch_builder(&k.natural_encode)
                            .arg(input)
                            .arg(&self.draws)
                            .arg(&mut *out)
                            .arg(&n)
                            .arg(&self.max_bits)
                            .launch(grid(self.n))
                    }
                }
                .map(drop)
                .map_err(&launch)
            }
            Kind::Qsgd { levels, bits } => {
                self.upload_draws(stream)?;
                if self.n > 0 {
                    // The norm, in the CPU's summation order (scan.rs sum_map), into out[0..4].
                    self.chunk_sums(k, stream, input, SUM_OF_SQUARES, out)?;
                } else {
                    // n = 0: the CPU writes a zero norm.
                    stream
                        .memset_zeros(out)
                        .map_err(cuda_err("cannot clear an empty payload"))?;
                }
                unsafe {
                    stream
                        .launch_builder(&k.qsgd_encode)
                        .arg(input)
                        .arg(&self.draws)
                        .arg(&mut *out)
                        .arg(&n)
                        .arg(&levels)
                        .arg(&bits)
                        .arg(&mut self.bad)
                        .launch(grid(self.n.div_ceil(8)))
                }
                .map(drop)
                .map_err(&launch)
            }
            Kind::PowerSgd => {
                // The CPU checks every element it reads; its first bad one is the lowest index.
                self.flag_non_finite(k, stream, input)?;
                self.powersgd().encode(k, stream, input, out)
            }
        }
    }

    /// Multi-round codecs (PowerSGD): turns the previous round's reduced payload in `payload`
    /// into this rank's payload of the next round, in place; `input` is what `encode` got.
    pub fn next_round(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
        payload: &mut CudaSlice<u8>,
    ) -> Result<()> {
        match self.powersgd.as_mut() {
            Some(p) => p.next_round(k, stream, input, payload),
            None => Err(ExecError::Protocol {
                compressor: self.c.to_string(),
                message: "has a single round".into(),
            }),
        }
    }

    /// The CPU's chunked sums in its order (16 lanes per 4096-element chunk, chunks in order,
    /// f64 across chunks) into the payload's header: the sign scales (`kind` 0: mean |x|, 1:
    /// per-sign means) or QSGD's sum of squares (`SUM_OF_SQUARES`).
    fn chunk_sums(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
        kind: i32,
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let launch = cuda_err("encode kernel launch failed");
        let n = self.n as u32;
        let chunks = self.n.div_ceil(CHUNK) as u32;
        // SAFETY: the argument lists match `sign_chunk_sums` and `sign_finish` in
        // exec/kernels/compress.cu; the chunk buffers hold one entry per chunk (sized in `new`)
        // and `out` holds at least the header the kernel writes.
        unsafe {
            stream
                .launch_builder(&k.sign_chunk_sums)
                .arg(input)
                .arg(&n)
                .arg(&kind)
                .arg(&mut self.chunk_a)
                .arg(&mut self.chunk_b)
                .arg(&mut self.chunk_neg)
                .launch(LaunchConfig {
                    grid_dim: (chunks, 1, 1),
                    block_dim: (16, 1, 1),
                    shared_mem_bytes: 0,
                })
        }
        .map_err(&launch)?;
        unsafe {
            stream
                .launch_builder(&k.sign_finish)
                .arg(&self.chunk_a)
                .arg(&self.chunk_b)
                .arg(&self.chunk_neg)
                .arg(&chunks)
                .arg(&n)
                .arg(&kind)
                .arg(&mut *out)
                .launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (1, 1, 1),
                    shared_mem_bytes: 0,
                })
        }
        .map_err(&launch)?;
        Ok(())
    }

    /// Threshold: counts |x| ≥ t on the device (one synchronization, for the count), then
    /// compacts them in index order into the CPU's layout (count, indices, values). The CPU
    /// payload is 4 + 8·count bytes; here it is the prefix of a `wire_bytes` block whose rest
    /// is zero.
    fn encode_threshold(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
        out: &mut CudaSlice<u8>,
        t: u32,
    ) -> Result<()> {
        stream
            .memset_zeros(out)
            .map_err(cuda_err("cannot clear the payload"))?;
        let select = self.select.as_mut().expect("threshold has a selector");
        let count = select.count_at_least(k, stream, input, t, &mut self.bad)?;
        if first_non_finite(stream, &self.bad)?.is_some() {
            // Non-finite input: `check_finite` reports it; the CPU sends nothing either.
            return Ok(());
        }
        stream
            .memcpy_htod(&(count as u32).to_le_bytes(), &mut out.slice_mut(..4))
            .map_err(cuda_err("cannot write the count"))?;
        if count == 0 {
            return Ok(());
        }
        select.at_least(k, stream, t)?;
        select.emit(k, stream, input, out, 4, 4 + 4 * count, count)
    }

    /// The stochastic quantizers' uniforms for this step: the next ceil(n/2) outputs of the
    /// CPU codec's generator, exactly the draws `quantize.rs` consumes for n elements
    /// (`compress::quantize::draws_for`), uploaded for the kernel to split (element i takes
    /// draw i / 2). This costs 4 bytes of PCIe traffic per element and step.
    fn upload_draws(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.host_draws.resize(draws_for(self.n), 0);
        self.rng.fill_u64(&mut self.host_draws);
        if !self.host_draws.is_empty() {
            stream
                .memcpy_htod(&self.host_draws, &mut self.draws)
                .map_err(cuda_err("cannot upload the quantizer's random draws"))?;
        }
        Ok(())
    }

    /// DGC and GradDrop: the branches of `Sampled::encode` in `compress/sampled.rs`, with the
    /// tensor passes (counts, k-th largest, compaction) on the device.
    fn encode_sampled(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
        out: &mut CudaSlice<u8>,
        ratio: f64,
        dgc: bool,
    ) -> Result<()> {
        let n = self.n;
        let slots = sparse_count(n as u64, ratio) as usize;
        stream
            .memset_zeros(out)
            .map_err(cuda_err("cannot clear the payload"))?;
        if slots == 0 {
            return Ok(());
        }
        let positions = if dgc {
            dgc_positions(n, ratio, &mut self.rng)
        } else {
            graddrop_positions(n, ratio, &mut self.rng)
        };
        let io = cuda_err("cannot gather the threshold sample");
        let pos = stream.clone_htod(&positions).map_err(&io)?;
        let mut samples = stream.alloc_zeros::<u32>(positions.len()).map_err(&io)?;
        let m = positions.len() as u32;
        // SAFETY: gather_abs(x, pos, m, out) reads m positions (< n) of x and writes m u32.
        unsafe {
            stream
                .launch_builder(&k.gather_abs)
                .arg(input)
                .arg(&pos)
                .arg(&m)
                .arg(&mut samples)
                .launch(grid(positions.len()))
        }
        .map_err(cuda_err("sample launch failed"))?;
        let mut samples = stream.clone_dtoh(&samples).map_err(&io)?;
        let t = sample_threshold(&mut samples, ratio);

        let GpuCodec { select, bad, .. } = self;
        let select = RefCell::new(
            select
                .as_mut()
                .expect("a sampled sparsifier has a selector"),
        );
        let bad = RefCell::new(bad);
        let count = |t: u32| {
            select
                .borrow_mut()
                .count_at_least(k, stream, input, t, &mut bad.borrow_mut())
        };
        let selected = count(t)?;
        if first_non_finite(stream, &bad.borrow())?.is_some() {
            // Non-finite input: `check_finite` reports it; the CPU sends nothing either.
            return Ok(());
        }
        let (low, high) = dgc_band(slots);
        let cap = high.max(slots);
        let in_band = !dgc || (low..=high).contains(&selected);
        let choice = if in_band && selected <= slots {
            Choice::AtLeast { t, selected }
        } else if in_band && selected <= cap {
            Choice::TopK
        } else {
            let estimate = if dgc {
                dgc_adapt_with(slots, t, selected, count, || {
                    let mut select = select.borrow_mut();
                    select.kth_largest(k, stream, input, slots)?;
                    select.threshold(stream)
                })?
            } else {
                Estimate {
                    threshold: t,
                    selected,
                }
            };
            if estimate.selected > slots {
                Choice::TopK
            } else {
                Choice::AtLeast {
                    t: estimate.threshold,
                    selected: estimate.selected,
                }
            }
        };
        let mut select = select.borrow_mut();
        let sent = match choice {
            Choice::AtLeast { t, selected } => {
                select.at_least(k, stream, t)?;
                selected
            }
            Choice::TopK => {
                select.kth_largest(k, stream, input, slots)?;
                slots
            }
        };
        select.emit(k, stream, input, out, 4, 4 + 4 * slots, slots)?;
        stream
            .memcpy_htod(&(sent as u32).to_le_bytes(), &mut out.slice_mut(..4))
            .map_err(cuda_err("cannot write the count"))
    }

    /// Enqueues the scan that flags `input`'s first non-finite element for [`Self::check_finite`].
    fn flag_non_finite(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<f32>,
    ) -> Result<()> {
        let n = self.n as u32;
        // SAFETY: check_finite(x, n, bad) reads n elements of x and writes one u32.
        unsafe {
            stream
                .launch_builder(&k.check_finite)
                .arg(input)
                .arg(&n)
                .arg(&mut self.bad)
                .launch(grid(self.n))
        }
        .map(drop)
        .map_err(cuda_err("the finite check's launch failed"))
    }

    /// After the encode completed: the CPU codecs' error for non-finite input, naming the
    /// first bad element. Synchronizes `stream`.
    pub fn check_finite(&self, stream: &Arc<CudaStream>, input: &CudaSlice<f32>) -> Result<()> {
        let Some(index) = first_non_finite(stream, &self.bad)? else {
            return Ok(());
        };
        let value = stream
            .clone_dtoh(&input.slice(index..index + 1))
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
        acc: &mut CudaSlice<f32>,
    ) -> Result<()> {
        // Threshold's payload is 4 + 8·count bytes (the CPU's) or a whole `wire_bytes` block.
        let length_ok = match self.kind {
            Kind::Threshold(_) => (4..=self.wire_bytes()).contains(&payload.len()),
            Kind::PowerSgd => (self.round_bytes(1)..=self.wire_bytes()).contains(&payload.len()),
            _ => payload.len() == self.wire_bytes(),
        };
        if !length_ok {
            return Err(ExecError::BadPayload {
                compressor: self.c.to_string(),
                message: format!(
                    "{} bytes, expected {} for {} elements",
                    payload.len(),
                    self.wire_bytes(),
                    self.n
                ),
            });
        }
        let launch = cuda_err("decode kernel launch failed");
        let n = self.n as u32;
        // SAFETY: as in `encode`; `payload` holds `wire_bytes` bytes (checked above).
        match self.kind {
            Kind::Cast(kind) => unsafe {
                stream
                    .launch_builder(&k.cast_decode_add)
                    .arg(payload)
                    .arg(&mut *acc)
                    .arg(&n)
                    .arg(&kind)
                    .launch(grid(self.n))
            },
            Kind::Fp8 { e5m2 } => {
                let e5m2 = i32::from(e5m2);
                unsafe {
                    stream
                        .launch_builder(&k.fp8_decode_add)
                        .arg(payload)
                        .arg(&mut *acc)
                        .arg(&n)
                        .arg(&e5m2)
                        .launch(grid(self.n))
                }
            }
            Kind::Sign(header) => unsafe {
                stream
                    .launch_builder(&k.sign_decode_add)
                    .arg(payload)
                    .arg(&mut *acc)
                    .arg(&n)
                    .arg(&header)
                    .launch(grid(self.n))
            },
            Kind::RandomK { ratio, .. } => {
                let count = sparse_count(self.n as u64, ratio) as usize;
                if self.host_indices.len() != count {
                    return Err(ExecError::Protocol {
                        compressor: self.c.to_string(),
                        message: "decode needs this worker's encode of the same step first (the indices come from the shared seed)".into(),
                    });
                }
                let k32 = count as u32;
                unsafe {
                    stream
                        .launch_builder(&k.scatter_add)
                        .arg(payload)
                        .arg(&self.indices)
                        .arg(&k32)
                        .arg(&mut *acc)
                        .launch(grid(count))
                }
            }
            Kind::TopK { ratio } | Kind::Sampled { ratio, .. } => {
                let count = sparse_count(self.n as u64, ratio) as usize;
                let k32 = count as u32;
                let header = i32::from(matches!(self.kind, Kind::Sampled { .. }));
                unsafe {
                    stream
                        .launch_builder(&k.sparse_decode_add)
                        .arg(payload)
                        .arg(&mut *acc)
                        .arg(&n)
                        .arg(&k32)
                        .arg(&header)
                        .launch(grid(count))
                }
            }
            Kind::Tbq(tau) => {
                let header = 0i32;
                unsafe {
                    stream
                        .launch_builder(&k.two_bit_decode_add)
                        .arg(payload)
                        .arg(&mut *acc)
                        .arg(&n)
                        .arg(&header)
                        .arg(&tau)
                        .launch(grid(self.n))
                }
            }
            Kind::TernGrad => {
                let (header, unused) = (1i32, 0.0f32);
                unsafe {
                    stream
                        .launch_builder(&k.two_bit_decode_add)
                        .arg(payload)
                        .arg(&mut *acc)
                        .arg(&n)
                        .arg(&header)
                        .arg(&unused)
                        .launch(grid(self.n))
                }
            }
            Kind::Signum(_) => {
                let header = 0i32;
                unsafe {
                    stream
                        .launch_builder(&k.sign_decode_add)
                        .arg(payload)
                        .arg(&mut *acc)
                        .arg(&n)
                        .arg(&header)
                        .launch(grid(self.n))
                }
            }
            Kind::Qsgd { levels, bits } => unsafe {
                stream
                    .launch_builder(&k.qsgd_decode_add)
                    .arg(payload)
                    .arg(&mut *acc)
                    .arg(&n)
                    .arg(&levels)
                    .arg(&bits)
                    .launch(grid(self.n))
            },
            Kind::Natural => unsafe {
                stream
                    .launch_builder(&k.natural_decode_add)
                    .arg(payload)
                    .arg(&mut *acc)
                    .arg(&n)
                    .launch(grid(self.n))
            },
            Kind::PowerSgd => {
                let q = payload.slice(..self.round_bytes(1));
                return self.powersgd().decode_add(k, stream, &q, acc);
            }
            Kind::Threshold(_) => {
                let len = payload.len() as u64;
                unsafe {
                    stream
                        .launch_builder(&k.threshold_decode_add)
                        .arg(payload)
                        .arg(&len)
                        .arg(&mut *acc)
                        .arg(&n)
                        .launch(grid(self.n))
                }
            }
        }
        .map(drop)
        .map_err(launch)
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::gpu_or_skip;
    use super::*;
    use crate::compress::{codec_for, codec_for_shapes};

    /// Runs without a GPU: every compressor the device profiles cover (one spec per profile
    /// key, PowerSGD included) has GPU kernels.
    #[test]
    fn every_profiled_compressor_has_gpu_kernels() {
        for spec in crate::profile_host::PROFILED {
            let c: Compressor = spec.parse().unwrap();
            assert!(supported(&c).is_ok(), "{spec}");
        }
    }

    /// GPU payload bytes equal the CPU codec's, and decoding adds the same values.
    #[test]
    fn gpu_payloads_match_the_cpu_bytes() {
        let Some((_ctx, stream, kernels)) = gpu_or_skip() else {
            return;
        };
        let specs = [
            "none",
            "fp16",
            "bf16",
            "fp8:e4m3",
            "fp8:e5m2",
            "signsgd",
            "efsignsgd",
            "onebit",
            "randomk:0.01",
            "topk:0.01",
            "topk:0.3",
            "dgc:0.01",
            "dgc:0.3",
            "graddrop:0.01",
            "graddrop:0.3",
            "tbq:0.5",
            "signum:0.9",
            "qsgd:1",
            "qsgd:4",
            "qsgd:127",
            "qsgd:32767",
            "terngrad",
            "natural",
            "threshold:1.5",
            "threshold:1e-7",
            "threshold:1e9",
        ];
        let mut rng = Rng::new(7);
        for spec in specs {
            let c: Compressor = spec.parse().unwrap();
            for n in [0usize, 1, 7, 17, 4095, 4096, 4097, 100_003] {
                // Normal data with some huge, tiny (subnormal after scaling) and ±0 values.
                let mut x: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
                for (i, v) in x.iter_mut().enumerate().step_by(97) {
                    *v = [1e6, -3e-9, 0.0, -0.0, 70000.0][i % 5];
                }
                let mut cpu = codec_for(&c, 11);
                let mut want = Vec::new();
                let mut gpu = GpuCodec::new(&c, n, &[], 11, &stream).unwrap();
                let mut out = stream.alloc_zeros::<u8>(gpu.wire_bytes().max(1)).unwrap();
                // Two steps, the second on a different gradient: stateful codecs (signum's
                // momentum, the quantizers' and samplers' generators) must stay in step.
                for step in 0..2 {
                    if step == 1 {
                        x.iter_mut().for_each(|v| *v = -0.75 * *v + 0.125);
                    }
                    cpu.encode(&x, &mut want).unwrap();
                    let input = stream.clone_htod(&x).unwrap();
                    gpu.encode(&kernels, &stream, &input, &mut out).unwrap();
                    gpu.check_finite(&stream, &input).unwrap();
                    let got = stream.clone_dtoh(&out).unwrap();
                    assert_eq!(
                        &got[..want.len()],
                        &want[..],
                        "{spec} n={n} step {step}: payload bytes"
                    );
                }
                let mut acc_cpu = vec![0.5f32; n];
                cpu.decode_add(&want, &mut acc_cpu).unwrap();
                let mut acc = stream.clone_htod(&vec![0.5f32; n.max(1)]).unwrap();
                gpu.decode_add(&kernels, &stream, &out.slice(..want.len()), &mut acc)
                    .unwrap();
                let acc_gpu = stream.clone_dtoh(&acc).unwrap();
                assert_eq!(&acc_gpu[..n], &acc_cpu[..], "{spec} n={n}: decode");
            }
        }
    }

    /// PowerSGD on the GPU: both rounds' payload bytes and the decoded sum equal the CPU
    /// codec's, for two workers (the GPU one and a CPU peer sharing the seed) over two steps
    /// (the second warm-started from the first's reduced Q).
    #[test]
    fn gpu_powersgd_rounds_match_the_cpu_bytes() {
        let Some((_ctx, stream, kernels)) = gpu_or_skip() else {
            return;
        };
        // Square, wide and tall matrices (column counts off the 8-lane groups, row counts off
        // the 32 dot lanes), a 4-D convolution, raw 1-D and small tensors, a flat buffer.
        let groups: [&[&[u64]]; 6] = [
            &[&[64, 64]],
            &[&[10, 1000]],
            &[&[1000, 10]],
            &[&[50, 27]],
            &[&[64, 32, 3, 3], &[64], &[300, 1030], &[3, 3], &[37]],
            &[],
        ];
        // What the allreduce would leave in the payload buffer (nothing: a round without bytes).
        let upload = |bytes: &[u8], out: &mut CudaSlice<u8>| {
            if !bytes.is_empty() {
                stream
                    .memcpy_htod(bytes, &mut out.slice_mut(..bytes.len()))
                    .unwrap();
            }
        };
        let mut rng = Rng::new(5);
        for shapes in groups {
            let n = if shapes.is_empty() {
                4097
            } else {
                shapes
                    .iter()
                    .map(|s| s.iter().product::<u64>() as usize)
                    .sum()
            };
            for rank in [1, 2, 4] {
                let c = Compressor::PowerSgd { rank };
                let what = format!("{c} on {shapes:?}");
                let mut cpu = codec_for_shapes(&c, shapes, 11);
                let mut peer = codec_for_shapes(&c, shapes, 11);
                let mut gpu = GpuCodec::new(&c, n, shapes, 11, &stream).unwrap();
                let mut out = stream.alloc_zeros::<u8>(gpu.wire_bytes().max(1)).unwrap();
                let mut x: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
                let y: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
                for step in 0..2 {
                    if step == 1 {
                        x.iter_mut().for_each(|v| *v = -0.75 * *v + 0.125);
                    }
                    let input = stream.clone_htod(&x).unwrap();
                    // Round 1: P (and raw values).
                    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
                    cpu.encode(&x, &mut mine).unwrap();
                    peer.encode(&y, &mut theirs).unwrap();
                    gpu.encode(&kernels, &stream, &input, &mut out).unwrap();
                    gpu.check_finite(&stream, &input).unwrap();
                    assert_eq!(gpu.round_bytes(0), mine.len(), "{what}: round 1 size");
                    let got = stream.clone_dtoh(&out).unwrap();
                    assert_eq!(&got[..mine.len()], &mine[..], "{what} step {step}: P bytes");
                    // Round 2: Q from the reduced P, which the GPU reads in its payload buffer.
                    let mut reduced = mine.clone();
                    cpu.sum_into(&mut reduced, &theirs).unwrap();
                    upload(&reduced, &mut out);
                    cpu.next_round(&reduced, &mut mine).unwrap();
                    peer.next_round(&reduced, &mut theirs).unwrap();
                    gpu.next_round(&kernels, &stream, &input, &mut out).unwrap();
                    assert_eq!(gpu.round_bytes(1), mine.len(), "{what}: round 2 size");
                    let got = stream.clone_dtoh(&out).unwrap();
                    assert_eq!(&got[..mine.len()], &mine[..], "{what} step {step}: Q bytes");
                    // Decode of the reduced Q, into a non-zero accumulator.
                    let mut reduced = mine.clone();
                    cpu.sum_into(&mut reduced, &theirs).unwrap();
                    upload(&reduced, &mut out);
                    let mut acc_cpu = vec![0.5f32; n];
                    cpu.decode_add(&reduced, &mut acc_cpu).unwrap();
                    peer.decode_add(&reduced, &mut vec![0.0; n]).unwrap();
                    let mut acc = stream.clone_htod(&vec![0.5f32; n]).unwrap();
                    gpu.decode_add(&kernels, &stream, &out.slice(..reduced.len()), &mut acc)
                        .unwrap();
                    let acc_gpu = stream.clone_dtoh(&acc).unwrap();
                    let (got, want): (Vec<u32>, Vec<u32>) = acc_gpu
                        .iter()
                        .zip(&acc_cpu)
                        .map(|(g, c)| (g.to_bits(), c.to_bits()))
                        .unzip();
                    assert_eq!(got, want, "{what} step {step}: decode");
                }
            }
        }
    }

    #[test]
    fn non_finite_input_names_the_element() {
        let Some((_ctx, stream, kernels)) = gpu_or_skip() else {
            return;
        };
        let mut x = vec![1.0f32; 10_000];
        x[7000] = f32::INFINITY;
        x[5000] = f32::NAN;
        let mut gpu = GpuCodec::new(&Compressor::Fp16, x.len(), &[], 0, &stream).unwrap();
        let input = stream.clone_htod(&x).unwrap();
        let mut out = stream.alloc_zeros::<u8>(gpu.wire_bytes()).unwrap();
        gpu.encode(&kernels, &stream, &input, &mut out).unwrap();
        match gpu.check_finite(&stream, &input) {
            Err(ExecError::NonFinite { index, .. }) => assert_eq!(index, 5000),
            other => panic!("{other:?}"),
        }
    }
}
