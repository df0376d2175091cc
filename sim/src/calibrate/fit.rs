//! Fitting an NCCL cluster's physical parameters to measurements, and reporting the fit's limits.
//!
//! The report names what the data could not determine or pushed against a bound.

use super::{error_table, group_for, predict, Measurement};
use crate::base::error::{Result, SimError};
use crate::collective::nccl_tree_latency;
use crate::collective_op::Op;
use crate::inputs::topology::{Cluster, Library, NcclParams, TreeLatency};
use std::collections::BTreeSet;

/// The lowest hop latencies the hardware alone allows: an NVLink/PCIe transfer, and a NIC plus
/// a switch on the network.
const MIN_INTRA_HOP_US: f64 = 0.3;
const MIN_INTER_HOP_US: f64 = 1.0;

/// How the search moves a parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    /// By factors (latencies, rates, efficiencies: positive, scale-free).
    Factor,
    /// By this many units per step (a share that may be zero).
    Add(f64),
}

/// What the data must contain before a parameter can be told apart from the others.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Needs {
    Anything,
    /// Multi-node groups.
    Network,
    /// Groups at two tree depths (a per-level cost is otherwise one with the intercept).
    TreeDepths,
    /// Two multi-node node counts, one beyond two nodes.
    NodeCounts,
}

struct Parameter {
    name: &'static str,
    min: f64,
    max: f64,
    step: Step,
    needs: Needs,
}

const fn factor(name: &'static str, min: f64, max: f64, needs: Needs) -> Parameter {
    Parameter {
        name,
        min,
        max,
        step: Step::Factor,
        needs,
    }
}

const UNBOUNDED: f64 = f64::INFINITY;

/// The fitted quantities of an NCCL cluster, in the order the search visits them, with their
/// physical bounds: efficiencies are fractions of a link, a hop costs at least what the
/// hardware takes; LL128 cannot beat its payload share of a line ([`bounds`]).
const PARAMETERS: [Parameter; 19] = [
    factor(
        "intra_node.latency_us",
        MIN_INTRA_HOP_US,
        UNBOUNDED,
        Needs::Anything,
    ),
    factor(
        "inter_node.latency_us",
        MIN_INTER_HOP_US,
        UNBOUNDED,
        Needs::Network,
    ),
    factor("library.intra_efficiency", 0.0, 1.0, Needs::Anything),
    factor("library.inter_efficiency", 0.0, 1.0, Needs::Network),
    factor(
        "library.ll_gbytes_per_s_per_rank",
        0.0,
        UNBOUNDED,
        Needs::Anything,
    ),
    factor(
        "library.base_latency_us.ll",
        0.0,
        UNBOUNDED,
        Needs::Anything,
    ),
    factor(
        "library.base_latency_us.ll128",
        0.0,
        UNBOUNDED,
        Needs::Anything,
    ),
    factor(
        "library.base_latency_us.simple",
        0.0,
        UNBOUNDED,
        Needs::Anything,
    ),
    factor("library.ll128_efficiency", 0.0, UNBOUNDED, Needs::Anything),
    factor(
        "library.ll_multi_node_gbytes_per_s",
        0.0,
        UNBOUNDED,
        Needs::Network,
    ),
    factor("library.nvls_efficiency", 0.0, 1.0, Needs::Anything),
    factor("library.nvls_latency_us", 0.0, UNBOUNDED, Needs::Anything),
    factor(
        "library.tree.base_latency_us.ll",
        0.0,
        UNBOUNDED,
        Needs::TreeDepths,
    ),
    factor(
        "library.tree.base_latency_us.ll128",
        0.0,
        UNBOUNDED,
        Needs::TreeDepths,
    ),
    factor(
        "library.tree.base_latency_us.simple",
        0.0,
        UNBOUNDED,
        Needs::TreeDepths,
    ),
    factor(
        "library.tree.level_latency_us.ll",
        0.0,
        UNBOUNDED,
        Needs::Network,
    ),
    factor(
        "library.tree.level_latency_us.ll128",
        0.0,
        UNBOUNDED,
        Needs::Network,
    ),
    factor(
        "library.tree.level_latency_us.simple",
        0.0,
        UNBOUNDED,
        Needs::Network,
    ),
    Parameter {
        name: "library.inter_efficiency_loss_per_doubling",
        min: 0.0,
        max: 1.0,
        step: Step::Add(0.1),
        needs: Needs::NodeCounts,
    },
];

fn nccl(cluster: &mut Cluster) -> &mut NcclParams {
    let Library::Nccl(params) = &mut cluster.library else {
        unreachable!("fit checks the library first")
    };
    params
}

fn parameter(cluster: &mut Cluster, index: usize) -> &mut f64 {
    match index {
        0 => return &mut cluster.intra_node.latency_us,
        1 => return &mut cluster.inter_node.latency_us,
        _ => {}
    }
    let params = nccl(cluster);
    if (12..18).contains(&index) {
        // with_explicit_tree writes the levels out before the fit starts; an intercept of the
        // tree's own starts from the ring's.
        let ring = params.base_latency_us;
        let tree = params
            .tree
            .as_mut()
            .expect("the fit writes the tree's levels out first");
        return match index {
            12 => &mut tree.base_latency_us.get_or_insert(ring).ll,
            13 => &mut tree.base_latency_us.get_or_insert(ring).ll128,
            14 => &mut tree.base_latency_us.get_or_insert(ring).simple,
            15 => &mut tree.level_latency_us.ll,
            16 => &mut tree.level_latency_us.ll128,
            _ => &mut tree.level_latency_us.simple,
        };
    }
    match index {
        2 => &mut params.intra_efficiency,
        3 => &mut params.inter_efficiency,
        4 => &mut params.ll_gbytes_per_s_per_rank,
        5 => &mut params.base_latency_us.ll,
        6 => &mut params.base_latency_us.ll128,
        7 => &mut params.base_latency_us.simple,
        8 => &mut params.ll128_efficiency,
        9 => &mut params.ll_multi_node_gbytes_per_s,
        10 => &mut params.nvls_efficiency,
        11 => &mut params.nvls_latency_us,
        _ => &mut params.inter_efficiency_loss_per_doubling,
    }
}

/// A cluster whose tree levels are written out (NCCL's relation to the ring's when the file has
/// none), so that the fit can move them one by one; the tree's intercept stays the ring's until
/// the fit moves it.
fn with_explicit_tree(cluster: &Cluster) -> Cluster {
    let mut explicit = cluster.clone();
    let network_hop = cluster.inter_node.latency_us;
    let params = nccl(&mut explicit);
    if params.tree.is_none() {
        let (_, level_latency_us) = nccl_tree_latency(network_hop, params);
        params.tree = Some(TreeLatency {
            base_latency_us: None,
            level_latency_us,
        });
    }
    explicit
}

fn original_tree(cluster: &Cluster) -> Option<TreeLatency> {
    match &cluster.library {
        Library::Nccl(params) => params.tree,
        Library::Mpi(_) | Library::Gloo(_) => None,
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

/// A parameter the fit left at its starting value, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    /// The parameter's field path, such as `inter_node.latency_us`.
    pub name: &'static str,
    /// Why the data cannot determine it.
    pub reason: &'static str,
}

/// A fitted parameter that ended on one of its physical bounds: the model wanted to go further,
/// so its structure, not noise, limits the fit.
#[derive(Clone, Debug, PartialEq)]
pub struct BoundHit {
    /// The parameter's field path, such as `library.intra_efficiency`.
    pub name: &'static str,
    /// The fitted value.
    pub value: f64,
    /// The bound it sits on (its minimum or its maximum).
    pub bound: f64,
}

/// A fitted cluster and what the fit could and could not say.
#[derive(Clone, Debug)]
pub struct FitReport {
    /// The cluster with the fitted parameters written in.
    pub cluster: Cluster,
    /// The objective at the optimum (mean over GPU counts of the mean |error| %, plus a tenth of
    /// the worst count's).
    pub objective: f64,
    /// Field paths of the parameters the fit moved.
    pub fitted: Vec<&'static str>,
    /// Requested parameters the fit left at their starting values, with the reason.
    pub kept: Vec<Kept>,
    /// Fitted parameters that ended on a physical bound.
    pub at_bounds: Vec<BoundHit>,
}

/// Fits an NCCL cluster and returns it with the objective (see [`fit_report`]).
pub fn fit(
    cluster: &Cluster,
    op: Op,
    measurements: &[Measurement],
    only: Option<&[String]>,
) -> Result<(Cluster, f64)> {
    fit_report(cluster, op, measurements, only).map(|r| (r.cluster, r.objective))
}

/// Fits an NCCL cluster's hop latencies, link efficiencies, LL rates, per-protocol ring and tree
/// latencies, NVLS costs and the network's loss with scale to measurements (deterministic).
/// A parameter is fitted only when the data can determine it: the network needs multi-node
/// groups, a per-level tree cost two tree depths, the loss with scale two node counts, and
/// nothing is fitted that the data does not exercise at all; the rest keep their values and
/// the report says why. The model has at most nineteen physical parameters against every size
/// and GPU count of the data, so it cannot memorize it. Pattern search in log space is
/// restarted from the given cluster and from each parameter halved and doubled, because the
/// objective has kinks wherever the chosen algorithm or protocol switches. `only` restricts
/// the fit to the named parameters (see [`fitted_fields`]).
pub fn fit_report(
    cluster: &Cluster,
    op: Op,
    measurements: &[Measurement],
    only: Option<&[String]>,
) -> Result<FitReport> {
    if !matches!(cluster.library, Library::Nccl(_)) {
        return Err(SimError::bad_value(
            "--fit-out",
            &cluster.name,
            "fitting is implemented for NCCL clusters",
        ));
    }
    if measurements.is_empty() {
        return Err(SimError::bad_value(
            "fit data",
            0,
            "no measurements to fit (everything is held out?)",
        ));
    }
    let requested: Vec<usize> = match only {
        None => (0..PARAMETERS.len()).collect(),
        Some(names) => names
            .iter()
            .map(|name| {
                PARAMETERS
                    .iter()
                    .position(|p| p.name == name)
                    .ok_or_else(|| {
                        SimError::bad_value(
                            "fitted parameter",
                            name,
                            format!("valid: {}", fitted_fields().join(", ")),
                        )
                    })
            })
            .collect::<Result<_>>()?,
    };
    let start = with_explicit_tree(cluster);
    let (indices, kept) = determinable(&start, op, measurements, requested);
    let mut starts = vec![start.clone()];
    for &index in &indices {
        for direction in [-1.0, 1.0] {
            let mut moved = start.clone();
            nudge(&mut moved, index, direction, 0.7);
            starts.push(moved);
        }
    }
    let mut best = (start, f64::INFINITY);
    for candidate in starts {
        let candidate = pattern_search(candidate, op, measurements, &indices);
        if candidate.1 < best.1 {
            best = candidate;
        }
    }
    let (mut fitted_cluster, objective) = best;
    let tree_fitted = indices.iter().any(|i| (12..18).contains(i));
    if !tree_fitted {
        // A file without tree latencies keeps following the ring's when the fit did not
        // determine the tree's.
        nccl(&mut fitted_cluster).tree = original_tree(cluster);
    }
    let at_bounds = hits(&mut fitted_cluster, &indices);
    Ok(FitReport {
        cluster: fitted_cluster,
        objective,
        fitted: indices.iter().map(|&i| PARAMETERS[i].name).collect(),
        kept,
        at_bounds,
    })
}

/// Splits `requested` parameters into those the data determines and those it cannot.
fn determinable(
    start: &Cluster,
    op: Op,
    measurements: &[Measurement],
    requested: Vec<usize>,
) -> (Vec<usize>, Vec<Kept>) {
    let shape = DataShape::of(start, measurements);
    let base_score = objective(start, op, measurements);
    let mut kept = Vec::new();
    let mut indices = Vec::new();
    for index in requested {
        let name = PARAMETERS[index].name;
        match shape.missing(PARAMETERS[index].needs) {
            Some(reason) => kept.push(Kept { name, reason }),
            None if !exercised(start, op, measurements, index, base_score) => kept.push(Kept {
                name,
                reason: "the data barely depends on it (doubling or halving it moves the error by less than 0.05 points)",
            }),
            None => indices.push(index),
        }
    }
    (indices, kept)
}

/// The names of the parameters `measurements` can determine on `cluster` (what a fit to them
/// would move).
pub fn determinable_fields(
    cluster: &Cluster,
    op: Op,
    measurements: &[Measurement],
) -> Vec<&'static str> {
    if !matches!(cluster.library, Library::Nccl(_)) {
        return Vec::new();
    }
    let start = with_explicit_tree(cluster);
    let all = (0..PARAMETERS.len()).collect();
    let (indices, _) = determinable(&start, op, measurements, all);
    indices.iter().map(|&i| PARAMETERS[i].name).collect()
}

/// How close to a bound counts as on it, relative to the bound (absolute for a bound of 0): the
/// search moves parameters by factors, so one driven towards 0 (a latency of 0.0002 µs) never
/// reaches the bound exactly.
const AT_BOUND: f64 = 1e-3;

/// The parameters among `indices` that sit on one of their bounds.
fn hits(cluster: &mut Cluster, indices: &[usize]) -> Vec<BoundHit> {
    indices
        .iter()
        .filter_map(|&index| {
            let p = &PARAMETERS[index];
            let (min, max) = bounds(cluster, index);
            let value = *parameter(cluster, index);
            let bound = [min, max]
                .into_iter()
                .find(|b| b.is_finite() && (value - b).abs() <= AT_BOUND * b.abs().max(1.0))?;
            Some(BoundHit {
                name: p.name,
                value,
                bound,
            })
        })
        .collect()
}

/// The named parameters of an NCCL cluster that sit on one of their physical bounds.
pub fn bound_hits(cluster: &Cluster, names: &[&str]) -> Vec<BoundHit> {
    if !matches!(cluster.library, Library::Nccl(_)) {
        return Vec::new();
    }
    let mut explicit = with_explicit_tree(cluster);
    let indices: Vec<usize> = names
        .iter()
        .filter_map(|name| PARAMETERS.iter().position(|p| p.name == *name))
        .collect();
    hits(&mut explicit, &indices)
}

/// What the fit data covers: multi-node node counts and tree depths.
struct DataShape {
    node_counts: BTreeSet<u32>,
    tree_depths: BTreeSet<u32>,
}

impl DataShape {
    fn of(cluster: &Cluster, measurements: &[Measurement]) -> DataShape {
        let node_counts: BTreeSet<u32> = measurements
            .iter()
            .map(|m| group_for(cluster, m.gpus).nodes)
            .filter(|&n| n > 1)
            .collect();
        let tree_depths = node_counts.iter().map(|n| n.ilog2()).collect();
        DataShape {
            node_counts,
            tree_depths,
        }
    }

    /// Why the data cannot determine a parameter with these needs, if it cannot.
    fn missing(&self, needs: Needs) -> Option<&'static str> {
        match needs {
            Needs::Anything => None,
            Needs::Network if self.node_counts.is_empty() => {
                Some("no multi-node data: the network is not exercised")
            }
            Needs::TreeDepths if self.tree_depths.len() < 2 => {
                Some("data at one tree depth cannot tell a per-level cost from the intercept")
            }
            Needs::NodeCounts
                if self.node_counts.len() < 2 || self.node_counts.iter().all(|&n| n <= 2) =>
            {
                Some("data at one node count cannot show a loss with scale")
            }
            _ => None,
        }
    }
}

/// Change of the objective (percentage points) below which doubling or halving a parameter
/// counts as not exercising it: the data would let it drift anywhere, onto a bound included.
const MIN_SENSITIVITY: f64 = 0.05;

/// Whether doubling or halving the parameter changes the objective noticeably.
fn exercised(
    start: &Cluster,
    op: Op,
    measurements: &[Measurement],
    index: usize,
    base_score: f64,
) -> bool {
    [-1.0, 1.0].into_iter().any(|direction| {
        let mut moved = start.clone();
        nudge(&mut moved, index, direction, 0.7);
        (objective(&moved, op, measurements) - base_score).abs() > MIN_SENSITIVITY
    })
}

/// Index of `library.ll128_efficiency` in [`PARAMETERS`].
const LL128_EFFICIENCY: usize = 8;

/// The bounds of parameter `index` on `cluster`: the static ones, and for LL128's share of
/// Simple's bandwidth the ceiling the link efficiencies leave it.
fn bounds(cluster: &mut Cluster, index: usize) -> (f64, f64) {
    let p = &PARAMETERS[index];
    if index == LL128_EFFICIENCY {
        (p.min, nccl(cluster).ll128_ceiling())
    } else {
        (p.min, p.max)
    }
}

/// Moves parameter `index` by `step` in `direction`, within its bounds; LL128's share follows a
/// link efficiency that rises past its ceiling.
fn nudge(cluster: &mut Cluster, index: usize, direction: f64, step: f64) {
    let p = &PARAMETERS[index];
    let (min, max) = bounds(cluster, index);
    let value = parameter(cluster, index);
    let moved = match p.step {
        Step::Factor => *value * (direction * step).exp(),
        Step::Add(unit) => *value + direction * step * unit,
    };
    *value = moved.clamp(min, max);
    let params = nccl(cluster);
    params.ll128_efficiency = params.ll128_efficiency.min(params.ll128_ceiling());
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
                nudge(&mut candidate, index, direction, step);
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

/// Names of the fittable fields, for reports and `--fit-only`.
pub fn fitted_fields() -> Vec<&'static str> {
    PARAMETERS.iter().map(|p| p.name).collect()
}
