//! nccl-tests measurements: reading them, comparing the collective model against them, and
//! fitting a cluster's link efficiencies and hop latencies to them.

use crate::collective::{self, Estimate, Group, Op};
use crate::error::{Result, SimError};
use crate::topology::{Cluster, Library, LL128_PAYLOAD_FRACTION};
use std::collections::BTreeMap;
use std::path::Path;

/// One measured point: `gpus` ranks, a buffer of `bytes`, and the time nccl-tests reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    pub gpus: u32,
    pub bytes: u64,
    pub time_us: f64,
}

/// Which column of a measurement CSV holds the result.
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    /// A time in µs (nccl-tests' `time` column).
    Time(String),
    /// A bus bandwidth in GB/s (nccl-tests' `busbw` column), turned into a time.
    BusBandwidth(String),
}

/// Reads a CSV of nccl-tests results. It needs a `size_bytes` column and either a time column
/// (`time_us…`) or a bus-bandwidth column (`…busbw…`); `column` picks one by name. Rows without
/// a `gpus` column take `default_gpus`. Rows whose value is zero or missing are skipped (nccl-tests
/// prints 0.00 GB/s for one rank).
pub fn read_measurements(
    path: &Path,
    op: Op,
    column: Option<&str>,
    default_gpus: u32,
) -> Result<Vec<Measurement>> {
    let label = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines
        .next()
        .ok_or_else(|| SimError::invalid(&label, "header", "the file is empty"))?;
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let find = |name: &str| names.iter().position(|n| *n == name);
    let size_at = find("size_bytes")
        .ok_or_else(|| SimError::invalid(&label, "header", "needs a `size_bytes` column"))?;
    let gpus_at = find("gpus");
    let chosen = match column {
        Some(name) => {
            let at = find(name).ok_or_else(|| {
                SimError::invalid(
                    &label,
                    "header",
                    format!("no column `{name}`; columns: {}", names.join(", ")),
                )
            })?;
            (at, pick_column(name))
        }
        None => names
            .iter()
            .enumerate()
            .find_map(|(i, n)| {
                (n.starts_with("time_us") || n.contains("busbw")).then(|| (i, pick_column(n)))
            })
            .ok_or_else(|| {
                SimError::invalid(&label, "header", "needs a `time_us…` or `…busbw…` column")
            })?,
    };
    let mut rows = Vec::new();
    for (line_index, line) in lines {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let at_line = |field: &str| format!("line {}, column `{field}`", line_index + 1);
        let get = |i: usize| fields.get(i).copied().unwrap_or("");
        let bytes: u64 = get(size_at).parse().map_err(|_| {
            SimError::invalid(
                &label,
                at_line("size_bytes"),
                format!("not a byte count: `{}`", get(size_at)),
            )
        })?;
        let gpus: u32 = match gpus_at {
            Some(i) => get(i).parse().map_err(|_| {
                SimError::invalid(
                    &label,
                    at_line("gpus"),
                    format!("not a GPU count: `{}`", get(i)),
                )
            })?,
            None => default_gpus,
        };
        let raw = get(chosen.0);
        let value: f64 = raw.parse().map_err(|_| {
            SimError::invalid(
                &label,
                at_line(names[chosen.0]),
                format!("not a number: `{raw}`"),
            )
        })?;
        if !(value.is_finite() && value > 0.0) || gpus == 0 || bytes == 0 {
            continue;
        }
        let time_us = match &chosen.1 {
            Column::Time(_) => value,
            Column::BusBandwidth(_) => {
                let factor = op.bus_factor(gpus);
                if factor == 0.0 {
                    continue;
                }
                bytes as f64 * factor / (value * 1e3)
            }
        };
        rows.push(Measurement {
            gpus,
            bytes,
            time_us,
        });
    }
    if rows.is_empty() {
        return Err(SimError::invalid(&label, names[chosen.0], "no usable rows"));
    }
    Ok(rows)
}

fn pick_column(name: &str) -> Column {
    if name.contains("busbw") {
        Column::BusBandwidth(name.to_string())
    } else {
        Column::Time(name.to_string())
    }
}

/// The group a measurement with `gpus` ranks ran on: as few nodes as hold them.
pub fn group_for(cluster: &Cluster, gpus: u32) -> Group {
    let nodes = gpus.div_ceil(cluster.gpus_per_node);
    Group { ranks: gpus, nodes }
}

/// The cluster resized to hold `gpus` ranks.
fn sized_for(cluster: &Cluster, gpus: u32) -> Cluster {
    let mut sized = cluster.clone();
    sized.nodes = gpus.div_ceil(cluster.gpus_per_node).max(1);
    sized
}

/// Predicts every measurement.
pub fn predict(cluster: &Cluster, op: Op, measurements: &[Measurement]) -> Result<Vec<Estimate>> {
    measurements
        .iter()
        .map(|m| {
            collective::estimate(
                &sized_for(cluster, m.gpus),
                op,
                m.bytes,
                group_for(cluster, m.gpus),
            )
        })
        .collect()
}

/// Mean and worst absolute percentage error for one GPU count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ErrorRow {
    pub gpus: u32,
    pub points: usize,
    pub mean_abs_pct: f64,
    pub max_abs_pct: f64,
}

/// Error of the predictions per GPU count, sorted by GPU count.
pub fn error_table(measurements: &[Measurement], predictions: &[Estimate]) -> Vec<ErrorRow> {
    let mut by_gpus: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for (m, p) in measurements.iter().zip(predictions) {
        let error = (p.time.as_us() - m.time_us).abs() / m.time_us * 100.0;
        by_gpus.entry(m.gpus).or_default().push(error);
    }
    by_gpus
        .into_iter()
        .map(|(gpus, errors)| ErrorRow {
            gpus,
            points: errors.len(),
            mean_abs_pct: errors.iter().sum::<f64>() / errors.len() as f64,
            max_abs_pct: errors.iter().copied().fold(0.0, f64::max),
        })
        .collect()
}

/// The fitted quantities of an NCCL cluster, in the order the search visits them.
const FIT_PARAMETERS: [&str; 12] = [
    "intra_node.latency_us",
    "inter_node.latency_us",
    "library.intra_efficiency",
    "library.inter_efficiency",
    "library.ll_gbytes_per_s_per_rank",
    "library.base_latency_us.ll",
    "library.base_latency_us.ll128",
    "library.base_latency_us.simple",
    "library.ll128_efficiency",
    "library.ll_multi_node_gbytes_per_s",
    "library.nvls_efficiency",
    "library.nvls_latency_us",
];

fn parameter(cluster: &mut Cluster, index: usize) -> &mut f64 {
    let Library::Nccl(params) = &mut cluster.library else {
        unreachable!("fit checks the library first")
    };
    match index {
        0 => &mut cluster.intra_node.latency_us,
        1 => &mut cluster.inter_node.latency_us,
        2 => &mut params.intra_efficiency,
        3 => &mut params.inter_efficiency,
        4 => &mut params.ll_gbytes_per_s_per_rank,
        5 => &mut params.base_latency_us.ll,
        6 => &mut params.base_latency_us.ll128,
        7 => &mut params.base_latency_us.simple,
        8 => &mut params.ll128_efficiency,
        9 => &mut params.ll_multi_node_gbytes_per_s,
        10 => &mut params.nvls_efficiency,
        _ => &mut params.nvls_latency_us,
    }
}

/// Objective of the fit: the average over GPU counts of each count's mean error, plus a small
/// share of the worst count so that no count is sacrificed.
fn objective(cluster: &Cluster, op: Op, measurements: &[Measurement]) -> f64 {
    match predict(cluster, op, measurements) {
        Ok(predictions) => {
            let table = error_table(measurements, &predictions);
            let worst = table.iter().map(|r| r.mean_abs_pct).fold(0.0, f64::max);
            let mean = table.iter().map(|r| r.mean_abs_pct).sum::<f64>() / table.len() as f64;
            mean + 0.1 * worst
        }
        Err(_) => f64::INFINITY,
    }
}

/// Fits an NCCL cluster's hop latencies, link efficiencies, LL rates, per-protocol base latencies
/// and NVLS costs to measurements (deterministic). Parameters the data does not exercise (the
/// network, for one-node data; NVLS, without NVSwitch reduction) keep their values. The model
/// has at most twelve physical parameters against
/// every size and GPU count of the data, so it cannot memorize it. Pattern search in log space
/// is restarted from the given cluster and from each parameter halved and doubled, because the
/// objective has kinks wherever the chosen algorithm or protocol switches.
/// `only` restricts the fit to the named parameters (see [`fitted_fields`]); data from one GPU
/// count cannot tell a per-hop latency from a fixed one, so such data should fit a subset.
pub fn fit(
    cluster: &Cluster,
    op: Op,
    measurements: &[Measurement],
    only: Option<&[String]>,
) -> Result<(Cluster, f64)> {
    if !matches!(cluster.library, Library::Nccl(_)) {
        return Err(SimError::bad_value(
            "--fit",
            &cluster.name,
            "fitting is implemented for NCCL clusters",
        ));
    }
    let indices: Vec<usize> = match only {
        None => (0..FIT_PARAMETERS.len()).collect(),
        Some(names) => names
            .iter()
            .map(|name| {
                FIT_PARAMETERS
                    .iter()
                    .position(|p| p == name)
                    .ok_or_else(|| {
                        SimError::bad_value(
                            "fitted parameter",
                            name,
                            format!("valid: {}", FIT_PARAMETERS.join(", ")),
                        )
                    })
            })
            .collect::<Result<_>>()?,
    };
    let mut starts = vec![cluster.clone()];
    for &index in &indices {
        for factor in [0.5, 2.0] {
            let mut start = cluster.clone();
            scale_parameter(&mut start, index, factor);
            starts.push(start);
        }
    }
    let mut best = (cluster.clone(), f64::INFINITY);
    for start in starts {
        let candidate = pattern_search(start, op, measurements, &indices);
        if candidate.1 < best.1 {
            best = candidate;
        }
    }
    Ok(best)
}

const MIN_INTRA_HOP_US: f64 = 0.3;
const MIN_INTER_HOP_US: f64 = 1.0;

fn scale_parameter(cluster: &mut Cluster, index: usize, factor: f64) {
    let value = parameter(cluster, index);
    *value *= factor;
    // Efficiencies are fractions of a link's bandwidth; LL128 cannot beat its payload share; a
    // hop costs at least what the hardware alone takes (an NVLink/PCIe transfer, a NIC and a
    // switch on the network).
    match index {
        0 => *value = value.max(MIN_INTRA_HOP_US),
        1 => *value = value.max(MIN_INTER_HOP_US),
        2 | 3 | 10 => *value = value.min(1.0),
        8 => *value = value.min(LL128_PAYLOAD_FRACTION),
        _ => {}
    }
}

fn pattern_search(
    start: Cluster,
    op: Op,
    measurements: &[Measurement],
    indices: &[usize],
) -> (Cluster, f64) {
    let mut best_score = objective(&start, op, measurements);
    let mut best = start;
    let mut step = 0.5_f64;
    while step > 1e-3 {
        let mut improved = false;
        for &index in indices {
            for direction in [1.0, -1.0] {
                let mut candidate = best.clone();
                scale_parameter(&mut candidate, index, (direction * step).exp());
                let score = objective(&candidate, op, measurements);
                if score < best_score {
                    best = candidate;
                    best_score = score;
                    improved = true;
                }
            }
        }
        if !improved {
            step /= 2.0;
        }
    }
    (best, best_score)
}

/// Names of the fitted fields, for reports.
pub fn fitted_fields() -> &'static [&'static str] {
    &FIT_PARAMETERS
}
