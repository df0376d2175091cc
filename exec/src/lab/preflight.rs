//! Checks a lab needs before it touches the kernel: root, namespaces, tools and usable CPUs.
//!
//! Namely root, network-namespace support, the `ip`, `tc`, `taskset` and `mpirun` tools, and which
//! CPUs this process may use.

use crate::error::{ExecError, Result};
use crate::tool;

/// What a command is about to do, so that only the tools it uses are required.
#[derive(Clone, Copy, Debug, Default)]
pub struct Needs {
    /// Creating or removing namespaces, links and qdiscs (`lab up`, `lab down`).
    pub network: bool,
    /// Pinning ranks to CPUs.
    pub taskset: bool,
    /// Launching ranks through Open MPI.
    pub mpirun: bool,
}

/// Fails with a message naming the first missing privilege, kernel feature or tool.
pub fn check(lab: &str, needs: Needs) -> Result<()> {
    let missing = |message: String| ExecError::Lab {
        lab: lab.to_string(),
        message,
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(missing(format!(
            "needs root (it creates network namespaces, links and qdiscs and enters namespaces); this process runs as uid {euid}"
        )));
    }
    if !std::path::Path::new("/proc/self/ns/net").exists() {
        return Err(missing(
            "this kernel has no network namespaces (/proc/self/ns/net is missing)".into(),
        ));
    }
    let mut tools = vec![("ip", "iproute2")];
    if needs.network {
        tools.push(("tc", "iproute2"));
    }
    if needs.taskset {
        tools.push(("taskset", "util-linux"));
    }
    if needs.mpirun {
        tools.push(("mpirun", "openmpi-bin"));
    }
    for (program, package) in tools {
        if !tool::on_path(program) {
            return Err(missing(format!(
                "`{program}` is not on PATH (Debian package {package})"
            )));
        }
    }
    if needs.network {
        // `ip netns` needs a kernel with namespaces and a writable /run/netns.
        tool::run("ip", &["netns", "list"]).map_err(|err| {
            missing(format!(
                "network namespaces are not usable here ({err}); a container may need CAP_SYS_ADMIN"
            ))
        })?;
    }
    Ok(())
}

/// The CPUs this process may run on (its affinity list, which honours cgroup cpusets and an
/// outer `taskset`), in increasing order.
pub fn online_cpus() -> Result<Vec<u32>> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|source| ExecError::Io {
        what: "reading /proc/self/status".into(),
        source,
    })?;
    let list = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .ok_or_else(|| ExecError::Lab {
            lab: String::new(),
            message: "/proc/self/status has no Cpus_allowed_list".into(),
        })?;
    parse_cpu_list(list.trim()).ok_or_else(|| ExecError::Lab {
        lab: String::new(),
        message: format!(
            "cannot read the CPU list `{}` of /proc/self/status",
            list.trim()
        ),
    })
}

/// Parses a kernel CPU list such as `0-3,8,10-11`.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((from, to)) => {
                let (from, to): (u32, u32) = (from.parse().ok()?, to.parse().ok()?);
                if from > to {
                    return None;
                }
                cpus.extend(from..=to);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0-2,5,7-8"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_cpu_list("3"), Some(vec![3]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("2-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn this_process_has_cpus() {
        assert!(!online_cpus().unwrap().is_empty());
    }
}
