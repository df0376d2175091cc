//! GPU codec tests: payload bytes and decoded sums against the CPU reference codecs.
//!
//! On a GPU every catalog compressor with kernels runs under every error-feedback memory for a
//! few steps, each mismatch is collected, and the test fails once listing them all; the
//! coverage checks need no GPU.

use super::super::kernels::gpu_or_skip;
use super::super::memory::GpuMemory;
use super::*;
use crate::compress::rng::Rng;
use crate::compress::{codec_for_shapes, Codec, MemoryState};
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use std::fmt::{self, Write};
use syncopate_sim::compress::Memory;

/// Runs without a GPU: the catalog's `gpu` column is what the families support, for every
/// catalog example (one spec per profile key, PowerSGD included).
#[test]
fn gpu_kernels_are_the_catalogs() {
    for entry in catalog() {
        let c: Compressor = entry.example.parse().unwrap();
        match supported(&c) {
            Ok(()) => assert!(entry.gpu, "{c} has kernels the catalog does not list"),
            Err(e) => {
                assert!(!entry.gpu, "{c}: {e}");
                assert!(e.to_string().contains(&format!("no GPU kernel for `{c}`")));
            }
        }
    }
}

/// Runs without a GPU: a QSGD beyond the kernels' code width is refused, naming it.
#[test]
fn qsgd_beyond_the_kernels_is_refused_by_name() {
    let c = Compressor::Qsgd {
        levels: syncopate_sim::compress::QSGD_MAX_LEVELS + 1,
    };
    let err = supported(&c).unwrap_err().to_string();
    assert!(err.contains(&format!("no GPU kernel for `{c}`")), "{err}");
}

/// Seed of every codec: the CPU and GPU codecs of a worker draw alike only with the same one.
const SEED: u64 = 11;
/// Steps per case: the later ones start from the memory's residual or momentum and from the
/// codecs' state (Signum's momentum, the generators, PowerSGD's warm-started Q).
const STEPS: usize = 3;
/// Failures the final panic lists; the rest are only counted.
const LISTED: usize = 200;

/// GPU payload bytes equal the CPU codec's and decoding adds the same values, for every
/// single-round compressor with kernels, size and memory, each step of each case.
#[test]
fn gpu_payloads_match_the_cpu_bytes() {
    let Some((_ctx, stream, kernels)) = gpu_or_skip() else {
        return;
    };
    let d = Device {
        stream: &stream,
        k: &kernels,
    };
    // Beyond the catalog's examples: the other fp8 layout, sparsifiers keeping 30%, every
    // QSGD code width, TBQ with a small τ, thresholds that keep some, all or nothing.
    let more = [
        "fp8:e5m2",
        "topk:0.3",
        "dgc:0.3",
        "graddrop:0.3",
        "tbq:0.5",
        "qsgd:1",
        "qsgd:4",
        "qsgd:127",
        "qsgd:32767",
        "threshold:1.5",
        "threshold:1e-7",
        "threshold:1e9",
    ];
    // Empty and single-element pieces, sizes off the 8-element codes, the 4096-element
    // chunks and tiles on both sides, and several chunks.
    let sizes = [0usize, 1, 7, 17, 4095, 4096, 4097, 100_003];
    let mut rng = Rng::new(7);
    let grads: Vec<Vec<Vec<f32>>> = sizes
        .iter()
        .map(|&n| (0..STEPS).map(|step| gradient(&mut rng, n, step)).collect())
        .collect();
    let memories = memories();
    let mut report = Report::default();
    for c in gpu_compressors(false, &more) {
        for (&n, grads) in sizes.iter().zip(&grads) {
            for &memory in &memories {
                let mut payload = Vec::new();
                report.run(
                    format!("{c} n={n} memory {memory}"),
                    || Worker::new(d, &c, &[], n, memory),
                    |w, step, report| w.single_round_step(d, &grads[step], &mut payload, report),
                );
            }
        }
        report.summary(format_args!(
            "{c}: {} sizes × {} memories × {STEPS} steps",
            sizes.len(),
            memories.len()
        ));
    }
    report.finish();
}

/// PowerSGD on the GPU: both rounds' payload bytes and the decoded sum equal the CPU
/// codec's, for two workers (the GPU one and a CPU peer sharing the seed) over the steps
/// (each warm-started from the last reduced Q), under every memory.
#[test]
fn gpu_powersgd_rounds_match_the_cpu_bytes() {
    let Some((_ctx, stream, kernels)) = gpu_or_skip() else {
        return;
    };
    let d = Device {
        stream: &stream,
        k: &kernels,
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
    let memories = memories();
    let mut rng = Rng::new(5);
    let mut report = Report::default();
    for c in gpu_compressors(true, &["powersgd:1", "powersgd:2"]) {
        for shapes in groups {
            let n = if shapes.is_empty() {
                4097
            } else {
                shapes
                    .iter()
                    .map(|s| s.iter().product::<u64>() as usize)
                    .sum()
            };
            for &memory in &memories {
                let mut peer = codec_for_shapes(&c, shapes, SEED);
                report.run(
                    format!("{c} on {shapes:?} memory {memory}"),
                    || Worker::new(d, &c, shapes, n, memory),
                    |w, step, report| {
                        let x = gradient(&mut rng, n, step);
                        let y = gradient(&mut rng, n, step);
                        w.powersgd_step(d, &mut *peer, &x, &y, report)
                    },
                );
            }
        }
        report.summary(format_args!(
            "{c}: {} groups × {} memories × {STEPS} steps",
            groups.len(),
            memories.len()
        ));
    }
    report.finish();
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

/// The catalog's examples of the compressors with GPU kernels, single-round or multi-round
/// (PowerSGD, tested with its rounds), then `more` specs: a compressor added to the catalog is
/// tested without a change here.
fn gpu_compressors(multi_round: bool, more: &[&str]) -> Vec<Compressor> {
    let mut all: Vec<Compressor> = catalog()
        .iter()
        .filter(|e| e.gpu)
        .map(|e| e.example.parse().unwrap())
        .filter(|c: &Compressor| (c.allreduce_rounds() > 1) == multi_round)
        .collect();
    for spec in more {
        let c = spec.parse().unwrap();
        if !all.contains(&c) {
            all.push(c);
        }
    }
    all
}

/// Every error-feedback memory, as the memory catalog lists them, with default parameters:
/// `GpuMemory` implements each.
fn memories() -> Vec<Memory> {
    Memory::memory_catalog()
        .iter()
        .map(|e| e.form.split('[').next().unwrap().parse().unwrap())
        .collect()
}

/// Step `step`'s gradient of n elements: normal values with huge, tiny (subnormal after
/// scaling) and ±0 ones, at positions that move with the step.
fn gradient(rng: &mut Rng, n: usize, step: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
    for (i, v) in x.iter_mut().enumerate().skip(step).step_by(97) {
        *v = [1e6, -3e-9, 0.0, -0.0, 70000.0][i % 5];
    }
    x
}

/// The GPU a test runs on. Its buffers hold at least one element: the driver refuses a
/// zero-byte allocation, and an empty piece is a case the codecs handle.
#[derive(Clone, Copy)]
struct Device<'a> {
    stream: &'a Arc<CudaStream>,
    k: &'a Kernels,
}

impl Device<'_> {
    /// A new buffer holding `host` (one zero for an empty one).
    fn upload<T: DeviceRepr + ValidAsZeroBits>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        let mut buffer = self
            .stream
            .alloc_zeros(host.len().max(1))
            .map_err(cuda_err("cannot allocate a test buffer"))?;
        self.write(host, &mut buffer)?;
        Ok(buffer)
    }

    /// `host` into the start of `buffer`; an error, not a panic, when it does not fit.
    fn write<T: DeviceRepr>(&self, host: &[T], buffer: &mut CudaSlice<T>) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        let len = buffer.len();
        let mut dst = buffer
            .try_slice_mut(..host.len())
            .ok_or_else(|| ExecError::Cuda {
                message: format!("{} elements do not fit a buffer of {len}", host.len()),
            })?;
        self.stream
            .memcpy_htod(host, &mut dst)
            .map_err(cuda_err("cannot upload test data"))
    }

    /// The first `len` elements of `buffer`, fewer when it is shorter (the comparison then
    /// reports the lengths).
    fn download<T: DeviceRepr>(&self, buffer: &CudaSlice<T>, len: usize) -> Result<Vec<T>> {
        let len = len.min(buffer.len());
        if len == 0 {
            return Ok(Vec::new());
        }
        self.stream
            .clone_dtoh(&buffer.slice(..len))
            .map_err(cuda_err("cannot download a result"))
    }
}

/// One worker's compressor and memory twice, the CPU reference and the GPU's, fed the same
/// gradients, with the GPU buffers `run.rs` gives a piece.
struct Worker {
    n: usize,
    cpu: Box<dyn Codec>,
    cpu_memory: MemoryState,
    gpu: GpuCodec,
    gpu_memory: GpuMemory,
    /// The compensated input, on the CPU and on the GPU.
    p: Vec<f32>,
    compensated: CudaSlice<f32>,
    /// The GPU's payload buffer, for every round.
    out: CudaSlice<u8>,
}

impl Worker {
    fn new(
        d: Device,
        c: &Compressor,
        shapes: &[&[u64]],
        n: usize,
        memory: Memory,
    ) -> Result<Worker> {
        let gpu = GpuCodec::new(c, n, shapes, SEED, d.stream)?;
        Ok(Worker {
            n,
            cpu: codec_for_shapes(c, shapes, SEED),
            cpu_memory: MemoryState::new(memory, n),
            gpu_memory: GpuMemory::new(memory, n, d.stream)?,
            p: Vec::new(),
            compensated: d.upload(&vec![0.0; n])?,
            out: d.upload(&vec![0; gpu.wire_bytes()])?,
            gpu,
        })
    }

    /// Compensates `x` and encodes it (the first round) on both sides; compares the
    /// compensated inputs and the payload, the CPU's in `payload`.
    fn encode(
        &mut self,
        d: Device,
        x: &[f32],
        payload: &mut Vec<u8>,
        check: &'static str,
        report: &mut Report,
    ) -> Result<()> {
        self.cpu_memory.compensate(x, &mut self.p)?;
        self.cpu.encode(&self.p, payload)?;
        let grad = d.upload(x)?;
        self.gpu_memory
            .compensate(d.k, d.stream, &grad.slice(..), &mut self.compensated)?;
        self.gpu
            .encode(d.k, d.stream, &self.compensated, &mut self.out)?;
        self.gpu.check_finite(d.stream, &self.compensated)?;
        let got = d.download(&self.compensated, self.n)?;
        report.compare("compensated inputs", &got, &self.p, f32::to_bits);
        self.compare_payload(d, payload, check, report)
    }

    /// Compares the GPU's payload buffer with the CPU's `payload`, over the CPU's length.
    fn compare_payload(
        &self,
        d: Device,
        payload: &[u8],
        check: &'static str,
        report: &mut Report,
    ) -> Result<()> {
        let got = d.download(&self.out, payload.len())?;
        report.compare(check, &got, payload, |b| b);
        Ok(())
    }

    /// Decodes into accumulators holding `start` (decoding adds): the CPU `payload`, the GPU
    /// the first `len` bytes of its payload buffer. Compares and returns both sums.
    fn decode(
        &mut self,
        d: Device,
        payload: &[u8],
        len: usize,
        (start, check): (f32, &'static str),
        report: &mut Report,
    ) -> Result<(Vec<f32>, CudaSlice<f32>)> {
        let mut cpu = vec![start; self.n];
        let mut gpu = d.upload(&cpu)?;
        self.cpu.decode_add(payload, &mut cpu)?;
        let view = self.out.try_slice(..len).ok_or_else(|| ExecError::Cuda {
            message: format!("no {len} payload bytes in {}", self.out.len()),
        })?;
        self.gpu.decode_add(d.k, d.stream, &view, &mut gpu)?;
        report.compare(check, &d.download(&gpu, self.n)?, &cpu, f32::to_bits);
        Ok((cpu, gpu))
    }

    /// Keeps in the memories what was not transmitted, `sent` on the CPU and `transmitted` on
    /// the GPU.
    fn update(&mut self, d: Device, sent: &[f32], transmitted: &CudaSlice<f32>) -> Result<()> {
        self.cpu_memory.update(&self.p, sent)?;
        self.gpu_memory
            .update(d.k, d.stream, &self.compensated, transmitted)
    }

    /// A step of a single-round codec: encode, decode into a non-zero accumulator, and the
    /// memories' update from this worker's own payload decoded, as `run.rs` and the host
    /// backends do.
    fn single_round_step(
        &mut self,
        d: Device,
        x: &[f32],
        payload: &mut Vec<u8>,
        report: &mut Report,
    ) -> Result<()> {
        self.encode(d, x, payload, "payload bytes", report)?;
        let wire = self.gpu.wire_bytes();
        self.decode(d, payload, wire, (0.5, "sums"), report)?;
        let (sent, transmitted) = self.decode(d, payload, wire, (0.0, "transmitted"), report)?;
        self.update(d, &sent, &transmitted)
    }

    /// A PowerSGD step with `peer`, a CPU worker encoding `y`: P, its allreduce (sum), Q from
    /// the reduced P, which the GPU reads in its payload buffer, Q's allreduce, the decode of
    /// the reduced Q into a non-zero accumulator, and the memories' update from the averaged
    /// result, as `run.rs` and the host backends do.
    fn powersgd_step(
        &mut self,
        d: Device,
        peer: &mut dyn Codec,
        x: &[f32],
        y: &[f32],
        report: &mut Report,
    ) -> Result<()> {
        const WORLD: f32 = 2.0;
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        self.encode(d, x, &mut mine, "P bytes", report)?;
        peer.encode(y, &mut theirs)?;
        report.compare(
            "round sizes",
            &[self.gpu.round_bytes(0)],
            &[mine.len()],
            |s| s,
        );
        let mut reduced = mine.clone();
        self.cpu.sum_into(&mut reduced, &theirs)?;
        d.write(&reduced, &mut self.out)?;
        self.cpu.next_round(&reduced, &mut mine)?;
        peer.next_round(&reduced, &mut theirs)?;
        self.gpu
            .next_round(d.k, d.stream, &self.compensated, &mut self.out)?;
        report.compare(
            "round sizes",
            &[self.gpu.round_bytes(1)],
            &[mine.len()],
            |s| s,
        );
        self.compare_payload(d, &mine, "Q bytes", report)?;
        let mut reduced = mine;
        self.cpu.sum_into(&mut reduced, &theirs)?;
        d.write(&reduced, &mut self.out)?;
        peer.decode_add(&reduced, &mut vec![0.0; self.n])?;
        let (acc, acc_gpu) = self.decode(d, &reduced, reduced.len(), (0.5, "sums"), report)?;
        // Each side averages its own accumulator, the 0.5 included: the same input when the
        // sums matched.
        let sent: Vec<f32> = acc.iter().map(|r| r / WORLD).collect();
        let mut transmitted = d.upload(&vec![0.0; self.n])?;
        d.k.powersgd_average(d.stream, &acc_gpu, &mut transmitted, self.n as u32, WORLD)?;
        self.update(d, &sent, &transmitted)
    }
}

/// Where a GPU test's results differ from the CPU's, over every case, so that one run on a GPU
/// shows all of them.
#[derive(Default)]
struct Report {
    /// The case and step being compared.
    case: String,
    failures: Vec<String>,
    /// The current compressor's checks, in first-use order, and the comparisons that differed.
    checks: Vec<(&'static str, usize)>,
    /// The current compressor's cases stopped by an error.
    errors: usize,
}

impl Report {
    /// Runs a case: `step` STEPS times on the worker `new` makes, up to the first error.
    fn run(
        &mut self,
        case: String,
        new: impl FnOnce() -> Result<Worker>,
        mut step: impl FnMut(&mut Worker, usize, &mut Report) -> Result<()>,
    ) {
        self.case.clone_from(&case);
        let result = new().and_then(|mut worker| {
            (0..STEPS).try_for_each(|s| {
                self.case = format!("{case} step {s}");
                step(&mut worker, s, self)
            })
        });
        if let Err(e) = result {
            self.errors += 1;
            self.failures.push(format!("{}: error: {e}", self.case));
        }
    }

    /// Compares `got` with `want` as `key` sees the elements (floats by their bits), noting
    /// the lengths, the first difference and how many elements differ.
    fn compare<T: Copy + fmt::Debug, K: PartialEq>(
        &mut self,
        check: &'static str,
        got: &[T],
        want: &[T],
        key: impl Fn(T) -> K,
    ) {
        let mut differing = got
            .iter()
            .zip(want)
            .enumerate()
            .filter(|(_, (&g, &w))| key(g) != key(w));
        let first = differing.next();
        let differs = first.is_some() || got.len() != want.len();
        match self.checks.iter_mut().find(|(name, _)| *name == check) {
            Some((_, count)) => *count += usize::from(differs),
            None => self.checks.push((check, usize::from(differs))),
        }
        if !differs {
            return;
        }
        let mut line = format!("{}: {check}", self.case);
        if got.len() != want.len() {
            let _ = write!(line, ", {} elements, want {}", got.len(), want.len());
        }
        if let Some((i, (g, w))) = first {
            let count = 1 + differing.count();
            let compared = got.len().min(want.len());
            let _ = write!(
                line,
                ", {count} of {compared} differ, the first at {i}: {g:?}, want {w:?}"
            );
        }
        self.failures.push(line);
    }

    /// Prints the current compressor's line (`what`, then each check's outcome) and starts
    /// the next one's counts.
    fn summary(&mut self, what: fmt::Arguments) {
        let mut outcomes: Vec<String> = self
            .checks
            .drain(..)
            .map(|(check, differed)| match differed {
                0 => format!("{check} equal"),
                _ => format!("{check} differ {differed} times"),
            })
            .collect();
        if self.errors > 0 {
            outcomes.push(format!("{} cases stopped by an error", self.errors));
        }
        self.errors = 0;
        println!("codec {what}, {}", outcomes.join(", "));
    }

    /// Fails, once, with the first `LISTED` failures and their number.
    fn finish(self) {
        let total = self.failures.len();
        if total == 0 {
            return;
        }
        let listed: Vec<&str> = self
            .failures
            .iter()
            .take(LISTED)
            .map(|s| s.as_str())
            .collect();
        panic!(
            "{total} GPU results differ from the CPU's ({} listed):\n{}",
            listed.len(),
            listed.join("\n")
        );
    }
}
