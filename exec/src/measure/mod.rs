//! Measurements of this machine that become its device and cluster files.
//!
//! The CPU codecs' cost curves, memory bandwidth and FMA rate ([`profile_host`]), the host
//! backend's collectives fitted to α/β/γ ([`host_collectives`]), and the cluster files made from
//! them or from NCCL's ([`profile_cluster`]), and a GPU's codecs, copies, GEMMs and NCCL
//! collectives through the CUDA backend's kernels ([`cuda`]). The MPI collective
//! micro-benchmarks that `lab up` sweeps are in `mpi_bench` (feature `mpi`), their records in
//! [`records`]. The labs' network probes are in `lab`, beside the namespaces they run in.

pub mod captured_speed;
pub mod cuda;
pub mod host_collectives;
#[cfg(feature = "mpi")]
pub mod mpi_bench;
pub mod profile_cluster;
pub mod profile_host;
pub mod records;
