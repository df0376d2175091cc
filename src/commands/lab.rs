//! `syncopate lab`: make, run on, describe, measure and remove an emulated cluster.
//!
//! The cluster is namespaces with shaped veths, measured into a cluster file; the hidden probes run
//! inside it.

use super::print_json;
use crate::cli::{Format, LabCommand, LabProbeCommand, LabRunArgs, LabStatusArgs, LabUpArgs};
use serde::Serialize;
use std::time::Duration;
use syncopate_exec::lab::fit::{self, LabMeasurements};
use syncopate_exec::lab::measure::{self, ProbeOptions, SelfExe};
use syncopate_exec::lab::run::{Output, RunSpec};
use syncopate_exec::lab::state::LabState;
use syncopate_exec::lab::{self, signals, LabSpec};
use syncopate_exec::measure::records;
use syncopate_sim::collective_op::Op;
use syncopate_sim::inputs::topology::Cluster;
use syncopate_sim::SimError;

/// The longest goodput measurement a user may ask for.
const MAX_MEASURE_S: f64 = 600.0;

/// The most repeats per allreduce size.
const MAX_REPEATS: usize = 1000;

pub fn run(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Up(args) => up(&args),
        LabCommand::Run(args) => run_ranks(&args),
        LabCommand::Down(args) => {
            let removed = lab::down(&args.name)?;
            println!(
                "removed lab `{}`: {} namespaces, bridge {}, state file",
                removed.name,
                removed.nodes.len(),
                removed.bridge
            );
            Ok(())
        }
        LabCommand::Status(args) => status(&args),
        LabCommand::Probe(probe) => self::probe(probe),
    }
}

/// The command line as typed, for the state and the cluster file's provenance.
fn command_line() -> String {
    let mut words = vec!["syncopate".to_string()];
    words.extend(std::env::args().skip(1).map(|a| {
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            format!("'{}'", a.replace('\'', r"'\''"))
        } else {
            a
        }
    }));
    words.join(" ")
}

fn seconds(flag: &str, value: f64, most: f64) -> anyhow::Result<Duration> {
    if value.is_finite() && value > 0.0 && value <= most {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(SimError::bad_value(flag, value, format!("a number of seconds in (0, {most}]")).into())
    }
}

/// What `lab up --format json` prints.
#[derive(Serialize)]
struct UpReport<'a> {
    lab: &'a LabState,
    #[serde(skip_serializing_if = "Option::is_none")]
    measurements: Option<&'a LabMeasurements>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<&'a Cluster>,
}

fn up(args: &LabUpArgs) -> anyhow::Result<()> {
    let interrupted = signals::install();
    let measure_s = seconds("--measure-s", args.measure_s, MAX_MEASURE_S)?;
    if args.repeats == 0 || args.repeats > MAX_REPEATS {
        return Err(SimError::bad_value(
            "--repeats",
            args.repeats,
            format!("from 1 to {MAX_REPEATS}"),
        )
        .into());
    }
    let command = command_line();
    let spec = LabSpec {
        name: args.lab.name.clone(),
        nodes: args.nodes,
        gbps: args.gbps,
        latency_us: args.latency_us,
        cores_per_node: args.cores_per_node,
        burst_bytes: args.burst_bytes,
        command: command.clone(),
    };
    let made = lab::up(&spec, interrupted)?;
    if args.no_measure {
        return report_up(args, &made, None, None);
    }
    // An up whose measurement fails leaves nothing behind either.
    let measured = measure_and_fit(args, &made, measure_s, &command, interrupted);
    match measured {
        Ok((measurements, cluster)) => {
            report_up(args, &made, Some(&measurements), cluster.as_ref())
        }
        Err(err) => match lab::remove(&made) {
            Ok(()) => Err(err.context(format!("lab `{}` was removed again", made.name))),
            Err(cleanup) => Err(err.context(format!(
                "removing lab `{}` also failed ({cleanup}); run `syncopate lab down --name {}`",
                made.name, made.name
            ))),
        },
    }
}

fn measure_and_fit(
    args: &LabUpArgs,
    made: &LabState,
    measure_s: Duration,
    command: &str,
    interrupted: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<(LabMeasurements, Option<Cluster>)> {
    let exe = SelfExe::current()?;
    let measurements = fit::measure(
        made,
        &exe,
        measure_s.as_secs_f64(),
        args.repeats,
        interrupted,
    )?;
    let cluster = match &args.cluster_out {
        Some(path) => {
            let cluster = fit::cluster(made, &measurements, &args.device, command, path)?;
            super::write_json(path, &cluster)?;
            fit::write_sweep(path, &measurements)?;
            Some(cluster)
        }
        None => None,
    };
    Ok((measurements, cluster))
}

fn report_up(
    args: &LabUpArgs,
    made: &LabState,
    measurements: Option<&LabMeasurements>,
    cluster: Option<&Cluster>,
) -> anyhow::Result<()> {
    if args.format == Format::Json {
        return print_json(&UpReport {
            lab: made,
            measurements,
            cluster,
        });
    }
    print_lab(made);
    if let Some(m) = measurements {
        let n = &m.network;
        println!(
            "goodput    {:.4} Gb/s single-stream TCP node 0 → node 1 over {:.1} s ({:.1} % of {} Gb/s)",
            n.goodput_gbps,
            n.goodput_seconds,
            n.goodput_gbps / made.gbps * 100.0,
            made.gbps
        );
        println!(
            "round trip {:.1} µs median of {} 64-byte TCP ping-pongs (min {:.1}, max {:.1})",
            n.rtt_us.median, n.rtt_us.repeats, n.rtt_us.min, n.rtt_us.max
        );
        let burst: Vec<String> = n
            .burst
            .iter()
            .map(|b| format!("{} KiB {:.3} Gb/s", b.bytes >> 10, b.effective_gbps))
            .collect();
        println!(
            "burst      {} B: one message's rate (size / (round trip − 64-byte round trip)): {}",
            made.burst_bytes,
            burst.join(", ")
        );
        let sweeps = [
            ("allreduce", "fp32 allreduce", &m.allreduce),
            ("allgather", "the MPI backend's allgather", &m.allgather),
        ];
        for (op, what, sweep) in sweeps {
            let Some(first) = sweep.first() else {
                println!(
                    "{op:<10} not measured: this syncopate was built without the `mpi` feature"
                );
                continue;
            };
            println!(
                "{op:<10} {what} over Open MPI, {} ranks, median (min–max) of {} repeats:",
                m.ranks, first.seconds.repeats
            );
            for p in sweep {
                println!(
                    "  {:>9} B  {:>10.1} µs ({:.1}–{:.1})  busbw {:.4} Gb/s ({:.1} % of goodput)",
                    p.bytes,
                    p.seconds.median * 1e6,
                    p.seconds.min * 1e6,
                    p.seconds.max * 1e6,
                    p.busbw_gbps,
                    p.busbw_gbps / n.goodput_gbps * 100.0
                );
            }
        }
    }
    if let (Some(cluster), Some(path)) = (cluster, &args.cluster_out) {
        if let syncopate_sim::inputs::topology::Library::Mpi(p) = &cluster.library {
            println!(
                "cluster    {}: tcp_efficiency {:.3}, latency {:.1} µs, message_overhead {:.1} µs, reduce {:.2} GB/s",
                path.display(),
                p.tcp_efficiency,
                cluster.inter_node.latency_us,
                p.message_overhead_us,
                p.reduce_gbytes_per_s
            );
        }
    }
    println!("remove it with: syncopate lab down --name {}", made.name);
    Ok(())
}

fn print_lab(made: &LabState) {
    println!(
        "lab `{}`: {} nodes on bridge {} ({}, root {}), {} Gb/s per direction, HTB burst {} B, {}",
        made.name,
        made.nodes.len(),
        made.bridge,
        made.subnet,
        made.root_address,
        made.gbps,
        made.burst_bytes,
        if made.latency_us > 0.0 {
            format!("netem delay {} µs", made.latency_us)
        } else {
            "no added delay".into()
        }
    );
    for (i, node) in made.nodes.iter().enumerate() {
        let cpus = if node.cpus.is_empty() {
            "any CPU".to_string()
        } else {
            format!("CPUs {:?}", node.cpus)
        };
        println!(
            "  node {i}  {}  {}  {}  {cpus}",
            node.namespace, node.interface, node.address
        );
    }
}

fn run_ranks(args: &LabRunArgs) -> anyhow::Result<()> {
    let interrupted = signals::install();
    lab::check_name(&args.lab.name)?;
    let timeout = seconds("--timeout-s", args.timeout_s, 7.0 * 24.0 * 3600.0)?;
    let made = LabState::load(&args.lab.name)?;
    let spec = RunSpec {
        ranks_per_node: args.ranks_per_node,
        mpi: args.mpi,
        timeout,
        command: args.command.clone(),
        master_port: args.master_port,
        output: Output::Print,
    };
    lab::run::run(&made, &spec, interrupted)?;
    Ok(())
}

fn status(args: &LabStatusArgs) -> anyhow::Result<()> {
    let status = lab::status(&args.lab.name)?;
    if args.format == Format::Json {
        return print_json(&status);
    }
    println!(
        "lab `{}` ({}): {} Gb/s per direction, burst {} B, delay {} µs, {} on {} ({}), root {}",
        status.name,
        if status.complete {
            "complete"
        } else {
            "INCOMPLETE: run `syncopate lab down`"
        },
        status.gbps,
        status.burst_bytes,
        status.latency_us,
        status.subnet,
        status.bridge,
        if status.bridge_exists {
            "exists"
        } else {
            "MISSING"
        },
        status.root_address
    );
    for (i, node) in status.nodes.iter().enumerate() {
        let counters = |c: &Option<syncopate_exec::lab::shape::Counters>| match c {
            Some(c) => format!(
                "{} B / {} pkts, {} dropped, {} overlimits",
                c.bytes, c.packets, c.drops, c.overlimits
            ),
            None => "no shaper".into(),
        };
        println!(
            "  node {i}  {}{}  {}  {}  out: {}  in: {}",
            node.namespace,
            if node.namespace_exists {
                ""
            } else {
                " (MISSING)"
            },
            node.interface,
            node.address,
            counters(&node.egress),
            counters(&node.ingress)
        );
    }
    println!("made by: {}", status.command);
    Ok(())
}

fn probe(probe: LabProbeCommand) -> anyhow::Result<()> {
    match probe {
        LabProbeCommand::Serve { listen, seconds: s } => {
            measure::serve(listen, seconds("--seconds", s, 3600.0)?)?;
        }
        LabProbeCommand::Client {
            connect,
            seconds: s,
            round_trips,
            burst_repeats,
        } => {
            let options = ProbeOptions {
                goodput_seconds: seconds("--seconds", s, MAX_MEASURE_S)?.as_secs_f64(),
                round_trips: round_trips.clamp(1, 1_000_000),
                burst_repeats: burst_repeats.clamp(1, 10_000),
            };
            print_json(&measure::probe(connect, &options)?)?;
        }
        LabProbeCommand::Sweep {
            op,
            sizes,
            repeats,
            timeout_s,
        } => {
            let op: Op = op
                .parse()
                .map_err(|_| SimError::bad_value("--op", &op, "allreduce or allgather"))?;
            records::check_swept(op)?;
            let timeout = seconds("--timeout-s", timeout_s, 24.0 * 3600.0)?;
            let points = mpi_sweep(op, &sizes, repeats, timeout)?;
            if !points.is_empty() {
                println!("{}", serde_json::to_string(&points)?);
            }
        }
        LabProbeCommand::Contention {
            sizes,
            repeats,
            timeout_s,
        } => {
            let timeout = seconds("--timeout-s", timeout_s, 24.0 * 3600.0)?;
            if let Some(point) = mpi_contention(&sizes, repeats, timeout)? {
                println!("{}", serde_json::to_string(&point)?);
            }
        }
        LabProbeCommand::Pace { repeats, timeout_s } => {
            let timeout = seconds("--timeout-s", timeout_s, 24.0 * 3600.0)?;
            if let Some(pace) = mpi_pace(repeats, timeout)? {
                println!("{}", serde_json::to_string(&pace)?);
            }
        }
        LabProbeCommand::MpiCheck {
            timeout_s,
            kill_rank,
        } => {
            let timeout = seconds("--timeout-s", timeout_s, 3600.0)?;
            for line in mpi_check(timeout, kill_rank)? {
                println!("ok: {line}");
            }
        }
    }
    Ok(())
}

#[cfg(feature = "mpi")]
fn mpi_sweep(
    op: Op,
    sizes: &[u64],
    repeats: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<records::CollectivePoint>> {
    super::as_mpi_rank(|world| {
        syncopate_exec::measure::mpi_bench::sweep(world, op, sizes, repeats, timeout)
    })
}

#[cfg(feature = "mpi")]
fn mpi_contention(
    sizes: &[u64],
    repeats: usize,
    timeout: Duration,
) -> anyhow::Result<Option<records::ContentionPoint>> {
    super::as_mpi_rank(|world| {
        syncopate_exec::measure::mpi_bench::contention(world, sizes, repeats, timeout)
    })
}

#[cfg(not(feature = "mpi"))]
fn mpi_contention(
    _: &[u64],
    _: usize,
    _: Duration,
) -> anyhow::Result<Option<records::ContentionPoint>> {
    Err(super::without_mpi())
}

#[cfg(feature = "mpi")]
fn mpi_pace(repeats: usize, timeout: Duration) -> anyhow::Result<Option<records::Pace>> {
    super::as_mpi_rank(|world| syncopate_exec::measure::mpi_bench::pace(world, repeats, timeout))
}

#[cfg(not(feature = "mpi"))]
fn mpi_pace(_: usize, _: Duration) -> anyhow::Result<Option<records::Pace>> {
    Err(super::without_mpi())
}

#[cfg(feature = "mpi")]
fn mpi_check(timeout: Duration, kill_rank: Option<u32>) -> anyhow::Result<Vec<String>> {
    super::as_mpi_rank(|world| syncopate_exec::mpi::conformance::run(world, timeout, kill_rank))
}

#[cfg(not(feature = "mpi"))]
fn mpi_sweep(
    _: Op,
    _: &[u64],
    _: usize,
    _: Duration,
) -> anyhow::Result<Vec<records::CollectivePoint>> {
    Err(super::without_mpi())
}

#[cfg(not(feature = "mpi"))]
fn mpi_check(_: Duration, _: Option<u32>) -> anyhow::Result<Vec<String>> {
    Err(super::without_mpi())
}
