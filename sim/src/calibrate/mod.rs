//! Every fit of a model parameter to measurements, and the tables that set predictions beside them.
//!
//! Here: nccl-tests measurements (reading and predicting them, their errors, and which a fit
//! may use). Beside it: the TCP libraries' fits of the labs ([`tcp_fit`], [`p2p_fit`],
//! [`beside_compute`]) and the predicted collective tables ([`compare`]).

pub mod beside_compute;
pub mod compare;
mod fit;
pub mod fp16_sum_fit;
pub mod p2p_fit;
pub mod tcp_fit;

pub use fit::{
    bound_hits, determinable_fields, fit, fit_report, fitted_fields, BoundHit, FitReport, Kept,
};

use crate::base::error::{Result, SimError};
use crate::collective::{self, Estimate, Group};
use crate::collective_op::Op;
use crate::inputs::topology::Cluster;
use std::collections::BTreeMap;
use std::path::Path;

/// One measured point: `gpus` ranks, a buffer of `bytes`, and the time nccl-tests reported.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    /// Ranks the collective ran over.
    pub gpus: u32,
    /// Buffer size, bytes.
    pub bytes: u64,
    /// Time nccl-tests reported, µs.
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

/// Keeps the rows of a CSV whose `column` holds `value` (a file with several runs, such as
/// several collectives, NCCL versions or network setups in one table). Filters on one column
/// are alternatives; filters on different columns must all hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowFilter {
    /// Name of the column to match.
    pub column: String,
    /// The value that column must hold.
    pub value: String,
}

impl std::str::FromStr for RowFilter {
    type Err = SimError;
    fn from_str(text: &str) -> Result<RowFilter> {
        match text.split_once('=') {
            Some((column, value)) if !column.trim().is_empty() => Ok(RowFilter {
                column: column.trim().to_string(),
                value: value.trim().to_string(),
            }),
            _ => Err(SimError::bad_value(
                "--where",
                text,
                "expected COLUMN=VALUE, e.g. env_setup=4",
            )),
        }
    }
}

/// Reads a CSV of nccl-tests results. It needs a `size_bytes` column and either a time column
/// (`time_us…`) or a bus-bandwidth column (`…busbw…`); `column` picks one by name. Rows without
/// a `gpus` column take `default_gpus`; only rows the filters accept are read, and in a file
/// with an `op` column (several collectives, as `python -m syncopate.torch.sweep` writes) only
/// `op`'s rows unless a filter names that column. Rows whose value is zero or missing are
/// skipped (nccl-tests prints 0.00 GB/s for one rank).
pub fn read_measurements(
    path: &Path,
    op: Op,
    column: Option<&str>,
    default_gpus: u32,
    filters: &[RowFilter],
) -> Result<Vec<Measurement>> {
    read_rows(path, op.name(), Some(op), column, default_gpus, filters)
}

/// The rows named `name` in the `op` column of a sweep's CSV (its time column), as
/// [`read_measurements`] reads a collective's, for what is not a collective (`push-pull`):
/// none is no error.
pub fn read_named(path: &Path, name: &str, default_gpus: u32) -> Result<Vec<Measurement>> {
    read_rows(path, name, None, None, default_gpus, &[])
}

/// The rows named `name` in the `op` column of a sweep's CSV, each with its value in `column`
/// (kept in `time_us`) rather than its time: none is no error.
pub fn read_named_column(
    path: &Path,
    name: &str,
    column: &str,
    default_gpus: u32,
) -> Result<Vec<Measurement>> {
    read_rows(path, name, None, Some(column), default_gpus, &[])
}

/// [`read_measurements`] of the rows named `name`; bus bandwidths convert with `op`'s factor.
fn read_rows(
    path: &Path,
    name: &str,
    op: Option<Op>,
    column: Option<&str>,
    default_gpus: u32,
    filters: &[RowFilter],
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
    let names = column_names(header);
    let find = |name: &str| names.iter().position(|n| *n == name);
    let size_at = find("size_bytes")
        .ok_or_else(|| SimError::invalid(&label, "header", "needs a `size_bytes` column"))?;
    let gpus_at = find("gpus");
    // Values of one column are alternatives; different columns must all match.
    let mut filter_at: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for f in filters {
        let at = find(&f.column).ok_or_else(|| {
            SimError::bad_value(
                "--where",
                &f.column,
                format!("{label} has no such column; columns: {}", names.join(", ")),
            )
        })?;
        filter_at.entry(at).or_default().push(&f.value);
    }
    if let Some(at) = find(OP_COLUMN).filter(|at| !filter_at.contains_key(at)) {
        filter_at.insert(at, vec![name]);
    }
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
        let fields = split_fields(line);
        let get = |i: usize| fields.get(i).map_or("", |f| f.trim());
        if filter_at
            .iter()
            .any(|(&at, values)| !values.contains(&get(at)))
        {
            continue;
        }
        let at_line = |field: &str| format!("line {}, column `{field}`", line_index + 1);
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
            Column::BusBandwidth(column) => {
                let Some(op) = op else {
                    return Err(SimError::invalid(
                        &label,
                        format!("column `{column}`"),
                        format!("`{name}` rows need a time column (`time_us…`)"),
                    ));
                };
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
    // A collective's rows are what the caller came for; named rows are optional.
    if rows.is_empty() && op.is_some() {
        return Err(SimError::invalid(&label, names[chosen.0], "no usable rows"));
    }
    Ok(rows)
}

/// The column of a measurement CSV that names each row's collective.
const OP_COLUMN: &str = "op";

fn column_names(header: &str) -> Vec<&str> {
    header.split(',').map(str::trim).collect()
}

/// Whether the measurement CSV at `path` names each row's collective in an `op` column.
pub fn has_op_column(path: &Path) -> Result<bool> {
    has_column(path, OP_COLUMN)
}

/// Whether the measurement CSV at `path` has a column `name`.
pub fn has_column(path: &Path, name: &str) -> Result<bool> {
    let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let header = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    Ok(column_names(header).contains(&name))
}

/// The fields of one CSV line, with RFC 4180 quoting (a quoted field may hold commas and
/// doubled quotes).
fn split_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let field = fields.last_mut().expect("never empty");
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            _ => field.push(c),
        }
    }
    fields
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

/// Absolute percentage error of one prediction.
fn abs_pct(measured: &Measurement, predicted: &Estimate) -> f64 {
    (predicted.time.as_us() - measured.time_us).abs() / measured.time_us * 100.0
}

/// Mean and worst absolute percentage error for one GPU count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ErrorRow {
    /// The GPU count.
    pub gpus: u32,
    /// Measurements at this GPU count.
    pub points: usize,
    /// Mean absolute percentage error.
    pub mean_abs_pct: f64,
    /// Worst absolute percentage error.
    pub max_abs_pct: f64,
}

/// Error of the predictions per GPU count, sorted by GPU count.
pub fn error_table(measurements: &[Measurement], predictions: &[Estimate]) -> Vec<ErrorRow> {
    let mut by_gpus: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for (m, p) in measurements.iter().zip(predictions) {
        by_gpus.entry(m.gpus).or_default().push(abs_pct(m, p));
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

/// The error over a set of GPU counts together: every point weighs the same.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorSummary {
    /// The GPU counts summarized.
    pub gpus: Vec<u32>,
    /// Measurements over all of those GPU counts.
    pub points: usize,
    /// Mean absolute percentage error, every point weighing the same.
    pub mean_abs_pct: f64,
    /// Worst absolute percentage error.
    pub max_abs_pct: f64,
}

/// Summarizes the rows of `table` whose GPU count `keep` accepts; None when there are none.
pub fn summarize(table: &[ErrorRow], keep: impl Fn(u32) -> bool) -> Option<ErrorSummary> {
    let rows: Vec<&ErrorRow> = table.iter().filter(|r| keep(r.gpus)).collect();
    let points: usize = rows.iter().map(|r| r.points).sum();
    (points > 0).then(|| ErrorSummary {
        gpus: rows.iter().map(|r| r.gpus).collect(),
        points,
        mean_abs_pct: rows
            .iter()
            .map(|r| r.mean_abs_pct * r.points as f64)
            .sum::<f64>()
            / points as f64,
        max_abs_pct: rows.iter().map(|r| r.max_abs_pct).fold(0.0, f64::max),
    })
}

/// Which GPU counts of the data a fit must not see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holdout {
    /// Fit on everything (the report then has no held-out error).
    Nothing,
    /// Keep the largest GPU count out: does the fit extrapolate in scale?
    LargestScale,
    /// Keep these GPU counts out.
    Gpus(Vec<u32>),
}

impl std::str::FromStr for Holdout {
    type Err = SimError;
    fn from_str(text: &str) -> Result<Holdout> {
        match text.trim() {
            "none" => Ok(Holdout::Nothing),
            "largest" => Ok(Holdout::LargestScale),
            list => list
                .split(',')
                .map(|gpus| match gpus.trim().parse::<u32>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(SimError::bad_value(
                        "--holdout-gpus",
                        text,
                        "expected `none`, `largest` or a list of GPU counts such as 32 or 16,32",
                    )),
                })
                .collect::<Result<Vec<u32>>>()
                .map(Holdout::Gpus),
        }
    }
}

impl Holdout {
    /// The GPU counts of `measurements` this holdout keeps out (sorted).
    pub fn gpus(&self, measurements: &[Measurement]) -> Vec<u32> {
        let mut counts: Vec<u32> = measurements.iter().map(|m| m.gpus).collect();
        counts.sort_unstable();
        counts.dedup();
        match self {
            Holdout::Nothing => Vec::new(),
            // With a single GPU count there is nothing left to fit on.
            Holdout::LargestScale if counts.len() > 1 => {
                counts.last().copied().into_iter().collect()
            }
            Holdout::LargestScale => Vec::new(),
            Holdout::Gpus(list) => counts.into_iter().filter(|g| list.contains(g)).collect(),
        }
    }
}

/// The measurements a fit may use: every one whose GPU count is not held out.
pub fn fit_set(measurements: &[Measurement], held_out: &[u32]) -> Vec<Measurement> {
    measurements
        .iter()
        .filter(|m| !held_out.contains(&m.gpus))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_fields_keep_their_commas() {
        assert_eq!(
            split_fields(r#"B,"hosts a,b",8,"say ""hi""",2.5"#),
            ["B", "hosts a,b", "8", "say \"hi\"", "2.5"]
        );
        assert_eq!(split_fields(""), [""]);
    }

    #[test]
    fn holdouts_name_gpu_counts_of_the_data() {
        let m = |gpus| Measurement {
            gpus,
            bytes: 1024,
            time_us: 1.0,
        };
        let data = [m(8), m(16), m(32), m(32)];
        assert_eq!(Holdout::LargestScale.gpus(&data), [32]);
        assert_eq!(Holdout::LargestScale.gpus(&data[..1]), Vec::<u32>::new());
        assert_eq!("16,64".parse::<Holdout>().unwrap().gpus(&data), [16]);
        assert_eq!(
            "none".parse::<Holdout>().unwrap().gpus(&data),
            Vec::<u32>::new()
        );
        assert!("0".parse::<Holdout>().is_err() && "x".parse::<Holdout>().is_err());
        assert_eq!(fit_set(&data, &[32]).len(), 2);
        let rows = error_table(&data, &[]);
        assert!(rows.is_empty());
    }

    #[test]
    fn row_filters_need_a_column_and_a_value() {
        let f: RowFilter = "env_setup = 4".parse().unwrap();
        assert_eq!((f.column.as_str(), f.value.as_str()), ("env_setup", "4"));
        assert!("=4".parse::<RowFilter>().is_err() && "env".parse::<RowFilter>().is_err());
    }
}
