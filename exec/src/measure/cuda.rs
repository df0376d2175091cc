//! Measures GPU 0 into a `gpu` DeviceProfile and, with ≥ 2 GPUs, sweeps NCCL allreduce sizes.
//!
//! The profile holds CUDA-event codec curves, copy bandwidth, GEMM rate and contention ratios; the
//! sweep is like nccl-tests'.

use crate::compress::rng::Rng;
use crate::error::{ExecError, Result};
use crate::measure::profile_host::{
    across_ratios, measured_codec, median, profiled, profiled_shapes, provenance,
};
use crate::runtime::cuda::codec::{supported, GpuCodec};
use crate::runtime::cuda::gemm::Gemm;
use crate::runtime::cuda::kernels::{cuda_err, Kernels};
use crate::runtime::cuda::probe;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{Comm, ReduceOp};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use syncopate_sim::base::data::FORMAT_VERSION;
use syncopate_sim::calibrate::Measurement;
use syncopate_sim::compress::Compressor;
use syncopate_sim::inputs::device::{Contention, DeviceKind, DeviceProfile};
use syncopate_sim::inputs::model::{Provenance, Status};

/// V100's fp32 peak, the unit of `compute_speed_vs_v100`.
const V100_FP32_TFLOPS: f64 = 15.7;
/// Copy-bandwidth buffer: far beyond any L2, so the copy streams from HBM.
const COPY_BYTES: usize = 256 << 20;
/// GEMM work per contention measurement: long against launch gaps and timer resolution.
const CONTENTION_NS: u64 = 50_000_000;
/// Allreduce buffer beside the GEMM: large enough for NCCL's bandwidth protocols.
const CONTENTION_ALLREDUCE_BYTES: usize = 64 << 20;

/// What to measure.
#[derive(Clone, Debug)]
pub struct CudaProfileOptions {
    /// Name of the device profile written.
    pub name: String,
    /// Tensor sizes (elements) each codec is timed at; the curve is fitted over them.
    pub sizes: Vec<usize>,
    /// Timings per point; the median is kept.
    pub repeats: usize,
    /// Allreduce buffer sizes (bytes) of the NCCL sweep; used only with ≥ 2 GPUs.
    pub sweep_bytes: Vec<u64>,
    /// `compute_speed_vs_v100` from models captured on this GPU (`captured_speed`); without it
    /// the GEMM's rate estimates it.
    pub compute_speed: Option<(f64, Provenance)>,
}

impl Default for CudaProfileOptions {
    fn default() -> Self {
        CudaProfileOptions {
            name: "gpu".into(),
            sizes: (12..=24).step_by(2).map(|p| 1usize << p).collect(),
            repeats: 5,
            // nccl-tests' `-b 4K -e 1G -f 2`.
            sweep_bytes: (12..=30).map(|p| 1u64 << p).collect(),
            compute_speed: None,
        }
    }
}

/// The measured device and, with ≥ 2 GPUs, the allreduce sweep over all of them.
pub struct CudaProfile {
    /// The profile measured on GPU 0.
    pub device: DeviceProfile,
    /// GPUs found; the allreduce sweep runs over all of them.
    pub gpus: usize,
    /// nccl-tests-style points (all GPUs, one node); empty with one GPU.
    pub allreduce: Vec<Measurement>,
}

/// Seconds between two events recorded around the work `f` enqueues on `stream`.
fn timed(stream: &Arc<CudaStream>, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let event = cuda_err("timing event failed");
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags).map_err(&event)?;
    f()?;
    let end = stream.record_event(flags).map_err(&event)?;
    // elapsed_ms waits for both events.
    Ok(f64::from(start.elapsed_ms(&end).map_err(&event)?) / 1e3)
}

/// Median encode and decode seconds of `c` over the first `n` elements of `input`, on the
/// host profile's shapes. Encode covers every round a worker computes (PowerSGD's P and Q, one
/// GPU's payload standing for the reduced one); decode is one `decode_add` of the last round.
fn time_codec(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    c: &Compressor,
    input: &CudaSlice<f32>,
    n: usize,
    repeats: usize,
) -> Result<(f64, f64)> {
    let alloc = cuda_err("cannot allocate profiling buffers");
    let shapes = profiled_shapes(c, n);
    let shapes: Vec<&[u64]> = shapes.iter().map(Vec::as_slice).collect();
    let mut codec = GpuCodec::new(c, n, &shapes, 1, stream)?;
    let bytes = codec.wire_bytes();
    let last = c.allreduce_rounds() - 1;
    let mut out = stream.alloc_zeros::<u8>(bytes.max(1)).map_err(&alloc)?;
    let mut acc = stream.alloc_zeros::<f32>(n.max(1)).map_err(&alloc)?;
    let (mut enc, mut dec) = (Vec::new(), Vec::new());
    // The first step is an untimed warm-up (module load, first-touch of the buffers).
    for rep in 0..=repeats {
        let e = timed(stream, || {
            codec.encode(k, stream, input, &mut out)?;
            for _ in 0..last {
                codec.next_round(k, stream, input, &mut out)?;
            }
            Ok(())
        })?;
        let d = timed(stream, || {
            codec.decode_add(k, stream, &out.slice(..codec.round_bytes(last)), &mut acc)
        })?;
        if rep > 0 {
            enc.push(e);
            dec.push(d);
        }
    }
    codec.check_finite(stream, input)?;
    Ok((median(enc), median(dec)))
}

/// Device-to-device copy bandwidth (bytes read + written per second, as the host profile
/// counts it), best of five.
fn copy_gbytes_per_s(stream: &Arc<CudaStream>) -> Result<f64> {
    let alloc = cuda_err("cannot allocate the copy buffers");
    let src = stream.alloc_zeros::<u8>(COPY_BYTES).map_err(&alloc)?;
    let mut dst = stream.alloc_zeros::<u8>(COPY_BYTES).map_err(&alloc)?;
    let copy = cuda_err("device-to-device copy failed");
    stream.memcpy_dtod(&src, &mut dst).map_err(&copy)?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = timed(stream, || stream.memcpy_dtod(&src, &mut dst).map_err(&copy))?;
        best = best.min(t);
    }
    Ok(2.0 * COPY_BYTES as f64 / best / 1e9)
}

/// The GEMM's best rate over its calibrated sizes, in TFLOP/s (2n³ flops per launch).
fn gemm_tflops(gemm: &Gemm) -> f64 {
    gemm.points
        .iter()
        .map(|&(n, ns)| 2.0 * f64::from(n).powi(3) / ns.max(1) as f64 / 1e3)
        .fold(0.0, f64::max)
}

/// One NCCL communicator per GPU, driven from this thread with group calls.
struct Ring {
    comms: Vec<Comm>,
    bufs: Vec<CudaSlice<f32>>,
    /// Sum, as nccl-tests times; on one GPU the average, since NCCL launches no kernel at all
    /// for a one-rank in-place sum (src/enqueue.cc, ncclLaunchOneRank) but scales the buffer
    /// in one kernel for the average.
    op: ReduceOp,
}

impl Ring {
    /// Communicators over every GPU, with `bytes` of buffer each; GPU 0 uses `first`.
    fn new(first: &Arc<CudaStream>, gpus: usize, bytes: usize) -> Result<Ring> {
        let mut streams = vec![first.clone()];
        for ordinal in 1..gpus {
            let ctx = CudaContext::new(ordinal).map_err(cuda_err("cannot open a GPU"))?;
            streams.push(
                ctx.new_stream()
                    .map_err(cuda_err("cannot create a stream"))?,
            );
        }
        let alloc = cuda_err("cannot allocate allreduce buffers");
        let bufs = streams
            .iter()
            .map(|s| s.alloc_zeros::<f32>(bytes / 4))
            .collect::<Result<Vec<_>, _>>()
            .map_err(alloc)?;
        let comms = Comm::from_devices(streams).map_err(|e| ExecError::Cuda {
            message: format!("cannot create the NCCL communicators: {e:?}"),
        })?;
        let op = if gpus == 1 {
            ReduceOp::Avg
        } else {
            ReduceOp::Sum
        };
        Ok(Ring { comms, bufs, op })
    }

    /// Enqueues one allreduce of the first `bytes` of every buffer on every GPU.
    fn allreduce(&mut self, bytes: usize) -> Result<()> {
        let nccl = |e: cudarc::nccl::result::NcclError| ExecError::Cuda {
            message: format!("NCCL allreduce failed: {e:?}"),
        };
        cudarc::nccl::result::group_start().map_err(nccl)?;
        let mut result = Ok(());
        for (comm, buf) in self.comms.iter().zip(&mut self.bufs) {
            let mut part = buf.slice_mut(..bytes / 4);
            if let Err(e) = comm.all_reduce_in_place(&mut part, &self.op) {
                result = Err(nccl(e));
                break;
            }
        }
        // The group must be closed even when a launch failed.
        cudarc::nccl::result::group_end().map_err(nccl)?;
        result
    }

    fn synchronize(&self) -> Result<()> {
        for comm in &self.comms {
            comm.stream()
                .synchronize()
                .map_err(cuda_err("allreduce failed"))?;
        }
        Ok(())
    }

    /// Host wall time per allreduce of `bytes`, nccl-tests style: warm-up, then `iters`
    /// back-to-back launches between two synchronizations.
    fn time(&mut self, bytes: usize, iters: u32) -> Result<f64> {
        for _ in 0..2 {
            self.allreduce(bytes)?;
        }
        self.synchronize()?;
        let start = Instant::now();
        for _ in 0..iters {
            self.allreduce(bytes)?;
        }
        self.synchronize()?;
        Ok(start.elapsed().as_secs_f64() / f64::from(iters))
    }
}

/// Compute slowdowns: the GEMM's time with a concurrent allreduce and with a concurrent fp16
/// encode kernel on another stream, each over its time alone (median of `repeats`).
fn contention(
    k: &Kernels,
    gemm: &mut Gemm,
    compute: &Arc<CudaStream>,
    side: &Arc<CudaStream>,
    ring: &mut Ring,
    input: &CudaSlice<f32>,
    repeats: usize,
) -> Result<(f64, f64)> {
    let &(order, ns) = gemm.points.last().ok_or_else(|| ExecError::Cuda {
        message: "the GEMM calibration produced no sizes".into(),
    })?;
    let reps = CONTENTION_NS.div_ceil(ns.max(1)).max(1) as u32;
    let mut alone = Vec::new();
    for _ in 0..repeats {
        alone.push(gemm.time(k, compute, order, reps)? as f64);
    }
    let alone = median(alone);
    // Enough background work to outlast the GEMM by half, so it overlaps the whole of it.
    let cover = |one: f64| ((1.5 * alone / 1e9 / one.max(1e-7)).ceil() as u32).max(1);

    let per_allreduce = ring.time(CONTENTION_ALLREDUCE_BYTES, 5)?;
    let mut with_collective = Vec::new();
    for _ in 0..repeats {
        for _ in 0..cover(per_allreduce) {
            ring.allreduce(CONTENTION_ALLREDUCE_BYTES)?;
        }
        with_collective.push(gemm.time(k, compute, order, reps)? as f64);
        ring.synchronize()?;
    }

    let n = input.len();
    let alloc = cuda_err("cannot allocate the encode buffers");
    let mut out = side.alloc_zeros::<u8>(2 * n).map_err(&alloc)?;
    let mut bad = side.alloc_zeros::<u32>(1).map_err(&alloc)?;
    let (n32, fp16) = (n as u32, 1);
    let encode = |out: &mut CudaSlice<u8>, bad: &mut CudaSlice<u32>| {
        k.cast_encode(side, input, out, n32, fp16, bad)
    };
    let per_encode = timed(side, || encode(&mut out, &mut bad))?;
    let mut with_codec = Vec::new();
    for _ in 0..repeats {
        for _ in 0..cover(per_encode) {
            encode(&mut out, &mut bad)?;
        }
        with_codec.push(gemm.time(k, compute, order, reps)? as f64);
        side.synchronize()
            .map_err(cuda_err("the encode loop failed"))?;
    }
    // Noise can put a ratio a hair under 1; the profile's contract is a factor ≥ 1.
    Ok((
        (median(with_collective) / alone).max(1.0),
        (median(with_codec) / alone).max(1.0),
    ))
}

/// Measures GPU 0 (and, with ≥ 2 GPUs, NCCL allreduce over all of them).
pub fn profile(options: &CudaProfileOptions) -> Result<CudaProfile> {
    let gpus = probe::probe()?;
    let ctx = CudaContext::new(0).map_err(cuda_err("cannot open GPU 0"))?;
    let stream = ctx
        .new_stream()
        .map_err(cuda_err("cannot create a stream"))?;
    let side = ctx
        .new_stream()
        .map_err(cuda_err("cannot create a stream"))?;
    let kernels = Kernels::load(&ctx)?;
    let model = ctx.name().map_err(cuda_err("cannot read the GPU's name"))?;
    let sms = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(cuda_err("cannot read the GPU's SM count"))?;
    let memory = ctx
        .total_mem()
        .map_err(cuda_err("cannot read the GPU's memory size"))?;
    let repeats = options.repeats.max(1);

    let largest = options.sizes.iter().copied().max().unwrap_or(0);
    let mut rng = Rng::new(42);
    let data: Vec<f32> = (0..largest.max(1)).map(|_| rng.normal() as f32).collect();
    let input = stream
        .clone_htod(&data)
        .map_err(cuda_err("cannot upload the test data"))?;

    let mut compression = BTreeMap::new();
    let mut without_kernel = Vec::new();
    for spec in profiled() {
        let c: Compressor = spec.parse()?;
        if supported(&c).is_err() {
            without_kernel.push(c.key().to_string());
            continue;
        }
        let (encode, decode, kept) = across_ratios(&c, &options.sizes, |c, n| {
            time_codec(&kernels, &stream, c, &input, n, repeats)
        })?;
        let method = format!(
            "measured by syncopate profile --backend cuda: {spec} GPU kernels on {model}, CUDA events around each encode / decode_add, median of {repeats} runs at {:?} elements (standard normal data), least-squares floor + per-element fit{kept}",
            options.sizes
        );
        compression.insert(c.key().to_string(), measured_codec(encode, decode, method));
    }

    let bandwidth = copy_gbytes_per_s(&stream)?;
    let mut gemm = Gemm::calibrate(&kernels, &stream)?;
    let fp32 = gemm_tflops(&gemm);
    let mut ring = Ring::new(&side, gpus, CONTENTION_ALLREDUCE_BYTES)?;
    let (collective, codec) = contention(
        &kernels, &mut gemm, &stream, &side, &mut ring, &input, repeats,
    )?;
    drop(ring);

    let allreduce = if gpus >= 2 {
        sweep(&side, gpus, &options.sweep_bytes)?
    } else {
        Vec::new()
    };
    let skipped = if without_kernel.is_empty() {
        String::new()
    } else {
        format!(
            "; compressors without a GPU kernel, left out of `compression`: {}",
            without_kernel.join(", ")
        )
    };
    let (compute_speed_vs_v100, compute_speed_provenance) =
        options.compute_speed.clone().unwrap_or_else(|| {
            (
                fp32 / V100_FP32_TFLOPS,
                provenance(
                    Status::Estimated,
                    format!("the tiled FMA GEMM's measured {fp32:.2} TFLOP/s divided by V100's {V100_FP32_TFLOPS} TFLOP/s fp32 peak (a naive GEMM reaches a fraction of peak, so this understates the GPU; profile --compute-from measures it)"),
                ),
            )
        });
    let device = DeviceProfile {
        format_version: FORMAT_VERSION,
        name: options.name.clone(),
        kind: DeviceKind::Gpu,
        model: model.clone(),
        source: format!(
            "syncopate profile --backend cuda on GPU 0 of {gpus}; memory bandwidth: 256 MiB device-to-device copy (read + written bytes), best of 5; peak_fp32_tflops: best rate of syncopate's tiled FMA GEMM (a lower bound on the part's peak); peak_fp16_tflops: not measured (no half-precision kernel), set to the fp32 GEMM rate{skipped}"
        ),
        memory_bandwidth_gbytes_per_s: bandwidth,
        memory_gib: Some(memory as f64 / f64::from(1u32 << 30)),
        peak_fp32_tflops: fp32,
        peak_fp16_tflops: fp32,
        peak_tf32_tflops: None,
        peak_fp8_tflops: None,
        sm_count: u32::try_from(sms).ok().filter(|&n| n > 0),
        compute_speed_vs_v100,
        compute_speed_provenance,
        // Its tiled GEMM measures no library's operation: nothing to state.
        achieved_fraction_of_peak: None,
        // A framework's caching allocator hands back device memory it holds: no fresh pages.
        fresh_memory: None,
        compression,
        contention: Contention {
            compute_slowdown_with_collective: Some(collective),
            compute_slowdown_with_compression: codec,
            provenance: provenance(
                Status::Measured,
                format!("measured on {model}: the tiled GEMM's CUDA-event time (≈{} ms) while a {} MiB NCCL allreduce over {gpus} GPU(s) loops on another stream{}, and while the fp16 encode kernel over {largest} elements loops on another stream, each divided by its time alone; medians of {repeats}", CONTENTION_NS / 1_000_000, CONTENTION_ALLREDUCE_BYTES >> 20, if gpus == 1 { " (one GPU: NCCL's one-rank average, a kernel that reads and writes the buffer once and moves nothing between GPUs, so a lower bound of a collective's interference)" } else { "" }),
            ),
        },
    };
    device.validate(&options.name)?;
    Ok(CudaProfile {
        device,
        gpus,
        allreduce,
    })
}

/// nccl-tests-style allreduce times over all GPUs (fp32 sum, in place), one point per size.
fn sweep(first: &Arc<CudaStream>, gpus: usize, sizes: &[u64]) -> Result<Vec<Measurement>> {
    let largest = sizes.iter().copied().max().unwrap_or(0) as usize;
    let mut ring = Ring::new(first, gpus, largest.max(4))?;
    let mut points = Vec::with_capacity(sizes.len());
    for &bytes in sizes {
        // About as many iterations as nccl-tests' default 20, fewer for the slow large sizes.
        let iters = if bytes >= 256 << 20 { 5 } else { 20 };
        let secs = ring.time(bytes as usize / 4 * 4, iters)?;
        points.push(Measurement {
            gpus: gpus as u32,
            bytes,
            time_us: secs * 1e6,
        });
    }
    Ok(points)
}
