//! The exec crate's error type: every variant names the compressor, element or payload at fault.

use syncopate_sim::SimError;

/// Everything that can go wrong in `syncopate-exec`, phrased so that a user can act on it.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("gradient element {index} is {value}: compression needs finite gradients (check the loss scale and learning rate)")]
    NonFinite { index: usize, value: f32 },

    #[error("{compressor}: malformed payload: {message}")]
    BadPayload { compressor: String, message: String },

    #[error("{compressor}: tensor has {got} elements, the codec was built for {expected}")]
    LengthMismatch {
        compressor: String,
        expected: usize,
        got: usize,
    },

    #[error("{compressor}: payloads are not summable in their wire type; aggregate them by allgather or a parameter server")]
    NotSummable { compressor: String },

    #[error("{compressor}: {message}")]
    Protocol { compressor: String, message: String },

    #[error(transparent)]
    Sim(#[from] SimError),
}

pub type Result<T, E = ExecError> = std::result::Result<T, E>;
