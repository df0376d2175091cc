//! nccl-tests-style tables of the collective model: time, algorithm and bus bandwidth per size.
//!
//! A table stands alone or next to measurements, with the error per GPU count, fitted and held out
//! apart.

use crate::base::error::Result;
use crate::calibrate::{self, ErrorRow, ErrorSummary, Measurement};
use crate::collective::{self, Estimate, Group};
use crate::collective_op::Op;
use crate::inputs::topology::Cluster;
use serde::{Serialize, Serializer};

/// One row of a table: a predicted collective, and the measured time when there is one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The ranks it ran on.
    #[serde(skip)]
    pub gpus: u32,
    /// Size of the collective, bytes.
    pub bytes: u64,
    /// Predicted time, µs (rounded to three decimals).
    pub time_us: f64,
    /// nccl-tests' algorithm bandwidth in GB/s.
    pub algbw_gbytes_per_s: f64,
    /// nccl-tests' bus bandwidth in GB/s.
    pub busbw_gbytes_per_s: f64,
    /// Name of the predicted algorithm.
    pub algorithm: &'static str,
    /// Name of the predicted protocol.
    pub protocol: &'static str,
    /// Measured time, µs, when the row compares against a measurement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_time_us: Option<f64>,
    /// Predicted minus measured time, in percent of the measured time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_pct: Option<f64>,
}

impl Row {
    fn new(op: Op, ranks: u32, bytes: u64, estimate: &Estimate, measured: Option<f64>) -> Row {
        let algbw = estimate.algbw_gbytes_per_s(bytes);
        Row {
            gpus: ranks,
            bytes,
            time_us: round3(estimate.time.as_us()),
            algbw_gbytes_per_s: round3(algbw),
            busbw_gbytes_per_s: round3(algbw * op.bus_factor(ranks)),
            algorithm: estimate.algorithm.name(),
            protocol: estimate.protocol.name(),
            measured_time_us: measured,
            error_pct: measured.map(|m| round3((estimate.time.as_us() - m) / m * 100.0)),
        }
    }
}

/// Rounds to three decimals, as the tables print.
fn round3(value: f64) -> f64 {
    (value * 1e3).round() / 1e3
}

/// The collective on all of the cluster's ranks at each size.
pub fn predict(cluster: &Cluster, op: Op, sizes: &[u64]) -> Result<Vec<Row>> {
    let group = Group::world(cluster);
    sizes
        .iter()
        .map(|&bytes| {
            let estimate = collective::estimate(cluster, op, bytes, group)?;
            Ok(Row::new(op, group.ranks, bytes, &estimate, None))
        })
        .collect()
}

/// Predicted against measured times: a row per measurement, the error per GPU count, and the
/// error over the GPU counts the cluster was fitted on apart from the ones held out of the fit.
pub struct Comparison {
    /// Name of the cluster predicted.
    pub cluster: String,
    /// One row per measurement, in the measurements' order.
    pub rows: Vec<Row>,
    /// Unrounded; the JSON form rounds to three decimals.
    pub errors: Vec<ErrorRow>,
    /// GPU counts kept out of the fit.
    pub held_out_gpus: Vec<u32>,
    /// Over the other GPU counts (every count when none is held out).
    pub fit_error: Option<ErrorSummary>,
    /// Over the held-out GPU counts (`None` when there are none).
    pub held_out_error: Option<ErrorSummary>,
}

/// Predicts every measurement on `cluster` (resized to each measurement's GPU count);
/// `held_out_gpus` are the counts the cluster was not fitted on.
pub fn compare(
    cluster: &Cluster,
    op: Op,
    measurements: &[Measurement],
    held_out_gpus: &[u32],
) -> Result<Comparison> {
    let predictions = calibrate::predict(cluster, op, measurements)?;
    let errors = calibrate::error_table(measurements, &predictions);
    let rows = measurements
        .iter()
        .zip(&predictions)
        .map(|(m, p)| Row::new(op, m.gpus, m.bytes, p, Some(m.time_us)))
        .collect();
    Ok(Comparison {
        cluster: cluster.name.clone(),
        rows,
        fit_error: calibrate::summarize(&errors, |g| !held_out_gpus.contains(&g)),
        held_out_error: calibrate::summarize(&errors, |g| held_out_gpus.contains(&g)),
        held_out_gpus: held_out_gpus.to_vec(),
        errors,
    })
}

impl Serialize for Comparison {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Json<'a> {
            rows: &'a [Row],
            error_by_gpus: Vec<ErrorJson>,
            fit_error: Option<SummaryJson<'a>>,
            held_out_error: Option<SummaryJson<'a>>,
            cluster: &'a str,
        }
        #[derive(Serialize)]
        struct ErrorJson {
            gpus: u32,
            held_out: bool,
            points: usize,
            mean_abs_error_pct: f64,
            max_abs_error_pct: f64,
        }
        #[derive(Serialize)]
        struct SummaryJson<'a> {
            gpus: &'a [u32],
            points: usize,
            mean_abs_error_pct: f64,
            max_abs_error_pct: f64,
        }
        fn summary(s: &ErrorSummary) -> SummaryJson<'_> {
            SummaryJson {
                gpus: &s.gpus,
                points: s.points,
                mean_abs_error_pct: round3(s.mean_abs_pct),
                max_abs_error_pct: round3(s.max_abs_pct),
            }
        }
        Json {
            rows: &self.rows,
            error_by_gpus: self
                .errors
                .iter()
                .map(|r| ErrorJson {
                    gpus: r.gpus,
                    held_out: self.held_out_gpus.contains(&r.gpus),
                    points: r.points,
                    mean_abs_error_pct: round3(r.mean_abs_pct),
                    max_abs_error_pct: round3(r.max_abs_pct),
                })
                .collect(),
            fit_error: self.fit_error.as_ref().map(summary),
            held_out_error: self.held_out_error.as_ref().map(summary),
            cluster: &self.cluster,
        }
        .serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::topology::ClusterOverrides;

    fn cluster() -> Cluster {
        Cluster::load("dgx-h100", ClusterOverrides::default()).unwrap()
    }

    #[test]
    fn bus_bandwidth_is_the_algorithm_bandwidth_times_the_bus_factor() {
        let c = cluster();
        let rows = predict(&c, Op::Allreduce, &[1 << 20, 1 << 30]).unwrap();
        assert_eq!(rows.len(), 2);
        for row in &rows {
            assert_eq!(row.gpus, c.world_size());
            let factor = Op::Allreduce.bus_factor(row.gpus);
            assert!(
                (row.busbw_gbytes_per_s - row.algbw_gbytes_per_s * factor).abs() < 2e-3,
                "{row:?}"
            );
            assert!(row.measured_time_us.is_none() && row.error_pct.is_none());
        }
        let json = serde_json::to_value(&rows[0]).unwrap();
        assert!(json.get("gpus").is_none() && json.get("error_pct").is_none());
    }

    #[test]
    fn the_error_is_relative_to_the_measured_time() {
        let c = cluster();
        let (gpus, predicted) = match &predict(&c, Op::Allreduce, &[1 << 24]).unwrap()[..] {
            [row] => (row.gpus, row.time_us),
            rows => panic!("{rows:?}"),
        };
        let measurements = [
            Measurement {
                gpus,
                bytes: 1 << 24,
                time_us: predicted / 2.0,
            },
            Measurement {
                gpus,
                bytes: 1 << 24,
                time_us: predicted * 2.0,
            },
        ];
        let comparison = compare(&c, Op::Allreduce, &measurements, &[]).unwrap();
        let errors: Vec<f64> = comparison.rows.iter().filter_map(|r| r.error_pct).collect();
        assert_eq!(errors.len(), 2);
        assert!(
            (errors[0] - 100.0).abs() < 0.1 && (errors[1] + 50.0).abs() < 0.1,
            "{errors:?}"
        );
        assert_eq!(comparison.errors.len(), 1);
        assert_eq!(comparison.errors[0].points, 2);
        let json = serde_json::to_value(&comparison).unwrap();
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys.len(), 5, "{keys:?}");
        assert_eq!(json["error_by_gpus"][0]["gpus"], gpus);
        assert_eq!(json["fit_error"]["points"], 2);
        assert!(json["held_out_error"].is_null());
    }
}
