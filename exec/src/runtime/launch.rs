//! Who this process is in a multi-process launch, from torchrun, Open MPI or Slurm variables.
//!
//! That is its rank, world size, local rank and the rendezvous address.

use crate::error::{ExecError, Result};

/// The port torchrun uses when MASTER_PORT is unset.
pub const DEFAULT_PORT: u16 = 29500;

/// This process's place in a launch of one process per GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Global rank of this process, in 0..world.
    pub rank: u32,
    /// Total number of processes in the launch.
    pub world: u32,
    /// Index of this process's GPU on its node.
    pub local_rank: u32,
    /// `host:port` of rank 0's rendezvous listener.
    pub master: String,
    /// Which launcher's variables were found.
    pub launcher: &'static str,
}

/// (launcher, rank, world size, local rank) variable names, in the order they are tried.
const LAUNCHERS: &[(&str, &str, &str, &str)] = &[
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    (
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
    ),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
];

fn number(get: &impl Fn(&str) -> Option<String>, variable: &str) -> Result<Option<u32>> {
    get(variable)
        .map(|text| {
            text.trim().parse().map_err(|_| ExecError::Launch {
                variable: variable.into(),
                message: format!("`{text}` is not a non-negative integer"),
            })
        })
        .transpose()
}

/// Reads the launch from variables (`get` is `std::env::var` in the binary, a map in tests).
/// `None` when no launcher's rank and world size are set: one process drives every visible GPU.
/// Open MPI and Slurm do not say where rank 0 listens, so MASTER_ADDR is required for them too
/// (`export MASTER_ADDR=$(hostname)` on the first node, as with torchrun).
pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
    for &(launcher, rank_var, world_var, local_var) in LAUNCHERS {
        let (Some(rank), Some(world)) = (number(&get, rank_var)?, number(&get, world_var)?) else {
            continue;
        };
        if world == 0 || rank >= world {
            return Err(ExecError::Launch {
                variable: rank_var.into(),
                message: format!("rank {rank} is not below the world size {world} ({world_var})"),
            });
        }
        let local_rank = number(&get, local_var)?.unwrap_or(0);
        let address = get("MASTER_ADDR").ok_or_else(|| ExecError::Launch {
            variable: "MASTER_ADDR".into(),
            message: format!(
                "{launcher} set {rank_var}/{world_var}, but rank 0's address is unknown: set MASTER_ADDR (and MASTER_PORT, default {DEFAULT_PORT})"
            ),
        })?;
        let port = match get("MASTER_PORT") {
            Some(text) => text.trim().parse::<u16>().map_err(|_| ExecError::Launch {
                variable: "MASTER_PORT".into(),
                message: format!("`{text}` is not a port number"),
            })?,
            None => DEFAULT_PORT,
        };
        return Ok(Some(LaunchInfo {
            rank,
            world,
            local_rank,
            master: format!("{address}:{port}"),
            launcher,
        }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn reads_each_launcher() {
        assert_eq!(from_env(env(&[])).unwrap(), None);
        let torchrun = from_env(env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(torchrun.master, "node0:29500");
        assert_eq!(
            (torchrun.rank, torchrun.world, torchrun.local_rank),
            (3, 8, 1)
        );
        let slurm = from_env(env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "4000"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (slurm.launcher, slurm.master.as_str()),
            ("slurm", "10.0.0.1:4000")
        );
    }

    #[test]
    fn rejects_inconsistent_launches() {
        let err = from_env(env(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(
            err.to_string().contains("not below the world size"),
            "{err}"
        );
        let err = from_env(env(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("MASTER_ADDR"), "{err}");
    }
}
