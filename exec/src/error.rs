//! The exec crate's error type: every variant names the compressor, element or payload at fault.

use syncopate_sim::SimError;

/// Everything that can go wrong in `syncopate-exec`, phrased so that a user can act on it.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A gradient element that is NaN or infinite.
    #[error("gradient element {index} is {value}: compression needs finite gradients (check the loss scale and learning rate)")]
    NonFinite {
        /// Position of the element in the gradient.
        index: usize,
        /// The element's value.
        value: f32,
    },

    /// A payload that does not decode under its compressor's format.
    #[error("{compressor}: malformed payload: {message}")]
    BadPayload {
        /// The compressor whose payload it is.
        compressor: String,
        /// What is wrong with it.
        message: String,
    },

    /// A tensor whose element count differs from the one its codec was built for.
    #[error("{compressor}: tensor has {got} elements, the codec was built for {expected}")]
    LengthMismatch {
        /// The compressor whose codec it is.
        compressor: String,
        /// Elements the codec was built for.
        expected: usize,
        /// Elements the tensor has.
        got: usize,
    },

    /// Payloads asked to be summed whose wire type cannot be summed.
    #[error("{compressor}: payloads are not summable in their wire type; aggregate them by allgather or a parameter server")]
    NotSummable {
        /// The compressor whose payloads they are.
        compressor: String,
    },

    /// A codec step asked of a piece whose compressor, memory or ring does not allow it.
    #[error("{compressor}: {message}")]
    Protocol {
        /// The piece's compressor.
        compressor: String,
        /// What was asked and why it cannot be done.
        message: String,
    },

    /// An error of `syncopate-sim` (a plan, profile or flag value), passed through.
    #[error(transparent)]
    Sim(#[from] SimError),

    /// Exit code 3 in the CLI: the cuda backend was asked for on a machine that cannot run it.
    #[error("needs a GPU, none available: {reason}")]
    NoGpu {
        /// Why no GPU can be used.
        reason: String,
    },

    /// A failure on, or reported by, one rank.
    #[error("rank {rank}: {message}")]
    Rank {
        /// The rank at fault.
        rank: u32,
        /// What went wrong there.
        message: String,
    },

    /// A rank that did not answer another rank's wait within the timeout.
    #[error(
        "rank {rank} did not answer within {seconds:.1} s while rank {waiting} waited for {what}"
    )]
    Timeout {
        /// The rank that did not answer.
        rank: u32,
        /// The rank that waited for it.
        waiting: u32,
        /// What was waited for.
        what: String,
        /// The timeout that passed, in seconds.
        seconds: f64,
    },

    /// A failure to meet the other ranks at the rendezvous address.
    #[error("rendezvous at {address}: {message}")]
    Rendezvous {
        /// The rendezvous address.
        address: String,
        /// What went wrong there.
        message: String,
    },

    /// A launcher environment variable that is missing or unusable.
    #[error("launch environment: `{variable}`: {message}")]
    Launch {
        /// The variable (or variables) at fault, e.g. `MASTER_ADDR`.
        variable: String,
        /// What is wrong with it.
        message: String,
    },

    /// A correctness check (`--check`, MPI conformance) that failed.
    #[error("group {group}: {message}")]
    Check {
        /// The plan group the check concerns.
        group: usize,
        /// What the check found.
        message: String,
    },

    /// A failure of the cuda backend (a missing kernel, NCCL, a calibration).
    #[error("cuda backend: {message}")]
    Cuda {
        /// What failed.
        message: String,
    },

    /// A kernel launch refused before it ran (a buffer shorter than the launch touches), or
    /// one the driver failed.
    #[error("cuda kernel `{kernel}`: {message}")]
    Kernel {
        /// The kernel's name.
        kernel: &'static str,
        /// Why it was refused, or how it failed.
        message: String,
    },

    /// A lab that cannot be made, used or removed as asked.
    #[error("lab `{lab}`: {message}")]
    Lab {
        /// The lab's name.
        lab: String,
        /// What is wrong.
        message: String,
    },

    /// An external tool (`ip`, `tc`, `mpirun`) that failed or could not be run.
    #[error("`{command}`: {message}")]
    Tool {
        /// The command that failed.
        command: String,
        /// How it failed.
        message: String,
    },

    /// An MPI operation that failed on a rank.
    #[error("rank {rank}: MPI {operation}: {message}")]
    Mpi {
        /// The rank it failed on.
        rank: u32,
        /// The operation, e.g. `MPI_Init_thread`.
        operation: String,
        /// How it failed.
        message: String,
    },

    /// An I/O error, with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, e.g. `creating /run/syncopate`.
        what: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
}

/// `Result` with [`ExecError`] as its default error.
pub type Result<T, E = ExecError> = std::result::Result<T, E>;
