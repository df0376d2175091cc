//! Pricing and running a schedule: costs, contention, the engine, noise, summaries and traces.

pub mod blocking;
pub mod contention;
pub mod cost;
pub mod engine;
pub mod evaluate;
pub mod framework_cost;
pub mod graph;
pub mod memory;
pub mod noise;
#[cfg(test)]
mod properties;
pub mod scenario;
pub mod simulate;
pub mod summary;
pub mod trace;
pub mod validate;
