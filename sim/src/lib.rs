//! Syncopate's simulator: data formats, cost models, the discrete-event engine and the search.
//!
//! # From a model to a trace
//!
//! A model profile ([`inputs::model::ModelProfile`]: each gradient tensor's size and compute
//! time) on a cluster ([`inputs::topology::Cluster`]: devices, links, collective curves) makes a
//! [`predict::scenario::Scenario`]. A strategy ([`strategy::Strategy`]) or the search
//! ([`search`]) turns it into a [`plan::Plan`]: which tensors are fused into groups, how each
//! group is compressed and exchanged, and how collectives are launched. A plan is lowered once
//! into a [`schedule::Schedule`], the steps every rank runs, which the simulator, every executor
//! and `syncopate.torch` all run. [`predict::cost`] prices each step for the scenario, the
//! [`predict::engine`] runs the steps of every rank in simulated time, and
//! [`predict::simulate::simulate`] summarizes the iterations it ran
//! ([`predict::summary::Summary`]) and can keep a timeline ([`predict::trace::Trace`], Chrome's
//! trace format).
//!
//! ```
//! use syncopate_sim::inputs::model::ModelProfile;
//! use syncopate_sim::predict::scenario::Scenario;
//! use syncopate_sim::predict::simulate::{schedule, simulate, SimOptions};
//! use syncopate_sim::strategy::{Strategy, StrategyOptions};
//! use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
//!
//! // ResNet-50 as profiled on a V100, on two 4-GPU machines joined by 10 Gb Ethernet.
//! let model = ModelProfile::load("resnet50")?;
//! let nodes = ClusterOverrides { nodes: Some(2), ..ClusterOverrides::default() };
//! let scenario = Scenario::new(model, Cluster::load("v100-10gbe", nodes)?)?;
//! // PyTorch DDP's buckets with every gradient cast to fp16 on the wire.
//! let options = StrategyOptions { compressor: "fp16".parse()?, ..StrategyOptions::default() };
//! let plan = Strategy::Ddp.plan(&scenario, &options)?;
//! // The steps each rank runs: a backward step per tensor, then per bucket an encode, the
//! // allreduce and a decode.
//! let steps = schedule(&scenario, &plan)?.steps.len();
//! assert!(steps > plan.groups.len() * 3);
//! // One warm-up and one measured iteration, with the timeline of rank 0.
//! let run = SimOptions { trace_ranks: 1, ..SimOptions::default() };
//! let outcome = simulate(&scenario, &plan, &run)?;
//! let iteration = outcome.summary.iteration_time_ms;
//! assert!(iteration > outcome.summary.compute_ms * 0.9);
//! let trace = outcome.trace.expect("rank 0's timeline");
//! assert!(trace.trace_events.iter().any(|event| event.name.starts_with("allreduce")));
//! # Ok::<(), syncopate_sim::SimError>(())
//! ```
//!
//! # Where things are
//!
//! The folders are layers: [`base`] under everything, [`inputs`] under plans, [`predict`] over
//! schedules.
//!
//! - [`base`]: what every layer uses: [`base::time`], [`base::units`], [`base::limits`],
//!   [`base::error`], the shipped data files ([`base::data`]), [`base::stats`], [`base::csv`],
//!   [`base::chart`].
//! - [`inputs`]: what a run is given, each a data file with its provenance:
//!   [`inputs::model`], [`inputs::device`], [`inputs::topology`], [`inputs::framework`]
//!   ([`inputs::flops`] and [`inputs::carry`] carry a profile to another device,
//!   [`inputs::real_run`] says how a real run is timed); the compressors ([`compress`]) and the
//!   codec sets that write them as framework ops ([`codec`], which also prices a compressor on a
//!   device).
//! - What a plan is and means: [`plan`] (with [`sharding`] for ZeRO and FSDP), [`strategy`],
//!   [`schedule`] (with the launch policy, [`schedule::launch`]).
//! - [`predict`]: pricing and running. [`collective`] (of the operations in [`collective_op`])
//!   and [`predict::cost`] price steps, [`predict::framework_cost`] what the framework adds to
//!   them, [`predict::contention`] what shares a device; [`predict::graph`],
//!   [`predict::engine`], [`predict::noise`], [`predict::simulate`], [`predict::evaluate`] (the
//!   tuner's steady time), [`predict::memory`], [`predict::summary`], [`predict::trace`], [`predict::validate`].
//! - Choosing plans: [`search`], [`sweep`], [`export`] (the settings of DDP, Horovod, BytePS and
//!   DeepSpeed).
//! - Fits and checks against measurements: [`calibrate`] (nccl-tests curves, the TCP, p2p and
//!   beside-compute fits of the labs, predicted-against-measured tables), [`experiment`].

#![forbid(unsafe_code)]
#![deny(missing_docs, unreachable_pub)]

pub mod base;
pub mod calibrate;
pub mod codec;
pub mod collective;
pub mod collective_op;
pub mod compress;
pub mod experiment;
pub mod export;
pub mod inputs;
pub mod plan;
pub mod predict;
pub mod schedule;
pub mod search;
pub mod sharding;
pub mod strategy;
pub mod sweep;

pub use base::error::{Result, SimError};
