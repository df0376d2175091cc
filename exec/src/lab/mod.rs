//! `syncopate lab`: an emulated cluster on one machine, made, described, run on, measured, removed.
//!
//! The cluster is network namespaces on a bridge with shaped veth links.
//!
//! ```text
//!   root namespace: bridge NAME-br (198.18.X.254/24, where mpirun's PMIx server listens)
//!        |                |
//!     NAME-h0          NAME-h1        veth ends in the root namespace: HTB to B Gb/s (ingress of the node)
//!        |                |
//!     NAME-e0          NAME-e1        veth ends inside NAME-n0, NAME-n1: HTB to B Gb/s (egress of the node)
//!   198.18.X.1       198.18.X.2
//! ```
//!
//! Every object is recorded in the lab's state file (`state`) the moment it exists, so
//! `down` removes a lab that a crash left half made, and an `up` that fails removes what it
//! made before it returns the error.

pub mod experiment;
pub mod fit;
pub mod measure;
pub mod net;
pub mod preflight;
pub mod run;
pub mod shape;
pub mod signals;
pub mod state;

use crate::error::{ExecError, Result};
use serde::Serialize;
use state::{Created, LabState, Node, STATE_FORMAT_VERSION};
use std::sync::atomic::{AtomicBool, Ordering};
use syncopate_sim::SimError;

/// The name a lab gets without `--name`.
pub const DEFAULT_NAME: &str = "lab";

/// The longest lab name: interface names are at most 15 bytes, and `NAME-h63` must fit.
pub const MAX_NAME: usize = 10;

/// The most nodes a lab may have whatever the machine: two decimal digits in link names and a
/// /24 with room for the root's address.
pub const MAX_NODES_ANY_MACHINE: u32 = 64;

/// Nodes per CPU beyond which a lab no longer emulates a cluster: each node runs at least one
/// rank plus its communication threads on a share of one core.
pub const NODES_PER_CPU: u32 = 8;

/// The fastest rate a shaped veth is asked for: veth copies in memory, and HTB's per-packet
/// work on a few cores cannot keep up far beyond this.
pub const MAX_GBPS: f64 = 100.0;

/// The slowest rate: 1 Mb/s.
pub const MIN_GBPS: f64 = 0.001;

/// The largest added one-way delay, 1 s.
pub const MAX_LATENCY_US: f64 = 1e6;

/// What `lab up` is asked to make.
#[derive(Clone, Debug)]
pub struct LabSpec {
    /// The lab's name (`--name`): it prefixes its namespaces and interfaces.
    pub name: String,
    /// Number of emulated nodes (`--nodes`).
    pub nodes: u32,
    /// Shaped rate of each node's link in each direction, in Gb/s (`--gbps`).
    pub gbps: f64,
    /// One-way delay added to each node's egress, in µs (`--latency-us`; 0: none).
    pub latency_us: f64,
    /// CPUs pinned per node, dealt round-robin (`--cores-per-node`; none: not pinned).
    pub cores_per_node: Option<u32>,
    /// HTB burst in bytes (default: [`shape::default_burst`]).
    pub burst_bytes: Option<u64>,
    /// The command line, recorded in the state and in the cluster file's provenance.
    pub command: String,
}

/// Checks a lab name: lowercase letters and digits, starting with a letter, at most
/// [`MAX_NAME`] long (it prefixes interface names).
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(SimError::bad_value(
            "--name",
            name,
            format!("a lab name is 1 to {MAX_NAME} lowercase letters or digits, starting with a letter (it prefixes interface names of at most 15 bytes)"),
        )
        .into())
    }
}

/// The most nodes a lab may have on a machine with `cpus` usable CPUs.
pub fn max_nodes(cpus: usize) -> u32 {
    (cpus as u32)
        .saturating_mul(NODES_PER_CPU)
        .clamp(2, MAX_NODES_ANY_MACHINE)
}

impl LabSpec {
    /// Rejects values that make no lab, naming the flag.
    pub fn check(&self, cpus: &[u32]) -> Result<()> {
        check_name(&self.name)?;
        let most = max_nodes(cpus.len());
        if self.nodes < 2 || self.nodes > most {
            return Err(SimError::bad_value(
                "--nodes",
                self.nodes,
                format!(
                    "a lab has 2 to {most} nodes on this machine ({} usable CPUs × {NODES_PER_CPU} nodes per CPU, at most {MAX_NODES_ANY_MACHINE})",
                    cpus.len()
                ),
            )
            .into());
        }
        if !(self.gbps.is_finite() && (MIN_GBPS..=MAX_GBPS).contains(&self.gbps)) {
            return Err(SimError::bad_value(
                "--gbps",
                self.gbps,
                format!("the shaped rate must be a number of Gb/s from {MIN_GBPS} to {MAX_GBPS}"),
            )
            .into());
        }
        if !(self.latency_us.is_finite() && (0.0..=MAX_LATENCY_US).contains(&self.latency_us)) {
            return Err(SimError::bad_value(
                "--latency-us",
                self.latency_us,
                format!("the added delay must be a number of µs from 0 to {MAX_LATENCY_US}"),
            )
            .into());
        }
        if let Some(cores) = self.cores_per_node {
            if cores == 0 || cores as usize > cpus.len() {
                return Err(SimError::bad_value(
                    "--cores-per-node",
                    cores,
                    format!(
                        "between 1 and the {} CPUs this process may use ({cpus:?})",
                        cpus.len()
                    ),
                )
                .into());
            }
        }
        if let Some(burst) = self.burst_bytes {
            if !(shape::MIN_BURST_BYTES..=shape::MAX_BURST_BYTES).contains(&burst) {
                return Err(SimError::bad_value(
                    "--burst-bytes",
                    burst,
                    format!(
                        "an HTB burst from {} to {} bytes",
                        shape::MIN_BURST_BYTES,
                        shape::MAX_BURST_BYTES
                    ),
                )
                .into());
            }
        }
        Ok(())
    }

    /// The lab this spec describes, on subnet `subnet_index`, nothing created yet. With
    /// `--cores-per-node C`, node i gets C CPUs round-robin from `cpus`.
    pub fn plan(&self, subnet_index: u32, cpus: &[u32]) -> LabState {
        let name = &self.name;
        let nodes = (0..self.nodes as usize)
            .map(|i| Node {
                namespace: format!("{name}-n{i}"),
                interface: format!("{name}-e{i}"),
                bridge_port: format!("{name}-h{i}"),
                address: net::address(subnet_index, i as u32 + 1),
                cpus: match self.cores_per_node {
                    Some(c) => (0..c as usize)
                        .map(|j| cpus[(i * c as usize + j) % cpus.len()])
                        .collect(),
                    None => Vec::new(),
                },
            })
            .collect();
        LabState {
            format_version: STATE_FORMAT_VERSION,
            name: name.clone(),
            command: self.command.clone(),
            gbps: self.gbps,
            burst_bytes: self
                .burst_bytes
                .unwrap_or_else(|| shape::default_burst(self.gbps)),
            latency_us: self.latency_us,
            subnet: net::subnet(subnet_index),
            bridge: format!("{name}-br"),
            root_address: net::address(subnet_index, net::ROOT_HOST),
            nodes,
            created: Vec::new(),
            complete: false,
        }
    }
}

/// Makes the lab: checks, claims the name, creates and shapes every link. On any failure, or
/// when `interrupted` is set between steps, removes what it made and returns the error.
pub fn up(spec: &LabSpec, interrupted: &AtomicBool) -> Result<LabState> {
    preflight::check(
        &spec.name,
        preflight::Needs {
            network: true,
            ..Default::default()
        },
    )?;
    let cpus = preflight::online_cpus()?;
    spec.check(&cpus)?;
    let lock = state::lock()?;
    refuse_leftovers(spec)?;
    // A state file that cannot be read has no subnet to avoid; a live lab's bridge address
    // still keeps its /24 taken (`free_subnet` looks at the root namespace's addresses).
    let others: Vec<LabState> = state::list()?
        .iter()
        .filter(|other| **other != spec.name)
        .filter_map(|other| LabState::load(other).ok())
        .collect();
    let mut lab = spec.plan(net::free_subnet(&spec.name, &others)?, &cpus);
    lab.claim()?;
    // From here the state file holds the name and the subnet for every later `up`.
    drop(lock);
    match build(&mut lab, interrupted) {
        Ok(()) => Ok(lab),
        Err(err) => match remove(&lab) {
            Ok(()) => Err(err),
            Err(cleanup) => Err(ExecError::Lab {
                lab: lab.name.clone(),
                message: format!(
                    "{err}; removing what was made also failed ({cleanup}): run `syncopate lab down --name {}`",
                    lab.name
                ),
            }),
        },
    }
}

/// A lab's objects may exist without a state file only if something else made them; never
/// take them over.
fn refuse_leftovers(spec: &LabSpec) -> Result<()> {
    if state::path(&spec.name).exists() {
        return Err(ExecError::Lab {
            lab: spec.name.clone(),
            message: format!(
                "a lab of this name exists ({}); remove it with `syncopate lab down --name {}` or pick another --name",
                state::path(&spec.name).display(),
                spec.name
            ),
        });
    }
    let bridge = format!("{}-br", spec.name);
    let first = format!("{}-n0", spec.name);
    if net::link_exists(&bridge)? || net::namespace_exists(&first) {
        return Err(ExecError::Lab {
            lab: spec.name.clone(),
            message: format!(
                "`{bridge}` or namespace `{first}` already exists: a lab of this name is up (see `syncopate lab status --name {}`) or something else uses these names",
                spec.name
            ),
        });
    }
    Ok(())
}

fn build(lab: &mut LabState, interrupted: &AtomicBool) -> Result<()> {
    let check_interrupt = |lab: &LabState| -> Result<()> {
        if interrupted.load(Ordering::Relaxed) {
            return Err(ExecError::Lab {
                lab: lab.name.clone(),
                message: "interrupted while being made; what was made is removed".into(),
            });
        }
        Ok(())
    };
    net::create_bridge(lab)?;
    for i in 0..lab.nodes.len() {
        check_interrupt(lab)?;
        net::create_namespace(lab, i)?;
        if i == 0 && lab.latency_us > 0.0 && !shape::netem_available(&lab.nodes[0].namespace)? {
            return Err(SimError::bad_value(
                "--latency-us",
                lab.latency_us,
                "this kernel lacks the netem qdisc (tc: \"Specified qdisc kind is unknown\"), so no delay can be added; leave --latency-us out (the lab then has the veth's own few tens of µs)",
            )
            .into());
        }
        net::create_link(lab, i)?;
        let node = lab.nodes[i].clone();
        // Egress of the node: its NIC's send direction, with the added delay.
        shape::shape(
            lab,
            Some(&node.namespace),
            &node.interface,
            lab.latency_us > 0.0,
        )?;
        // The bridge's port towards the node: the NIC's receive direction, so that several
        // senders cannot push more than the rate into one node.
        shape::shape(lab, None, &node.bridge_port, false)?;
    }
    lab.complete = true;
    lab.save()
}

/// Removes everything `lab` records, last made first, then its state file. Objects already
/// gone are skipped, so removal can be repeated after a failure.
pub fn remove(lab: &LabState) -> Result<()> {
    let mut first_error = None;
    for created in lab.created.iter().rev() {
        if let Err(err) = net::remove(created) {
            first_error.get_or_insert(err);
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => lab.remove_file(),
    }
}

/// `lab down`: removes the lab called `name`.
pub fn down(name: &str) -> Result<LabState> {
    check_name(name)?;
    preflight::check(
        name,
        preflight::Needs {
            network: true,
            ..Default::default()
        },
    )?;
    let lab = LabState::load(name)?;
    remove(&lab)?;
    Ok(lab)
}

/// One node as `lab status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    /// The node's network namespace.
    pub namespace: String,
    /// The node's IPv4 address on the lab's /24.
    pub address: String,
    /// The node's NIC: the veth end inside its namespace.
    pub interface: String,
    /// CPUs the node's processes are pinned to (empty: not pinned).
    pub cpus: Vec<u32>,
    /// Whether the namespace exists now.
    pub namespace_exists: bool,
    /// Counters of the node's egress shaper (None when it is missing).
    pub egress: Option<shape::Counters>,
    /// Counters of the shaper towards the node.
    pub ingress: Option<shape::Counters>,
}

/// `lab status`: what the state file says and what of it exists.
#[derive(Clone, Debug, Serialize)]
pub struct LabStatus {
    /// The lab's name.
    pub name: String,
    /// Whether `lab up` finished making it.
    pub complete: bool,
    /// Shaped rate of each node's egress and ingress, in Gb/s.
    pub gbps: f64,
    /// HTB burst of every shaped direction, in bytes.
    pub burst_bytes: u64,
    /// Delay added to each node's egress, in µs (0: none).
    pub latency_us: f64,
    /// The lab's /24, e.g. `198.18.0.0/24`.
    pub subnet: String,
    /// The bridge's name in the root namespace.
    pub bridge: String,
    /// Whether the bridge exists now.
    pub bridge_exists: bool,
    /// The root namespace's address on the bridge.
    pub root_address: String,
    /// Each node's status, in node order.
    pub nodes: Vec<NodeStatus>,
    /// The `syncopate lab up` command line that made the lab.
    pub command: String,
}

/// `lab status`: the lab called `name` as recorded, which of its objects exist, and
/// its shapers' counters.
pub fn status(name: &str) -> Result<LabStatus> {
    check_name(name)?;
    preflight::check(name, preflight::Needs::default())?;
    let lab = LabState::load(name)?;
    let mut nodes = Vec::new();
    for node in &lab.nodes {
        let exists = net::namespace_exists(&node.namespace);
        let has_shaper = |created: &Created| matches!(created, Created::Qdisc { dev, .. } if *dev == node.interface || *dev == node.bridge_port);
        let shaped = lab.created.iter().any(has_shaper);
        nodes.push(NodeStatus {
            namespace: node.namespace.clone(),
            address: node.address.clone(),
            interface: node.interface.clone(),
            cpus: node.cpus.clone(),
            namespace_exists: exists,
            egress: (exists && shaped)
                .then(|| shape::counters(Some(&node.namespace), &node.interface).ok())
                .flatten(),
            ingress: shaped
                .then(|| shape::counters(None, &node.bridge_port).ok())
                .flatten(),
        });
    }
    Ok(LabStatus {
        name: lab.name.clone(),
        complete: lab.complete,
        gbps: lab.gbps,
        burst_bytes: lab.burst_bytes,
        latency_us: lab.latency_us,
        subnet: lab.subnet.clone(),
        bridge: lab.bridge.clone(),
        bridge_exists: net::link_exists(&lab.bridge)?,
        root_address: lab.root_address.clone(),
        nodes,
        command: lab.command.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(nodes: u32, gbps: f64) -> LabSpec {
        LabSpec {
            name: "t".into(),
            nodes,
            gbps,
            latency_us: 0.0,
            cores_per_node: Some(1),
            burst_bytes: None,
            command: String::new(),
        }
    }

    #[test]
    fn names_fit_interface_names() {
        assert!(check_name("lab").is_ok());
        assert!(check_name("a123456789").is_ok());
        assert!(check_name("a1234567890").is_err());
        assert!(check_name("").is_err());
        assert!(check_name("1a").is_err());
        assert!(check_name("La").is_err());
        assert!(check_name("a-b").is_err());
        let longest = format!("{}-h{}", "a".repeat(MAX_NAME), MAX_NODES_ANY_MACHINE - 1);
        assert!(longest.len() <= 15);
    }

    #[test]
    fn bad_specs_name_their_flag() {
        let cpus = [0, 1];
        for (bad, flag) in [
            (spec(1, 1.0), "--nodes"),
            (spec(17, 1.0), "--nodes"),
            (spec(2, 0.0), "--gbps"),
            (spec(2, -1.0), "--gbps"),
            (spec(2, f64::NAN), "--gbps"),
            (spec(2, 1e9), "--gbps"),
        ] {
            let err = bad.check(&cpus).unwrap_err().to_string();
            assert!(err.contains(flag), "{err}");
        }
        let mut late = spec(2, 1.0);
        late.latency_us = f64::INFINITY;
        assert!(late
            .check(&cpus)
            .unwrap_err()
            .to_string()
            .contains("--latency-us"));
        let mut cores = spec(2, 1.0);
        cores.cores_per_node = Some(3);
        assert!(cores
            .check(&cpus)
            .unwrap_err()
            .to_string()
            .contains("--cores-per-node"));
        assert!(spec(16, 1.0).check(&cpus).is_ok());
    }

    #[test]
    fn cpus_are_dealt_round_robin() {
        let mut s = spec(3, 1.0);
        s.cores_per_node = Some(1);
        let lab = s.plan(5, &[0, 1]);
        let cpus: Vec<Vec<u32>> = lab.nodes.iter().map(|n| n.cpus.clone()).collect();
        assert_eq!(cpus, vec![vec![0], vec![1], vec![0]]);
        assert_eq!(lab.nodes[2].address, "198.18.5.3");
        assert_eq!(lab.root_address, "198.18.5.254");
        assert_eq!(lab.nodes[1].bridge_port, "t-h1");
        s.cores_per_node = Some(2);
        assert_eq!(s.plan(0, &[0, 1]).nodes[2].cpus, vec![0, 1]);
    }
}
