//! Measures this machine into a `cpu` DeviceProfile.
//!
//! It measures the compression cost curves, memory bandwidth and FMA rate.

use crate::compress::{codec_for_shapes, rng::Rng, Codec};
use crate::error::Result;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;
use syncopate_sim::base::data::FORMAT_VERSION;
use syncopate_sim::compress::{catalog, Compressor, Family};
use syncopate_sim::inputs::device::{
    CodecCost, Contention, CostCurve, DeviceKind, DeviceProfile, FreshMemory,
};
use syncopate_sim::inputs::model::{Provenance, Status};

/// What to measure.
#[derive(Clone, Debug)]
pub struct HostProfileOptions {
    /// Name of the device profile written.
    pub name: String,
    /// Tensor sizes (elements) to time each kernel at; the curve is fitted over them.
    pub sizes: Vec<usize>,
    /// Timings per size; the median is kept.
    pub repeats: usize,
    /// Compressor specs to measure, one per device-profile key (default: [`profiled`]).
    pub compressors: Vec<String>,
}

/// The smallest tensor a host profile times, and the largest by default: 4096 to 16 Mi
/// elements reaches past the caches, to the size of a large fused buffer.
pub const SMALLEST_PROFILED: usize = 1 << 12;
/// The largest tensor a host profile times by default, in elements (16 Mi).
pub const DEFAULT_LARGEST_PROFILED: usize = 1 << 24;

/// The sizes a profile times: powers of four from [`SMALLEST_PROFILED`] up to `largest`.
pub fn profiled_sizes(largest: usize) -> Vec<usize> {
    std::iter::successors(Some(SMALLEST_PROFILED), |&n| (n < largest).then_some(n * 4)).collect()
}

impl Default for HostProfileOptions {
    fn default() -> Self {
        HostProfileOptions {
            name: "host-cpu".into(),
            sizes: profiled_sizes(DEFAULT_LARGEST_PROFILED),
            repeats: 5,
            compressors: profiled().into_iter().map(String::from).collect(),
        }
    }
}

/// One representative spec per device-profile key: the compressor catalog's examples.
pub fn profiled() -> Vec<&'static str> {
    catalog().iter().map(|e| e.example).collect()
}

/// The median of `xs` (the mean of the middle two for an even count): timings' robust summary.
/// NaN only for no samples: every caller times at least one repeat.
pub fn median(xs: Vec<f64>) -> f64 {
    syncopate_sim::base::stats::median(&xs).unwrap_or(f64::NAN)
}

/// Least-squares fit of t = floor + slope·n, both clamped at zero (a negative intercept from
/// noise is refitted through the origin).
pub fn fit_curve(points: &[(f64, f64)]) -> CostCurve {
    let k = points.len() as f64;
    let (mn, mt) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (n, t)| (a + n / k, b + t / k));
    let var: f64 = points.iter().map(|(n, _)| (n - mn).powi(2)).sum();
    let cov: f64 = points.iter().map(|(n, t)| (n - mn) * (t - mt)).sum();
    let mut slope = if var > 0.0 { (cov / var).max(0.0) } else { 0.0 };
    let mut floor = mt - slope * mn;
    if floor < 0.0 {
        floor = 0.0;
        let nn: f64 = points.iter().map(|(n, _)| n * n).sum();
        slope = points.iter().map(|(n, t)| n * t).sum::<f64>() / nn;
    }
    CostCurve {
        floor_us: floor * 1e6,
        ns_per_element: slope * 1e9,
        ns_per_kept_element: 0.0,
        fresh_pages: None,
    }
}

/// A compressor's (encode, decode) curves, fitted ([`fit_curve`]) over `sizes` to the seconds
/// that `time` gives for (compressor, elements). A sparsifier's cost grows with what it keeps,
/// so it is timed again at [`second_ratio`] and the change is its cost per kept element
/// ([`split_kept`]), which lets the curve serve every ratio. The third value says so for the
/// curve's provenance (empty for other compressors).
pub fn across_ratios(
    c: &Compressor,
    sizes: &[usize],
    mut time: impl FnMut(&Compressor, usize) -> Result<(f64, f64)>,
) -> Result<(CostCurve, CostCurve, String)> {
    let mut curves = |c: &Compressor| -> Result<(CostCurve, CostCurve)> {
        let (mut enc, mut dec) = (Vec::new(), Vec::new());
        for &n in sizes {
            let (e, d) = time(c, n)?;
            enc.push((n as f64, e));
            dec.push((n as f64, d));
        }
        Ok((fit_curve(&enc), fit_curve(&dec)))
    };
    let (encode, decode) = curves(c)?;
    let Some(ratio) = c.kept_fraction() else {
        return Ok((encode, decode, String::new()));
    };
    let other = second_ratio(ratio);
    let Some(again) = c.with_kept_fraction(other) else {
        return Ok((encode, decode, String::new()));
    };
    let (e2, d2) = curves(&again)?;
    Ok((
        split_kept((ratio, encode), (other, e2)),
        split_kept((ratio, decode), (other, d2)),
        format!(", then at ratio {other} too: the per-element slope's change from ratio {ratio} is the cost per kept element"),
    ))
}

/// The other ratio a sparsifier is timed at: ten times `ratio`, or a tenth of it above 0.1.
pub fn second_ratio(ratio: f64) -> f64 {
    if ratio <= 0.1 {
        ratio * 10.0
    } else {
        ratio / 10.0
    }
}

/// One curve from a sparsifier's curves at two ratios: the per-element slope's change between
/// them is the cost per kept element, the rest the cost per element; the floor is the first's.
/// Both slopes are clamped at zero, as noise may make the change negative.
pub fn split_kept(first: (f64, CostCurve), second: (f64, CostCurve)) -> CostCurve {
    let ((r1, c1), (r2, c2)) = (first, second);
    let kept = ((c2.ns_per_element - c1.ns_per_element) / (r2 - r1)).max(0.0);
    CostCurve {
        floor_us: c1.floor_us,
        ns_per_element: (c1.ns_per_element - kept * r1).max(0.0),
        ns_per_kept_element: kept,
        fresh_pages: None,
    }
}

fn time(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed().as_secs_f64())
}

/// The tensor shapes profiled for `n` elements: PowerSGD's cost depends on the matrix shape,
/// so a square-ish rows × cols matrix for it; a flat buffer (no shapes) for the others.
pub fn profiled_shapes(c: &Compressor, n: usize) -> Vec<Vec<u64>> {
    match c.family() {
        Family::PowerSgd => {
            let rows = 1u64 << (n.trailing_zeros() / 2);
            vec![vec![rows, n as u64 / rows]]
        }
        _ => Vec::new(),
    }
}

/// The codec profiled for `n` elements, on [`profiled_shapes`].
pub fn make_codec(c: &Compressor, n: usize) -> Box<dyn Codec> {
    let shapes = profiled_shapes(c, n);
    let shapes: Vec<&[u64]> = shapes.iter().map(Vec::as_slice).collect();
    codec_for_shapes(c, &shapes, 1)
}

/// Median encode and decode seconds at one size. Encode covers every round a worker computes
/// (PowerSGD's P and Q); decode is one `decode_add` of one payload.
fn measure(c: &Compressor, grad: &[f32], repeats: usize) -> Result<(f64, f64)> {
    let mut codec = make_codec(c, grad.len());
    let mut payload = Vec::new();
    let mut next = Vec::new();
    let mut acc = vec![0.0f32; grad.len()];
    let (mut enc, mut dec) = (Vec::new(), Vec::new());
    // One untimed warm-up step faults the buffers in.
    for rep in 0..=repeats {
        let e = time(|| {
            codec.encode(grad, &mut payload)?;
            for _ in 1..c.allreduce_rounds() {
                codec.next_round(&payload, &mut next)?;
                std::mem::swap(&mut payload, &mut next);
            }
            Ok(())
        })?;
        let d = time(|| codec.decode_add(black_box(&payload), &mut acc))?;
        if rep > 0 {
            enc.push(e);
            dec.push(d);
        }
    }
    Ok((median(enc), median(dec)))
}

/// glibc's largest dynamic mmap threshold on 64-bit systems (mallopt(3),
/// DEFAULT_MMAP_THRESHOLD_MAX: 4 × 1024 × 1024 × sizeof(long)): an allocation at least this
/// large is mapped anew every time, a smaller one reuses memory freed before.
const GLIBC_MMAP_THRESHOLD_MAX: u64 = 32 << 20;

/// The bytes [`fresh_memory`] allocates: one size on each side of glibc's threshold.
const FRESH_PROBES: [u64; 2] = [16 << 20, 64 << 20];

/// What writing freshly allocated memory costs beyond writing memory in use, per byte: the
/// medians of nine allocate-write-free rounds and nine writes into a kept buffer, interleaved,
/// their difference (at least zero), at 64 MiB. Timed at 16 MiB too: where that costs less
/// than half as much per byte, smaller allocations reuse memory (glibc's threshold, 32 MiB),
/// else allocations from 16 MiB are taken as fresh (nothing smaller was timed).
pub fn fresh_memory() -> FreshMemory {
    let [(small, small_ms), (large, large_ms)] = FRESH_PROBES.map(fresh_extra_ns_per_byte);
    let from_bytes = match small < large / 2.0 {
        true => GLIBC_MMAP_THRESHOLD_MAX,
        false => FRESH_PROBES[0],
    };
    FreshMemory {
        ns_per_byte: large,
        from_bytes,
        provenance: provenance(
            Status::Measured,
            format!("measured by syncopate-exec profile_host: writing 64 MiB into a new allocation and freeing it, against the same write into a buffer in use, medians of 9 interleaved rounds ({:.2} and {:.2} ms), the difference per byte; at 16 MiB {small:.3} ns per byte ({:.2} and {:.2} ms), so from {from_bytes} B", large_ms.0, large_ms.1, small_ms.0, small_ms.1),
        ),
    }
}

/// The extra ns per byte of writing `bytes` of fresh memory, and the medians (fresh, kept)
/// in ms.
fn fresh_extra_ns_per_byte(bytes: u64) -> (f64, (f64, f64)) {
    let n = (bytes / 4) as usize;
    let mut kept = vec![0.0f32; n];
    kept.fill(1.0);
    let (mut fresh_s, mut kept_s) = (Vec::new(), Vec::new());
    for round in 0..9 {
        let value = black_box(round as f32);
        let start = Instant::now();
        let mut fresh: Vec<f32> = Vec::with_capacity(n);
        fresh.resize(n, value);
        black_box(&fresh);
        drop(fresh);
        fresh_s.push(start.elapsed().as_secs_f64());
        let start = Instant::now();
        kept.fill(value);
        black_box(&kept);
        kept_s.push(start.elapsed().as_secs_f64());
    }
    let (fresh, kept) = (median(fresh_s), median(kept_s));
    let extra = ((fresh - kept) / bytes as f64 * 1e9).max(0.0);
    (extra, (fresh * 1e3, kept * 1e3))
}

/// Copy bandwidth (bytes read + written per second) of a 64 MiB buffer, best of five.
pub fn memcpy_gbytes_per_s() -> f64 {
    let n = 16 << 20;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let best = (0..5)
        .map(|_| {
            let start = Instant::now();
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    (2 * 4 * n) as f64 / best / 1e9
}

/// fp32 multiply-add rate of one core over 64 independent accumulators (vectorizable, no
/// dependency stalls), in TFLOP/s.
pub fn fma_tflops_one_core() -> f64 {
    let mut acc = [1.0f32; 64];
    let (a, b) = (black_box(0.999_999f32), black_box(1e-7f32));
    let iterations = 2_000_000;
    let start = Instant::now();
    for _ in 0..iterations {
        for x in acc.iter_mut() {
            *x = *x * a + b;
        }
    }
    black_box(&acc);
    (2 * 64 * iterations) as f64 / start.elapsed().as_secs_f64() / 1e12
}

/// A profile's provenance: how sure and how it was measured.
pub(crate) fn provenance(status: Status, method: impl Into<String>) -> Provenance {
    Provenance {
        status,
        method: method.into(),
    }
}

/// A codec's measured encode and decode curves, as `method` measured them.
pub(crate) fn measured_codec(encode: CostCurve, decode: CostCurve, method: String) -> CodecCost {
    CodecCost {
        encode,
        decode,
        // Measured kernels only: the executors' passes around them are priced apart.
        includes_passes: false,
        // Its kernels decode each payload into the result: no per-call pass.
        aggregate: Default::default(),
        provenance: provenance(Status::Measured, method),
    }
}

/// Measures every compressor of `options.compressors` on this machine, one core, and returns a `cpu`
/// profile. Data: standard normal values from a fixed seed.
pub fn profile_host(options: &HostProfileOptions) -> Result<DeviceProfile> {
    let largest = options.sizes.iter().copied().max().unwrap_or(0);
    let mut rng = Rng::new(42);
    let data: Vec<f32> = (0..largest).map(|_| rng.normal() as f32).collect();
    let repeats = options.repeats.max(1);
    let mut compression = BTreeMap::new();
    for spec in &options.compressors {
        let c: Compressor = spec.parse()?;
        let (encode, decode, kept) =
            across_ratios(&c, &options.sizes, |c, n| measure(c, &data[..n], repeats))?;
        let method = format!(
            "measured by syncopate-exec profile_host: {spec} on one core, median of {repeats} runs at {:?} elements, least-squares floor + per-element fit{kept}",
            options.sizes
        );
        compression.insert(c.key().to_string(), measured_codec(encode, decode, method));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fp32 = fma_tflops_one_core() * cores as f64;
    Ok(DeviceProfile {
        format_version: FORMAT_VERSION,
        name: options.name.clone(),
        kind: DeviceKind::Cpu,
        model: format!("host CPU, {cores} hardware threads"),
        source: "syncopate-exec profile_host on this machine".into(),
        memory_bandwidth_gbytes_per_s: memcpy_gbytes_per_s(),
        // A CPU rank's memory is the host's, shared with everything else on it.
        memory_gib: None,
        peak_fp32_tflops: fp32,
        // CPUs have no faster half-precision arithmetic path in this code: same as fp32.
        peak_fp16_tflops: fp32,
        peak_tf32_tflops: None,
        peak_fp8_tflops: None,
        sm_count: None,
        // V100 fp32 peak is 15.7 TFLOP/s; training speed is assumed proportional to it.
        compute_speed_vs_v100: fp32 / 15.7,
        compute_speed_provenance: provenance(
            Status::Estimated,
            format!("measured one-core multiply-add rate × {cores} threads, divided by V100's 15.7 TFLOP/s fp32 peak"),
        ),
        achieved_fraction_of_peak: None,
        fresh_memory: Some(fresh_memory()),
        compression,
        contention: Contention {
            compute_slowdown_with_collective: None,
            compute_slowdown_with_compression: 1.0,
            provenance: provenance(
                Status::Estimated,
                "not measured: assumes compression and communication run on cores that backward compute does not use",
            ),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_line() {
        let pts: Vec<(f64, f64)> = [1e3, 1e4, 1e5]
            .iter()
            .map(|&n| (n, 5e-6 + 2e-9 * n))
            .collect();
        let c = fit_curve(&pts);
        assert!((c.floor_us - 5.0).abs() < 1e-6 && (c.ns_per_element - 2.0).abs() < 1e-9);
        let through_origin = fit_curve(&[(1e3, 0.0), (2e3, 3e-6), (3e3, 3e-6)]);
        assert!(through_origin.floor_us == 0.0 && through_origin.ns_per_element > 0.0);
    }

    #[test]
    fn a_sparsifier_curve_splits_into_per_element_and_per_kept_costs() {
        // 2 ns per element and 30 per kept one: 2.3 ns per element at 1 %, 5 at 10 %.
        let at = |slope: f64| CostCurve {
            floor_us: 4.0,
            ns_per_element: slope,
            ns_per_kept_element: 0.0,
            fresh_pages: None,
        };
        let c = split_kept((0.01, at(2.3)), (second_ratio(0.01), at(5.0)));
        assert!((c.ns_per_element - 2.0).abs() < 1e-9, "{c:?}");
        assert!((c.ns_per_kept_element - 30.0).abs() < 1e-9, "{c:?}");
        assert_eq!(c.floor_us, 4.0);
        // At the first ratio the split curve is the measured one.
        assert!((c.keeping(0.01).ns_per_element - 2.3).abs() < 1e-9);
        // Noise that makes the larger ratio cheaper leaves no per-kept cost.
        let flat = split_kept((0.5, at(3.0)), (second_ratio(0.5), at(3.1)));
        assert_eq!(flat.ns_per_kept_element, 0.0);
        assert_eq!(flat.ns_per_element, 3.0);
    }

    #[test]
    fn tiny_profile_is_valid() {
        // Three repeats (their median): with one, a single preemption on a loaded machine
        // makes the sparsifiers' per-kept cost, a difference of two small timings over a few
        // kept elements, absurd (42 µs per element seen while a build ran beside the tests).
        let options = HostProfileOptions {
            name: "test".into(),
            sizes: vec![256, 1024],
            repeats: 3,
            ..HostProfileOptions::default()
        };
        let profile = profile_host(&options).unwrap();
        profile.validate("test").unwrap();
        assert_eq!(profile.compression.len(), catalog().len());
        let fresh = profile.fresh_memory.as_ref().unwrap();
        assert!(fresh.ns_per_byte >= 0.0 && fresh.provenance.method.contains("64 MiB"));
        let c: Compressor = "topk:0.01".parse().unwrap();
        assert!(!syncopate_sim::codec::CodecCurves::on(&c, &profile).fallback);
        // Only the sparsifiers were timed at a second ratio.
        for (key, cost) in &profile.compression {
            let kept = [cost.encode, cost.decode]
                .iter()
                .any(|c| c.ns_per_kept_element > 0.0);
            let sparsifier = syncopate_sim::compress::sparsifier_keys().contains(&key.as_str());
            assert!(!kept || sparsifier, "{key}");
            assert_eq!(
                cost.provenance.method.contains("cost per kept element"),
                sparsifier,
                "{key}"
            );
        }
    }
}
