//! What this build accepts: every input time, rate, size and count is bounded here.
//!
//! Thus no arithmetic can overflow, and an input out of range is an error that names its limit.
//!
//! The bounds are far beyond any real training job and small enough that sums over every task
//! of a run stay within integer nanoseconds (2^64 ns is 584 years).

use crate::base::error::{Result, SimError};

/// Longest duration any single input may state (a task's time, a latency, a cycle): 10^12 µs,
/// about 11.6 days.
pub const MAX_DURATION_US: f64 = 1e12;
/// Most elements in one tensor: 2^40 (4 TiB of fp32).
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;
/// Most elements in one model: 2^44.
pub const MAX_MODEL_ELEMENTS: u64 = 1 << 44;
/// Largest per-element cost of a kernel curve, in ns (10 µs per element).
pub const MAX_NS_PER_ELEMENT: f64 = 1e4;
/// Most samples per GPU of one iteration: 2^24.
pub const MAX_BATCH: u32 = 1 << 24;
/// Most tensors in one model.
pub const MAX_TENSORS: usize = 1 << 20;
/// Slowest and fastest link or processing rate, in Gb/s or GB/s: 1 Mb/s to 10^7 Gb/s.
pub const MIN_RATE: f64 = 1e-3;
/// Fastest link or processing rate, in Gb/s or GB/s.
pub const MAX_RATE: f64 = 1e7;
/// Most ranks of a cluster (nodes × GPUs per node).
pub const MAX_RANKS: u64 = 1 << 20;
/// Most partitions of all groups of a plan together: every one is a collective per iteration.
pub const MAX_PIECES: u64 = 1 << 20;
/// Most communication streams of a plan.
pub const MAX_COMM_STREAMS: u32 = 64;
/// Most tasks one run unrolls (iterations × steps per iteration).
pub const MAX_TASKS: u64 = 20_000_000;
/// Most (rank, task) pairs of one iteration the explicit path tracks (it holds those of the
/// few iterations in flight: 4 bytes each for the tasks waiting for more than one other).
pub const MAX_RANK_TASKS: u64 = 1 << 28;
/// Largest slowdown factor of a straggler, and largest jitter coefficient of variation.
pub const MAX_SLOWDOWN: f64 = 1e3;
/// Largest jitter coefficient of variation.
pub const MAX_JITTER_CV: f64 = 10.0;
/// Most bytes queued ahead on one connection (socket buffers hold megabytes).
pub const MAX_QUEUE_BYTES: u64 = 1 << 30;

/// Whether `cv` is a coefficient of variation the noise model accepts: finite, 0 to MAX_JITTER_CV.
pub fn is_cv(cv: f64) -> bool {
    cv.is_finite() && (0.0..=MAX_JITTER_CV).contains(&cv)
}
/// Most cores one host may have (the largest CPU servers have a few hundred).
pub const MAX_CORES: u32 = 1 << 16;

/// A number as messages show it: plain when ordinary, in scientific notation when huge or tiny
/// (so that `1e300` does not print as three hundred digits).
pub fn num(value: f64) -> String {
    let magnitude = value.abs();
    if value.is_finite() && magnitude != 0.0 && !(1e-4..1e9).contains(&magnitude) {
        format!("{value:e}")
    } else {
        value.to_string()
    }
}

/// Err unless `value` is finite and within `range`; `expected` says what `field` holds.
pub fn check_within(
    label: &str,
    field: &str,
    value: f64,
    range: std::ops::RangeInclusive<f64>,
    expected: impl FnOnce() -> String,
) -> Result<()> {
    if value.is_finite() && range.contains(&value) {
        Ok(())
    } else {
        Err(SimError::invalid(
            label,
            field,
            format!("{}, got {}", expected(), num(value)),
        ))
    }
}

/// Err unless `value` is a duration in µs within 0..=MAX_DURATION_US.
pub fn check_duration_us(label: &str, field: &str, value: f64) -> Result<()> {
    check_within(label, field, value, 0.0..=MAX_DURATION_US, || {
        format!("a duration is 0 to {MAX_DURATION_US:e} µs")
    })
}

/// Err unless `value` is a cost per element in ns within 0..=MAX_NS_PER_ELEMENT.
pub fn check_ns_per_element(label: &str, field: &str, value: f64) -> Result<()> {
    check_within(label, field, value, 0.0..=MAX_NS_PER_ELEMENT, || {
        format!("a per-element cost is 0 to {MAX_NS_PER_ELEMENT} ns")
    })
}

/// Err unless `value` is a rate within MIN_RATE..=MAX_RATE (`unit` names it in the message).
pub fn check_rate(label: &str, field: &str, value: f64, unit: &str) -> Result<()> {
    check_within(label, field, value, MIN_RATE..=MAX_RATE, || {
        format!("a rate is {MIN_RATE} to {MAX_RATE:e} {unit}")
    })
}

/// Err unless `value` is positive and at most `max` (a speed that may be small but not zero).
pub fn check_positive_at_most(label: &str, field: &str, value: f64, max: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 && value <= max {
        Ok(())
    } else {
        Err(SimError::invalid(
            label,
            field,
            format!(
                "must be more than 0 and at most {max:e}, got {}",
                num(value)
            ),
        ))
    }
}

/// Err unless `value` is a fraction in (0, 1] (an efficiency, a share of a peak).
pub fn check_fraction(label: &str, field: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(SimError::invalid(
            label,
            field,
            format!("must be in (0, 1], got {value}"),
        ))
    }
}

/// The same bound for a command-line flag.
pub fn flag_rate(flag: &str, value: f64, unit: &str) -> Result<f64> {
    if value.is_finite() && (MIN_RATE..=MAX_RATE).contains(&value) {
        Ok(value)
    } else {
        Err(SimError::bad_value(
            flag,
            num(value),
            format!("must be {MIN_RATE} to {MAX_RATE:e} {unit}"),
        ))
    }
}

/// The largest size a MiB flag or field takes: 2^30 MiB (1 PiB).
pub const MAX_MIB: f64 = 1073741824.0;

/// A size in MiB (a flag's or a field's, named by `what`) as bytes: at least one byte, at most
/// [`MAX_MIB`].
pub fn mib(what: &str, value: f64) -> Result<u64> {
    if value.is_finite() && value * 1048576.0 >= 1.0 && value <= MAX_MIB {
        Ok((value * 1048576.0) as u64)
    } else {
        Err(SimError::bad_value(
            what,
            num(value),
            format!("must be at least one byte (1/1048576) and at most {MAX_MIB} MiB"),
        ))
    }
}

/// A duration flag in µs (already converted from the flag's unit), within 0..=MAX_DURATION_US.
pub fn flag_duration_us(flag: &str, shown: f64, us: f64) -> Result<f64> {
    if us.is_finite() && (0.0..=MAX_DURATION_US).contains(&us) {
        Ok(us)
    } else {
        Err(SimError::bad_value(
            flag,
            num(shown),
            format!(
                "must be zero or positive and at most {:e} s",
                MAX_DURATION_US / 1e6
            ),
        ))
    }
}

/// The ranks of `nodes × per_node`, or an error naming the limit.
pub fn ranks(nodes: u32, per_node: u32, what: &str) -> Result<u32> {
    let ranks = u64::from(nodes) * u64::from(per_node);
    if ranks <= MAX_RANKS {
        Ok(ranks as u32)
    } else {
        Err(SimError::bad_value(
            what,
            format!("{nodes} nodes × {per_node}"),
            format!("more than {MAX_RANKS} ranks"),
        ))
    }
}
