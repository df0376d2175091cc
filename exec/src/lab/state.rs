//! The on-disk record of a lab: what it is meant to be and every object created so far.
//!
//! It lives at `/run/syncopate/lab-NAME.json` and is written as each object is created, so that
//! `lab down` can remove a half-made lab.

use crate::error::{ExecError, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The state files' format version.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// Where lab state files live: `/run` is a tmpfs, so a reboot, which also removes the lab's
/// namespaces and links, removes the record of them.
pub const STATE_DIR: &str = "/run/syncopate";

/// One kernel object a lab made, in creation order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Created {
    /// A named network namespace (`ip netns add`).
    Namespace {
        /// The namespace's name.
        name: String,
    },
    /// A link in the root namespace (the bridge, or the root end of a veth pair; deleting it
    /// deletes its peer).
    Link {
        /// The link's name.
        name: String,
    },
    /// A root qdisc on `dev`, inside `namespace` when given.
    Qdisc {
        /// The namespace the device is in (none: the root namespace).
        namespace: Option<String>,
        /// The device the qdisc is on.
        dev: String,
    },
}

/// One emulated node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// The node's network namespace, `NAME-nI`.
    pub namespace: String,
    /// The veth end inside the namespace: the node's NIC.
    pub interface: String,
    /// The veth end in the root namespace, a port of the bridge.
    pub bridge_port: String,
    /// The node's IPv4 address on the lab's /24.
    pub address: String,
    /// CPUs the node's processes are pinned to (empty: not pinned).
    pub cpus: Vec<u32>,
}

/// Everything a lab is and has made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabState {
    /// The state file's format version ([`STATE_FORMAT_VERSION`]).
    pub format_version: u32,
    /// The lab's name.
    pub name: String,
    /// The `syncopate lab up` command line that made it.
    pub command: String,
    /// Shaped rate of each node's egress and ingress, Gb/s.
    pub gbps: f64,
    /// HTB burst of every shaped direction, bytes.
    pub burst_bytes: u64,
    /// Delay added to each node's egress (0: none).
    pub latency_us: f64,
    /// The lab's /24, e.g. `198.18.0.0/24`.
    pub subnet: String,
    /// The bridge's name in the root namespace, `NAME-br`.
    pub bridge: String,
    /// The root namespace's address on the bridge (mpirun's PMIx server listens there).
    pub root_address: String,
    /// The emulated nodes, in node order.
    pub nodes: Vec<Node>,
    /// Objects created so far, in order.
    pub created: Vec<Created>,
    /// Set once every object exists and is configured.
    pub complete: bool,
}

/// An exclusive lock over all labs' state files, held while a lab picks its subnet and claims
/// its name, so that two `lab up`s at once cannot pick the same /24. Released when dropped.
pub struct Lock {
    /// Closing the file releases the lock.
    _file: std::fs::File,
}

/// How long `lock` waits for another `lab up` to finish claiming.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Takes the lock over all labs' state files, waiting at most 20 s for another holder.
pub fn lock() -> Result<Lock> {
    use std::os::fd::AsRawFd;
    let path = Path::new(STATE_DIR).join(".lock");
    let io = |what: String| move |source| ExecError::Io { what, source };
    std::fs::create_dir_all(STATE_DIR).map_err(io(format!("creating {STATE_DIR}")))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io(format!("opening {}", path.display())))?;
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Lock { _file: file });
        }
        if std::time::Instant::now() >= deadline {
            return Err(ExecError::Io {
                what: format!(
                    "locking {} (another `syncopate lab up` holds it)",
                    path.display()
                ),
                source: std::io::Error::last_os_error(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The state file of the lab called `name`.
pub fn path(name: &str) -> PathBuf {
    Path::new(STATE_DIR).join(format!("lab-{name}.json"))
}

impl LabState {
    /// Creates the state file, failing if a lab of this name already has one: the exclusive
    /// create is what claims the name, so two `lab up`s cannot both make the same lab.
    pub fn claim(&self) -> Result<()> {
        let path = path(&self.name);
        std::fs::create_dir_all(STATE_DIR).map_err(|source| ExecError::Io {
            what: format!("creating {STATE_DIR}"),
            source,
        })?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path);
        match file {
            Ok(mut file) => file
                .write_all(self.to_json().as_bytes())
                .map_err(|source| ExecError::Io {
                    what: format!("writing {}", path.display()),
                    source,
                }),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Err(ExecError::Lab {
                lab: self.name.clone(),
                message: format!(
                    "a lab of this name exists ({}); remove it with `syncopate lab down --name {}` or pick another --name",
                    path.display(),
                    self.name
                ),
            }),
            Err(source) => Err(ExecError::Io {
                what: format!("creating {}", path.display()),
                source,
            }),
        }
    }

    /// Records a created object and saves the file at once (before anything else is created).
    pub fn record(&mut self, created: Created) -> Result<()> {
        self.created.push(created);
        self.save()
    }

    /// Rewrites the state file atomically (a crash leaves the old or the new record, whole).
    pub fn save(&self) -> Result<()> {
        let path = path(&self.name);
        syncopate_sim::base::data::write_atomically(&path, &self.to_json()).map_err(|source| {
            ExecError::Io {
                what: format!("writing {}", path.display()),
                source,
            }
        })
    }

    fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a lab state serializes") + "\n"
    }

    /// Loads the state of the lab called `name`; a missing file is an error naming the lab.
    pub fn load(name: &str) -> Result<LabState> {
        let path = path(name);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let known = list()?;
                return Err(ExecError::Lab {
                    lab: name.to_string(),
                    message: format!(
                        "no such lab (no {}); labs on this machine: {}",
                        path.display(),
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                });
            }
            Err(source) => {
                return Err(ExecError::Io {
                    what: format!("reading {}", path.display()),
                    source,
                })
            }
        };
        let state: LabState = serde_json::from_str(&text).map_err(|err| ExecError::Lab {
            lab: name.to_string(),
            message: format!("{} is not a lab state file: {err}", path.display()),
        })?;
        if state.format_version != STATE_FORMAT_VERSION {
            return Err(ExecError::Lab {
                lab: name.to_string(),
                message: format!(
                    "{}: format_version {} (this syncopate reads {STATE_FORMAT_VERSION})",
                    path.display(),
                    state.format_version
                ),
            });
        }
        Ok(state)
    }

    /// Deletes the state file (the last step of `lab down`).
    pub fn remove_file(&self) -> Result<()> {
        let path = path(&self.name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ExecError::Io {
                what: format!("removing {}", path.display()),
                source,
            }),
        }
    }

    /// The lab's node count.
    pub fn world_nodes(&self) -> u32 {
        self.nodes.len() as u32
    }
}

/// Names of the labs that have a state file, sorted.
pub fn list() -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(STATE_DIR) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ExecError::Io {
                what: format!("reading {STATE_DIR}"),
                source,
            })
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let file = entry.file_name().to_string_lossy().into_owned();
            file.strip_prefix("lab-")
                .and_then(|rest| rest.strip_suffix(".json"))
                .map(str::to_string)
        })
        .collect();
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_round_trips_through_json() {
        let state = LabState {
            format_version: STATE_FORMAT_VERSION,
            name: "t".into(),
            command: "syncopate lab up --nodes 2 --gbps 1".into(),
            gbps: 1.0,
            burst_bytes: 6250,
            latency_us: 0.0,
            subnet: "198.18.0.0/24".into(),
            bridge: "t-br".into(),
            root_address: "198.18.0.254".into(),
            nodes: vec![Node {
                namespace: "t-n0".into(),
                interface: "t-e0".into(),
                bridge_port: "t-h0".into(),
                address: "198.18.0.1".into(),
                cpus: vec![0],
            }],
            created: vec![
                Created::Link {
                    name: "t-br".into(),
                },
                Created::Qdisc {
                    namespace: Some("t-n0".into()),
                    dev: "t-e0".into(),
                },
            ],
            complete: false,
        };
        let back: LabState = serde_json::from_str(&state.to_json()).unwrap();
        assert_eq!(back, state);
    }
}
