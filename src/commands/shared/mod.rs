//! Helpers that several commands use, so that no command imports another.

pub mod deliver;
pub mod execute;
pub mod plan_file;
pub mod plan_target;
