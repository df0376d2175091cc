//! Grids of simulations (model × cluster layout × strategy × compressor) run in parallel, with infeasible combinations kept as skipped rows.

use crate::compress::{Compressor, Memory};
use crate::error::Result;
use crate::model::ModelProfile;
use crate::plan::{CodecCalls, Scheme};
use crate::scenario::Scenario;
use crate::simulate::{simulate, SimOptions, Summary};
use crate::strategy::{Strategy, StrategyOptions};
use crate::topology::{Cluster, ClusterOverrides};
use rayon::prelude::*;
use std::collections::BTreeMap;

pub mod table;

/// One simulation of a grid.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub model: String,
    pub cluster: String,
    pub overrides: ClusterOverrides,
    pub strategy: Strategy,
    pub compressor: Compressor,
    pub memory: Memory,
    /// Forces every group of the strategy's plan onto this scheme (GRACE's allgather, say).
    pub scheme: Option<Scheme>,
    /// One codec call per group, or per tensor (Horovod's and MergeComp's layer-wise runs).
    pub codec_calls: CodecCalls,
}

/// The cluster layout a point ran on, after overrides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Layout {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub inter_gbps: f64,
}

impl Layout {
    pub fn gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

/// What became of a point: a prediction, or why the combination cannot run (a compressing
/// strategy without a compressor, a scheme the compressor cannot aggregate with).
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Done(Box<Summary>),
    Skipped(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub point: Point,
    pub layout: Layout,
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
    pub model: &'a str,
    pub cluster: &'a str,
    pub nodes: &'a [u32],
    pub gpus_per_node: Option<u32>,
    pub inter_gbps: &'a [f64],
    pub strategies: &'a [Strategy],
    pub compressors: &'a [Compressor],
    pub memory: Memory,
    pub codec_calls: CodecCalls,
}

impl Grid<'_> {
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
                        });
                    }
                }
            }
        }
        points
    }
}

/// Simulates every point on all cores, rows in the order of `points`. A model or cluster that
/// does not load, or a layout the cluster rejects, is an error; a combination the strategy or
/// plan rejects is a skipped row.
pub fn run(points: &[Point], base: &StrategyOptions) -> Result<Vec<Row>> {
    let mut models = BTreeMap::new();
    for point in points {
        if !models.contains_key(&point.model) {
            models.insert(point.model.clone(), ModelProfile::load(&point.model)?);
        }
    }
    let scenarios = points
        .iter()
        .map(|point| {
            let cluster = Cluster::load(&point.cluster, point.overrides)?;
            Scenario::new(models[&point.model].clone(), cluster)
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

fn run_point(point: &Point, scenario: Scenario, base: &StrategyOptions) -> Result<Summary> {
    point
        .strategy
        .check_codec_calls(point.codec_calls, "codec_calls")?;
    let options = StrategyOptions {
        compressor: point.compressor,
        memory: point.memory,
        ..*base
    };
    let mut plan = point.strategy.plan(&scenario, &options)?;
    if let Some(scheme) = point.scheme {
        plan.set_scheme(scheme);
    }
    plan.codec_calls = point.codec_calls;
    Ok(simulate(&scenario, &plan, &SimOptions::default())?.summary)
}
