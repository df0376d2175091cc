//! `syncopate validate`: runs a plan for real and simulates it, then reports predicted vs measured.
//!
//! The simulation is of the same scenario with this machine's profiles.

use super::shared::execute::{
    choose_backend, execute, host_ranks, measured_trace, options, Chosen,
};
use super::shared::plan_file::{load_plan_to_run, plan_cluster};
use crate::cli::{Format, RunClusterArgs, ValidateArgs};
use anyhow::Context;
use syncopate_exec::measure::profile_cluster::{host_cluster, powers_of_four};
use syncopate_exec::measure::profile_host::{profile_host, HostProfileOptions};
use syncopate_exec::runtime::MeasuredSummary;
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::plan::Plan;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::predict::simulate::{schedule, simulate, SimOptions};
use syncopate_sim::predict::trace::Trace;
use syncopate_sim::predict::validate::{Report, Run, Times};
use syncopate_sim::SimError;

pub fn run(args: &ValidateArgs) -> anyhow::Result<()> {
    match &args.measured {
        Some(path) => validate_trace(args, path),
        None => validate_run(args),
    }
}

/// Runs the plan on a backend, then predicts the same run.
fn validate_run(args: &ValidateArgs) -> anyhow::Result<()> {
    let run = &args.run;
    let (plan, model) = load_plan_to_run(run)?;
    let backend = choose_backend(run.backend)?;
    let cluster = machine_cluster(args, &plan, &model, backend)?;
    let scenario = Scenario::new(model, cluster)?;
    if backend != Chosen::Cuda {
        require_cpu_ranks(&scenario, &format!("the {} backend", backend.name()))?;
    }
    // One schedule: the real run and the prediction interpret the same steps.
    let schedule = schedule(&scenario, &plan)?;
    let options = options(run, false)?;
    let Some((job, measured)) = execute(backend, run, &scenario, &schedule, &options)? else {
        // An MPI rank other than 0: rank 0 reports.
        return Ok(());
    };
    let summary = measured.summary(&job.run_info(backend.name()));
    let measured_trace = measured_trace(&scenario.model, &job, &measured, &summary)?;
    // Predict the run as it ran: the host backend's compute scale replaces the device's.
    let mut predicted_scenario = scenario;
    predicted_scenario.compute_scale = job.compute_scale;
    let span = (options.warmup, options.iterations);
    predict_and_report(
        args,
        &predicted_scenario,
        &plan,
        span,
        &summary,
        &measured_trace,
    )
}

/// Compares a trace measured elsewhere (`exec --trace`, `syncopate.torch`'s `write_trace`)
/// with the prediction of the same plan on `--cluster`.
fn validate_trace(args: &ValidateArgs, path: &std::path::Path) -> anyhow::Result<()> {
    let run = &args.run;
    let (plan, model) = load_plan_to_run(run)?;
    let Some(name) = &args.cluster else {
        anyhow::bail!(
            "--measured needs --cluster: the cluster file of the machine the trace was measured on (`lab up --cluster-out`, `profile --backend host --cluster-out`)"
        );
    };
    let cluster = with_device(args, cluster_file(args, name)?)?;
    let mut scenario = Scenario::new(model, cluster)?;
    let (trace, summary) = read_measured_trace(path)?;
    if summary.backend != "cuda" {
        require_cpu_ranks(
            &scenario,
            &format!("a run on the {} backend", summary.backend),
        )?;
    }
    let world = scenario.cluster.world_size();
    if summary.world_size != world {
        return Err(SimError::bad_value(
            "--measured",
            path.display(),
            format!(
                "the trace ran {} ranks, but --cluster {} has {world} (pass --nodes/--gpus-per-node to match)",
                summary.world_size, scenario.cluster.name
            ),
        )
        .into());
    }
    if summary.model != scenario.model.name || summary.strategy != plan.strategy {
        return Err(SimError::bad_value(
            "--measured",
            path.display(),
            format!(
                "the trace ran model {} with strategy {}, but --plan {} is for model {} with strategy {}",
                summary.model,
                summary.strategy,
                run.plan.display(),
                scenario.model.name,
                plan.strategy
            ),
        )
        .into());
    }
    if summary.measured_iterations == 0 {
        return Err(SimError::bad_value(
            "--measured",
            path.display(),
            "the trace has no measured iteration (run at least its warm-up plus 2 iterations)",
        )
        .into());
    }
    scenario.compute_scale = summary.compute_scale;
    // The simulator's first iteration is never steady state; a real run's warm-up is at least 1.
    let span = (
        summary.warmup_iterations.max(1),
        summary.measured_iterations,
    );
    predict_and_report(args, &scenario, &plan, span, &summary, &trace)
}

/// A measured trace and its summary (`otherData`); errors name the file.
fn read_measured_trace(path: &std::path::Path) -> anyhow::Result<(Trace, MeasuredSummary)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--measured: cannot read {}", path.display()))?;
    let trace: Trace = serde_json::from_str(&text).with_context(|| {
        format!(
            "--measured {}: not a Chrome trace with traceEvents and otherData",
            path.display()
        )
    })?;
    let summary: MeasuredSummary = serde_json::from_value(trace.other_data.clone())
        .with_context(|| {
            format!(
                "--measured {}: otherData is not a measured run's summary (written by `exec --trace` or syncopate.torch's write_trace)",
                path.display()
            )
        })?;
    Ok((trace, summary))
}

/// A CPU run's times say nothing about GPUs: the cluster's ranks must be CPUs.
fn require_cpu_ranks(scenario: &Scenario, run: &str) -> anyhow::Result<()> {
    if scenario.cpu_ranks() {
        return Ok(());
    }
    Err(SimError::bad_value(
        "--cluster",
        &scenario.cluster.name,
        format!(
            "its ranks are GPUs (device {}), but {run} ran CPU ranks, whose times say nothing about GPUs: pass this machine's or the lab's cluster file (`profile --backend host --cluster-out`, `lab up --cluster-out`)",
            scenario.device.name,
        ),
    )
    .into())
}

/// Simulates `plan` on `scenario` over the measured run's (warm-up, measured iterations), then
/// prints (and optionally writes) predicted against measured.
fn predict_and_report(
    args: &ValidateArgs,
    scenario: &Scenario,
    plan: &Plan,
    (warmup, iterations): (u32, u32),
    summary: &MeasuredSummary,
    measured_trace: &Trace,
) -> anyhow::Result<()> {
    let sim_options = SimOptions {
        warmup,
        iterations: Some(iterations),
        trace_ranks: 1,
        ..SimOptions::default()
    };
    let predicted = simulate(scenario, plan, &sim_options)?;
    let predicted_trace = predicted.trace.as_ref().expect("a trace was asked for");
    if let Some(prefix) = &args.traces {
        for (kind, trace) in [("predicted", predicted_trace), ("measured", measured_trace)] {
            let mut path = prefix.clone().into_os_string();
            path.push(format!(".{kind}.json"));
            let path = std::path::PathBuf::from(path);
            super::write_atomically(&path, &serde_json::to_string(trace)?)
                .with_context(|| format!("--traces: cannot write {}", path.display()))?;
        }
    }
    let report = Report::new(
        scenario,
        &summary.backend,
        Run {
            times: Times::from(&predicted.summary),
            trace: predicted_trace,
        },
        Run {
            times: Times {
                iteration_ms: summary.iteration_time_ms,
                compute_ms: summary.compute_ms,
                comm_ms: summary.comm_ms,
            },
            trace: measured_trace,
        },
        warmup,
        args.top as usize,
    );
    match args.format {
        Format::Json => super::print_json(&report),
        Format::Text => {
            print_report(&report);
            Ok(())
        }
    }
}

/// The thread-ranks `validate --backend host` runs when `--ranks` is not given.
const DEFAULT_HOST_RANKS: u32 = 4;

/// The machine's cluster: a file given with --cluster (its device optionally replaced by
/// --device-profile), or for the host one measured now on the run's thread-ranks.
fn machine_cluster(
    args: &ValidateArgs,
    plan: &Plan,
    model: &ModelProfile,
    backend: Chosen,
) -> anyhow::Result<Cluster> {
    let cluster = match (&args.cluster, backend) {
        (Some(name), _) => cluster_file(args, name)?,
        // A real machine's file: the one the plan records (a lab's, a profiled cluster's).
        (None, Chosen::Cuda | Chosen::Mpi) => {
            let recorded = RunClusterArgs {
                cluster: None,
                nodes: args.nodes,
                gpus_per_node: args.gpus_per_node,
                inter_gbps: None,
            };
            let (name, overrides) = plan_cluster(&recorded, plan)?;
            Cluster::load(&name, overrides)?
        }
        (None, Chosen::Host) => {
            let ranks = match args.run.ranks {
                Some(ranks) => host_ranks(ranks)?,
                None => DEFAULT_HOST_RANKS,
            };
            let largest = largest_group(plan, model);
            let device = match &args.device_profile {
                Some(path) => path.clone(),
                None => measure_host_device(plan, largest)?,
            };
            let memory = DeviceProfile::load(&device)?.memory_bandwidth_gbytes_per_s;
            // Up to the largest group's fp32 bytes, an upper bound of its payload.
            let sizes = powers_of_four(1 << 10, (largest * 4).clamp(1 << 20, 1 << 28));
            let cluster = host_cluster("host", &device, ranks, 5, memory, &sizes)?;
            // Validate what was measured by loading it the way the simulator does.
            let path = scratch_file("cluster.json");
            std::fs::write(&path, serde_json::to_string(&cluster)?)?;
            Cluster::load(&path.to_string_lossy(), ClusterOverrides::default())?
        }
    };
    with_device(args, cluster)
}

/// The cluster file `name` (--cluster) with --nodes and --gpus-per-node applied.
fn cluster_file(args: &ValidateArgs, name: &str) -> anyhow::Result<Cluster> {
    Ok(Cluster::load(
        name,
        ClusterOverrides {
            nodes: args.nodes,
            gpus_per_node: args.gpus_per_node,
            inter_gbps: None,
        },
    )?)
}

/// `cluster` with its device replaced by --device-profile's, when given.
fn with_device(args: &ValidateArgs, mut cluster: Cluster) -> anyhow::Result<Cluster> {
    if let Some(path) = &args.device_profile {
        let profile = DeviceProfile::load(path)?;
        cluster.device = path.clone();
        cluster.device_memory_gbytes_per_s = profile.memory_bandwidth_gbytes_per_s;
    }
    Ok(cluster)
}

/// The plan's largest group's element count.
fn largest_group(plan: &Plan, model: &ModelProfile) -> u64 {
    plan.groups
        .iter()
        .map(|g| g.numel(model))
        .max()
        .unwrap_or(0)
}

/// Profiles the plan's compressors on this CPU at sizes up to its largest group; returns the
/// profile's path.
fn measure_host_device(plan: &Plan, largest: u64) -> anyhow::Result<String> {
    let mut specs: Vec<String> = plan
        .groups
        .iter()
        .map(|g| g.compressor.to_string())
        .collect();
    specs.push("none".into());
    specs.sort();
    specs.dedup();
    let profile = profile_host(&HostProfileOptions {
        name: "host".into(),
        sizes: powers_of_four(1 << 10, largest.clamp(1 << 16, 1 << 26))
            .into_iter()
            .map(|n| n as usize)
            .collect(),
        repeats: 3,
        compressors: specs,
    })?;
    let path = scratch_file("device.json");
    std::fs::write(&path, serde_json::to_string(&profile)?)?;
    Ok(path.to_string_lossy().into_owned())
}

fn scratch_file(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("syncopate-validate-{}", std::process::id()));
    // A failure shows up when the file is written.
    let _ = std::fs::create_dir_all(&dir);
    dir.join(name)
}

fn print_report(r: &Report) {
    println!(
        "{} on the {} backend, {} ranks (cluster {}, device {})",
        r.model, r.backend, r.world_size, r.cluster, r.device
    );
    println!("                     predicted     measured");
    println!(
        "  iteration time  {:>12.3} {:>12.3} ms   error {:+.1} %",
        r.predicted_iteration_ms,
        r.measured_iteration_ms,
        r.error * 100.0
    );
    println!(
        "  compute         {:>12.3} {:>12.3} ms",
        r.predicted_compute_ms, r.measured_compute_ms
    );
    println!(
        "  communication   {:>12.3} {:>12.3} ms",
        r.predicted_comm_ms, r.measured_comm_ms
    );
    println!("  largest tasks (µs per iteration, rank 0):");
    for row in &r.largest_tasks {
        println!(
            "    {:<40} {:>10.1} {:>10.1}   {:+.1} %",
            row.task,
            row.predicted_us,
            row.measured_us,
            row.error * 100.0
        );
    }
}
