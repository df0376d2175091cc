//! Command-line grammar (clap): every command, flag and default in one place.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use syncopate_sim::inputs::topology::ClusterOverrides;

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
    /// Predict one training iteration: iteration time, throughput, scaling efficiency, timeline.
    Simulate(Box<SimulateArgs>),
    /// Search the fastest fusion and compression plan; compare it with every baseline strategy.
    Tune(Box<TuneArgs>),
    /// Write a plan's nearest PyTorch DDP, Horovod, BytePS or DeepSpeed settings, in the file
    /// that framework reads,
    /// with the time they take as that framework runs them.
    Export(Box<ExportArgs>),
    /// Simulate a grid of GPU counts, bandwidths, strategies and compressors: table, CSV, SVG.
    Sweep(Box<SweepArgs>),
    /// Reproducible studies: `experiment run experiments/NAME` regenerates its results.
    #[command(subcommand)]
    Experiment(ExperimentCommand),
    /// Measure this machine into a device profile (compression encode/decode cost curves).
    Profile(ProfileArgs),
    /// List shipped models, devices, clusters, compressors or strategies.
    #[command(subcommand)]
    List(ListWhat),
    /// Run a plan for real (CUDA/NCCL, or host threads) and write the measured trace.
    Exec(Box<ExecArgs>),
    /// Run a plan for real and simulate it with this machine's profile: predicted vs measured.
    Validate(Box<ValidateArgs>),
    /// Write the Schedule a plan means: every step of one rank's iteration, its stream,
    /// dependencies and synchronization ops (what the simulator and every executor run).
    Lower(Box<LowerArgs>),
    /// An emulated cluster on this machine: namespaces on a bridge with shaped links (needs root).
    #[command(subcommand)]
    Lab(LabCommand),
}

#[derive(Subcommand, Clone, Debug, PartialEq, Eq)]
pub enum ListWhat {
    /// Model profiles; `--check` compares each one's implied FLOP/s with its device's peak.
    Models {
        /// Training FLOPs per iteration over forward + backward time, against the device's peak
        /// in the precision the profile was measured in; exits 1 if any profile is impossible.
        #[arg(long)]
        check: bool,
        /// With --check: these model names or profile files instead of every shipped model.
        #[arg(requires = "check")]
        models: Vec<String>,
    },
    /// Device profiles: GPUs and measured hosts.
    Devices,
    /// Cluster files: nodes, GPUs per node, links.
    Clusters,
    /// Frameworks that run a plan (`--framework`), with their per-call costs.
    Frameworks,
    /// Codec sets: compressors as a system writes them (`--codecs`), with their ops and bytes.
    Codecs,
    /// Compressors and error-feedback memories.
    Compressors,
    /// Named baseline strategies.
    Strategies,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Text,
    Json,
}

/// `simulate --scheme`: the plan schemes a user may force on every group.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemeArg {
    /// The compressor's aggregation rule picks: allreduce if summable, else allgather.
    Auto,
    Allreduce,
    Allgather,
    Ps,
    Hierarchical,
}

impl SchemeArg {
    pub fn scheme(self) -> syncopate_sim::plan::Scheme {
        use syncopate_sim::plan::Scheme;
        match self {
            SchemeArg::Auto => Scheme::Auto,
            SchemeArg::Allreduce => Scheme::Allreduce,
            SchemeArg::Allgather => Scheme::Allgather,
            SchemeArg::Ps => Scheme::Ps,
            SchemeArg::Hierarchical => Scheme::Hierarchical,
        }
    }
}

/// `simulate --wire`: how the implementation lays sub-byte element codes on the wire.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireArg {
    /// Packed bits: the catalog's formats, what `exec` runs.
    Packed,
    /// One byte per code, as GRACE's TensorFlow compressors send (simulation only).
    Bytes,
}

impl WireArg {
    pub fn wire(self) -> syncopate_sim::compress::Wire {
        use syncopate_sim::compress::Wire;
        match self {
            WireArg::Packed => Wire::Packed,
            WireArg::Bytes => Wire::Bytes,
        }
    }
}

/// `simulate --codec-calls`: one codec call per group or per tensor.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodecCallsArg {
    /// One call on each group's fused buffer (each partition of it).
    Group,
    /// One call per tensor before the fused collective: Horovod's `Compression`, GRACE, and
    /// MergeComp's layer-wise compression.
    Tensor,
}

impl CodecCallsArg {
    pub fn codec_calls(self) -> syncopate_sim::plan::CodecCalls {
        use syncopate_sim::plan::CodecCalls;
        match self {
            CodecCallsArg::Group => CodecCalls::Group,
            CodecCallsArg::Tensor => CodecCalls::Tensor,
        }
    }
}

/// `simulate --param-dtype`: the precision a sharded plan gathers parameters in.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamDtypeArg {
    /// As stored, 4 bytes per element.
    Fp32,
    /// bfloat16, 2 bytes per element (FSDP's MixedPrecisionPolicy(param_dtype=torch.bfloat16)).
    Bf16,
    /// ZeRO++'s quantized weights (DeepSpeed's zero_quantized_weights), fsdp and hsdp only:
    /// int8 with an f32 scale per 8000 elements, quantized before and dequantized after each
    /// gather.
    Int8,
}

impl ParamDtypeArg {
    pub fn param_dtype(self) -> syncopate_sim::sharding::ParamDtype {
        use syncopate_sim::sharding::ParamDtype;
        match self {
            ParamDtypeArg::Fp32 => ParamDtype::Fp32,
            ParamDtypeArg::Bf16 => ParamDtype::Bf16,
            ParamDtypeArg::Int8 => ParamDtype::Int8,
        }
    }
}

/// A cluster by shipped name or path, with the overrides every cluster-taking command accepts.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Shipped cluster name (see `syncopate list clusters`) or path to a cluster JSON file.
    #[arg(long)]
    pub cluster: String,
    /// Override the number of nodes.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub nodes: Option<u32>,
    /// Override the number of GPUs per node.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub gpus_per_node: Option<u32>,
    /// Override the bandwidth of each inter-node NIC, in Gb/s.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::number)]
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

/// A collective library over TCP that a cluster's TCP parameters can be priced as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TcpLibrary {
    Mpi,
    Gloo,
}

#[derive(Args, Debug)]
pub struct CollectiveArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Collective operation: allreduce, allgather, reduce-scatter, broadcast, reduce, alltoall.
    /// A --compare file with an `op` column is read at this operation's rows.
    #[arg(long, default_value = "allreduce")]
    pub op: String,
    /// Price a TCP cluster (library mpi or gloo) as this library, its TCP parameters kept: `gloo`
    /// turns a lab's MPI-fitted file into the start of a gloo fit (with --fit-out, which then
    /// fits to the allreduce and allgather rows of a `python -m syncopate.torch.sweep` file).
    #[arg(long, value_enum)]
    pub library: Option<TcpLibrary>,
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
    /// The --compare sweep timed again while every rank computes beside it (`python -m
    /// syncopate.torch.sweep --beside-compute`): a TCP cluster's fit then also sets
    /// `contention.collective_slowdown_with_compute` and `collective_delay_with_compute_us`
    /// to the line `beside = factor × alone + delay` through the two, and, where its rows
    /// have a `compute_slowdown` column, `compute_slowdown_with_collective` to the median of
    /// its allreduces from 1 MiB.
    #[arg(long, requires = "fit_out")]
    pub beside_compute: Option<PathBuf>,
    /// GPU counts of the --compare data kept out of the fit, whose error is reported apart:
    /// a list (32 or 16,32), `largest` (the default with --fit-out) or `none`. Without
    /// --fit-out it names the counts the cluster was not calibrated on.
    #[arg(long, requires = "compare")]
    pub holdout_gpus: Option<String>,
    /// Read only the --compare rows whose COLUMN holds VALUE (COLUMN=VALUE, comma-separated or
    /// repeated; values of one column are alternatives), for files that hold several runs.
    #[arg(long = "where", requires = "compare", value_delimiter = ',')]
    pub where_: Vec<String>,
}

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Shipped model name (see `syncopate list models`) or path to a model profile JSON file
    /// (default with --plan: the model the plan records).
    #[arg(long)]
    pub model: Option<String>,
    /// Samples per GPU, where the run uses another batch than the model profile's: forward and
    /// backward times scaled in proportion (an upper bound above the profile's batch, a lower
    /// bound below: kernels fill the device better at larger batches); default: the profile's.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub batch_size: Option<u32>,
    /// The cluster (required without --plan; with --plan, the plan's by default).
    #[command(flatten)]
    pub cluster: RunClusterArgs,
    /// Strategy producing the plan (see `syncopate list strategies`).
    #[arg(long, default_value = "horovod", conflicts_with = "plan")]
    pub strategy: String,
    /// Run this plan (JSON, e.g. from --save-plan) instead of a strategy.
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Communication streams (concurrent collectives share the network); default: the plan's.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub comm_streams: Option<u32>,
    /// Write the plan that ran to this file.
    #[arg(long)]
    pub save_plan: Option<PathBuf>,
    /// Compressor for every group (see `syncopate list compressors`).
    #[arg(long, default_value = "none", conflicts_with = "plan")]
    pub compressor: String,
    /// Error-feedback memory for every group: none, residual, dgc, efsignsgd.
    #[arg(long, default_value = "none", conflicts_with = "plan")]
    pub memory: String,
    /// Synchronization scheme for every group of the strategy's plan (GRACE ran allgather).
    #[arg(long, value_enum, default_value = "auto", conflicts_with = "plan")]
    pub scheme: SchemeArg,
    /// Wire layout of sub-byte codes (sign bits, ternary and QSGD levels) for the strategy's
    /// plan: `bytes` describes GRACE's TensorFlow compressors (one byte per code).
    #[arg(long, value_enum, default_value = "packed", conflicts_with = "plan")]
    pub wire: WireArg,
    /// Compress each group in one codec call, or each tensor in a call of its own before the
    /// group's fused collective (Horovod's `Compression`, GRACE, MergeComp's layer-wise runs).
    #[arg(long, value_enum, default_value = "group", conflicts_with = "plan")]
    pub codec_calls: CodecCallsArg,
    /// Run compression on the host CPU with this `cpu` device profile (name or path), as
    /// measured by `syncopate profile --backend host`, instead of on the GPU.
    #[arg(long)]
    pub cpu_compression: Option<String>,
    /// The framework that runs the plan (see `syncopate list frameworks`; a name or a path),
    /// whose per-call costs are added, or `none`; default: the plan's, or the strategy's own
    /// (ddp: pytorch-ddp, horovod: horovod, byteps: byteps, deepspeed: deepspeed, fsdp: pytorch-fsdp, others none).
    #[arg(long)]
    pub framework: Option<String>,
    /// The codec set whose implementations compress the plan (see `syncopate list codecs`; a
    /// name or a path), each op priced by the framework, or `native` for the device profile's
    /// codec curves; default: the plan's, else native.
    #[arg(long)]
    pub codecs: Option<String>,
    /// Horovod's fusion buffer in MiB (HOROVOD_FUSION_THRESHOLD: 128 since Horovod 0.21, 64
    /// before).
    #[arg(long, default_value_t = (syncopate_sim::strategy::HOROVOD_FUSION_BYTES >> 20) as f64, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub fusion_mb: f64,
    /// Horovod's cycle time in milliseconds (HOROVOD_CYCLE_TIME: 1 since Horovod 0.21, 5
    /// before).
    #[arg(long, default_value_t = syncopate_sim::strategy::HOROVOD_CYCLE_US / 1e3, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub cycle_ms: f64,
    /// DDP's bucket cap and DeAR's fusion threshold in MiB.
    #[arg(long, default_value_t = 25.0, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub bucket_mb: f64,
    /// DDP's first bucket in MiB (first_bucket_bytes_cap). 1 as in PyTorch 1.x, whatever
    /// bucket_cap_mb; recent PyTorch (2.15 checked) keeps 1 MiB only when bucket_cap_mb is left
    /// at its default and otherwise caps the first bucket like the others: pass --bucket-mb's value.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub first_bucket_mb: f64,
    /// Partition size of bytescheduler and byteps/ps in MiB (BytePS: 4,096,000 bytes).
    #[arg(long, default_value_t = 3.90625, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub partition_mb: f64,
    /// Partitions in flight at once (ByteScheduler's credit).
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub credit: u32,
    /// Sharded strategies (fsdp, zero1, zero2): units whose parameter all-gather may run ahead
    /// of the unit computing (FSDP prefetches one).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = crate::args::whole)]
    pub prefetch: u32,
    /// fsdp: free each unit's parameters after its forward and gather them again for its
    /// backward (FSDP's reshard_after_forward).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub reshard_after_forward: bool,
    /// Sharded strategies: the precision parameters are all-gathered in (FSDP's param_dtype;
    /// int8: ZeRO++'s quantized weights).
    #[arg(long, value_enum, default_value = "fp32")]
    pub param_dtype: ParamDtypeArg,
    /// fsdp: ZeRO++'s hierarchical partitioning (hpZ, DeepSpeed's zero_hpz_partition_size at the
    /// node's ranks): a second shard of each unit inside the node, gathered for backward there.
    #[arg(long)]
    pub hpz: bool,
    /// fsdp: torchao's float8 all-gather (Float8LinearConfig(enable_fsdp_float8_all_gather=True)):
    /// the weights of nn.Linear layers whose dimensions are multiples of 16 are gathered in
    /// float8 e4m3, one scale each, agreed on once an iteration; the model's profile must record
    /// each tensor's module.
    #[arg(long)]
    pub float8_all_gather: bool,
    /// fsdp: consecutive blocks sharded together as one unit (FSDP's usual wrapping: 1).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub blocks_per_unit: u32,
    /// zero1, zero2: elements per gradient bucket (DeepSpeed's reduce_bucket_size, 5e8).
    #[arg(long, default_value_t = 500_000_000.0, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub reduce_bucket_size: f64,
    /// Dedicated parameter servers for `ps` (default: as many as nodes).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = crate::args::whole)]
    pub ps_servers: u32,
    /// Per-task lognormal jitter: coefficient of variation of every task's duration.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub jitter: f64,
    /// Stragglers: PROBABILITY,SLOWDOWN (each rank's compute is SLOWDOWN× slower in an iteration
    /// with this probability).
    #[arg(long)]
    pub straggler: Option<String>,
    /// Measured iterations; the JSON then carries mean, p50, p99 and a 95% confidence interval.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub iterations: Option<u32>,
    /// Warm-up iterations before measuring.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = crate::args::whole)]
    pub warmup: u32,
    /// Seed of the noise generators.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = crate::args::seed)]
    pub seed: u64,
    /// Simulate every rank even without noise (the symmetric path is exact then, and faster).
    #[arg(long)]
    pub explicit: bool,
    /// Write a Chrome/Perfetto trace of the run here.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Ranks to include in the trace.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub trace_ranks: u32,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

/// Where `profile` measures.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileBackend {
    /// This machine's CPU, one core: the CPU compression kernels of `syncopate-exec`; with
    /// `--ranks N` also the host backend's channel collectives.
    Host,
    /// The visible NVIDIA GPUs.
    Cuda,
}

#[derive(Args, Debug)]
pub struct ProfileArgs {
    #[arg(long, value_enum)]
    pub backend: ProfileBackend,
    /// Where to write the device profile JSON.
    #[arg(long)]
    pub out: PathBuf,
    /// The profile's name (default: the file name without .json).
    #[arg(long)]
    pub name: Option<String>,
    /// Timings per size; the median is kept.
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = crate::args::repeats)]
    pub repeats: u32,
    /// Host: the largest tensor timed, in elements; sizes are powers of four up to it. Cost
    /// curves are straight lines fitted over these sizes, so reach the largest fused buffer
    /// your plans compress (past the caches, a kernel's cost per element changes).
    #[arg(long, default_value_t = syncopate_exec::measure::profile_host::DEFAULT_LARGEST_PROFILED as u32, allow_negative_numbers = true, value_parser = crate::args::profile_elements)]
    pub largest: u32,
    /// Host: also time the in-process collectives of this many thread-ranks (at least 2) and
    /// fit them into an MPI-style cluster written to --cluster-out.
    #[arg(long, requires = "cluster_out", allow_negative_numbers = true, value_parser = crate::args::thread_ranks)]
    pub ranks: Option<u32>,
    /// Where to write the fitted cluster (its device is the profile written to --out). Host:
    /// needs --ranks. Cuda: needs at least 2 GPUs; NCCL allreduce over all of them is fitted.
    #[arg(long)]
    pub cluster_out: Option<PathBuf>,
    /// Cuda: the shipped cluster (name or path) whose NCCL parameters the fit starts from
    /// (default: the DGX of the GPU's generation, e.g. dgx-h100 for an H100).
    #[arg(long, requires = "cluster_out")]
    pub cluster_base: Option<String>,
    /// Cuda: model profiles captured on this GPU in fp32 with TF32 off (`python -m
    /// syncopate.capture --tf32 off`) of shipped models at their shipped batch; the profile's
    /// compute_speed_vs_v100 is then the median of the shipped compute times over the captured
    /// ones instead of an estimate from the profiler's own GEMM. Repeat for several models.
    #[arg(long)]
    pub compute_from: Vec<PathBuf>,
}

/// Where `exec` and `validate` run the plan.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecBackend {
    /// The visible GPUs when there are any, else host threads (says which it picked).
    Auto,
    /// The visible NVIDIA GPUs with NCCL (one process driving all, or one process per GPU).
    Cuda,
    /// CPU threads on this machine, in-process channels: runs the whole exec path on a laptop
    /// or in CI. Not a cluster backend: its timings say nothing about GPUs.
    Host,
    /// One CPU rank per process over MPI (start with mpirun, srun or `syncopate lab run
    /// --mpi`); needs a build with `--features mpi`. The backend for real CPU clusters.
    Mpi,
}

/// The plan a real run executes, and how.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The plan to run (JSON from `simulate --save-plan` or `tune --out`; it records its model
    /// and cluster).
    #[arg(long)]
    pub plan: PathBuf,
    /// The model (default: the one the plan records); it must be the one the plan was made for.
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: ExecBackend,
    /// Host backend: run this many thread-ranks as one node (default: the cluster's world size).
    #[arg(long, allow_negative_numbers = true)]
    pub ranks: Option<i64>,
    /// Host backend: multiply the model profile's compute times by this (default: so that
    /// forward + backward + optimizer take at most 100 ms, and never more than the profile).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub compute_scale: Option<f64>,
    /// Measured iterations.
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub iterations: u32,
    /// Warm-up iterations before measuring; then one more runs, unmeasured (it carries the
    /// last warm-up iteration's communication tail).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = crate::args::whole)]
    pub warmup: u32,
    /// Seed of the synthetic gradients and the stochastic compressors.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = crate::args::seed)]
    pub seed: u64,
    /// Longest a rank waits for another (rendezvous, collectives) before failing, in seconds.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub timeout_s: f64,
}

/// The cluster of a run: by default the one the plan records, with these overrides.
#[derive(Args, Debug, Clone)]
pub struct RunClusterArgs {
    /// Shipped cluster name or path (default: the plan's).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Override the number of nodes (default: the plan's).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub nodes: Option<u32>,
    /// Override the number of GPUs per node (default: the plan's).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub gpus_per_node: Option<u32>,
    /// Override the bandwidth of each inter-node NIC, in Gb/s (default: the plan's).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::number)]
    pub inter_gbps: Option<f64>,
}

#[derive(Args, Debug)]
#[command(
    after_help = "The host backend runs ranks as CPU threads with the real CPU compression kernels and \
in-process channel collectives; it exists so that CI and laptops exercise the whole exec path and \
is not a cluster backend. --check compares every aggregate with a reference computed on the side, \
which slows every rank: its timings are not representative."
)]
pub struct ExecArgs {
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub cluster: RunClusterArgs,
    /// Verify every iteration: each rank's aggregated gradient against the compressor's
    /// reference aggregation of all ranks' inputs (and, for precision casts, their exact sum).
    #[arg(long)]
    pub check: bool,
    /// Write the measured Chrome/Perfetto trace here (same schema as `simulate --trace`).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    pub run: LowerPlanArgs,
    /// The framework: ddp (PyTorch DistributedDataParallel), horovod, byteps (its PyTorch
    /// plugin), deepspeed (stage 0) or fsdp (PyTorch FSDP2's fully_shard).
    #[arg(long)]
    pub to: String,
    #[command(flatten)]
    pub cluster: RunClusterArgs,
    /// Where to write the settings (Python for every framework); default: stdout, the report
    /// then on stderr.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the plan the framework runs with these settings (`simulate --plan` on it
    /// gives the predicted time).
    #[arg(long)]
    pub save_plan: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Args, Debug)]
pub struct LowerArgs {
    #[command(flatten)]
    pub run: LowerPlanArgs,
    #[command(flatten)]
    pub cluster: RunClusterArgs,
    /// Where to write the schedule JSON (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The plan to lower and, optionally, the model it was made for.
#[derive(Args, Debug, Clone)]
pub struct LowerPlanArgs {
    /// The plan (JSON from `simulate --save-plan` or `tune --out`).
    #[arg(long)]
    pub plan: PathBuf,
    /// The model (default: the one the plan records).
    #[arg(long)]
    pub model: Option<String>,
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// The machine's cluster file (from `profile --cluster-out` or `lab up --cluster-out`); when
    /// absent, host: measured on the fly; cuda and mpi: the one the plan records.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Override the cluster file's number of nodes (e.g. 1 to validate on one machine).
    #[arg(long, requires = "cluster", allow_negative_numbers = true, value_parser = crate::args::count)]
    pub nodes: Option<u32>,
    /// Override the cluster file's GPUs per node (e.g. 1 to validate on one GPU).
    #[arg(long, requires = "cluster", allow_negative_numbers = true, value_parser = crate::args::count)]
    pub gpus_per_node: Option<u32>,
    /// Host: the `cpu` device profile with the compression curves (default: measured on the fly
    /// for the plan's compressors, or the cluster's device when --cluster is given).
    #[arg(long)]
    pub device_profile: Option<String>,
    /// Per-task rows to report, largest measured tasks first.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = crate::args::whole)]
    pub top: u32,
    /// Write both timelines as Chrome traces: PREFIX.predicted.json and PREFIX.measured.json
    /// (open them side by side in Perfetto to see where the prediction departs from the run).
    #[arg(long, value_name = "PREFIX")]
    pub traces: Option<PathBuf>,
    /// Compare a trace measured elsewhere instead of running the plan: `exec --trace`'s or
    /// syncopate.torch's `write_trace` (real training). Needs --cluster, the machine it ran on.
    #[arg(long, value_name = "TRACE", requires = "cluster", conflicts_with_all = ["backend", "ranks", "compute_scale", "iterations", "warmup", "seed", "timeout_s"])]
    pub measured: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Args, Debug)]
pub struct SweepArgs {
    /// Shipped model name or path to a model profile JSON file.
    #[arg(long)]
    pub model: String,
    /// Shipped cluster name or path to a cluster JSON file.
    #[arg(long)]
    pub cluster: String,
    /// Node counts to sweep (comma-separated).
    #[arg(long, value_delimiter = ',', required = true, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub nodes: Vec<u32>,
    /// GPUs per node (default: the cluster's).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::count)]
    pub gpus_per_node: Option<u32>,
    /// Per-NIC bandwidths in Gb/s to sweep (default: the cluster's).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true, value_parser = crate::args::number)]
    pub inter_gbps: Vec<f64>,
    /// Strategies (comma-separated, see `syncopate list strategies`).
    #[arg(long, value_delimiter = ',', default_value = "horovod")]
    pub strategy: Vec<String>,
    /// Compressor specs (comma-separated, see `syncopate list compressors`).
    #[arg(long, value_delimiter = ',', default_value = "none")]
    pub compressor: Vec<String>,
    /// Error-feedback memory for every compressed run.
    #[arg(long, default_value = "none")]
    pub memory: String,
    /// Compress each group in one codec call, or each tensor in a call of its own before the
    /// group's fused collective (strategies that price their own codecs skip `tensor`).
    #[arg(long, value_enum, default_value = "group")]
    pub codec_calls: CodecCallsArg,
    /// The framework that runs every plan (see `syncopate list frameworks`; a name or a path),
    /// `strategy` for each strategy's own (ddp: pytorch-ddp, horovod: horovod, byteps: byteps, deepspeed: deepspeed, fsdp: pytorch-fsdp, others none), or
    /// `none`.
    #[arg(long, default_value = "none")]
    pub framework: String,
    /// The codec set whose implementations compress every plan (see `syncopate list codecs`),
    /// each op priced by `--framework`; default: the device profile's codec curves.
    #[arg(long)]
    pub codecs: Option<String>,
    /// Folder for sweep.csv and sweep.svg (created if missing).
    #[arg(long, default_value = "sweep")]
    pub out: PathBuf,
}

#[derive(Subcommand, Debug)]
pub enum ExperimentCommand {
    /// Regenerate an experiment directory's results.csv, SVG plots and README results table.
    Run(ExperimentRunArgs),
}

#[derive(Args, Debug)]
pub struct ExperimentRunArgs {
    /// The experiment directory (holding spec.json and README.md).
    pub dir: PathBuf,
    /// Calibration experiments: evaluate the shipped calibrated inputs instead of fitting anew;
    /// lab experiments: predict the shipped measurements instead of measuring anew.
    #[arg(long)]
    pub reuse_fit: bool,
}

#[derive(Args, Debug)]
pub struct TuneArgs {
    /// Shipped model name or path to a model profile JSON file.
    #[arg(long)]
    pub model: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// A compressor spec a group may use (besides none), or `auto` for a set of common ones.
    #[arg(long, default_value = "none")]
    pub compressor: String,
    /// Error-feedback memory for the compressor (default: residual for biased compressors).
    #[arg(long)]
    pub memory: Option<String>,
    /// What to search: fusion (groups, count, thresholds), compression (per-group choice), all.
    #[arg(long, default_value = "fusion")]
    pub search: String,
    /// How every candidate's codecs run: one call per group, or one per tensor before the
    /// group's fused collective (`auto` then leaves out PowerSGD; baselines that price their own
    /// codecs are skipped).
    #[arg(long, value_enum, default_value = "group")]
    pub codec_calls: CodecCallsArg,
    /// The framework that runs every candidate plan: `ddp` (or `pytorch-ddp`), `horovod`,
    /// `byteps` and `deepspeed` search only the settings that framework has (bucket caps, bucket
    /// views and comm hook; fusion threshold, cycle time and fp16; partition size and fp16; the
    /// communication data type), each priced as it runs them; with `--codecs`,
    /// or another framework file (see `syncopate list frameworks`; a name or a path), every
    /// plan is searched, priced with the framework's per-call costs; default none.
    #[arg(long)]
    pub framework: Option<String>,
    /// The codec set whose implementations compress every candidate (see `syncopate list
    /// codecs`), each op priced by `--framework`; `--compressor auto` then picks among its
    /// compressors; default: the device profile's codec curves.
    #[arg(long)]
    pub codecs: Option<String>,
    /// Write the best plan here (`simulate --plan` on it reproduces the tuned time).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// With `--framework ddp`, `horovod`, `byteps` or `deepspeed`: write the tuned settings here, as
    /// `export` does.
    #[arg(long)]
    pub export: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Make a lab: N namespaces on a bridge, each node's link shaped; measure it; write a cluster.
    Up(LabUpArgs),
    /// Run a command once per rank inside the lab's namespaces (directly, or with --mpi).
    Run(LabRunArgs),
    /// Remove everything a lab made (also after a crashed `up`).
    Down(LabNameArgs),
    /// What a lab is, what of it exists, and its shapers' counters.
    Status(LabStatusArgs),
    /// The lab's own measurements, run inside its namespaces.
    #[command(subcommand, hide = true)]
    Probe(LabProbeCommand),
}

#[derive(Args, Debug)]
pub struct LabNameArgs {
    /// The lab's name (prefix of its namespaces and links).
    #[arg(long, default_value = syncopate_exec::lab::DEFAULT_NAME)]
    pub name: String,
}

#[derive(Args, Debug)]
pub struct LabUpArgs {
    /// Nodes (network namespaces).
    #[arg(long)]
    pub nodes: u32,
    /// Rate of each node's link, per direction, in Gb/s.
    #[arg(long, allow_negative_numbers = true)]
    pub gbps: f64,
    /// Delay added to each node's egress in µs (needs the kernel's netem qdisc).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub latency_us: f64,
    /// CPUs per node, dealt round-robin from the CPUs this process may use; `lab run` pins
    /// each node's ranks to them.
    #[arg(long)]
    pub cores_per_node: Option<u32>,
    /// HTB burst per shaped direction in bytes (default: 50 µs of the rate, at least two frames).
    #[arg(long)]
    pub burst_bytes: Option<u64>,
    #[command(flatten)]
    pub lab: LabNameArgs,
    /// Write the lab as a cluster file fitted to the measurements.
    #[arg(long, conflicts_with = "no_measure")]
    pub cluster_out: Option<PathBuf>,
    /// Device profile of the cluster file (name or path).
    #[arg(long, default_value = "host-2core")]
    pub device: String,
    /// Seconds of the single-stream goodput measurement.
    #[arg(long, default_value_t = 3.0, allow_negative_numbers = true)]
    pub measure_s: f64,
    /// Repeats of each allreduce size (the median is kept).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Make the lab without measuring it.
    #[arg(long)]
    pub no_measure: bool,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Args, Debug)]
pub struct LabRunArgs {
    #[command(flatten)]
    pub lab: LabNameArgs,
    /// Ranks per node (node-major: node 0 holds ranks 0..K).
    #[arg(long, default_value_t = 1)]
    pub ranks_per_node: u32,
    /// Launch through Open MPI's mpirun (one MPMD context per rank, traffic over the lab's links).
    #[arg(long)]
    pub mpi: bool,
    /// Longest the whole run may take, in seconds; then every rank is stopped.
    #[arg(long, default_value_t = 600.0, allow_negative_numbers = true)]
    pub timeout_s: f64,
    /// MASTER_PORT of torchrun's variables.
    #[arg(long, default_value_t = syncopate_exec::lab::run::DEFAULT_MASTER_PORT)]
    pub master_port: u16,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct LabStatusArgs {
    #[command(flatten)]
    pub lab: LabNameArgs,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

#[derive(Subcommand, Debug)]
pub enum LabProbeCommand {
    /// TCP probe server: prints `ready`, serves until a client is done.
    Serve {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        seconds: f64,
    },
    /// TCP probe client: goodput, round trip and burst against a server; JSON on stdout.
    Client {
        #[arg(long)]
        connect: std::net::SocketAddr,
        #[arg(long)]
        seconds: f64,
        #[arg(long)]
        round_trips: usize,
        #[arg(long)]
        burst_repeats: usize,
    },
    /// Collective sweep over MPI (one process per rank under mpirun): fp32 allreduce or the
    /// backend's allgather; JSON on rank 0's stdout.
    Sweep {
        /// allreduce or allgather.
        #[arg(long)]
        op: String,
        #[arg(long, value_delimiter = ',', required = true)]
        sizes: Vec<u64>,
        #[arg(long)]
        repeats: usize,
        #[arg(long)]
        timeout_s: f64,
    },
    /// How compute and allreduces slow each other on every rank (under mpirun); JSON on rank 0.
    /// Compute is timed beside the largest size; every size alone and beside compute; a 4 KiB
    /// allreduce alone and behind a second stream's allreduces of the largest size.
    Contention {
        #[arg(long, value_delimiter = ',', required = true)]
        sizes: Vec<u64>,
        #[arg(long)]
        repeats: usize,
        #[arg(long)]
        timeout_s: f64,
    },
    /// The pace of the MPI backend's compute as a run meets it (under mpirun); JSON on rank 0:
    /// every rank calibrates and then computes 200 ms of it at once, `--repeats` times.
    Pace {
        #[arg(long)]
        repeats: usize,
        #[arg(long)]
        timeout_s: f64,
    },
    /// The MPI transport's conformance checks against the host mesh (under mpirun).
    MpiCheck {
        #[arg(long, default_value_t = 30.0)]
        timeout_s: f64,
        /// This rank exits abruptly before the timeout check; the others must report it in time.
        #[arg(long)]
        kill_rank: Option<u32>,
    },
}
