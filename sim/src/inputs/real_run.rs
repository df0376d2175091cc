//! How a real run is timed: the iterations an executor runs, and which of them it measures.
//!
//! An iteration is timed from the end of the previous iteration's closing step (its last
//! backward step, `Schedule::iteration_end`) to the end of its own, so its time carries the
//! previous iteration's communication tail. A real run's warm-up iterations pay first-time
//! costs (connections, allocations, first touches) in their tails too: on a 2-node lab, DGC's
//! warm-up tail took 0.23–0.90 s where a steady one took 0.5–12 ms. The first measured iteration
//! therefore follows an iteration that is past warm-up, and a run executes one iteration more
//! than its warm-up and measured ones. The simulator has no first-time costs, so its steady
//! state starts an iteration earlier (`simulate`).

use crate::base::time::SimTime;

/// Iterations a real run of `warmup` warm-up and `measured` measured iterations executes
/// (`None` past `u32::MAX`).
pub fn iterations_to_run(warmup: u32, measured: u32) -> Option<u32> {
    warmup.checked_add(measured)?.checked_add(1)
}

/// The first iteration whose time a real run after `warmup` warm-up iterations measures.
pub fn first_measured(warmup: u32) -> u32 {
    warmup.saturating_add(1)
}

/// Whether the work of iteration `iteration` counts towards the measured iterations' busy
/// times: the iterations whose own time is measured.
pub fn is_measured(iteration: u32, warmup: u32) -> bool {
    iteration >= first_measured(warmup)
}

/// The measured iterations' times, from every executed iteration's end (in iteration order).
pub fn measured_times(ends: &[SimTime], warmup: u32) -> Vec<SimTime> {
    (first_measured(warmup) as usize..ends.len())
        .map(|k| ends[k] - ends[k - 1])
        .collect()
}

/// Total length of the union of `spans` (start, end): overlapping spans count once.
pub fn covered_ns(mut spans: Vec<(SimTime, SimTime)>) -> u64 {
    spans.sort_unstable();
    let mut total = 0;
    let mut reached = SimTime::ZERO;
    for (start, end) in spans {
        let start = start.max(reached);
        if end > start {
            total = (end - start).as_ns().saturating_add(total);
            reached = end;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_measured_iteration_follows_one_past_warm_up() {
        assert_eq!(iterations_to_run(1, 3), Some(5));
        assert_eq!(iterations_to_run(u32::MAX, 0), None);
        // Iteration 1's time carries warm-up iteration 0's tail: not measured.
        let ends = [100, 900, 1400, 1900, 2450].map(SimTime);
        assert_eq!(measured_times(&ends, 1), [500, 500, 550].map(SimTime));
        assert!(!is_measured(1, 1) && is_measured(2, 1));
    }

    #[test]
    fn overlapping_spans_count_once() {
        let spans = [(0, 10), (5, 15), (20, 25), (21, 22)]
            .map(|(a, b)| (SimTime(a), SimTime(b)))
            .to_vec();
        assert_eq!(covered_ns(spans), 20);
        assert_eq!(covered_ns(Vec::new()), 0);
    }
}
