//! `lab run`: launches a command once per rank inside the lab's namespaces.
//!
//! A rank is launched directly with torchrun's variables, or through `mpirun` in MPMD form; the
//! ranks' output is forwarded or captured, and the first failure is returned, every wait bounded.

use super::net;
use super::state::LabState;
use crate::error::{ExecError, Result};
use crate::tool;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// torchrun's default rendezvous port; free in every fresh namespace.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// How long ranks get between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(2);

/// The most ranks per node: beyond this a 2-core machine only time-slices.
pub const MAX_RANKS_PER_NODE: u32 = 16;

/// Where the ranks' standard output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// To this process's stdout and stderr, each line prefixed by its rank.
    Print,
    /// Standard output kept and returned (for the lab's own measurements); stderr printed.
    Capture,
}

/// What to run and how.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// Ranks launched on each node (`--ranks-per-node`).
    pub ranks_per_node: u32,
    /// Launch through `mpirun` (one MPMD application context per rank).
    pub mpi: bool,
    /// How long the whole run may take before its ranks are stopped.
    pub timeout: Duration,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Rendezvous port given to the ranks as `MASTER_PORT`.
    pub master_port: u16,
    /// Where the ranks' standard output goes.
    pub output: Output,
}

/// What a successful run leaves: the captured standard output (empty with [`Output::Print`]).
#[derive(Clone, Debug, Default)]
pub struct RunOutcome {
    /// Every rank's captured standard output (empty with [`Output::Print`]).
    pub stdout: String,
}

/// One rank's place in the lab.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The rank's global index.
    pub rank: u32,
    /// Index of the node it runs on.
    pub node: usize,
    /// Its index among its node's ranks.
    pub local_rank: u32,
}

/// Ranks node-major: node 0 holds ranks 0..K, node 1 the next K, as torchrun numbers them.
pub fn placements(nodes: usize, ranks_per_node: u32) -> Vec<Placement> {
    (0..nodes)
        .flat_map(|node| {
            (0..ranks_per_node).map(move |local| Placement {
                rank: node as u32 * ranks_per_node + local,
                node,
                local_rank: local,
            })
        })
        .collect()
}

/// Checks the run's flags against the lab.
pub fn check(lab: &LabState, spec: &RunSpec) -> Result<()> {
    use syncopate_sim::SimError;
    if spec.command.is_empty() {
        return Err(SimError::bad_value(
            "CMD",
            "(none)",
            "give the command after `--`, e.g. `syncopate lab run -- hostname`",
        )
        .into());
    }
    if spec.ranks_per_node == 0 || spec.ranks_per_node > MAX_RANKS_PER_NODE {
        return Err(SimError::bad_value(
            "--ranks-per-node",
            spec.ranks_per_node,
            format!("from 1 to {MAX_RANKS_PER_NODE}"),
        )
        .into());
    }
    if spec.timeout.is_zero() {
        return Err(SimError::bad_value("--timeout-s", 0, "a run needs time").into());
    }
    if !lab.complete {
        return Err(ExecError::Lab {
            lab: lab.name.clone(),
            message: format!(
                "was not made completely (a `lab up` failed or is running); remove it with `syncopate lab down --name {}`",
                lab.name
            ),
        });
    }
    Ok(())
}

/// Runs the command on every rank of `lab` and waits, at most `spec.timeout`, for all of them.
/// The first rank to fail (or a timeout, or `interrupted`) stops the others; the error names
/// the rank and its exit status.
pub fn run(lab: &LabState, spec: &RunSpec, interrupted: &AtomicBool) -> Result<RunOutcome> {
    check(lab, spec)?;
    super::preflight::check(
        &lab.name,
        super::preflight::Needs {
            taskset: lab.nodes.iter().any(|n| !n.cpus.is_empty()),
            mpirun: spec.mpi,
            ..Default::default()
        },
    )?;
    let ranks = placements(lab.nodes.len(), spec.ranks_per_node);
    let captured = Arc::new(Mutex::new(String::new()));
    let processes = if spec.mpi {
        vec![spawn(
            "mpirun".into(),
            mpirun_command(lab, spec, &ranks),
            spec.output,
            &captured,
        )?]
    } else {
        let mut processes = Vec::new();
        for placement in &ranks {
            let command = rank_command(lab, spec, placement, ranks.len() as u32);
            match spawn(
                format!("rank {}", placement.rank),
                command,
                spec.output,
                &captured,
            ) {
                Ok(p) => processes.push(p),
                Err(err) => {
                    stop(&mut processes);
                    return Err(err);
                }
            }
        }
        processes
    };
    let result = supervise(lab, processes, spec, interrupted);
    let stdout = std::mem::take(&mut *captured.lock().expect("capture lock"));
    result.map(|()| RunOutcome { stdout })
}

/// `[taskset -c CPUS] ip netns exec NS` — the prefix that puts a process on a node.
fn on_node(lab: &LabState, node: usize) -> Vec<String> {
    let node = &lab.nodes[node];
    let mut prefix = Vec::new();
    if !node.cpus.is_empty() {
        let list: Vec<String> = node.cpus.iter().map(u32::to_string).collect();
        prefix.extend(["taskset".into(), "-c".into(), list.join(",")]);
    }
    prefix.extend([
        "ip".into(),
        "netns".into(),
        "exec".into(),
        node.namespace.clone(),
    ]);
    prefix
}

/// One rank started directly, with torchrun's variables and gloo's interface.
fn rank_command(lab: &LabState, spec: &RunSpec, at: &Placement, world: u32) -> Command {
    let argv: Vec<String> = on_node(lab, at.node)
        .into_iter()
        .chain(spec.command.iter().cloned())
        .collect();
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    let node = &lab.nodes[at.node];
    for (key, value) in [
        ("RANK", at.rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_RANK", at.local_rank.to_string()),
        ("LOCAL_WORLD_SIZE", spec.ranks_per_node.to_string()),
        ("GROUP_RANK", at.node.to_string()),
        ("NODE_RANK", at.node.to_string()),
        ("MASTER_ADDR", lab.nodes[0].address.clone()),
        ("MASTER_PORT", spec.master_port.to_string()),
        ("GLOO_SOCKET_IFNAME", node.interface.clone()),
        ("NCCL_SOCKET_IFNAME", node.interface.clone()),
        ("SYNCOPATE_LAB", lab.name.clone()),
    ] {
        command.env(key, value);
    }
    command
}

/// One `mpirun` whose application contexts put each rank in its namespace. PMIx and the TCP
/// transport are told to use the lab's bridge and subnet: PMIx's server listens in the root
/// namespace, which a rank reaches only through the bridge, and without `btl tcp,self` Open MPI
/// would carry same-node traffic in shared memory instead of over the shaped links.
fn mpirun_command(lab: &LabState, spec: &RunSpec, ranks: &[Placement]) -> Command {
    let mut command = Command::new("mpirun");
    command.args(mpirun_args(lab, spec, ranks));
    command
        .env("PMIX_MCA_ptl_tcp_if_include", &lab.bridge)
        .env("PMIX_MCA_ptl_tcp_remote_connections", "1")
        .env("SYNCOPATE_LAB", &lab.name);
    command
}

/// mpirun's arguments: TCP transports on the lab's subnet and bridge, then one MPMD
/// application context (`-np 1` on its node) per rank.
pub fn mpirun_args(lab: &LabState, spec: &RunSpec, ranks: &[Placement]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        &lab.subnet,
        "--mca",
        "oob_tcp_if_include",
        &lab.bridge,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if spec.output == Output::Print {
        args.push("--tag-output".into());
    }
    for (i, at) in ranks.iter().enumerate() {
        if i > 0 {
            args.push(":".into());
        }
        args.extend(["-np".into(), "1".into()]);
        args.extend(on_node(lab, at.node));
        args.extend(spec.command.iter().cloned());
    }
    args
}

/// A started process (a rank, or mpirun) in its own process group.
struct Process {
    label: String,
    child: Child,
    readers: Vec<std::thread::JoinHandle<()>>,
    /// Its stderr, kept to find which rank mpirun says failed.
    stderr: Arc<Mutex<String>>,
}

fn spawn(
    label: String,
    mut command: Command,
    output: Output,
    captured: &Arc<Mutex<String>>,
) -> Result<Process> {
    let program = command.get_program().to_string_lossy().into_owned();
    // Its own process group: a terminal's Ctrl-C reaches only us, and we stop the whole
    // group (whatever the rank forked) on the way out.
    command
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|err| ExecError::Tool {
        command: program.clone(),
        message: format!("cannot start {label}: {err}"),
    })?;
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        let (prefix, captured) = (format!("[{label}] "), Arc::clone(captured));
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(out)
                .lines()
                .map_while(std::result::Result::ok)
            {
                match output {
                    Output::Capture => {
                        let mut text = captured.lock().expect("capture lock");
                        text.push_str(&line);
                        text.push('\n');
                    }
                    Output::Print => {
                        let _ = writeln!(std::io::stdout().lock(), "{prefix}{line}");
                    }
                }
            }
        }));
    }
    if let Some(err) = child.stderr.take() {
        let (prefix, kept) = (format!("[{label}] "), Arc::clone(&stderr));
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(err)
                .lines()
                .map_while(std::result::Result::ok)
            {
                let _ = writeln!(std::io::stderr().lock(), "{prefix}{line}");
                let mut text = kept.lock().expect("stderr lock");
                text.push_str(&line);
                text.push('\n');
            }
        }));
    }
    Ok(Process {
        label,
        child,
        readers,
        stderr,
    })
}

/// Waits for every process; stops all of them at the first failure, the deadline or an
/// interrupt. Whatever ends the run, no process of it is left in the lab's namespaces
/// after an abnormal end.
fn supervise(
    lab: &LabState,
    mut processes: Vec<Process>,
    spec: &RunSpec,
    interrupted: &AtomicBool,
) -> Result<()> {
    let deadline = Instant::now() + spec.timeout;
    let mut done: Vec<Option<ExitStatus>> = vec![None; processes.len()];
    let outcome = loop {
        let mut failed = None;
        for (process, status) in processes.iter_mut().zip(done.iter_mut()) {
            if status.is_none() {
                match process.child.try_wait() {
                    Ok(Some(exit)) => {
                        *status = Some(exit);
                        if !exit.success() && failed.is_none() {
                            failed = Some(failure(process, exit));
                        }
                    }
                    Ok(None) => {}
                    Err(err) => {
                        failed.get_or_insert(ExecError::Tool {
                            command: process.label.clone(),
                            message: format!("cannot wait for it: {err}"),
                        });
                    }
                }
            }
        }
        if let Some(err) = failed {
            break Err(err);
        }
        if done.iter().all(Option::is_some) {
            break Ok(());
        }
        if interrupted.load(Ordering::Relaxed) {
            break Err(ExecError::Lab {
                lab: lab.name.clone(),
                message: "run interrupted; its ranks were stopped".into(),
            });
        }
        if Instant::now() >= deadline {
            let running: Vec<&str> = processes
                .iter()
                .zip(&done)
                .filter(|(_, s)| s.is_none())
                .map(|(p, _)| p.label.as_str())
                .collect();
            break Err(ExecError::Lab {
                lab: lab.name.clone(),
                message: format!(
                    "run timed out after {:.1} s (--timeout-s); still running: {}",
                    spec.timeout.as_secs_f64(),
                    running.join(", ")
                ),
            });
        }
        std::thread::sleep(tool::POLL);
    };
    stop(&mut processes);
    if outcome.is_err() {
        for node in &lab.nodes {
            // Ranks that mpirun or a rank's own children left behind.
            let _ = net::kill_processes(&node.namespace);
        }
    }
    outcome
}

/// The error for a process that exited unsuccessfully; for mpirun, the rank it names.
fn failure(process: &Process, exit: ExitStatus) -> ExecError {
    let what = describe(exit);
    if process.label == "mpirun" {
        let stderr = process.stderr.lock().expect("stderr lock").clone();
        if let Some((rank, status)) = mpirun_failed_rank(&stderr) {
            return ExecError::Rank {
                rank,
                message: format!("{status} (reported by mpirun, which then {what})"),
            };
        }
        return ExecError::Tool {
            command: "mpirun".into(),
            message: format!("{what}; its messages are above"),
        };
    }
    match process
        .label
        .strip_prefix("rank ")
        .and_then(|r| r.parse().ok())
    {
        Some(rank) => ExecError::Rank {
            rank,
            message: what,
        },
        None => ExecError::Tool {
            command: process.label.clone(),
            message: what,
        },
    }
}

fn describe(exit: ExitStatus) -> String {
    match (exit.code(), exit.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => format!("ended: {exit}"),
    }
}

/// Open MPI's report of the first failed process: `Process name: [[JOB,1],RANK]` followed by
/// `Exit code: N`, or `…process rank R with PID … exited on signal S`.
fn mpirun_failed_rank(stderr: &str) -> Option<(u32, String)> {
    let lines: Vec<&str> = stderr.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = line.strip_prefix("Process name: [[") {
            let rank = name
                .split(',')
                .nth(1)?
                .trim_start_matches(|c: char| !c.is_ascii_digit());
            let rank: u32 = rank.trim_end_matches(']').parse().ok()?;
            let code = lines
                .get(i + 1)
                .and_then(|l| l.strip_prefix("Exit code:"))
                .map(|c| format!("exited with status {}", c.trim()))
                .unwrap_or_else(|| "failed".into());
            return Some((rank, code));
        }
        if let Some(rest) = line.split("process rank ").nth(1) {
            let rank: u32 = rest.split_whitespace().next()?.parse().ok()?;
            let how = rest
                .split("exited on signal ")
                .nth(1)
                .map(|s| format!("was killed by signal {}", s.trim_end_matches('.')))
                .unwrap_or_else(|| "failed".into());
            return Some((rank, how));
        }
    }
    None
}

/// Stops every process group that is still running (SIGTERM, then SIGKILL after a grace
/// period), kills what the groups left behind, and waits for the output readers.
fn stop(processes: &mut [Process]) {
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        let mut alive = false;
        for process in processes.iter_mut() {
            if matches!(process.child.try_wait(), Ok(None)) {
                alive = true;
                signal_group(&process.child, signal);
            }
        }
        if !alive {
            break;
        }
        let deadline = Instant::now() + GRACE;
        while Instant::now() < deadline
            && processes
                .iter_mut()
                .any(|p| matches!(p.child.try_wait(), Ok(None)))
        {
            std::thread::sleep(tool::POLL);
        }
    }
    for process in processes.iter_mut() {
        // Children a rank forked hold its pipes open: they go with its group. The group id is
        // the reaped leader's pid, which the kernel hands out again only after its sequential
        // allocation has wrapped around pid_max (32768 or more), not within these milliseconds.
        signal_group(&process.child, libc::SIGKILL);
        let _ = tool::wait_bounded(&mut process.child, GRACE);
        for reader in process.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

fn signal_group(child: &Child, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: killpg has no memory-safety preconditions. The group is the child's own
    // (process_group(0) at spawn); a group that no longer exists makes it fail with ESRCH.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_placed_node_major() {
        let p = placements(2, 2);
        assert_eq!(
            p.iter()
                .map(|p| (p.rank, p.node, p.local_rank))
                .collect::<Vec<_>>(),
            vec![(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
        );
    }

    #[test]
    fn mpiruns_report_names_the_failed_rank() {
        let text = "--------\nmpirun detected that one or more processes exited with non-zero status, thus causing\nthe job to be terminated. The first process to do so was:\n\n  Process name: [[47262,1],1]\n  Exit code:    3\n-----\n";
        assert_eq!(
            mpirun_failed_rank(text),
            Some((1, "exited with status 3".into()))
        );
        let signal = "mpirun noticed that process rank 2 with PID 123 on node x exited on signal 9 (Killed).\n";
        assert_eq!(
            mpirun_failed_rank(signal),
            Some((2, "was killed by signal 9 (Killed)".into()))
        );
        assert_eq!(mpirun_failed_rank("nothing here"), None);
    }
}
