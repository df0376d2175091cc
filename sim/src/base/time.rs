//! Simulated time: integer nanoseconds, so that every run is exactly reproducible.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// A point or span of simulated time in nanoseconds.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct SimTime(pub u64);

impl SimTime {
    /// Zero nanoseconds.
    pub const ZERO: SimTime = SimTime(0);
    /// Where saturating arithmetic stops: a run that reaches it is an error.
    pub const MAX: SimTime = SimTime(u64::MAX);

    /// Rounds a non-negative duration in microseconds to the nearest nanosecond.
    pub fn from_us(us: f64) -> SimTime {
        SimTime::from_ns(us * 1e3)
    }

    /// Rounds a non-negative duration in seconds to the nearest nanosecond.
    pub fn from_secs(s: f64) -> SimTime {
        SimTime::from_ns(s * 1e9)
    }

    /// Rounds to the nearest nanosecond; negative and NaN inputs clamp to zero because a
    /// duration cannot be negative, and huge ones saturate at `SimTime::MAX` (inputs are
    /// validated against `crate::base::limits` before they reach here).
    pub fn from_ns(ns: f64) -> SimTime {
        if ns.is_finite() && ns > 0.0 {
            SimTime(ns.round() as u64)
        } else {
            SimTime::ZERO
        }
    }

    /// The time in nanoseconds.
    pub fn as_ns(self) -> u64 {
        self.0
    }

    /// The time in microseconds.
    pub fn as_us(self) -> f64 {
        self.0 as f64 / 1e3
    }

    /// The time in milliseconds.
    pub fn as_ms(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// The time in seconds.
    pub fn as_secs(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `self - other`, or zero when `other` is later.
    pub fn saturating_sub(self, other: SimTime) -> SimTime {
        SimTime(self.0.saturating_sub(other.0))
    }

    /// Scales a duration by a factor (a slowdown or a speed ratio), rounding to the nearest ns.
    pub fn scale(self, factor: f64) -> SimTime {
        SimTime::from_ns(self.0 as f64 * factor)
    }
}

// Arithmetic saturates instead of wrapping: inputs are bounded (`crate::base::limits`) so that no
// real run comes near 2^64 ns, and a run that still reaches `SimTime::MAX` is reported as an
// error by the engine instead of wrapping into a small, wrong number.
impl Add for SimTime {
    type Output = SimTime;
    fn add(self, rhs: SimTime) -> SimTime {
        SimTime(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for SimTime {
    fn add_assign(&mut self, rhs: SimTime) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

impl Sub for SimTime {
    type Output = SimTime;
    fn sub(self, rhs: SimTime) -> SimTime {
        SimTime(self.0.saturating_sub(rhs.0))
    }
}

impl std::iter::Sum for SimTime {
    fn sum<I: Iterator<Item = SimTime>>(iter: I) -> SimTime {
        iter.fold(SimTime::ZERO, |a, b| a + b)
    }
}

impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3} ms", self.as_ms())
    }
}
