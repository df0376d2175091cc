//! Times the host backend's channel collectives and fits them into an MPI-style α/β/γ cluster.
//!
//! The simulator can then predict host runs.
//!
//! A ring allgather of S bytes over p ranks costs (p−1)·α + (p−1)/p·S·β and a ring allreduce
//! 2(p−1)·α + 2(p−1)/p·S·β + (p−1)/p·S·γ (Thakur, Rabenseifner & Gropp 2005), which is linear
//! in (α, β, γ): both are measured at several sizes and fitted by least squares on relative
//! errors. The cluster then has p one-rank "nodes" joined by a "NIC" with β's bandwidth.

use crate::compress::codec_for;
use crate::error::{ExecError, Result};
use crate::measure::profile_host::median;
use crate::runtime::host::comm::meshes;
use crate::runtime::ring::{self, Ring};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use syncopate_sim::base::data::FORMAT_VERSION;
use syncopate_sim::compress::Compressor;
use syncopate_sim::inputs::model::{Provenance, Status};
use syncopate_sim::inputs::topology::{
    Cluster, Fabric, InterNode, IntraNode, Library, TcpParams, Transport,
};

/// One timed collective: ranks, total bytes (S above), median seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CollectivePoint {
    /// Whether the collective was an allreduce (else an allgather).
    pub allreduce: bool,
    /// Total bytes of the collective (S in the cost formulas).
    pub bytes: u64,
    /// Median time over the repeats, in seconds.
    pub secs: f64,
}

/// Median time of `repeats` allreduces and allgathers of each size in `sizes` (bytes) on
/// `ranks` thread-ranks.
pub fn measure(ranks: u32, sizes: &[u64], repeats: usize) -> Result<Vec<CollectivePoint>> {
    let mut points = Vec::new();
    for &bytes in sizes {
        for allreduce in [true, false] {
            let mut times = Vec::with_capacity(repeats);
            for _ in 0..repeats.max(1) + 1 {
                times.push(time_once(ranks, bytes, allreduce)?);
            }
            // The first run pays thread and buffer start-up: drop it.
            times.remove(0);
            points.push(CollectivePoint {
                allreduce,
                bytes,
                secs: median(times),
            });
        }
    }
    Ok(points)
}

/// The slowest rank's time of one collective, all ranks started together.
fn time_once(ranks: u32, bytes: u64, allreduce: bool) -> Result<f64> {
    let abort = AtomicBool::new(false);
    let ends = meshes(1, ranks, Duration::from_secs(30))
        .pop()
        .expect("one stream");
    let barrier = std::sync::Barrier::new(ranks as usize);
    let results: Vec<Result<f64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ends
            .into_iter()
            .map(|mesh| {
                let (abort, barrier) = (&abort, &barrier);
                scope.spawn(move || -> Result<f64> {
                    let codec = codec_for(&Compressor::None, 0);
                    let mut payload = vec![1u8; bytes as usize / 4 * 4];
                    let block = vec![1u8; (bytes / u64::from(ranks)) as usize];
                    barrier.wait();
                    let start = Instant::now();
                    if allreduce {
                        let ring = Ring::world(mesh.rank as usize, ranks as usize);
                        ring::allreduce(&mesh, &ring, &mut payload, 4, &*codec, abort)?;
                    } else {
                        mesh.allgather(block, abort)?;
                    }
                    Ok(start.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a profiling rank"))
            .collect()
    });
    let mut slowest: f64 = 0.0;
    for r in results {
        slowest = slowest.max(r?);
    }
    Ok(slowest)
}

/// Least-squares (α, β, γ) in seconds, seconds per byte, seconds per byte, each at least 0.
pub fn fit(ranks: u32, points: &[CollectivePoint]) -> Result<(f64, f64, f64)> {
    let p = f64::from(ranks);
    let frac = (p - 1.0) / p;
    // Rows of the linear model, each divided by its measurement so that small and large
    // sizes weigh alike.
    let rows: Vec<([f64; 3], f64)> = points
        .iter()
        .filter(|pt| pt.secs > 0.0)
        .map(|pt| {
            let s = pt.bytes as f64;
            let x = if pt.allreduce {
                [2.0 * (p - 1.0), 2.0 * frac * s, frac * s]
            } else {
                [p - 1.0, frac * s, 0.0]
            };
            ([x[0] / pt.secs, x[1] / pt.secs, x[2] / pt.secs], 1.0)
        })
        .collect();
    let mut a = [[0.0f64; 3]; 3];
    let mut b = [0.0f64; 3];
    for (x, y) in &rows {
        for i in 0..3 {
            for j in 0..3 {
                a[i][j] += x[i] * x[j];
            }
            b[i] += x[i] * y;
        }
    }
    let solution = solve3(a, b).ok_or_else(|| ExecError::Protocol {
        compressor: "host collective fit".into(),
        message: "the measurements do not determine α, β and γ (too few sizes?)".into(),
    })?;
    Ok((
        solution[0].max(0.0),
        solution[1].max(1e-15),
        solution[2].max(1e-15),
    ))
}

/// Gaussian elimination with partial pivoting.
fn solve3(mut a: [[f64; 3]; 3], mut b: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..3 {
            let f = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (x, p) in a[row].iter_mut().zip(pivot_row).skip(col) {
                *x -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; 3];
    for row in (0..3).rev() {
        let rest: f64 = (row + 1..3).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - rest) / a[row][row];
    }
    Some(x)
}

/// A cluster of `ranks` one-rank nodes whose MPI parameters are the fitted (α, β, γ), with
/// `device` (a path or name of the host's `cpu` device profile) as its device.
pub fn cluster(
    name: &str,
    device: &str,
    ranks: u32,
    fitted: (f64, f64, f64),
    memory_gbytes_per_s: f64,
) -> Cluster {
    let (alpha, beta, gamma) = fitted;
    let method = format!(
        "fitted by syncopate profile --backend host: ring allreduce and allgather over in-process channels on {ranks} thread-ranks; α = {:.2} µs, β = {:.3} ns/B, γ = {:.3} ns/B",
        alpha * 1e6,
        beta * 1e9,
        gamma * 1e9
    );
    Cluster {
        format_version: FORMAT_VERSION,
        name: name.to_string(),
        description: format!("this host as {ranks} thread-ranks joined by in-process channels (syncopate's host backend)"),
        source: method.clone(),
        device: device.to_string(),
        nodes: ranks,
        gpus_per_node: 1,
        contention: None,
        intra_node: IntraNode {
            fabric: Fabric::Pcie,
            bandwidth_gbytes_per_s: memory_gbytes_per_s,
            latency_us: alpha * 1e6,
            nvls: false,
            mesh: None,
        },
        // The channels play the network: one "NIC" per rank at β's bandwidth, latency in α.
        inter_node: InterNode {
            transport: Transport::Tcp,
            nics_per_node: 1,
            nic_bandwidth_gbps: 8.0 / beta / 1e9,
            latency_us: 0.0,
        },
        library: Library::Mpi(TcpParams::base_costs(
            1.0,
            alpha * 1e6,
            1.0 / gamma / 1e9,
            Provenance {
                status: Status::Measured,
                method,
            },
        )),
        device_memory_gbytes_per_s: memory_gbytes_per_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_synthetic_ring() {
        let (alpha, beta, gamma) = (20e-6, 0.5e-9, 0.25e-9);
        let p = 4.0;
        let points: Vec<CollectivePoint> = [1u64 << 12, 1 << 16, 1 << 20]
            .iter()
            .flat_map(|&bytes| {
                let s = bytes as f64;
                [
                    CollectivePoint {
                        allreduce: true,
                        bytes,
                        secs: 2.0 * (p - 1.0) * alpha + 1.5 * s * beta + 0.75 * s * gamma,
                    },
                    CollectivePoint {
                        allreduce: false,
                        bytes,
                        secs: (p - 1.0) * alpha + 0.75 * s * beta,
                    },
                ]
            })
            .collect();
        let (a, b, g) = fit(4, &points).unwrap();
        assert!(
            (a / alpha - 1.0).abs() < 1e-6
                && (b / beta - 1.0).abs() < 1e-6
                && (g / gamma - 1.0).abs() < 1e-6
        );
    }
}
