//! Compression: the sim's wire bytes against the real encoders, error bounds, unbiasedness.
//!
//! Also error feedback, aggregation and convergence.

use statrs::distribution::{ContinuousCDF, StudentsT};
use syncopate_exec::compress::rng::Rng;
use syncopate_exec::compress::sampled::dgc_estimate;
use syncopate_exec::compress::{
    aggregate, codec_for, codec_for_shapes, roundtrip, Codec, MemoryState,
};
use syncopate_exec::measure::profile_host::profiled;
use syncopate_sim::compress::{
    auto_specs, catalog, powersgd_layout, powersgd_rounds, sparse_count, Compressor, Element,
    Memory,
};

/// Specs besides the catalog's examples, which every test here runs too: other parameters and
/// formats.
const MORE_SPECS: &[&str] = &[
    "fp8:e5m2",
    "topk:0.5",
    "randomk:0.1",
    "dgc:0.3",
    "threshold:1.5",
    "qsgd:1",
    "qsgd:7",
    "qsgd:32767",
    "tbq:0.5",
    "graddrop:0.05",
];

/// Every catalog row's example (so a new compressor is tested here without being listed), then
/// [`MORE_SPECS`].
fn every_spec() -> Vec<&'static str> {
    catalog()
        .iter()
        .map(|e| e.example)
        .chain(MORE_SPECS.iter().copied())
        .collect()
}

const SIZES: &[usize] = &[1, 7, 8, 9, 1000, 4097, (1 << 16) + 3];

fn spec(s: &str) -> Compressor {
    s.parse().unwrap()
}

fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// Bytes one worker sends in all rounds when it is alone.
fn sent_bytes(codec: &mut dyn Codec, grad: &[f32]) -> u64 {
    let mut payload = Vec::new();
    codec.encode(grad, &mut payload).unwrap();
    let mut total = payload.len() as u64;
    let mut next = Vec::new();
    for _ in 1..codec.compressor().allreduce_rounds() {
        codec.next_round(&payload, &mut next).unwrap();
        total += next.len() as u64;
        std::mem::swap(&mut payload, &mut next);
    }
    total
}

/// The catalog is the one list of compressors: each row's example is its row's compressor,
/// prints as itself and builds its family's codec for that compressor; what `profile` measures
/// and what `tune --compressor auto` considers are derived from the rows.
#[test]
fn every_catalog_row_builds_its_codec_and_the_lists_derive_from_it() {
    for entry in catalog() {
        let c = spec(entry.example);
        assert_eq!(c.key(), entry.key);
        assert_eq!(c.to_string(), entry.example);
        assert_eq!(codec_for(&c, 0).compressor(), c, "{}", entry.key);
        assert_eq!(c.allowed_aggregations(), entry.aggregations);
    }
    let examples: Vec<&str> = catalog().iter().map(|e| e.example).collect();
    assert_eq!(profiled(), examples);
    let mut auto: Vec<(u8, &str)> = catalog()
        .iter()
        .filter_map(|e| Some((e.auto?, e.example)))
        .collect();
    auto.sort_unstable();
    assert_eq!(
        auto_specs(),
        auto.into_iter().map(|(_, s)| s).collect::<Vec<_>>()
    );
}

#[test]
fn sim_wire_bytes_equal_the_real_payloads() {
    for s in every_spec() {
        let c = spec(s);
        for &n in SIZES {
            let g = gaussian(n, n as u64);
            let got = sent_bytes(&mut *codec_for(&c, 1), &g);
            match c {
                // Data-dependent: 4 + 8 per element at or above the threshold, bounded by the sim.
                Compressor::Threshold { value } => {
                    let count = g.iter().filter(|x| x.abs() >= value as f32).count() as u64;
                    assert_eq!(got, 4 + 8 * count, "{s} n={n}");
                    assert!(got <= c.wire_bytes(n as u64));
                }
                _ => assert_eq!(got, c.wire_bytes(n as u64), "{s} n={n}"),
            }
        }
    }
    // Threshold's bound is reached when everything passes.
    let c = spec("threshold:1e-30");
    let g = gaussian(1000, 3);
    assert_eq!(sent_bytes(&mut *codec_for(&c, 1), &g), c.wire_bytes(1000));
}

/// The deterministic formats of `exec/WIRE_FORMAT.md` worked out by hand on one small
/// gradient: the bytes the CPU reference writes, which the GPU kernels must equal.
#[test]
fn deterministic_payloads_follow_the_wire_format_by_hand() {
    let x = [1.0f32, -2.0, 0.5, -0.25, 3.0];
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let u32s = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let cat = |parts: &[Vec<u8>]| parts.concat();
    // Sign bits, 1 = negative, element i at bit i: elements 1 and 3.
    let signs = vec![0b0_1010u8];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("none", f32s(&x)),
        // IEEE half: 1 = 0x3C00, −2 = 0xC000, 0.5 = 0x3800, −0.25 = 0xB400, 3 = 0x4200.
        (
            "fp16",
            vec![0x00, 0x3C, 0x00, 0xC0, 0x00, 0x38, 0x00, 0xB4, 0x00, 0x42],
        ),
        // bfloat16: the top halves 0x3F80, 0xC000, 0x3F00, 0xBE80, 0x4040.
        (
            "bf16",
            vec![0x80, 0x3F, 0x00, 0xC0, 0x00, 0x3F, 0x80, 0xBE, 0x40, 0x40],
        ),
        // Scale 3/448; x·(448/3) ≈ 149.3, −298.7, 74.7, −37.3, 448 round to 144 = 1.125·2^7,
        // −288, 72, −36 (exponent fields 14, 15, 13, 12; mantissa 001) and 448 (0x7E, the
        // largest finite code).
        (
            "fp8:e4m3",
            cat(&[
                (3.0f32 / 448.0).to_le_bytes().to_vec(),
                vec![0x71, 0xF9, 0x69, 0xE1, 0x7E],
            ]),
        ),
        ("signsgd", signs.clone()),
        // mean |x| = 6.75 / 5.
        ("efsignsgd", cat(&[f32s(&[1.35]), signs.clone()])),
        // Means of the non-negative (1, 0.5, 3) and of the negative (−2, −0.25) elements.
        ("onebit", cat(&[f32s(&[1.5, -1.125]), signs])),
        // Codes 1 (> τ), 2 (< −τ), 0, 0, 1; element i at bits 2·(i % 4) of byte i / 4.
        ("tbq:0.5", vec![0b0000_1001, 0b0000_0001]),
        // k = ceil(0.4 · 5) = 2: the largest |x| are elements 1 and 4, ascending.
        ("topk:0.4", cat(&[u32s(&[1, 4]), f32s(&[-2.0, 3.0])])),
        // Every |x| ≥ 1: count 3, indices 0, 1, 4, then their values.
        (
            "threshold:1",
            cat(&[u32s(&[3, 0, 1, 4]), f32s(&[1.0, -2.0, 3.0])]),
        ),
    ];
    for (s, want) in cases {
        let mut payload = Vec::new();
        codec_for(&spec(s), 1).encode(&x, &mut payload).unwrap();
        assert_eq!(payload, want, "{s}");
    }
}

#[test]
fn powersgd_group_bytes_equal_the_real_rounds() {
    let shapes: [&[u64]; 4] = [&[64, 32, 3, 3], &[64], &[10, 1000], &[3, 3]];
    let n: u64 = shapes.iter().map(|s| s.iter().product::<u64>()).sum();
    for rank in [1, 4, 16] {
        let c = Compressor::PowerSgd { rank };
        let g = gaussian(n as usize, 5);
        let got = sent_bytes(&mut *codec_for_shapes(&c, &shapes, 1), &g);
        assert_eq!(got, c.group_wire_bytes(&shapes), "rank {rank}");
    }
}

#[test]
fn topk_selects_exactly_the_k_largest() {
    for (n, ratio) in [(1000, 0.01), (4097, 0.1), (65_539, 0.001), (7, 1.0)] {
        let g = gaussian(n, 9);
        let c = Compressor::TopK { ratio };
        let mut out = vec![0.0; n];
        roundtrip(&mut *codec_for(&c, 0), &g, &mut Vec::new(), &mut out).unwrap();
        let k = sparse_count(n as u64, ratio) as usize;
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
        for (rank, &i) in order.iter().enumerate() {
            let want = if rank < k { g[i] } else { 0.0 };
            assert_eq!(out[i], want, "n={n} rank {rank}");
        }
    }
}

#[test]
fn round_trip_errors_are_bounded() {
    let n = 4097;
    let g = gaussian(n, 21);
    let max = g.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let norm = g.iter().map(|x| x * x).sum::<f32>().sqrt();
    for s in every_spec() {
        let c = spec(s);
        let mut y = vec![0.0; n];
        roundtrip(&mut *codec_for(&c, 3), &g, &mut Vec::new(), &mut y).unwrap();
        for (i, (&x, &v)) in g.iter().zip(&y).enumerate() {
            let ok = match c {
                Compressor::None => v == x,
                Compressor::Fp16 => (v - x).abs() <= x.abs() * 2f32.powi(-11) + 3e-8,
                Compressor::Bf16 => (v - x).abs() <= x.abs() * 2f32.powi(-8),
                Compressor::Fp8(_) => (v - x).abs() <= x.abs() * 0.125 + max * 1e-4,
                // Half a step of the block's scale, at most the tensor's max / 254.
                Compressor::Int8 { .. } => (v - x).abs() <= max / 254.0 * 1.0001,
                Compressor::Int4 { .. } => (v - x).abs() <= max / 14.0 * 1.0001,
                // Sparsifiers send exact values or nothing.
                Compressor::TopK { .. }
                | Compressor::RandomKIndexed { .. }
                | Compressor::Dgc { .. }
                | Compressor::GradDrop { .. }
                | Compressor::Threshold { .. } => v == x || v == 0.0,
                Compressor::RandomK { ratio } => {
                    let scale = n as f32 / sparse_count(n as u64, ratio) as f32;
                    v == 0.0 || v == x * scale
                }
                Compressor::Qsgd { levels } => (v - x).abs() <= norm / levels as f32 * 1.0001,
                Compressor::TernGrad => v == 0.0 || (v.abs() == max && v.signum() == x.signum()),
                Compressor::Natural => {
                    v == 0.0 || (v.abs() <= 2.0 * x.abs() && v.abs() >= 0.5 * x.abs())
                }
                Compressor::Tbq { threshold } => {
                    let t = threshold as f32;
                    v == if x > t {
                        t
                    } else if x < -t {
                        -t
                    } else {
                        0.0
                    }
                }
                Compressor::SignSgd
                | Compressor::Signum { .. }
                | Compressor::EfSignSgd
                | Compressor::OneBit => v.signum() == if x < 0.0 { -1.0 } else { 1.0 },
                // 1-D: sent raw.
                Compressor::PowerSgd { .. } => v == x,
            };
            assert!(ok, "{s}: element {i}: {x} → {v}");
        }
    }
}

#[test]
fn dgc_keeps_within_twenty_percent_of_k() {
    let mut rng = Rng::new(17);
    let uniform: Vec<f32> = (0..200_000).map(|_| rng.next_f32_pair().0 - 0.5).collect();
    let heavy: Vec<f32> = gaussian(200_000, 4).iter().map(|x| x * x * x).collect();
    let mut blocky = gaussian(100_000, 5);
    for x in &mut blocky[..50_000] {
        *x *= 100.0;
    }
    for data in [gaussian(300_000, 1), uniform, heavy, blocky] {
        for ratio in [0.001, 0.01, 0.1] {
            for _ in 0..5 {
                let e = dgc_estimate(&data, ratio, &mut rng).unwrap();
                let k = sparse_count(data.len() as u64, ratio) as f64;
                let r = e.selected as f64 / k;
                assert!(
                    (0.8..=1.2).contains(&r),
                    "ratio {ratio}: selected {} for k {k}",
                    e.selected
                );
            }
        }
    }
}

/// Number of random ±1 projections of the error tested for zero mean.
const PROJECTIONS: usize = 8;

/// Student t-tests of E[w·(decode(encode(g)) − g)] = 0 over seeded draws, for several random
/// ±1 weight vectors w (a projection never has zero variance by accident, unlike a single
/// element that sits next to a quantization level). Returns the smallest p-value; a
/// deterministic projection counts as p = 0 when it is not zero.
fn min_p_value(c: &Compressor, g: &[f32], draws: usize) -> f64 {
    let n = g.len();
    let mut rng = Rng::new(1234);
    let weights: Vec<Vec<f64>> = (0..PROJECTIONS)
        .map(|_| {
            (0..n)
                .map(|_| if rng.next_u64() & 1 == 1 { 1.0 } else { -1.0 })
                .collect()
        })
        .collect();
    let (mut sum, mut sq) = ([0.0f64; PROJECTIONS], [0.0f64; PROJECTIONS]);
    let mut codec = codec_for(c, 99);
    let mut y = vec![0.0; n];
    let mut payload = Vec::new();
    for _ in 0..draws {
        roundtrip(&mut *codec, g, &mut payload, &mut y).unwrap();
        for (k, w) in weights.iter().enumerate() {
            let s: f64 = (0..n)
                .map(|i| w[i] * (f64::from(y[i]) - f64::from(g[i])))
                .sum();
            sum[k] += s;
            sq[k] += s * s;
        }
    }
    let d = draws as f64;
    let t = StudentsT::new(0.0, 1.0, d - 1.0).unwrap();
    (0..PROJECTIONS)
        .map(|k| {
            let mean = sum[k] / d;
            let var = ((sq[k] - d * mean * mean) / (d - 1.0)).max(0.0);
            if var <= 1e-12 * mean * mean || var == 0.0 {
                if mean.abs() < 1e-9 {
                    1.0
                } else {
                    0.0
                }
            } else {
                2.0 * (1.0 - t.cdf((mean / (var / d).sqrt()).abs()))
            }
        })
        .fold(1.0, f64::min)
}

#[test]
fn stochastic_quantizers_and_scaled_randomk_are_unbiased() {
    let g: Vec<f32> = gaussian(48, 8).iter().map(|x| x * 0.3).collect();
    // Bonferroni over the projections at a family-wise level of 0.5%.
    let alpha = 0.005 / PROJECTIONS as f64;
    for s in ["qsgd:4", "qsgd:256", "terngrad", "natural", "randomk:0.25"] {
        let p = min_p_value(&spec(s), &g, 3000);
        assert!(p > alpha, "{s}: smallest p-value {p}");
    }
    // The test has power: biased compressors fail it.
    for s in ["tbq:0.1", "signsgd", "topk:0.25"] {
        let p = min_p_value(&spec(s), &g, 3000);
        assert!(p < alpha, "{s} looked unbiased: {p}");
    }
}

#[test]
fn error_feedback_loses_no_gradient_mass() {
    let n = 1000;
    for (c, m) in [
        ("topk:0.01", "residual"),
        ("signsgd", "residual"),
        ("qsgd:256", "residual"),
        ("efsignsgd", "efsignsgd:0.1"),
    ] {
        let c = spec(c);
        let m: Memory = m.parse().unwrap();
        let lr = match m {
            Memory::EfSignSgd { lr } => lr,
            _ => 1.0,
        };
        let mut codec = codec_for(&c, 1);
        let mut memory = MemoryState::new(m, n);
        let (mut fed, mut sent) = (vec![0.0f64; n], vec![0.0f64; n]);
        let (mut p, mut payload, mut y) = (Vec::new(), Vec::new(), vec![0.0; n]);
        for step in 0..50 {
            let g = gaussian(n, step);
            memory.compensate(&g, &mut p).unwrap();
            roundtrip(&mut *codec, &p, &mut payload, &mut y).unwrap();
            memory.update(&p, &y).unwrap();
            for i in 0..n {
                fed[i] += f64::from(g[i]) * lr;
                sent[i] += f64::from(y[i]);
            }
        }
        for i in 0..n {
            let kept = f64::from(memory.residual()[i]);
            assert!(
                (sent[i] + kept - fed[i]).abs() < 1e-3,
                "{c}: element {i}: {} + {kept} vs {}",
                sent[i],
                fed[i]
            );
        }
    }
}

#[test]
fn aggregation_through_wire_bytes_equals_the_reference_sum() {
    let (p, n) = (4, 1003);
    let grads: Vec<Vec<f32>> = (0..p).map(|w| gaussian(n, 100 + w as u64)).collect();
    let views: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
    let exact: Vec<f32> = (0..n).map(|i| grads.iter().map(|g| g[i]).sum()).collect();
    // Partial sums are bounded by the sum of magnitudes: the scale of half-type rounding.
    let magnitude: Vec<f64> = (0..n)
        .map(|i| grads.iter().map(|g| f64::from(g[i].abs())).sum())
        .collect();
    for s in every_spec() {
        let c = spec(s);
        // Random-k and PowerSGD need a shared seed; the others get one per worker.
        let seed = |w: usize| if c.shared_seed() { 7 } else { 7 + w as u64 };
        let mut codecs: Vec<Box<dyn Codec>> = (0..p).map(|w| codec_for(&c, seed(w))).collect();
        let mut outs = vec![vec![0.0; n]; p];
        aggregate(&mut codecs, &views, &mut outs).unwrap();
        // Reference: each worker's own decode, summed in f64.
        let mut reference = vec![0.0f64; n];
        for (w, g) in grads.iter().enumerate() {
            let mut y = vec![0.0; n];
            roundtrip(&mut *codec_for(&c, seed(w)), g, &mut Vec::new(), &mut y).unwrap();
            for i in 0..n {
                reference[i] += f64::from(y[i]);
            }
        }
        // Half types round the partial sums in the wire type, as NCCL does.
        let tolerance = match c.summed_as() {
            Some(half @ (Element::F16 | Element::Bf16)) => 4.0 * half.unit_roundoff(),
            _ => 1e-5,
        };
        for out in &outs {
            for i in 0..n {
                let scale = magnitude[i].max(reference[i].abs()).max(1.0);
                assert!(
                    (f64::from(out[i]) - reference[i]).abs() <= tolerance * scale,
                    "{s}: element {i}"
                );
            }
        }
        if c.is_exact() {
            assert_eq!(outs[0], exact);
        }
    }
}

#[test]
fn powersgd_aggregates_low_rank_gradients_exactly() {
    // Every worker's gradient is u_w vᵀ with a common v: the sum has rank 1.
    let (rows, cols, p) = (32usize, 48usize, 4usize);
    let v = gaussian(cols, 1);
    let grads: Vec<Vec<f32>> = (0..p)
        .map(|w| {
            let u = gaussian(rows, 10 + w as u64);
            (0..rows * cols)
                .map(|k| u[k / cols] * v[k % cols])
                .collect()
        })
        .collect();
    let views: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
    let shape: &[u64] = &[rows as u64, cols as u64];
    let c = Compressor::PowerSgd { rank: 1 };
    let mut codecs: Vec<Box<dyn Codec>> =
        (0..p).map(|_| codec_for_shapes(&c, &[shape], 5)).collect();
    let mut outs = vec![vec![0.0; rows * cols]; p];
    let sent = aggregate(&mut codecs, &views, &mut outs).unwrap();
    assert_eq!(sent, c.group_wire_bytes(&[shape]));
    for i in 0..rows * cols {
        let want: f32 = grads.iter().map(|g| g[i]).sum();
        assert!(
            (outs[0][i] - want).abs() < 1e-3 * want.abs().max(1.0),
            "{i}"
        );
    }
}

/// A PowerSGD group without a low-rank matrix (biases, tiny matrices) is lowered to one round;
/// its codec decodes the reduced first round without a second one.
#[test]
fn powersgd_group_without_a_matrix_decodes_after_one_round() {
    let shapes: [&[u64]; 2] = [&[64], &[3, 3]];
    let c = Compressor::PowerSgd { rank: 4 };
    assert_eq!(powersgd_rounds(&powersgd_layout(&shapes, 4)), 1);
    let grads: Vec<Vec<f32>> = (0..3).map(|w| gaussian(73, 30 + w)).collect();
    let mut codecs: Vec<Box<dyn Codec>> =
        (0..3).map(|_| codec_for_shapes(&c, &shapes, 5)).collect();
    let mut payloads = vec![Vec::new(); 3];
    for ((codec, g), out) in codecs.iter_mut().zip(&grads).zip(&mut payloads) {
        codec.encode(g, out).unwrap();
    }
    let mut reduced = payloads[0].clone();
    for other in &payloads[1..] {
        codecs[0].sum_into(&mut reduced, other).unwrap();
    }
    for codec in &mut codecs {
        let mut out = vec![0.0; 73];
        codec.decode_add(&reduced, &mut out).unwrap();
        for (i, &x) in out.iter().enumerate() {
            let want: f32 = grads.iter().map(|g| g[i]).sum();
            assert!((x - want).abs() <= 1e-5 * want.abs().max(1.0), "{i}");
        }
    }
}

#[test]
fn bad_specs_are_rejected_with_the_valid_forms() {
    for s in [
        "topk:0",
        "topk:2",
        "qsgd:0",
        "powersgd:0",
        "fp8",
        "dgc:nan",
        "nope",
    ] {
        let message = s.parse::<Compressor>().unwrap_err().to_string();
        assert!(
            message.contains("valid forms:") && message.contains("topk:RATIO"),
            "{message}"
        );
    }
}

#[test]
fn nan_and_inf_are_reported_with_their_index() {
    let mut g = gaussian(300, 2);
    g[123] = f32::NAN;
    g[200] = f32::INFINITY;
    for s in every_spec() {
        let err = codec_for(&spec(s), 0)
            .encode(&g, &mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("element 123"), "{s}: {err}");
    }
}

#[test]
fn same_seed_same_bytes() {
    let g = gaussian(5000, 1);
    for s in every_spec() {
        let c = spec(s);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        codec_for(&c, 42).encode(&g, &mut a).unwrap();
        codec_for(&c, 42).encode(&g, &mut b).unwrap();
        assert_eq!(a, b, "{s}");
    }
}

/// Least squares split over 4 workers, full-batch SGD: returns the final loss.
fn train(c: &Compressor, memory: Memory, steps: usize) -> f64 {
    let (p, rows, d, lr) = (4usize, 64usize, 16usize, 0.05f32);
    let truth = gaussian(d, 1);
    let data: Vec<(Vec<f32>, Vec<f32>)> = (0..p)
        .map(|w| {
            let a = gaussian(rows * d, 10 + w as u64);
            let noise = gaussian(rows, 20 + w as u64);
            let b = (0..rows)
                .map(|r| (0..d).map(|j| a[r * d + j] * truth[j]).sum::<f32>() + 0.1 * noise[r])
                .collect();
            (a, b)
        })
        .collect();
    let loss = |x: &[f32]| -> f64 {
        let mut total = 0.0f64;
        for (a, b) in &data {
            for r in 0..rows {
                let e = (0..d).map(|j| a[r * d + j] * x[j]).sum::<f32>() - b[r];
                total += f64::from(e * e);
            }
        }
        total / (2 * p * rows) as f64
    };
    let mut x = vec![0.0f32; d];
    let mut codecs: Vec<Box<dyn Codec>> = (0..p).map(|w| codec_for(c, w as u64)).collect();
    let mut memories: Vec<MemoryState> = (0..p).map(|_| MemoryState::new(memory, d)).collect();
    let (mut comp, mut payload, mut mine) = (Vec::new(), Vec::new(), vec![0.0; d]);
    for _ in 0..steps {
        let mut sum = vec![0.0f32; d];
        for w in 0..p {
            let (a, b) = &data[w];
            let mut g = vec![0.0f32; d];
            for r in 0..rows {
                let e = (0..d).map(|j| a[r * d + j] * x[j]).sum::<f32>() - b[r];
                for j in 0..d {
                    g[j] += e * a[r * d + j] / rows as f32;
                }
            }
            memories[w].compensate(&g, &mut comp).unwrap();
            roundtrip(&mut *codecs[w], &comp, &mut payload, &mut mine).unwrap();
            memories[w].update(&comp, &mine).unwrap();
            // Allgather: every worker adds every decoded payload; this worker's is `mine`.
            for j in 0..d {
                sum[j] += mine[j] * memories[w].output_scale();
            }
        }
        for j in 0..d {
            x[j] -= lr * sum[j] / p as f32;
        }
    }
    loss(&x)
}

#[test]
fn error_feedback_variants_converge_like_uncompressed_sgd() {
    let steps = 400;
    let baseline = train(&Compressor::None, Memory::None, steps);
    let dgc = Memory::Dgc {
        momentum: 0.9,
        warmup_epochs: 0,
    };
    // Tolerance: within 5% of the uncompressed loss (which sits at the noise floor, ~0.005).
    let close = |loss: f64| loss <= baseline * 1.05;
    for (c, m) in [
        ("topk:0.125", Memory::Residual),
        ("efsignsgd", Memory::EfSignSgd { lr: 0.05 }),
        ("dgc:0.125", dgc),
    ] {
        let loss = train(&spec(c), m, steps);
        assert!(close(loss), "{c} + {m}: {loss} vs uncompressed {baseline}");
    }
    // Plain signSGD with a constant step keeps oscillating around the optimum.
    let plain = train(&spec("signsgd"), Memory::None, steps);
    assert!(!close(plain), "signsgd {plain} vs {baseline}");
}
