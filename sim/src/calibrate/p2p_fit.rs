//! A TCP library's parameter-server costs fitted to a sweep's push-pull rows.
//!
//! They are what a server pays per message beside the bytes, and how many rounds to different
//! servers the hosts run at once.
//!
//! A parameter server takes its peers' pushes one message at a time and sends its result the
//! same way. The collective fit's per-call and per-message costs describe a collective's
//! launch and its ring's messages; a point-to-point receive of bytes that have arrived costs
//! something else. `python -m syncopate.torch.sweep` times `syncopate.torch`'s own push-pull
//! (rank 0 serving, one rank per node); the cost per message is the median over the sizes of
//! what each row's time leaves once the links' share is taken out. Its `push-pull-all` rows
//! time one round to every server at once: where the links would let them all run at full
//! speed but the hosts do not (a lab's nodes share one machine's kernel and cores), the median
//! of ranks × (one round's time) / (their time) is the rounds that run at once.

use crate::base::error::{Result, SimError};
use crate::base::limits::MAX_DURATION_US;
use crate::calibrate::Measurement;
use crate::collective::{self, ServerLink};
use crate::inputs::topology::Cluster;

/// The sweep's name for the push-pull rows.
pub const OP: &str = "push-pull";
/// The sweep's name for the rows of one push-pull to every server at once.
pub const OP_ALL: &str = "push-pull-all";

/// One row and what it says the per-message cost is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// The sweep's row.
    pub measured: Measurement,
    /// The round's time with no cost per message.
    pub bare_us: f64,
    /// Cost per message the row implies, µs.
    pub per_message_us: f64,
}

/// One size timed one round at a time and every server's round at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AtOnce {
    /// Bytes of the size timed.
    pub bytes: u64,
    /// One round's time (the median over its rows), µs.
    pub one_us: f64,
    /// Time of every server's round at once, µs.
    pub all_us: f64,
    /// Rounds that ran at full speed together: ranks × one / all, within 1..=ranks.
    pub rounds: f64,
}

/// The fitted cost per message (at least 0), the rounds that run at once (none without
/// `push-pull-all` rows), and the rows they come from.
#[derive(Clone, Debug, PartialEq)]
pub struct P2pFit {
    /// Fitted cost per message, µs, at least 0.
    pub per_message_us: f64,
    /// The push-pull rows, each with the cost it implies.
    pub rows: Vec<Row>,
    /// Rounds to different servers that run at once; `None` without `push-pull-all` rows.
    pub rounds_at_once: Option<f64>,
    /// The `push-pull-all` sizes that `rounds_at_once` comes from.
    pub at_once: Vec<AtOnce>,
}

/// `cluster` with `per_message_us` as its TCP library's point-to-point cost (and its other
/// parameters as they are).
fn with_cost(cluster: &Cluster, per_message_us: f64) -> Cluster {
    let mut out = cluster.clone();
    if let Some(params) = out.library.tcp_mut() {
        params.p2p_message_overhead_us = Some(per_message_us);
    }
    out
}

/// The round's time on `cluster` for one row, served by node 0 as the sweep serves it.
fn round_us(cluster: &Cluster, bytes: u64) -> Result<f64> {
    Ok(collective::push_pull(cluster, bytes, ServerLink::Node(0))?
        .0
        .time
        .as_us())
}

/// The cost per message that describes `rows` (one rank per node of `cluster`, as the sweep
/// runs on a lab) on `cluster`'s links, and the rounds at once that `all` (the same sizes to
/// every server at once) imply. `label` names the rows' file in errors.
pub fn fit(
    cluster: &Cluster,
    rows: &[Measurement],
    all: &[Measurement],
    label: &str,
) -> Result<P2pFit> {
    if cluster.library.tcp().is_none() {
        return Err(SimError::bad_value(
            label,
            OP,
            format!(
                "`{}` runs NCCL; point-to-point costs are fitted for a TCP library (MPI or gloo)",
                cluster.name
            ),
        ));
    }
    if let Some(row) = rows.iter().chain(all).find(|r| r.gpus != cluster.nodes) {
        return Err(SimError::bad_value(
            label,
            format!("{OP} on {} ranks", row.gpus),
            format!(
                "the sweep runs one rank per node: `{}` has {} nodes",
                cluster.name, cluster.nodes
            ),
        ));
    }
    let (bare, unit) = (with_cost(cluster, 0.0), with_cost(cluster, 1.0));
    let fitted: Vec<Row> = rows
        .iter()
        .map(|&measured| {
            let bare_us = round_us(&bare, measured.bytes)?;
            // Microseconds of the round per microsecond of cost per message.
            let messages = round_us(&unit, measured.bytes)? - bare_us;
            let per_message_us = if messages > 0.0 {
                (measured.time_us - bare_us) / messages
            } else {
                0.0
            };
            Ok(Row {
                measured,
                bare_us,
                per_message_us,
            })
        })
        .collect::<Result<_>>()?;
    let costs: Vec<f64> = fitted.iter().map(|r| r.per_message_us).collect();
    let Some(median) = crate::base::stats::median(&costs) else {
        return Err(SimError::bad_value(
            label,
            OP,
            "has no push-pull rows (`python -m syncopate.torch.sweep` times them)",
        ));
    };
    if !(median.is_finite() && median <= MAX_DURATION_US) {
        return Err(SimError::bad_value(
            label,
            crate::base::limits::num(median),
            "the fitted cost per point-to-point message is out of range",
        ));
    }
    let ranks = f64::from(cluster.nodes);
    let at_once: Vec<AtOnce> = all
        .iter()
        .filter_map(|a| {
            // A size timed more than once one round at a time: the median of its times.
            let same: Vec<f64> = rows
                .iter()
                .filter(|r| r.bytes == a.bytes)
                .map(|r| r.time_us)
                .collect();
            let one_us = crate::base::stats::median(&same)?;
            Some(AtOnce {
                bytes: a.bytes,
                one_us,
                all_us: a.time_us,
                rounds: (ranks * one_us / a.time_us).clamp(1.0, ranks),
            })
        })
        .collect();
    let rounds: Vec<f64> = at_once.iter().map(|a| a.rounds).collect();
    Ok(P2pFit {
        per_message_us: median.max(0.0),
        rows: fitted,
        rounds_at_once: crate::base::stats::median(&rounds),
        at_once,
    })
}

/// `cluster` with the fitted costs in its TCP library.
pub fn apply(cluster: &Cluster, fitted: &P2pFit) -> Cluster {
    let mut out = with_cost(cluster, fitted.per_message_us);
    if let Some(params) = out.library.tcp_mut() {
        params.p2p_rounds_at_once = fitted.rounds_at_once;
    }
    out
}

/// The fit in words, each row with its time, its time without message costs and the cost it
/// implies, for a provenance.
pub fn describe(fitted: &P2pFit) -> String {
    let rows: Vec<String> = fitted
        .rows
        .iter()
        .map(|r| {
            format!(
                "{} ranks {} B: {:.1} µs measured, {:.1} without ({:.1} µs per message)",
                r.measured.gpus, r.measured.bytes, r.measured.time_us, r.bare_us, r.per_message_us
            )
        })
        .collect();
    let described = format!(
        "p2p_message_overhead_us {:.2}: the median (at least 0) over the push-pull rows of what each round's time leaves beyond its links' share, per message the server takes or sends: {}",
        fitted.per_message_us,
        rows.join(", ")
    );
    match fitted.rounds_at_once {
        None => described,
        Some(rounds) => {
            let sizes: Vec<String> = fitted
                .at_once
                .iter()
                .map(|a| {
                    format!(
                        "{} B: {:.1} µs one round, {:.1} every server's at once ({:.2} rounds)",
                        a.bytes, a.one_us, a.all_us, a.rounds
                    )
                })
                .collect();
            format!(
                "{described}; p2p_rounds_at_once {rounds:.2}: the median over the sizes of ranks × one round's time / the time of a round to every server at once: {}",
                sizes.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::topology::ClusterOverrides;

    fn lab() -> Cluster {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../experiments/lab-validation/clusters/lab-4n-1g.json"
        );
        Cluster::load(path, ClusterOverrides::default()).unwrap()
    }

    fn rows(cluster: &Cluster, sizes: &[u64]) -> Vec<Measurement> {
        sizes
            .iter()
            .map(|&bytes| Measurement {
                gpus: cluster.nodes,
                bytes,
                time_us: round_us(cluster, bytes).unwrap(),
            })
            .collect()
    }

    #[test]
    fn the_fit_recovers_the_cost_the_rows_were_made_with() {
        let truth = with_cost(&lab(), 123.0);
        let one = rows(&truth, &[4096, 65536, 1 << 20]);
        // Every server's round at once takes 2.5 rounds' time on 4 ranks: 1.6 at once.
        let all: Vec<Measurement> = one
            .iter()
            .map(|m| Measurement {
                time_us: m.time_us * 2.5,
                ..*m
            })
            .collect();
        let fitted = fit(&lab(), &one, &all, "s.csv").unwrap();
        assert!((fitted.per_message_us - 123.0).abs() < 1e-3, "{fitted:?}");
        assert!(
            (fitted.rounds_at_once.unwrap() - 1.6).abs() < 1e-9,
            "{fitted:?}"
        );
        let applied = apply(&lab(), &fitted);
        assert!((round_us(&applied, 4096).unwrap() - round_us(&truth, 4096).unwrap()).abs() < 0.01);
        let at_once = applied.library.tcp().unwrap().p2p_rounds_at_once.unwrap();
        assert!((at_once - 1.6).abs() < 1e-9, "{at_once}");
        let described = describe(&fitted);
        assert!(
            described.contains("p2p_message_overhead_us 123.00"),
            "{described}"
        );
        assert!(described.contains("p2p_rounds_at_once 1.60"), "{described}");
        // Without rounds at once, none is fitted.
        let alone = fit(&lab(), &one, &[], "s.csv").unwrap();
        assert_eq!(alone.rounds_at_once, None);
    }

    #[test]
    fn rows_faster_than_the_links_allow_fit_no_negative_cost() {
        let mut fast = rows(&lab(), &[1 << 20]);
        fast[0].time_us /= 2.0;
        assert_eq!(
            fit(&lab(), &fast, &[], "s.csv").unwrap().per_message_us,
            0.0
        );
    }

    #[test]
    fn rows_of_another_rank_count_or_none_at_all_are_refused() {
        let mut other = rows(&lab(), &[4096]);
        other[0].gpus = 2;
        let err = fit(&lab(), &other, &[], "s.csv").unwrap_err().to_string();
        assert!(err.contains("s.csv") && err.contains("4 nodes"), "{err}");
        let err = fit(&lab(), &[], &[], "s.csv").unwrap_err().to_string();
        assert!(err.contains("no push-pull rows"), "{err}");
    }
}
