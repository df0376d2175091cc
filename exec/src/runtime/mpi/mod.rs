//! The MPI transport (feature `mpi`): Open MPI through the `mpi` crate.
//!
//! It has one duplicated communicator per communication stream, and runs the in-process mesh's
//! collectives as non-blocking MPI operations bounded by a deadline and an abort flag.
//!
//! ```text
//! World::init (MPI_THREAD_MULTIPLE) ─► World::streams(n) ─► Stream: allreduce │ ring steps (runtime::ring)
//!                                                                   allgather (any sizes) │ push_pull │ broadcast
//! ```

pub mod backend;
pub mod conformance;
mod coordinate;
mod nonblocking;
pub mod transport;
pub mod wire;
pub mod world;

pub use transport::Stream;
pub use world::World;
