//! Command-line grammar (clap): every command, flag and default in one place.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use syncopate_sim::topology::ClusterOverrides;

#[derive(Parser, Debug)]
#[command(
    name = "syncopate",
    version,
    about = "Simulate, tune and run the gradient synchronization of data-parallel DNN training",
    long_about = "Syncopate predicts one training iteration of data-parallel DNN training as a DAG of \
per-tensor backward compute, compression and collective tasks against measured hardware profiles."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Predict collective times on a cluster, nccl-tests style; compare with or fit to measurements.
    Collective(Box<CollectiveArgs>),
    /// List shipped models, devices, clusters, compressors or strategies.
    List {
        #[arg(value_enum)]
        what: ListWhat,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListWhat {
    Models,
    Devices,
    Clusters,
    Compressors,
    Strategies,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Text,
    Json,
}

/// A cluster by shipped name or path, with the overrides every cluster-taking command accepts.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Shipped cluster name (see `syncopate list clusters`) or path to a cluster JSON file.
    #[arg(long)]
    pub cluster: String,
    /// Override the number of nodes.
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Override the number of GPUs per node.
    #[arg(long)]
    pub gpus_per_node: Option<u32>,
    /// Override the bandwidth of each inter-node NIC, in Gb/s.
    #[arg(long, allow_negative_numbers = true)]
    pub inter_gbps: Option<f64>,
}

impl ClusterArgs {
    pub fn overrides(&self) -> ClusterOverrides {
        ClusterOverrides {
            nodes: self.nodes,
            gpus_per_node: self.gpus_per_node,
            inter_gbps: self.inter_gbps,
        }
    }
}

#[derive(Args, Debug)]
pub struct CollectiveArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Collective operation: allreduce, allgather, reduce-scatter, broadcast, reduce, alltoall.
    #[arg(long, default_value = "allreduce")]
    pub op: String,
    /// Buffer sizes as nccl-tests counts them: a list (4K,1M,1G) or a power-of-two range (8-1G).
    #[arg(long, default_value = "8-1G")]
    pub bytes: String,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
    /// nccl-tests results (CSV with size_bytes and a time_us… or …busbw… column) to compare with.
    #[arg(long)]
    pub compare: Option<PathBuf>,
    /// Column of the --compare file to read (default: the first time or busbw column).
    #[arg(long, requires = "compare")]
    pub column: Option<String>,
    /// Smallest size of the comparison.
    #[arg(long, default_value = "4K", requires = "compare")]
    pub min_bytes: String,
    /// Largest size of the comparison.
    #[arg(long, default_value = "4G", requires = "compare")]
    pub max_bytes: String,
    /// Fit the cluster's hop latencies and link efficiencies to the --compare data and write the
    /// fitted cluster file here.
    #[arg(long, requires = "compare")]
    pub fit_out: Option<PathBuf>,
    /// Fit only these parameters (comma-separated, e.g. library.intra_efficiency,library.nvls_efficiency);
    /// default: all of them.
    #[arg(long, requires = "fit_out", value_delimiter = ',')]
    pub fit_only: Option<Vec<String>>,
}
