//! Grids of simulations run in parallel, with infeasible combinations kept as skipped rows.
//!
//! A grid spans model × cluster layout × strategy × compressor.

use crate::base::error::{Result, SimError};
use crate::codec::CodecSet;
use crate::compress::{Compressor, Memory};
use crate::inputs::framework::Framework;
use crate::inputs::model::ModelProfile;
use crate::inputs::topology::{Cluster, ClusterOverrides};
use crate::plan::{CodecCalls, Scheme};
use crate::predict::scenario::Scenario;
use crate::predict::simulate::{simulate, SimOptions};
use crate::predict::summary::Summary;
use crate::strategy::{Strategy, StrategyOptions};
use rayon::prelude::*;
use std::collections::BTreeMap;

pub mod table;

/// One simulation of a grid.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Model profile: a shipped name or a path.
    pub model: String,
    /// Cluster: a shipped name or a path.
    pub cluster: String,
    /// Changes to the cluster's layout (nodes, GPUs per node, inter-node rate).
    pub overrides: ClusterOverrides,
    /// The strategy that plans the point.
    pub strategy: Strategy,
    /// The compressor the strategy is given.
    pub compressor: Compressor,
    /// Its error-feedback memory.
    pub memory: Memory,
    /// Forces every group of the strategy's plan onto this scheme (GRACE's allgather, say).
    pub scheme: Option<Scheme>,
    /// One codec call per group, or per tensor (Horovod's and MergeComp's layer-wise runs).
    pub codec_calls: CodecCalls,
    /// The framework that runs the point's plan.
    pub framework: FrameworkChoice,
    /// The codec set that compresses it (`crate::codec::CodecSet`: a name, a path, or
    /// `native`); none or `native`: the device's curves.
    pub codecs: Option<String>,
    /// Horovod's cycle time for this point, in µs; none: the sweep's.
    pub cycle_us: Option<f64>,
    /// Samples per GPU, where the run used another batch than the model profile's
    /// (`ModelProfile::at_batch`); none: the profile's.
    pub batch: Option<u32>,
    /// Ops per parameter tensor of the update the run's code makes after the framework's wait
    /// for its collectives, where it replaces the framework's optimizer step
    /// (`Framework::step_ops_per_tensor`); none: the framework's.
    pub step_ops_per_tensor: Option<f64>,
}

/// Which framework runs a point's plan (`crate::inputs::framework`).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum FrameworkChoice {
    /// None: the plan's steps alone.
    #[default]
    None,
    /// Each strategy's own (`Strategy::framework`: ddp runs on pytorch-ddp, horovod on horovod,
    /// byteps on byteps, the others on none).
    Strategy,
    /// A framework file: a shipped name or a path.
    Named(String),
}

impl FrameworkChoice {
    /// `none`, `strategy`, or a framework's name or path.
    pub fn parse(text: &str) -> FrameworkChoice {
        match text {
            "none" => FrameworkChoice::None,
            "strategy" => FrameworkChoice::Strategy,
            name => FrameworkChoice::Named(name.to_string()),
        }
    }

    /// The framework's name for `strategy`, if any.
    fn name(&self, strategy: Strategy) -> Option<String> {
        match self {
            FrameworkChoice::None => None,
            FrameworkChoice::Strategy => strategy.framework().map(str::to_string),
            FrameworkChoice::Named(name) => Some(name.clone()),
        }
    }
}

/// The cluster layout a point ran on, after overrides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Layout {
    /// Number of nodes.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Inter-node NIC bandwidth, in Gb/s.
    pub inter_gbps: f64,
}

impl Layout {
    /// Total GPUs: nodes × GPUs per node.
    pub fn gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

/// What became of a point: a prediction, or why the combination cannot run (a compressing
/// strategy without a compressor, a scheme the compressor cannot aggregate with).
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The simulation's summary.
    Done(Box<Summary>),
    /// Why the combination cannot run.
    Skipped(String),
}

/// One point's result: the point, the layout it ran on and its outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The point simulated.
    pub point: Point,
    /// The cluster layout it ran on.
    pub layout: Layout,
    /// Its prediction, or why it was skipped.
    pub outcome: Outcome,
}

impl Row {
    /// The prediction, or `None` for a skipped combination.
    pub fn summary(&self) -> Option<&Summary> {
        match &self.outcome {
            Outcome::Done(summary) => Some(summary),
            Outcome::Skipped(_) => None,
        }
    }
}

/// Every combination of the lists, layouts outermost and compressors innermost.
pub struct Grid<'a> {
    /// Model profile of every point.
    pub model: &'a str,
    /// Cluster of every point.
    pub cluster: &'a str,
    /// Node counts to sweep.
    pub nodes: &'a [u32],
    /// GPUs per node of every point (none: the cluster's).
    pub gpus_per_node: Option<u32>,
    /// Inter-node rates to sweep, in Gb/s.
    pub inter_gbps: &'a [f64],
    /// Strategies to sweep.
    pub strategies: &'a [Strategy],
    /// Compressors to sweep.
    pub compressors: &'a [Compressor],
    /// Error-feedback memory of every point.
    pub memory: Memory,
    /// One codec call per group or per tensor, for every point.
    pub codec_calls: CodecCalls,
    /// Which framework runs every point's plan.
    pub framework: &'a FrameworkChoice,
    /// The codec set of every point (`Point::codecs`).
    pub codecs: Option<&'a str>,
}

impl Grid<'_> {
    /// The grid's points: rates outermost, then node counts, strategies and compressors.
    pub fn points(&self) -> Vec<Point> {
        let mut points = Vec::new();
        for &gbps in self.inter_gbps {
            for &nodes in self.nodes {
                for &strategy in self.strategies {
                    for &compressor in self.compressors {
                        points.push(Point {
                            model: self.model.to_string(),
                            cluster: self.cluster.to_string(),
                            overrides: ClusterOverrides {
                                nodes: Some(nodes),
                                gpus_per_node: self.gpus_per_node,
                                inter_gbps: Some(gbps),
                            },
                            strategy,
                            compressor,
                            memory: self.memory,
                            scheme: None,
                            codec_calls: self.codec_calls,
                            framework: self.framework.clone(),
                            codecs: self.codecs.map(str::to_string),
                            cycle_us: None,
                            batch: None,
                            step_ops_per_tensor: None,
                        });
                    }
                }
            }
        }
        points
    }
}

/// Simulates every point on all cores, rows in the order of `points`. A model, cluster or
/// framework that does not load, or a layout the cluster rejects, is an error; a combination the
/// strategy or plan rejects is a skipped row.
pub fn run(points: &[Point], base: &StrategyOptions) -> Result<Vec<Row>> {
    let mut models = BTreeMap::new();
    let mut frameworks = BTreeMap::new();
    let mut codec_sets = BTreeMap::new();
    for point in points {
        if let Some(name) = &point.codecs {
            if !codec_sets.contains_key(name) {
                let set = CodecSet::named(name)?.map(|(_, set)| set);
                codec_sets.insert(name.clone(), set);
            }
        }
        if let std::collections::btree_map::Entry::Vacant(entry) =
            models.entry((point.model.clone(), point.batch))
        {
            let profile = ModelProfile::load(&point.model)?;
            entry.insert(match point.batch {
                Some(batch) => {
                    profile.at_batch(batch, &format!("{} at batch {batch}", point.model))?
                }
                None => profile,
            });
        }
        if let Some(name) = point.framework.name(point.strategy) {
            if let std::collections::btree_map::Entry::Vacant(entry) = frameworks.entry(name) {
                let framework = Framework::named(entry.key())?;
                entry.insert(framework);
            }
        }
    }
    let scenarios = points
        .iter()
        .map(|point| {
            let cluster = Cluster::load(&point.cluster, point.overrides)?;
            let framework = point
                .framework
                .name(point.strategy)
                .and_then(|name| frameworks[&name].clone())
                .map(|(_, framework)| framework);
            let framework = with_step_ops(framework, point.step_ops_per_tensor)?;
            Scenario::new(models[&(point.model.clone(), point.batch)].clone(), cluster)?
                .with_framework(framework)
                .with_codecs(
                    point
                        .codecs
                        .as_ref()
                        .and_then(|name| codec_sets[name].clone()),
                )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(points
        .par_iter()
        .zip(scenarios)
        .map(|(point, scenario)| {
            let cluster = &scenario.cluster;
            let layout = Layout {
                nodes: cluster.nodes,
                gpus_per_node: cluster.gpus_per_node,
                inter_gbps: cluster.inter_node.nic_bandwidth_gbps,
            };
            let outcome = match run_point(point, scenario, base) {
                Ok(summary) => Outcome::Done(Box::new(summary)),
                Err(err) => Outcome::Skipped(err.to_string()),
            };
            Row {
                point: point.clone(),
                layout,
                outcome,
            }
        })
        .collect())
}

/// `framework` with a point's own optimizer step (`Point::step_ops_per_tensor`), checked; a
/// step without a framework to replace is refused.
fn with_step_ops(framework: Option<Framework>, ops: Option<f64>) -> Result<Option<Framework>> {
    match (framework, ops) {
        (Some(mut framework), Some(ops)) => {
            framework.step_ops_per_tensor = ops;
            let label = format!("{} with the point's step_ops_per_tensor", framework.name);
            framework.validate(&label)?;
            Ok(Some(framework))
        }
        (None, Some(_)) => Err(SimError::bad_value(
            "step_ops_per_tensor",
            "a point without a framework",
            "the ops replace a framework's optimizer step: name the framework",
        )),
        (framework, None) => Ok(framework),
    }
}

fn run_point(point: &Point, scenario: Scenario, base: &StrategyOptions) -> Result<Summary> {
    point
        .strategy
        .check_codec_calls(point.codec_calls, "codec_calls")?;
    let options = StrategyOptions {
        compressor: point.compressor,
        memory: point.memory,
        cycle_us: point.cycle_us.unwrap_or(base.cycle_us),
        ..*base
    };
    let mut plan = point.strategy.plan(&scenario, &options)?;
    if let Some(scheme) = point.scheme {
        plan.set_scheme(scheme);
    }
    plan.codec_calls = point.codec_calls;
    plan.framework = scenario.framework.as_ref().map(|f| f.name.clone());
    if let Some(codecs) = &scenario.codecs {
        codecs.check_plan(&plan)?;
        plan.codecs = point.codecs.clone();
    }
    Ok(simulate(&scenario, &plan, &SimOptions::default())?.summary)
}
