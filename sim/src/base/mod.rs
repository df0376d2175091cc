//! Base types and helpers every layer uses: time, units, limits, errors, data files, tables.

pub mod chart;
pub mod csv;
pub mod data;
pub mod error;
pub mod limits;
pub mod stats;
pub mod time;
pub mod units;
