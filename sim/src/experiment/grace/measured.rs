//! GRACE's measured throughput CSV: reading the rows we compare with and merging repeated runs.

use crate::base::error::{Result, SimError};
use std::collections::BTreeMap;
use std::path::Path;

/// One configuration GRACE measured (repeated runs merged).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Measurement {
    pub model: String,
    pub workers: u32,
    pub method: String,
    /// `n/a` or the sparsification ratio as GRACE wrote it.
    pub ratio: String,
    /// Error feedback on (`true`), off (`false`) or not applicable (`n/a`).
    pub memory: String,
    pub comm_method: String,
    /// Median over the repeated runs, images/s over all workers.
    pub throughput: f64,
    pub runs: usize,
    /// Why the consistency rules exclude this row from the fit and the headline error, if they do.
    pub excluded: Option<String>,
}

#[cfg(test)]
impl Measurement {
    /// One run of a configuration without ratio or memory, for tests.
    pub(crate) fn test_row(
        model: &str,
        workers: u32,
        method: &str,
        throughput: f64,
    ) -> Measurement {
        Measurement {
            model: model.to_string(),
            workers,
            method: method.to_string(),
            ratio: "n/a".to_string(),
            memory: "n/a".to_string(),
            comm_method: "allreduce".to_string(),
            throughput,
            runs: 1,
            excluded: None,
        }
    }
}

/// A configuration: model, workers, method, ratio, memory, communication method.
type Key = (String, u32, String, String, String, String);

/// Reads the `backend=mpi` rows of one `mode` (`throughput` is compared; `upper-bound` only
/// checks it) and merges repeated runs of one configuration into their median: GRACE repeated
/// some configurations and the runs differ by up to 1.5×, which no parameter we fit explains.
pub(super) fn load(path: &Path, wanted_mode: &str) -> Result<Vec<Measurement>> {
    let label = path.display().to_string();
    let text = crate::base::data::read_text(path)?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| SimError::invalid(&label, name, "column missing from the header"))
    };
    let [model, mode, workers, backend, comm, method, ratio, memory, throughput] = [
        "model",
        "mode",
        "workers",
        "backend",
        "comm_method",
        "method",
        "ratio",
        "memory",
        "throughput",
    ]
    .map(column);
    let (model, mode, workers, backend, comm) = (model?, mode?, workers?, backend?, comm?);
    let (method, ratio, memory, throughput) = (method?, ratio?, memory?, throughput?);
    let mut runs: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
    for (i, line) in lines.enumerate() {
        let fields: Vec<&str> = line.split(',').collect();
        let field = |c: usize| fields.get(c).copied().unwrap_or("");
        if field(mode) != wanted_mode || field(backend) != "mpi" {
            continue;
        }
        let bad = |name: &str| {
            SimError::invalid(
                &label,
                format!("line {}, {name}", i + 2),
                format!(
                    "`{}` is not a positive number",
                    field(column(name).unwrap_or(0))
                ),
            )
        };
        let n: u32 = field(workers).parse().map_err(|_| bad("workers"))?;
        let t: f64 = field(throughput)
            .parse()
            .ok()
            .filter(|t: &f64| *t > 0.0)
            .ok_or_else(|| bad("throughput"))?;
        let key = (
            field(model).to_string(),
            n,
            field(method).to_string(),
            field(ratio).to_string(),
            field(memory).to_string(),
            field(comm).to_string(),
        );
        runs.entry(key).or_default().push(t);
    }
    Ok(runs
        .into_iter()
        .map(
            |((model, workers, method, ratio, memory, comm_method), mut t)| {
                t.sort_by(f64::total_cmp);
                let median = if t.len() % 2 == 1 {
                    t[t.len() / 2]
                } else {
                    (t[t.len() / 2 - 1] + t[t.len() / 2]) / 2.0
                };
                Measurement {
                    model,
                    workers,
                    method,
                    ratio,
                    memory,
                    comm_method,
                    throughput: median,
                    runs: t.len(),
                    excluded: None,
                }
            },
        )
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "model,mode,workers,backend,comm_method,method,ratio,memory,throughput";

    fn file(name: &str, rows: &[&str]) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("syncopate-grace-{}-{name}.csv", std::process::id()));
        std::fs::write(
            &path,
            [HEADER]
                .iter()
                .chain(rows)
                .copied()
                .collect::<Vec<_>>()
                .join("\n"),
        )
        .unwrap();
        path
    }

    #[test]
    fn repeated_runs_merge_into_their_median_and_other_modes_are_skipped() {
        let path = file(
            "median",
            &[
                "resnet50,throughput,2,mpi,allreduce,none,n/a,n/a,100",
                "resnet50,throughput,2,mpi,allreduce,none,n/a,n/a,300",
                "resnet50,throughput,2,mpi,allreduce,none,n/a,n/a,150",
                "resnet50,throughput,2,nccl,allreduce,none,n/a,n/a,999",
                "resnet50,upper-bound,2,mpi,allreduce,none,n/a,n/a,999",
                "resnet50,throughput,4,mpi,allgather,topk,0.01,true,50",
                "resnet50,throughput,4,mpi,allgather,topk,0.01,true,70",
            ],
        );
        let rows = load(&path, "throughput").unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].workers, rows[0].throughput, rows[0].runs),
            (2, 150.0, 3)
        );
        assert_eq!(
            (rows[1].method.as_str(), rows[1].ratio.as_str()),
            ("topk", "0.01")
        );
        assert_eq!((rows[1].throughput, rows[1].runs), (60.0, 2));
    }

    #[test]
    fn a_non_positive_throughput_names_its_line() {
        let path = file(
            "negative",
            &["resnet50,throughput,2,mpi,allreduce,none,n/a,n/a,-3"],
        );
        let err = load(&path, "throughput").unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(
            err.contains("line 2, throughput") && err.contains("`-3`"),
            "{err}"
        );
    }
}
