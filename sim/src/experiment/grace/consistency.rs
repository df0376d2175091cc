//! GRACE's data checked against itself: the rows its own `upper-bound` runs or its 1-worker runs contradict are flagged.

use super::measured::Measurement;

/// How many rows each consistency rule excluded.
#[derive(Debug, Default)]
pub struct Exclusions {
    /// Rule 1: below `min_ratio` of GRACE's `upper-bound` row of the same configuration.
    pub below_upper_bound: usize,
    /// Rule 2: a 1-worker `none` row slower per worker than most of its model's multi-worker rows.
    pub slow_one_worker: usize,
    /// Rule 3: a configuration whose `upper-bound` run is far slower than those of the
    /// configurations that send as many bytes.
    pub disturbed_run: usize,
}

/// Configurations whose payloads are within this share of each other's bytes send "as many
/// bytes" for rule 3 (GRACE's one-byte codes differ only by a few bytes of scales).
const SAME_VOLUME: f64 = 0.01;
/// Rule 3 judges a configuration only against at least this many of its kind, itself included,
/// so that their median is not one run's.
const MIN_PEERS: usize = 3;

/// Rule 3, on the rows no earlier rule excluded: GRACE's `upper-bound` runs move a
/// configuration's compressed volume without its codec's work, so those with the same model,
/// workers, communication method and bytes per iteration (`volume`; `None` for a method we do
/// not cover) take about the same time. A configuration whose `upper-bound` row's throughput is below the median of
/// its kind divided by `max_ratio` was disturbed (the network, another job), and its
/// `throughput` row with it. Returns how many rows it excluded.
pub fn flag_disturbed_runs(
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
        let mut peers: Vec<f64> = sized
            .iter()
            .filter(|(u, b)| {
                (&u.model, u.workers, &u.comm_method) == (&own.model, own.workers, &own.comm_method)
                    && (*b as f64 - bytes as f64).abs() <= SAME_VOLUME * bytes as f64
            })
            .map(|(u, _)| u.throughput)
            .collect();
        if peers.len() < MIN_PEERS {
            continue;
        }
        peers.sort_by(f64::total_cmp);
        let middle = peers.len() / 2;
        let median = (peers[(peers.len() - 1) / 2] + peers[middle]) / 2.0;
        if own.throughput * max_ratio < median {
            m.excluded = Some(format!(
                "its upper-bound row ({:.1} img/s) takes {:.2}× the time of the median of the {} upper-bound rows that send as many bytes ({median:.1} img/s)",
                own.throughput,
                median / own.throughput,
                peers.len()
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

/// Flags the rows GRACE's own data contradicts, in place; the rules, in order:
/// 1. a `throughput` row below `min_ratio` × the `upper-bound` row of the same configuration
///    (model, workers, method, ratio, memory, communication method);
/// 2. a model's 1-worker `none` row that runs slower per worker than more than half of that
///    model's remaining multi-worker rows with at most `max_workers` workers (the calibration
///    rows, so that no held-out row decides what the fit uses): adding workers only adds
///    communication, so a 1-worker run cannot be slower per worker than a multi-worker run of
///    the same model and batch.
///
/// Rule 3, [`flag_disturbed_runs`], judges the rows these leave.
pub fn flag_inconsistent(
    data: &mut [Measurement],
    upper: &[Measurement],
    min_ratio: f64,
    max_workers: u32,
) -> Exclusions {
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
        let counts = flag_inconsistent(&mut data, &upper, 0.5, 8);
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
        let counts = flag_inconsistent(&mut data, &[other], 0.5, 8);
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
        let counts = flag_inconsistent(&mut data, &[], 0.5, 8);
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
        let counts = flag_inconsistent(&mut data, &[], 0.5, 2);
        assert_eq!(counts.slow_one_worker, 0);
        assert!(data[0].excluded.is_none());
        assert_eq!(flag_inconsistent(&mut data, &[], 0.5, 8).slow_one_worker, 1);
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
        let counts = flag_inconsistent(&mut data, &[], 0.5, 8);
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
        let counts = flag_inconsistent(&mut data, &upper, 0.5, 8);
        assert_eq!(counts.below_upper_bound, 2);
        assert_eq!(counts.slow_one_worker, 0);
        assert!(data[0].excluded.is_none());
    }

    fn allgather(mut m: Measurement) -> Measurement {
        m.comm_method = "allgather".to_string();
        m
    }

    /// Bytes by method: the one-byte codes alike, `topk` 8 times less, `fp16` twice more.
    fn volume(m: &Measurement) -> Option<u64> {
        match m.method.as_str() {
            "signsgd" | "terngrad" => Some(1000),
            "qsgd" => Some(1004),
            "topk" => Some(125),
            "fp16" => Some(2000),
            _ => None,
        }
    }

    #[test]
    fn a_run_far_slower_than_its_equal_volume_peers_is_excluded() {
        let mut data = vec![
            row("resnet50", 8, "qsgd", 900.0),
            row("resnet50", 8, "signsgd", 1500.0),
            row("resnet50", 8, "topk", 800.0),
            row("resnet50", 4, "qsgd", 1000.0),
        ];
        // At 8 workers the one-byte codes' upper bounds are 1000, 1600 and 1700: the median
        // 1600 is 1.6 times qsgd's. topk sends other bytes and has no peers; at 4 workers qsgd
        // has one peer that reduces as it does (terngrad's allgather moves other traffic).
        let upper = [
            row("resnet50", 8, "qsgd", 1000.0),
            row("resnet50", 8, "signsgd", 1600.0),
            row("resnet50", 8, "terngrad", 1700.0),
            row("resnet50", 8, "topk", 300.0),
            row("resnet50", 8, "fp16", 1200.0),
            row("resnet50", 4, "qsgd", 500.0),
            row("resnet50", 4, "signsgd", 1000.0),
            allgather(row("resnet50", 4, "terngrad", 1000.0)),
            row("vgg19", 4, "signsgd", 1000.0),
        ];
        assert_eq!(flag_disturbed_runs(&mut data, &upper, 1.5, &volume), 1);
        let reason = data[0].excluded.as_deref().unwrap();
        assert!(
            reason.contains("1.60×") && reason.contains("3 upper-bound rows"),
            "{reason}"
        );
        assert!(data[1..].iter().all(|m| m.excluded.is_none()));
        // Under a ratio of 1.7 the same run stays.
        let mut again = vec![row("resnet50", 8, "qsgd", 900.0)];
        assert_eq!(flag_disturbed_runs(&mut again, &upper, 1.7, &volume), 0);
    }

    #[test]
    fn a_row_an_earlier_rule_excluded_is_not_counted_again() {
        let mut data = vec![row("resnet50", 8, "qsgd", 100.0)];
        let upper = [
            row("resnet50", 8, "qsgd", 1000.0),
            row("resnet50", 8, "signsgd", 1600.0),
            row("resnet50", 8, "terngrad", 1700.0),
        ];
        assert_eq!(
            flag_inconsistent(&mut data, &upper, 0.5, 8).below_upper_bound,
            1
        );
        assert_eq!(flag_disturbed_runs(&mut data, &upper, 1.5, &volume), 0);
        assert!(data[0].excluded.as_deref().unwrap().contains("0.50×"));
    }

    #[test]
    fn a_one_worker_row_is_counted_once() {
        let mut data = vec![
            row("vgg19", 1, "none", 50.0),
            row("vgg19", 2, "none", 120.0),
        ];
        let upper = [row("vgg19", 1, "none", 1000.0)];
        let counts = flag_inconsistent(&mut data, &upper, 0.5, 8);
        assert_eq!((counts.below_upper_bound, counts.slow_one_worker), (1, 0));
        assert!(data[0].excluded.as_deref().unwrap().contains("upper-bound"));
    }
}
