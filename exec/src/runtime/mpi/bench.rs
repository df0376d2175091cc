//! The fp32 allreduce micro-benchmark over the MPI transport that `lab up` sweeps: per size, a warm-up and then timed repeats, each started together after a barrier; the median and spread as rank 0 saw them.

use super::world::World;
use crate::compress::codec_for;
use crate::error::Result;
use crate::lab::measure::{AllreducePoint, Spread};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use syncopate_sim::compress::Compressor;
use syncopate_sim::SimError;

/// The largest size the sweep accepts (per rank): 1 GiB.
pub const MAX_BYTES: u64 = 1 << 30;

/// The most repeats per size.
pub const MAX_REPEATS: usize = 1000;

/// Checks the sweep's arguments, naming the flag at fault.
pub fn check(sizes: &[u64], repeats: usize, timeout: Duration) -> Result<()> {
    if let Some(&bad) = sizes.iter().find(|&&s| !(4..=MAX_BYTES).contains(&s)) {
        return Err(SimError::bad_value(
            "--sizes",
            bad,
            format!("each size is 4 to {MAX_BYTES} bytes"),
        )
        .into());
    }
    if sizes.is_empty() {
        return Err(SimError::bad_value("--sizes", "(none)", "give at least one size").into());
    }
    if repeats == 0 || repeats > MAX_REPEATS {
        return Err(
            SimError::bad_value("--repeats", repeats, format!("from 1 to {MAX_REPEATS}")).into(),
        );
    }
    if timeout.is_zero() {
        return Err(SimError::bad_value("--timeout-s", 0, "operations need time").into());
    }
    Ok(())
}

/// Times fp32 allreduces of every size (rounded down to whole floats) over all ranks of this
/// MPI job. Rank 0 returns the sweep; the other ranks return an empty one.
pub fn allreduce_sweep(
    world: &World,
    sizes: &[u64],
    repeats: usize,
    timeout: Duration,
) -> Result<Vec<AllreducePoint>> {
    check(sizes, repeats, timeout)?;
    let streams = world.streams(1, timeout)?;
    let stream = &streams[0];
    let abort = AtomicBool::new(false);
    let codec = codec_for(&Compressor::None, 0);
    let n = f64::from(world.size);
    let mut points = Vec::new();
    for &size in sizes {
        let elements = (size / 4) as usize;
        let values: Vec<u8> = (0..elements)
            .flat_map(|i| ((i % 251) as f32 + world.rank as f32).to_le_bytes())
            .collect();
        let mut times = Vec::with_capacity(repeats);
        // One untimed run first: connection set-up and buffer first touch.
        for timed in std::iter::once(false).chain(std::iter::repeat_n(true, repeats)) {
            let mut payload = values.clone();
            stream.barrier(&abort)?;
            let start = Instant::now();
            stream.allreduce(&mut payload, 4, &*codec, &abort)?;
            if timed {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        let seconds = Spread::of(&times);
        let bytes = elements as u64 * 4;
        points.push(AllreducePoint {
            bytes,
            seconds,
            busbw_gbps: 2.0 * (n - 1.0) / n * bytes as f64 * 8.0 / seconds.median / 1e9,
        });
    }
    drop(streams);
    Ok(if world.rank == 0 { points } else { Vec::new() })
}
