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

    /// Exit code 3 in the CLI: the cuda backend was asked for on a machine that cannot run it.
    #[error("needs a GPU, none available: {reason}")]
    NoGpu { reason: String },

    #[error("rank {rank}: {message}")]
    Rank { rank: u32, message: String },

    #[error(
        "rank {rank} did not answer within {seconds:.1} s while rank {waiting} waited for {what}"
    )]
    Timeout {
        rank: u32,
        waiting: u32,
        what: String,
        seconds: f64,
    },

    #[error("rendezvous at {address}: {message}")]
    Rendezvous { address: String, message: String },

    #[error("launch environment: `{variable}`: {message}")]
    Launch { variable: String, message: String },

    #[error("group {group}: {message}")]
    Check { group: usize, message: String },

    #[error("cuda backend: {message}")]
    Cuda { message: String },

    /// A kernel launch refused before it ran (a buffer shorter than the launch touches), or
    /// one the driver failed.
    #[error("cuda kernel `{kernel}`: {message}")]
    Kernel {
        kernel: &'static str,
        message: String,
    },

    #[error("lab `{lab}`: {message}")]
    Lab { lab: String, message: String },

    /// An external tool (`ip`, `tc`, `mpirun`) that failed or could not be run.
    #[error("`{command}`: {message}")]
    Tool { command: String, message: String },

    #[error("rank {rank}: MPI {operation}: {message}")]
    Mpi {
        rank: u32,
        operation: String,
        message: String,
    },

    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

pub type Result<T, E = ExecError> = std::result::Result<T, E>;
