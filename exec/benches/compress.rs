//! Criterion benchmarks of every compression kernel on one core, against memcpy.
//!
//! Throughput is in bytes of fp32 input.
//!
//! `cargo bench -p syncopate-exec --bench compress`; filter with e.g. `-- encode/fp16`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::{Duration, Instant};
use syncopate_exec::compress::rng::Rng;
use syncopate_exec::measure::profile_host::{make_codec, profiled};
use syncopate_sim::compress::Compressor;

const ENCODE_SIZES: [u32; 6] = [10, 14, 18, 22, 24, 26];
const DECODE_SIZES: [u32; 2] = [16, 24];

fn data(n: usize) -> Vec<f32> {
    let mut rng = Rng::new(7);
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// Large sizes take long per iteration: fewer samples keep the whole run to minutes.
fn tune(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, log2: u32) {
    if log2 >= 22 {
        group
            .sample_size(10)
            .measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_millis(300));
    } else {
        group
            .sample_size(30)
            .measurement_time(Duration::from_secs(1))
            .warm_up_time(Duration::from_millis(200));
    }
}

fn encode(crit: &mut Criterion) {
    let largest = data(1 << ENCODE_SIZES[ENCODE_SIZES.len() - 1]);
    let mut group = crit.benchmark_group("encode");
    for &log2 in &ENCODE_SIZES {
        let n = 1usize << log2;
        let grad = &largest[..n];
        tune(&mut group, log2);
        group.throughput(Throughput::Bytes(4 * n as u64));
        let mut dst = vec![0.0f32; n];
        group.bench_function(BenchmarkId::new("memcpy", n), |b| {
            b.iter(|| dst.copy_from_slice(black_box(grad)))
        });
        for spec in profiled() {
            let c: Compressor = spec.parse().expect("profiled specs parse");
            let mut codec = make_codec(&c, n);
            let mut payload = Vec::new();
            let mut next = Vec::new();
            group.bench_function(BenchmarkId::new(c.key(), n), |b| {
                b.iter(|| {
                    codec
                        .encode(black_box(grad), &mut payload)
                        .expect("finite data");
                    for _ in 1..c.allreduce_rounds() {
                        codec.next_round(&payload, &mut next).expect("round");
                    }
                })
            });
        }
    }
    group.finish();
}

fn decode(crit: &mut Criterion) {
    let mut group = crit.benchmark_group("decode");
    for &log2 in &DECODE_SIZES {
        let n = 1usize << log2;
        let grad = data(n);
        tune(&mut group, log2);
        group.throughput(Throughput::Bytes(4 * n as u64));
        for spec in profiled() {
            let c: Compressor = spec.parse().expect("profiled specs parse");
            let mut codec = make_codec(&c, n);
            let mut payload = Vec::new();
            let mut next = Vec::new();
            let mut acc = vec![0.0f32; n];
            group.bench_function(BenchmarkId::new(c.key(), n), |b| {
                // PowerSGD decodes once per step, so every iteration re-runs the rounds
                // outside the timed region.
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        codec.encode(&grad, &mut payload).expect("finite data");
                        for _ in 1..c.allreduce_rounds() {
                            codec.next_round(&payload, &mut next).expect("round");
                            std::mem::swap(&mut payload, &mut next);
                        }
                        let start = Instant::now();
                        codec
                            .decode_add(black_box(&payload), &mut acc)
                            .expect("own payload");
                        total += start.elapsed();
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, encode, decode);
criterion_main!(benches);
