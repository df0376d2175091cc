//! The simulator crate's error type: every variant names the file, field, value or tensor at fault.

use std::path::PathBuf;

/// Everything that can go wrong in `syncopate-sim`, phrased so that a user can act on it.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A JSON file that does not parse into what it should hold.
    #[error("{file}: line {line}, column {column}: at `{field}`: {message}")]
    Json {
        /// The file's label.
        file: String,
        /// Line of the error.
        line: usize,
        /// Column of the error.
        column: usize,
        /// Path of the field at fault (`(top level)` for the document).
        field: String,
        /// What is wrong.
        message: String,
    },

    /// A name that matches none of the valid ones.
    #[error("unknown {kind} `{name}`; valid {kind}s: {valid} (or a path to a JSON file)")]
    UnknownName {
        /// What the name names, e.g. a model or a compressor in a device profile.
        kind: &'static str,
        /// The name given.
        name: String,
        /// The valid names, comma-separated.
        valid: String,
    },

    /// A data file whose content parses but breaks a rule.
    #[error("{file}: `{field}`: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// The field at fault.
        field: String,
        /// The rule it breaks.
        message: String,
    },

    /// A simulated schedule in which a task never ran.
    #[error("the schedule stalled: {task} never ran: {message}")]
    Stalled {
        /// The task that never ran.
        task: String,
        /// What it was still waiting for.
        message: String,
    },

    /// A command-line or plan value that does not parse or is out of range.
    #[error("invalid {what} `{value}`: {message}")]
    BadValue {
        /// The option or setting.
        what: String,
        /// The value given.
        value: String,
        /// Why it is rejected.
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

/// The crate's result, with [`SimError`] as its default error.
pub type Result<T, E = SimError> = std::result::Result<T, E>;
