//! A lab's network made with `ip`, and the removal of each of its parts.
//!
//! It consists of a bridge in the root namespace, one namespace per node joined to it by a veth
//! pair, and addresses on the lab's /24.

use super::state::{Created, LabState};
use crate::error::{ExecError, Result};
use crate::tool;
use std::path::Path;

/// The block every lab takes its /24 from: 198.18.0.0/15 is reserved for benchmarking
/// network devices (RFC 2544), so it collides with no real network this machine is on.
pub const LAB_NET_PREFIX: &str = "198.18";

/// How many /24s a lab may pick from (198.18.0.0/24 … 198.18.255.0/24).
pub const SUBNETS: u32 = 256;

/// The last octet of the root namespace's address on a lab's bridge.
pub const ROOT_HOST: u32 = 254;

/// The /24 of subnet `index`, e.g. `198.18.3.0/24`.
pub fn subnet(index: u32) -> String {
    format!("{LAB_NET_PREFIX}.{index}.0/24")
}

/// Host `host` of subnet `index`.
pub fn address(index: u32, host: u32) -> String {
    format!("{LAB_NET_PREFIX}.{index}.{host}")
}

/// The lowest /24 of the lab block that no other lab's state file and no address of the root
/// namespace uses.
pub fn free_subnet(lab: &str, others: &[LabState]) -> Result<u32> {
    let addresses = tool::run("ip", &["-o", "-4", "addr", "show"])?;
    (0..SUBNETS)
        .find(|&index| {
            let prefix = format!("{LAB_NET_PREFIX}.{index}.");
            let by_lab = others.iter().any(|o| o.subnet == subnet(index));
            let by_host = addresses.contains(&format!(" {prefix}"));
            !by_lab && !by_host
        })
        .ok_or_else(|| ExecError::Lab {
            lab: lab.to_string(),
            message: format!(
                "every /24 of {LAB_NET_PREFIX}.0.0/16 is taken by another lab or an address of this machine"
            ),
        })
}

/// Whether the network namespace `name` exists (has an entry in `/run/netns`).
pub fn namespace_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Whether a link called `name` exists in the root namespace (`ip link show`).
pub fn link_exists(name: &str) -> Result<bool> {
    tool::succeeds("ip", &["link", "show", "dev", name])
}

/// Creates the bridge with the root namespace's address on it (mpirun's PMIx server must be
/// reachable from the nodes) and brings it up.
pub fn create_bridge(state: &mut LabState) -> Result<()> {
    let bridge = state.bridge.clone();
    tool::run("ip", &["link", "add", &bridge, "type", "bridge"])?;
    state.record(Created::Link {
        name: bridge.clone(),
    })?;
    let root = format!("{}/24", state.root_address);
    tool::run("ip", &["addr", "add", &root, "dev", &bridge])?;
    tool::run("ip", &["link", "set", &bridge, "up"])?;
    Ok(())
}

/// Creates node `i`'s namespace (loopback up).
pub fn create_namespace(state: &mut LabState, i: usize) -> Result<()> {
    let ns = state.nodes[i].namespace.clone();
    tool::run("ip", &["netns", "add", &ns])?;
    state.record(Created::Namespace { name: ns.clone() })?;
    tool::run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
    Ok(())
}

/// Joins node `i`'s namespace to the bridge with a veth pair and gives it its address.
pub fn create_link(state: &mut LabState, i: usize) -> Result<()> {
    let node = state.nodes[i].clone();
    // The node's end is born inside its namespace: it never shows in the root namespace,
    // where a crash between creating and moving it would strand it.
    tool::run(
        "ip",
        &[
            "link",
            "add",
            &node.bridge_port,
            "type",
            "veth",
            "peer",
            "name",
            &node.interface,
            "netns",
            &node.namespace,
        ],
    )?;
    state.record(Created::Link {
        name: node.bridge_port.clone(),
    })?;
    tool::run(
        "ip",
        &["link", "set", &node.bridge_port, "master", &state.bridge],
    )?;
    tool::run("ip", &["link", "set", &node.bridge_port, "up"])?;
    let address = format!("{}/24", node.address);
    tool::run(
        "ip",
        &[
            "-n",
            &node.namespace,
            "addr",
            "add",
            &address,
            "dev",
            &node.interface,
        ],
    )?;
    tool::run(
        "ip",
        &["-n", &node.namespace, "link", "set", &node.interface, "up"],
    )?;
    Ok(())
}

/// Removes one created object if it still exists (so removal can be repeated).
pub fn remove(created: &Created) -> Result<()> {
    match created {
        Created::Namespace { name } => {
            if namespace_exists(name) {
                kill_processes(name)?;
                tool::run("ip", &["netns", "del", name])?;
            }
        }
        Created::Link { name } => {
            if link_exists(name)? {
                tool::run("ip", &["link", "del", "dev", name])?;
            }
        }
        Created::Qdisc { namespace, dev } => {
            let present = match namespace {
                Some(ns) => {
                    namespace_exists(ns) && tool::succeeds("ip", &["-n", ns, "link", "show", dev])?
                }
                None => link_exists(dev)?,
            };
            if present {
                let mut args: Vec<&str> = Vec::new();
                if let Some(ns) = namespace {
                    args.extend(["-n", ns.as_str()]);
                }
                args.extend(["qdisc", "del", "dev", dev.as_str(), "root"]);
                // A link without a root qdisc of ours (already removed) answers with an
                // error that means there is nothing left to do.
                let (status, _, stderr) = tool::output("tc", &args)?;
                if !status.success() && !stderr.contains("Cannot delete qdisc with handle of zero")
                {
                    return Err(ExecError::Tool {
                        command: tool::command_line("tc", &args),
                        message: tool::first_line_or(&stderr, "failed").to_string(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Kills every process still inside namespace `ns` (ranks of an interrupted run), so that
/// deleting the namespace really frees it.
pub fn kill_processes(ns: &str) -> Result<usize> {
    let pids = tool::run("ip", &["netns", "pids", ns])?;
    let mut killed = 0;
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        // SAFETY: kill has no memory-safety preconditions; a pid that exited meanwhile
        // makes it fail with ESRCH, which is what we want anyway.
        if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
            killed += 1;
        }
    }
    Ok(killed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_in_the_benchmarking_block() {
        assert_eq!(subnet(3), "198.18.3.0/24");
        assert_eq!(address(3, 1), "198.18.3.1");
        assert_eq!(address(0, ROOT_HOST), "198.18.0.254");
    }
}
