//! Syncopate's simulator: data formats, cost models, the discrete-event engine and the search.

pub mod calibrate;
pub mod collective;
pub mod compress;
pub mod data;
pub mod device;
pub mod error;
pub mod model;
pub mod time;
pub mod topology;
pub mod units;

pub use error::{Result, SimError};
