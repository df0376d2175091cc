//! GRACE's data checked against itself: the rows its own runs contradict are flagged.
//!
//! The runs are its `upper-bound` runs or its 1-worker runs.

use super::measured::Measurement;
use crate::base::stats::median;

/// How many rows each consistency rule excluded.
#[derive(Debug, Default)]
pub(super) struct Exclusions {
    /// Rule 1: below `min_ratio` of GRACE's `upper-bound` row of the same configuration.
    pub below_upper_bound: usize,
    /// Rule 2: a configuration whose `upper-bound` run takes far longer than those of the other
    /// methods that send as many bytes.
    pub disturbed_run: usize,
    /// Rule 3: a 1-worker `none` row slower per worker than most of its model's multi-worker rows.
    pub slow_one_worker: usize,
}

/// The thresholds of the consistency rules, and what rule 2 needs to know of a configuration.
pub(super) struct Rules<'a> {
    /// Rule 1: the least share of its `upper-bound` row a `throughput` row may reach.
    pub min_ratio: f64,
    /// Rule 2: the most an `upper-bound` run's time may exceed its kind's median by.
    pub peer_max_ratio: f64,
    /// Rule 3: the calibration rows' most workers.
    pub max_workers: u32,
    /// Rule 2: a configuration's payload bytes for a fixed element count, the same for every
    /// model; `None` for a method we do not cover or whose bytes depend on the shapes.
    pub volume: &'a dyn Fn(&Measurement) -> Option<u64>,
}

/// Configurations whose payloads are within this share of each other's bytes send "as many
/// bytes" for rule 2 (GRACE's one-byte codes differ only by a few bytes of scales).
const SAME_VOLUME: f64 = 0.01;
/// Rule 2 judges a configuration only against at least this many rows of other methods, so
/// that their median is not one run's, nor the same method's with memory on or off (which
/// ran alike and may have been disturbed alike).
const MIN_PEERS: usize = 3;

/// Rule 2, on the rows rule 1 left: GRACE's `upper-bound` runs move a configuration's
/// compressed volume without its codec's work, so those with the same model, workers,
/// communication method and payload bytes take about the same time. A configuration whose
/// `upper-bound` run takes more than `max_ratio` times the median of the other methods' runs
/// of its kind was disturbed (the network, another job), and its `throughput` row with it.
fn flag_disturbed_runs(
    data: &mut [Measurement],
    upper: &[Measurement],
    max_ratio: f64,
    volume: &dyn Fn(&Measurement) -> Option<u64>,
) -> usize {
    let sized: Vec<(&Measurement, u64)> =
        upper.iter().filter_map(|u| Some((u, volume(u)?))).collect();
    let mut count = 0;
    for m in data.iter_mut().filter(|m| m.excluded.is_none()) {
        let Some(&(own, bytes)) = sized.iter().find(|(u, _)| same_configuration(m, u)) else {
            continue;
        };
        // Seconds per image over all workers: at one worker count, proportional to the time
        // of an iteration.
        let peer_times: Vec<f64> = sized
            .iter()
            .filter(|(u, b)| {
                (&u.model, u.workers, &u.comm_method) == (&own.model, own.workers, &own.comm_method)
                    && u.method != own.method
                    && (*b as f64 - bytes as f64).abs() <= SAME_VOLUME * bytes as f64
            })
            .map(|(u, _)| 1.0 / u.throughput)
            .collect();
        if peer_times.len() < MIN_PEERS {
            continue;
        }
        let Some(median) = median(&peer_times) else {
            continue;
        };
        let ratio = (1.0 / own.throughput) / median;
        if ratio > max_ratio {
            m.excluded = Some(format!(
                "its upper-bound row ({:.1} img/s) takes {ratio:.2}× the median time of the {} upper-bound rows of other methods that send as many bytes ({:.1} img/s)",
                own.throughput,
                peer_times.len(),
                1.0 / median
            ));
            count += 1;
        }
    }
    count
}

/// Whether two rows are runs of one configuration: model, workers, method, ratio, memory and
/// communication method.
fn same_configuration(a: &Measurement, b: &Measurement) -> bool {
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
}

/// Flags the rows GRACE's own data contradicts, in place; the rules, in order, each on the
/// rows the ones before left:
/// 1. a `throughput` row below `min_ratio` × the `upper-bound` row of the same configuration
///    (model, workers, method, ratio, memory, communication method);
/// 2. a configuration whose `upper-bound` run was disturbed ([`flag_disturbed_runs`]);
/// 3. a model's 1-worker `none` row that runs slower per worker than more than half of that
///    model's remaining multi-worker rows with at most `max_workers` workers (the calibration
///    rows, so that no held-out row decides what the fit uses): adding workers only adds
///    communication, so a 1-worker run cannot be slower per worker than a multi-worker run of
///    the same model and batch.
pub(super) fn flag_inconsistent(
    data: &mut [Measurement],
    upper: &[Measurement],
    rules: &Rules,
) -> Exclusions {
    let Rules {
        min_ratio,
        peer_max_ratio,
        max_workers,
        volume,
    } = *rules;
    let mut counts = Exclusions::default();
    for m in data.iter_mut() {
        if let Some(u) = upper.iter().find(|u| same_configuration(m, u)) {
            if m.throughput < min_ratio * u.throughput {
                m.excluded = Some(format!(
                    "below {:.2}× GRACE's upper-bound row ({:.1} img/s)",
                    min_ratio, u.throughput
                ));
                counts.below_upper_bound += 1;
            }
        }
    }
    counts.disturbed_run = flag_disturbed_runs(data, upper, peer_max_ratio, volume);
    let models: Vec<String> = data.iter().map(|m| m.model.clone()).collect();
    for model in models {
        let per_worker: Vec<f64> = data
            .iter()
            .filter(|m| {
                m.model == model && (2..=max_workers).contains(&m.workers) && m.excluded.is_none()
            })
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
                "slower per worker than {faster} of its model's {} rows with 2 to {max_workers} workers",
                per_worker.len()
            ));
            counts.slow_one_worker += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(model: &str, workers: u32, method: &str, throughput: f64) -> Measurement {
        Measurement::test_row(model, workers, method, throughput)
    }

    #[test]
    fn rows_far_below_their_upper_bound_are_excluded() {
        let mut data = vec![
            row("resnet50", 2, "fp16", 100.0),
            row("resnet50", 2, "dgc", 200.0),
            row("resnet50", 4, "fp16", 10.0),
        ];
        // fp16 at 2 workers: 100 < 0.5 × 300; dgc at 2: 200 ≥ 0.5 × 300; fp16 at 4 has no bound.
        let upper = [
            row("resnet50", 2, "fp16", 300.0),
            row("resnet50", 2, "dgc", 300.0),
        ];
        let counts = flag(&mut data, &upper, 0.5, 8);
        assert_eq!(counts.below_upper_bound, 1);
        assert_eq!(counts.slow_one_worker, 0);
        let reason = data[0].excluded.as_deref().unwrap();
        assert!(
            reason.contains("0.50×") && reason.contains("300.0 img/s"),
            "{reason}"
        );
        assert!(data[1].excluded.is_none() && data[2].excluded.is_none());
    }

    #[test]
    fn an_upper_bound_of_another_configuration_does_not_apply() {
        let mut data = vec![row("resnet50", 2, "fp16", 100.0)];
        let mut other = row("resnet50", 2, "fp16", 1000.0);
        other.memory = "true".to_string();
        let counts = flag(&mut data, &[other], 0.5, 8);
        assert_eq!(counts.below_upper_bound, 0);
        assert!(data[0].excluded.is_none());
    }

    #[test]
    fn a_one_worker_row_slower_per_worker_than_most_multi_worker_rows_is_excluded() {
        // Per worker: 60, 55 and 40 img/s against the 1-worker row's 50: two of three are faster.
        let mut data = vec![
            row("vgg19", 1, "none", 50.0),
            row("vgg19", 2, "none", 120.0),
            row("vgg19", 4, "fp16", 220.0),
            row("vgg19", 8, "dgc", 320.0),
        ];
        let counts = flag(&mut data, &[], 0.5, 8);
        assert_eq!(counts.slow_one_worker, 1);
        let reason = data[0].excluded.as_deref().unwrap();
        assert!(reason.contains("2 of its model's 3 rows"), "{reason}");
        assert!(data[1..].iter().all(|m| m.excluded.is_none()));
    }

    #[test]
    fn rows_above_max_workers_do_not_judge_the_one_worker_row() {
        // At 8 workers two rows are faster per worker, but only 2-worker rows count.
        let mut data = vec![
            row("vgg19", 1, "none", 50.0),
            row("vgg19", 2, "none", 80.0),
            row("vgg19", 8, "fp16", 480.0),
            row("vgg19", 8, "dgc", 800.0),
        ];
        let counts = flag(&mut data, &[], 0.5, 2);
        assert_eq!(counts.slow_one_worker, 0);
        assert!(data[0].excluded.is_none());
        assert_eq!(flag(&mut data, &[], 0.5, 8).slow_one_worker, 1);
    }

    #[test]
    fn a_one_worker_row_faster_than_half_or_more_stays() {
        // Per worker: 60 and 40 img/s against 50: one of two is faster, not more than half.
        let mut data = vec![
            row("vgg19", 1, "none", 50.0),
            row("vgg19", 2, "none", 120.0),
            row("vgg19", 4, "none", 160.0),
            // Another model's rows do not count against vgg19.
            row("resnet50", 2, "none", 1000.0),
        ];
        let counts = flag(&mut data, &[], 0.5, 8);
        assert_eq!(counts.slow_one_worker, 0);
        assert!(data.iter().all(|m| m.excluded.is_none()));
    }

    #[test]
    fn rows_excluded_by_the_upper_bound_do_not_count_against_the_one_worker_row() {
        let mut data = vec![
            row("vgg19", 1, "none", 50.0),
            row("vgg19", 2, "none", 120.0),
            row("vgg19", 4, "none", 240.0),
            row("vgg19", 8, "none", 320.0),
        ];
        // Without the rule-1 exclusions two of three rows (60, 60, 40 per worker) would be faster.
        let upper = [
            row("vgg19", 2, "none", 1000.0),
            row("vgg19", 4, "none", 1000.0),
        ];
        let counts = flag(&mut data, &upper, 0.5, 8);
        assert_eq!(counts.below_upper_bound, 2);
        assert_eq!(counts.slow_one_worker, 0);
        assert!(data[0].excluded.is_none());
    }

    /// Bytes by method: the one-byte codes alike, `topk` 8 times less, `fp16` twice more.
    fn volume(m: &Measurement) -> Option<u64> {
        match m.method.as_str() {
            "signsgd" | "signum" | "terngrad" => Some(1000),
            "qsgd" => Some(1004),
            "topk" => Some(125),
            "fp16" => Some(2000),
            _ => None,
        }
    }

    /// The rules at these thresholds, rule 2 over [`volume`].
    fn flag_at(
        data: &mut [Measurement],
        upper: &[Measurement],
        min_ratio: f64,
        max_workers: u32,
        peer_max_ratio: f64,
    ) -> Exclusions {
        let rules = Rules {
            min_ratio,
            peer_max_ratio,
            max_workers,
            volume: &volume,
        };
        flag_inconsistent(data, upper, &rules)
    }

    fn flag(
        data: &mut [Measurement],
        upper: &[Measurement],
        min_ratio: f64,
        max_workers: u32,
    ) -> Exclusions {
        flag_at(data, upper, min_ratio, max_workers, 1.5)
    }

    fn with_memory(mut m: Measurement) -> Measurement {
        m.memory = "true".to_string();
        m
    }

    fn allgather(mut m: Measurement) -> Measurement {
        m.comm_method = "allgather".to_string();
        m
    }

    /// Upper bounds at 8 workers: qsgd (memory off and on) 1000 img/s, the other one-byte
    /// codes 1500 to 1700, topk and fp16 alone of their bytes.
    fn upper_at_8() -> Vec<Measurement> {
        vec![
            row("resnet50", 8, "qsgd", 1000.0),
            with_memory(row("resnet50", 8, "qsgd", 1000.0)),
            row("resnet50", 8, "signsgd", 1600.0),
            row("resnet50", 8, "signum", 1500.0),
            row("resnet50", 8, "terngrad", 1700.0),
            row("resnet50", 8, "topk", 300.0),
            row("resnet50", 8, "fp16", 1200.0),
        ]
    }

    #[test]
    fn a_run_far_slower_than_other_methods_of_its_volume_is_excluded() {
        let mut data = vec![
            row("resnet50", 8, "qsgd", 900.0),
            with_memory(row("resnet50", 8, "qsgd", 950.0)),
            row("resnet50", 8, "signsgd", 1500.0),
            row("resnet50", 8, "topk", 800.0),
            row("resnet50", 4, "qsgd", 1000.0),
        ];
        // Both qsgd runs take 1.6 times the median time of signsgd, signum and terngrad (1600
        // img/s): the other qsgd run is the same method and not among its peers. topk has no
        // peers; at 4 workers qsgd has one of its communication method (terngrad gathers).
        let mut upper = upper_at_8();
        upper.extend([
            row("resnet50", 4, "qsgd", 500.0),
            row("resnet50", 4, "signsgd", 1000.0),
            row("resnet50", 4, "signum", 1000.0),
            allgather(row("resnet50", 4, "terngrad", 1000.0)),
        ]);
        let counts = flag_at(&mut data, &upper, 0.5, 8, 1.5);
        assert_eq!(counts.disturbed_run, 2);
        for m in &data[..2] {
            let reason = m.excluded.as_deref().unwrap();
            assert!(
                reason.contains("1.60×")
                    && reason.contains("3 upper-bound rows of other methods")
                    && reason.contains("1600.0 img/s"),
                "{reason}"
            );
        }
        assert!(data[2..].iter().all(|m| m.excluded.is_none()));
        // Under a factor of 1.7 the same runs stay.
        let mut again = vec![row("resnet50", 8, "qsgd", 900.0)];
        assert_eq!(flag_at(&mut again, &upper, 0.5, 8, 1.7).disturbed_run, 0);
    }

    #[test]
    fn a_row_rule_one_excluded_is_not_counted_again() {
        let mut data = vec![row("resnet50", 8, "qsgd", 100.0)];
        let counts = flag_at(&mut data, &upper_at_8(), 0.5, 8, 1.5);
        assert_eq!((counts.below_upper_bound, counts.disturbed_run), (1, 0));
        assert!(data[0].excluded.as_deref().unwrap().contains("0.50×"));
    }

    #[test]
    fn a_disturbed_calibration_row_does_not_judge_the_one_worker_row() {
        // Per worker 60 (qsgd, disturbed) and 40 against the 1-worker row's 50: with the
        // disturbed row one of two would be faster; without it none of one is.
        let mut data = vec![
            row("resnet50", 1, "none", 50.0),
            row("resnet50", 2, "qsgd", 120.0),
            row("resnet50", 2, "fp16", 80.0),
        ];
        let upper = [
            row("resnet50", 2, "qsgd", 100.0),
            row("resnet50", 2, "signsgd", 1600.0),
            row("resnet50", 2, "signum", 1500.0),
            row("resnet50", 2, "terngrad", 1700.0),
        ];
        let counts = flag_at(&mut data, &upper, 0.5, 8, 1.5);
        assert_eq!((counts.disturbed_run, counts.slow_one_worker), (1, 0));
        assert!(data[0].excluded.is_none());
    }

    #[test]
    fn a_one_worker_row_is_counted_once() {
        let mut data = vec![
            row("vgg19", 1, "none", 50.0),
            row("vgg19", 2, "none", 120.0),
        ];
        let upper = [row("vgg19", 1, "none", 1000.0)];
        let counts = flag(&mut data, &upper, 0.5, 8);
        assert_eq!((counts.below_upper_bound, counts.slow_one_worker), (1, 0));
        assert!(data[0].excluded.as_deref().unwrap().contains("upper-bound"));
    }
}
