//! GPU codec tests: bytes and sums against the CPU reference codecs, and the coverage check.
//!
//! Payload bytes and decoded sums are compared on a GPU; the coverage check needs no GPU.

use super::super::kernels::gpu_or_skip;
use super::*;
use crate::compress::rng::Rng;
use crate::compress::{codec_for, codec_for_shapes};

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
