//! Syncopate's integration tests: shipped data, closed-form cases, properties and the CLI end to end.

mod compression;
