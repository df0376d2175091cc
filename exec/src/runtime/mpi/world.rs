//! This process's place in an MPI job: initialization, launcher check, per-stream communicators.
//!
//! MPI is initialized with MPI_THREAD_MULTIPLE, since streams run on their own threads; each
//! communication stream gets one duplicated communicator.

use super::transport::Stream;
use crate::error::{ExecError, Result};
use mpi::environment::Universe;
use mpi::topology::Communicator;
use mpi::Threading;
use std::time::Duration;

/// Variables an MPI launcher sets for each process it starts (Open MPI's mpirun, PMIx
/// launchers such as srun, and MPICH-style PMI).
const LAUNCHER_VARIABLES: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"];

/// Open MPI's variable choosing the algorithm of MPI_Iallreduce (libnbc).
const IALLREDUCE_ALGORITHM: &str = "OMPI_MCA_coll_libnbc_iallreduce_algorithm";

/// libnbc's ring. Its default for fewer than four ranks is a binomial tree — a reduce to one
/// rank then a broadcast, which moves every byte twice one way at a time and so reaches half
/// the link's bandwidth on two ranks (measured on a 1 Gb/s lab: 0.43 against the ring's 0.75
/// Gb/s of bus bandwidth for 32 MiB). The ring is bandwidth-optimal, as the host backend's.
const RING: &str = "1";

/// The initialized MPI library; finalized when dropped (after every stream).
pub struct World {
    universe: Universe,
    /// This process's rank in MPI_COMM_WORLD.
    pub rank: u32,
    /// Processes in MPI_COMM_WORLD.
    pub size: u32,
}

impl World {
    /// Initializes MPI for a process started by an MPI launcher, asking Open MPI for the ring
    /// allreduce unless `OMPI_MCA_coll_libnbc_iallreduce_algorithm` is set (it sets that
    /// variable in this process's environment: call it before starting other threads).
    /// Errors: not launched by one, MPI already initialized, or a library without
    /// MPI_THREAD_MULTIPLE.
    pub fn init() -> Result<World> {
        if !LAUNCHER_VARIABLES
            .iter()
            .any(|v| std::env::var_os(v).is_some())
        {
            return Err(ExecError::Launch {
                variable: LAUNCHER_VARIABLES.join(" / "),
                message: "not set: this process was not started by an MPI launcher; start it with `mpirun -np N …`, `srun …` or `syncopate lab run --mpi -- …`".into(),
            });
        }
        if std::env::var_os(IALLREDUCE_ALGORITHM).is_none() {
            // Read by Open MPI during MPI_Init_thread, below; a user's own choice is kept.
            std::env::set_var(IALLREDUCE_ALGORITHM, RING);
        }
        let (universe, provided) =
            mpi::initialize_with_threading(Threading::Multiple).ok_or_else(|| ExecError::Mpi {
                rank: 0,
                operation: "MPI_Init_thread".into(),
                message: "MPI is already initialized in this process".into(),
            })?;
        let world = universe.world();
        let (rank, size) = (world.rank() as u32, world.size() as u32);
        if provided != Threading::Multiple {
            return Err(ExecError::Mpi {
                rank,
                operation: "MPI_Init_thread".into(),
                message: format!(
                    "the MPI library provides {provided:?} thread support; Syncopate's streams call MPI from several threads and need MPI_THREAD_MULTIPLE (Open MPI has it unless built with --disable-mpi-thread-multiple)"
                ),
            });
        }
        Ok(World {
            universe,
            rank,
            size,
        })
    }

    /// Ends every process of the job (MPI_Abort), so that a failed rank does not wait in
    /// MPI_Finalize for ranks that wait for it: the launcher then reports this rank's failure
    /// and stops the others at once.
    pub fn abort(&self, code: i32) -> ! {
        self.universe.world().abort(code)
    }

    /// `count` streams, each on its own duplicate of the world communicator (so that
    /// collectives of different streams never match each other), waiting at most `timeout`
    /// for any operation.
    pub fn streams(&self, count: u32, timeout: Duration) -> Result<Vec<Stream<'_>>> {
        (0..count)
            .map(|index| Stream::new(self, self.universe.world().duplicate(), index, timeout))
            .collect()
    }
}
