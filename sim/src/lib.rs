//! Syncopate's simulator: data formats, cost models, the discrete-event engine and the search.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod beside_compute;
pub mod calibrate;
pub mod carry;
pub mod chart;
pub mod collective;
pub mod compare;
pub mod compress;
pub mod contention;
pub mod cost;
pub mod csv;
pub mod data;
pub mod device;
pub mod engine;
pub mod error;
pub mod evaluate;
pub mod experiment;
pub mod export;
pub mod flops;
pub mod framework;
pub mod graph;
pub mod launch;
pub mod limits;
pub mod model;
pub mod noise;
pub mod p2p_fit;
pub mod plan;
#[cfg(test)]
mod properties;
pub mod real_run;
pub mod scenario;
pub mod schedule;
pub mod search;
pub mod simulate;
pub mod stats;
pub mod strategy;
pub mod summary;
pub mod sweep;
pub mod tcp_fit;
pub mod time;
pub mod topology;
pub mod trace;
pub mod units;
pub mod validate;

pub use error::{Result, SimError};
