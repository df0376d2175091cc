//! Reproduces compute tasks of a given duration on the GPU with a tiled FMA GEMM.
//!
//! The GEMM is calibrated with CUDA events at start-up, then sized per task.
//!
//! Method: at start-up every size of [`SIZES`] is launched on the compute stream and timed
//! with CUDA events (median of a few runs after a warm-up). A task of duration d is then
//! issued as r launches of the largest size whose time t_big ≤ d (r = ⌊d / t_big⌋) followed
//! by one launch of the largest size whose time fits the remainder, when the remainder is at
//! least half the smallest size's time. Tasks shorter than half the smallest launch (a few
//! µs) issue nothing and are recorded at their real (near-zero) duration. Unlike a sleep, the
//! GEMM occupies SMs and memory bandwidth, so NCCL and compression kernels on other streams
//! contend with it as they would with backward compute.

use super::kernels::{cuda_err, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;

/// Matrix orders calibrated, from a few µs to tens of ms on current GPUs.
pub const SIZES: &[u32] = &[
    32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
];
const RUNS: usize = 5;

/// Time per launch of each calibrated size, and the matrices the launches use.
pub struct Gemm {
    /// (order, ns per launch), increasing in both.
    pub points: Vec<(u32, u64)>,
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    c: CudaSlice<f32>,
}

impl Gemm {
    /// Allocates the operands (the largest size) and measures every size on `stream`.
    pub fn calibrate(k: &Kernels, stream: &Arc<CudaStream>) -> Result<Gemm> {
        let largest = *SIZES.last().expect("sizes") as usize;
        let alloc = cuda_err("cannot allocate the GEMM operands");
        // Small non-zero values keep the FMAs on ordinary (non-subnormal) numbers.
        let ones = vec![1e-3f32; largest * largest];
        let mut gemm = Gemm {
            points: Vec::new(),
            a: stream.clone_htod(&ones).map_err(&alloc)?,
            b: stream.clone_htod(&ones).map_err(&alloc)?,
            c: stream.alloc_zeros(largest * largest).map_err(&alloc)?,
        };
        for &n in SIZES {
            gemm.launch(k, stream, n)?;
            let mut times = Vec::with_capacity(RUNS);
            for _ in 0..RUNS {
                times.push(gemm.time(k, stream, n, 1)?);
            }
            times.sort_unstable();
            gemm.points.push((n, times[RUNS / 2]));
        }
        // Keep the times increasing: a size no slower than a smaller one adds nothing.
        let mut last = 0;
        gemm.points.retain(|&(_, t)| {
            let keep = t > last;
            last = last.max(t);
            keep
        });
        Ok(gemm)
    }

    /// Enqueues one n × n GEMM on `stream`; the operands hold the largest calibrated order
    /// squared.
    pub fn launch(&mut self, k: &Kernels, stream: &Arc<CudaStream>, n: u32) -> Result<()> {
        k.gemm(stream, &self.a, &self.b, &mut self.c, n)
    }

    /// Nanoseconds of `reps` back-to-back launches of order n, timed with CUDA events.
    pub fn time(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        n: u32,
        reps: u32,
    ) -> Result<u64> {
        let event = cuda_err("GEMM timing event failed");
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = stream.record_event(flags).map_err(&event)?;
        for _ in 0..reps {
            self.launch(k, stream, n)?;
        }
        let end = stream.record_event(flags).map_err(&event)?;
        let ms = start.elapsed_ms(&end).map_err(&event)?;
        Ok((f64::from(ms) * 1e6) as u64)
    }

    /// Enqueues the launches of [`plan`] for `ns` of compute.
    pub fn run_for(&mut self, k: &Kernels, stream: &Arc<CudaStream>, ns: u64) -> Result<()> {
        for (n, reps) in plan(&self.points, ns) {
            for _ in 0..reps {
                self.launch(k, stream, n)?;
            }
        }
        Ok(())
    }
}

/// The launches that reproduce `ns` of compute from calibrated (order, ns) points: (order,
/// repetitions), largest first.
pub fn plan(points: &[(u32, u64)], ns: u64) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    let Some(&(first, smallest)) = points.first() else {
        return out;
    };
    let fits = |budget: u64| points.iter().rev().find(|&&(_, t)| t <= budget).copied();
    match fits(ns) {
        Some((n, t)) => {
            let reps = ns / t;
            out.push((n, reps));
            let rest = ns - reps * t;
            if rest * 2 >= smallest {
                out.push((fits(rest).map_or(first, |(m, _)| m), 1));
            }
        }
        None if ns * 2 >= smallest => out.push((first, 1)),
        None => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_fill_the_duration_from_the_largest_size_down() {
        let points = [(32, 4_000), (64, 10_000), (128, 50_000)];
        assert_eq!(plan(&points, 120_000), vec![(128, 2), (64, 1)]);
        assert_eq!(plan(&points, 103_000), vec![(128, 2), (32, 1)]);
        assert_eq!(plan(&points, 101_000), vec![(128, 2)]);
        assert_eq!(plan(&points, 3_000), vec![(32, 1)]);
        assert_eq!(plan(&points, 1_000), vec![]);
        assert_eq!(plan(&[], 1_000), vec![]);
    }
}
