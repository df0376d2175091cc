//! GRACE's measured throughput CSV: reading the rows we compare with and merging repeated runs.

use std::collections::BTreeMap;
use std::path::Path;
use syncopate_sim::SimError;

/// One configuration GRACE measured (repeated runs merged).
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
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

/// A configuration: model, workers, method, ratio, memory, communication method.
type Key = (String, u32, String, String, String, String);

/// Reads the `backend=mpi` rows of one `mode` (`throughput` is compared; `upper-bound` only
/// checks it) and merges repeated runs of one configuration into their median: GRACE repeated
/// some configurations and the runs differ by up to 1.5×, which no parameter we fit explains.
pub fn load(path: &Path, wanted_mode: &str) -> anyhow::Result<Vec<Measurement>> {
    let label = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })?;
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

/// How many rows each consistency rule excluded.
#[derive(Debug, Default)]
pub struct Exclusions {
    /// Rule 1: below `min_ratio` of GRACE's `upper-bound` row of the same configuration.
    pub below_upper_bound: usize,
    /// Rule 2: a 1-worker `none` row slower per worker than most of its model's multi-worker rows.
    pub slow_one_worker: usize,
}

/// Flags the rows GRACE's own data contradicts, in place; the rules, in order:
/// 1. a `throughput` row below `min_ratio` × the `upper-bound` row of the same configuration
///    (model, workers, method, ratio, memory, communication method);
/// 2. a model's 1-worker `none` row that runs slower per worker than more than half of that
///    model's remaining multi-worker rows: adding workers only adds communication, so a 1-worker
///    run cannot be slower per worker than a multi-worker run of the same model and batch.
pub fn flag_inconsistent(
    data: &mut [Measurement],
    upper: &[Measurement],
    min_ratio: f64,
) -> Exclusions {
    let same = |a: &Measurement, b: &Measurement| {
        (
            &a.model,
            a.workers,
            &a.method,
            &a.ratio,
            &a.memory,
            &a.comm_method,
        ) == (
            &b.model,
            b.workers,
            &b.method,
            &b.ratio,
            &b.memory,
            &b.comm_method,
        )
    };
    let mut counts = Exclusions::default();
    for m in data.iter_mut() {
        if let Some(u) = upper.iter().find(|u| same(m, u)) {
            if m.throughput < min_ratio * u.throughput {
                m.excluded = Some(format!(
                    "below {:.2}× GRACE's upper-bound row ({:.1} img/s)",
                    min_ratio, u.throughput
                ));
                counts.below_upper_bound += 1;
            }
        }
    }
    let models: Vec<String> = data.iter().map(|m| m.model.clone()).collect();
    for model in models {
        let per_worker: Vec<f64> = data
            .iter()
            .filter(|m| m.model == model && m.workers > 1 && m.excluded.is_none())
            .map(|m| m.throughput / f64::from(m.workers))
            .collect();
        let Some(one) = data
            .iter_mut()
            .find(|m| m.model == model && m.workers == 1 && m.method == "none")
        else {
            continue;
        };
        if one.excluded.is_some() {
            continue;
        }
        let faster = per_worker.iter().filter(|&&t| t > one.throughput).count();
        if 2 * faster > per_worker.len() {
            one.excluded = Some(format!(
                "slower per worker than {faster} of its model's {} multi-worker rows",
                per_worker.len()
            ));
            counts.slow_one_worker += 1;
        }
    }
    counts
}
