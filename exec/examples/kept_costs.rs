//! Measured against predicted codec times of the sparsifiers across ratios.
//!
//! It sets the two-ratio curves of `profile_host` against one ratio's.
//!
//! `cargo run --release -p syncopate-exec --example kept_costs`: profiles topk, dgc and randomk on
//! one core (at the catalog ratio and ten times it), then times each at ratios 0.001 to 0.5 on
//! 2^22 elements (median of 7 after a warm-up) and prints what the profile predicts, and what the
//! curve at the catalog ratio alone would.

use std::time::Instant;
use syncopate_exec::compress::rng::Rng;
use syncopate_exec::measure::profile_host::{make_codec, median, profile_host, HostProfileOptions};
use syncopate_sim::base::time::SimTime;
use syncopate_sim::codec::CodecCurves;
use syncopate_sim::compress::Compressor;
use syncopate_sim::inputs::device::CostCurve;

const ELEMENTS: usize = 1 << 22;
const REPEATS: usize = 7;

fn ms(time: SimTime) -> f64 {
    time.as_ns() as f64 / 1e6
}

/// A curve measured at one ratio alone, which prices every ratio as that one.
fn one_ratio(curve: CostCurve, ratio: f64) -> SimTime {
    curve.keeping(ratio).time(ELEMENTS as u64, 0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sparsifiers = ["topk:0.01", "dgc:0.01", "randomk:0.01"];
    let profile = profile_host(&HostProfileOptions {
        name: "kept-costs".into(),
        sizes: (7..=11).map(|k| 1usize << (2 * k)).collect(),
        repeats: REPEATS,
        compressors: sparsifiers.iter().map(|s| s.to_string()).collect(),
    })?;
    let mut rng = Rng::new(7);
    let grad: Vec<f32> = (0..ELEMENTS).map(|_| rng.normal() as f32).collect();
    println!("compressor | encode ms: measured, predicted, one ratio | decode ms: measured, predicted, one ratio");
    for spec in sparsifiers {
        let base: Compressor = spec.parse()?;
        let catalog_ratio = base.kept_fraction().unwrap_or(0.0);
        let cost = &profile.compression[base.key()];
        for ratio in [0.001, 0.01, 0.03, 0.1, 0.25, 0.5] {
            let c: Compressor = format!("{}:{ratio}", base.key()).parse()?;
            let mut codec = make_codec(&c, ELEMENTS);
            let (mut payload, mut sum) = (Vec::new(), vec![0.0f32; ELEMENTS]);
            let (mut encode, mut decode) = (Vec::new(), Vec::new());
            for repeat in 0..=REPEATS {
                let start = Instant::now();
                codec.encode(&grad, &mut payload)?;
                let e = start.elapsed().as_secs_f64() * 1e3;
                let start = Instant::now();
                codec.decode_add(&payload, &mut sum)?;
                let d = start.elapsed().as_secs_f64() * 1e3;
                // The first repeat faults the buffers in.
                if repeat > 0 {
                    encode.push(e);
                    decode.push(d);
                }
            }
            let predicted = CodecCurves::on(&c, &profile);
            println!(
                "{c} | {:.2}, {:.2}, {:.2} | {:.2}, {:.2}, {:.2}",
                median(encode),
                ms(predicted.encode_time(ELEMENTS as u64)),
                ms(one_ratio(cost.encode, catalog_ratio)),
                median(decode),
                ms(predicted.decode_time(ELEMENTS as u64)),
                ms(one_ratio(cost.decode, catalog_ratio)),
            );
        }
    }
    Ok(())
}
