//! The simulator crate's error type: every variant names the file, field, value or tensor at fault.

use std::path::PathBuf;

/// Everything that can go wrong in `syncopate-sim`, phrased so that a user can act on it.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("{file}: line {line}, column {column}: at `{field}`: {message}")]
    Json {
        file: String,
        line: usize,
        column: usize,
        field: String,
        message: String,
    },

    #[error("unknown {kind} `{name}`; valid {kind}s: {valid} (or a path to a JSON file)")]
    UnknownName {
        kind: &'static str,
        name: String,
        valid: String,
    },

    #[error("{file}: `{field}`: {message}")]
    Invalid {
        file: String,
        field: String,
        message: String,
    },

    #[error("the schedule stalled: {task} never ran: {message}")]
    Stalled { task: String, message: String },

    #[error("invalid {what} `{value}`: {message}")]
    BadValue {
        what: String,
        value: String,
        message: String,
    },
}

impl SimError {
    /// A data file whose content parses but breaks a rule (a field out of range, inconsistent totals).
    pub fn invalid(file: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        SimError::Invalid {
            file: file.to_string(),
            field: field.into(),
            message: message.into(),
        }
    }

    /// A command-line or plan value that does not parse or is out of range.
    pub fn bad_value(
        what: impl Into<String>,
        value: impl ToString,
        message: impl Into<String>,
    ) -> Self {
        SimError::BadValue {
            what: what.into(),
            value: value.to_string(),
            message: message.into(),
        }
    }
}

pub type Result<T, E = SimError> = std::result::Result<T, E>;
