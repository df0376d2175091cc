//! What `simulate` prints: the predicted steady-state iteration and its Monte Carlo statistics.
//!
//! Its own module, below `simulate` (which fills it) and `trace` (which embeds it), so that the
//! two need not import each other.

use crate::predict::memory::MemoryUse;
use serde::Serialize;

/// Monte Carlo statistics over the measured iterations.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Statistics {
    /// Mean iteration time, ms.
    pub mean_ms: f64,
    /// Sample standard deviation of the iteration times, ms.
    pub std_dev_ms: f64,
    /// Median iteration time, ms.
    pub p50_ms: f64,
    /// 99th-percentile iteration time, ms.
    pub p99_ms: f64,
    /// Lower end of the mean's 95 % confidence interval (Student's t), ms.
    pub ci95_low_ms: f64,
    /// Upper end of the mean's 95 % confidence interval (Student's t), ms.
    pub ci95_high_ms: f64,
}

/// The predicted steady-state iteration, as printed by `simulate --format json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// The model's name.
    pub model: String,
    /// The cluster's name.
    pub cluster: String,
    /// The strategy that produced the plan.
    pub strategy: String,
    /// The framework whose per-call costs were added (`crate::inputs::framework`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    /// The codec set whose implementations priced the codecs (`crate::codec::CodecSet`), if
    /// any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub codecs: Option<String>,
    /// Ranks in the cluster.
    pub world_size: u32,
    /// `symmetric` (one rank stands for all) or `explicit` (every rank simulated).
    pub path: &'static str,
    /// The model profile's measured skew between ranks, which made the path explicit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank_skew_cv: Option<f64>,
    /// Mean time of the measured iterations, ms.
    pub iteration_time_ms: f64,
    /// Samples per second over all ranks: world size × batch per GPU / iteration time.
    pub throughput_samples_per_s: f64,
    /// Throughput per GPU relative to the same model on one GPU of this cluster.
    pub scaling_efficiency: f64,
    /// Iteration time of the model on one GPU of this cluster, ms.
    pub single_gpu_iteration_time_ms: f64,
    /// Busy time of a rank's compute stream per iteration (forward, backward, optimizer, with
    /// contention slowdowns).
    pub compute_ms: f64,
    /// Time per iteration some collective runs while a rank's compute stream is idle (mean
    /// over ranks): the communication compute does not hide. At most `comm_ms`.
    pub exposed_comm_ms: f64,
    /// Busy time of a rank's compression stream per iteration.
    pub compression_ms: f64,
    /// Time some collective was running per iteration.
    pub comm_ms: f64,
    /// Bytes each rank contributes to collectives per iteration (compressed payloads, all rounds).
    pub wire_bytes_per_rank: u64,
    /// Fusion groups in the plan.
    pub groups: usize,
    /// Collective steps in one iteration.
    pub collectives_per_iteration: usize,
    /// What one rank keeps on its device, against the device's capacity.
    pub memory_per_rank: MemoryUse,
    /// The model's compute time on this cluster's GPU over its measured time
    /// (`crate::inputs::carry`).
    pub compute_scale: f64,
    /// How much compute slows while a collective shares the GPU (`crate::predict::contention`).
    pub collective_slowdown: f64,
    /// Seed of the noise.
    pub seed: u64,
    /// Iterations simulated before the measured ones.
    pub warmup_iterations: u32,
    /// Iterations whose times were measured.
    pub measured_iterations: u32,
    /// Events the engine processed.
    pub events: u64,
    /// Statistics over the measured iterations, when an iteration count was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statistics: Option<Statistics>,
    /// Compressors whose encode and decode were priced by the memory-bandwidth fallback
    /// (`compress::Work`) because the device running their codec has no cost curve for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub codec_cost_fallback: Vec<CostFallback>,
}

/// A compressor key and the device profile that lacks its cost curves.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct CostFallback {
    /// The compressor's key.
    pub compressor: &'static str,
    /// Name of the device profile that lacks the compressor's cost curves.
    pub device: String,
}
