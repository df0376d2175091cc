//! Measuring the lab-validation experiment into `measurements.json`.
//!
//! For each lab of the spec: bring it up and measure it into a cluster file, then run every
//! strategy × compressor over the MPI backend, repeats interleaved, and record the measured
//! iterations in `measurements.json`.

use super::fit;
use super::measure::SelfExe;
use super::run::{self, Output, RunSpec};
use super::{signals, LabSpec as MakeLab};
use crate::error::{ExecError, Result};
use crate::measure::profile_host::{profile_host, HostProfileOptions};
use crate::measure::records::{ContentionPoint, Pace};
use crate::runtime::MeasuredSummary;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use syncopate_sim::compress::{Compressor, Memory};
use syncopate_sim::experiment::lab::{ConfigRuns, LabMeasurements, LabRuns, LabSpec, MEASUREMENTS};
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::plan::{Plan, Target};
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::strategy::{HorovodFusion, Strategy, StrategyOptions};

/// The name of the labs this experiment makes (one at a time).
const LAB: &str = "val";
/// Seconds of each lab's goodput probe, and repeats of its collective sweeps.
const GOODPUT_SECONDS: f64 = 3.0;
const SWEEP_REPEATS: usize = 3;
/// The experiment's device profile (this machine's compression costs), and its repeats.
const DEVICE: &str = "device.json";
const DEVICE_REPEATS: usize = 7;

/// Runs every lab of `spec` and writes `dir/clusters/*.json` and `dir/measurements.json`.
/// `progress` gets one line per run.
pub fn measure(dir: &Path, spec: &LabSpec, progress: &dyn Fn(&str)) -> Result<LabMeasurements> {
    let interrupted = signals::install();
    let exe = SelfExe::current()?;
    let model = ModelProfile::load(&spec.model)?;
    let profiled_us = (model.forward_time() + model.backward_time()).as_us() + model.optimizer_us;
    let compute_scale = spec.compute_ms * 1e3 / profiled_us;
    std::fs::create_dir_all(dir.join("clusters")).map_err(|e| io(dir, e))?;
    // The compression costs of the CPU the ranks run on, measured here, once, before any lab
    // loads it: the runs' own codecs, not a profile from another day's machine load.
    progress("measuring this machine's compression costs");
    let device = profile_host(&HostProfileOptions {
        name: "lab-host".into(),
        repeats: DEVICE_REPEATS,
        ..HostProfileOptions::default()
    })?;
    write_json(&dir.join(DEVICE), &device)?;
    let mut labs = Vec::new();
    for setting in &spec.labs {
        let made = super::up(
            &MakeLab {
                name: LAB.into(),
                nodes: setting.nodes,
                gbps: setting.gbps,
                latency_us: 0.0,
                cores_per_node: None,
                burst_bytes: None,
                command: format!("syncopate experiment run {}", dir.display()),
            },
            interrupted,
        )?;
        // Whatever happens on the lab, it is removed before the result is looked at.
        let runs = on_lab(
            dir,
            spec,
            &made,
            &exe,
            &model,
            compute_scale,
            interrupted,
            progress,
        );
        super::remove(&made)?;
        labs.push(runs?);
        let measured = LabMeasurements {
            format_version: syncopate_sim::base::data::FORMAT_VERSION,
            source: format!(
                "`syncopate experiment run {}` on a machine with {} CPUs, one rank per lab node, MPI over TCP",
                dir.display(),
                std::thread::available_parallelism().map_or(0, |n| n.get())
            ),
            labs: labs.clone(),
        };
        // Written after every lab, so that a long run that stops keeps what it measured.
        write_json(&dir.join(MEASUREMENTS), &measured)?;
    }
    Ok(LabMeasurements {
        format_version: syncopate_sim::base::data::FORMAT_VERSION,
        source: String::new(),
        labs,
    })
}

#[allow(clippy::too_many_arguments)]
fn on_lab(
    dir: &Path,
    spec: &LabSpec,
    made: &super::state::LabState,
    exe: &SelfExe,
    model: &ModelProfile,
    compute_scale: f64,
    interrupted: &AtomicBool,
    progress: &dyn Fn(&str),
) -> Result<LabRuns> {
    let setting = spec
        .labs
        .iter()
        .find(|s| s.nodes == made.nodes.len() as u32 && s.gbps == made.gbps)
        .copied()
        .expect("the lab was made from a setting");
    progress(&format!(
        "lab: {} nodes at {} Gb/s: measuring the network",
        setting.nodes, setting.gbps
    ));
    let mut measured = fit::measure(made, exe, GOODPUT_SECONDS, SWEEP_REPEATS, interrupted)?;
    let cluster_name = format!("clusters/lab-{}n-{}g.json", setting.nodes, setting.gbps);
    let cluster_path = dir.join(&cluster_name);
    write_cluster(dir, made, &measured, &cluster_path)?;
    fit::write_sweep(&cluster_path, &measured)?;
    let loaded = Cluster::load(&cluster_path.to_string_lossy(), ClusterOverrides::default())?;
    let scenario = Scenario::new(model.clone(), loaded)?;
    let mut configs = plans(spec, &scenario, &cluster_path)?;
    let scratch =
        std::env::temp_dir().join(format!("syncopate-lab-experiment-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| io(&scratch, e))?;
    // The hosts' pace drifts over minutes: the contention is probed again after every round
    // of runs, and the cluster file gets each timing's median over the probes. The pace of
    // compute, which scales every compute task, is drawn after every run, so that its draws
    // sample the moments the runs do.
    let mut probes: Vec<ContentionPoint> = measured.contention.iter().cloned().collect();
    let mut pace_draws: Vec<Pace> = Vec::new();
    for repeat in 0..spec.repeats {
        for (i, config) in configs.iter_mut().enumerate() {
            let plan_path = scratch.join(format!("plan-{i}.json"));
            write_json(&plan_path, &config.plan)?;
            let outcome = run_once(spec, made, exe, &plan_path, compute_scale, interrupted);
            let line = match outcome {
                Ok(ms) => {
                    config.iteration_ms.push(ms);
                    format!("{ms:.1} ms")
                }
                Err(err) => {
                    config.failures.push(err.to_string());
                    format!("failed: {err}")
                }
            };
            if !probes.is_empty() && !interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                // A lost draw costs one sample of many, not the lab's runs.
                match fit::probe_pace(made, exe, interrupted) {
                    Ok(draw) => pace_draws.push(draw),
                    Err(err) => progress(&format!("a pace draw failed (left out): {err}")),
                }
            }
            progress(&format!(
                "lab {}n {}G, repeat {}/{}: {} {} {}: {line}",
                setting.nodes,
                setting.gbps,
                repeat + 1,
                spec.repeats,
                config.strategy,
                config.compressor,
                config.memory
            ));
            if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(ExecError::Lab {
                    lab: LAB.into(),
                    message: "interrupted".into(),
                });
            }
        }
        if !probes.is_empty() {
            progress(&format!(
                "lab {}n {}G: probing contention again after repeat {}/{}",
                setting.nodes,
                setting.gbps,
                repeat + 1,
                spec.repeats
            ));
            probes.push(fit::probe_contention(made, exe, interrupted)?);
        }
    }
    if !probes.is_empty() {
        let pooled = ContentionPoint::pooled(&probes).ok_or_else(|| ExecError::Lab {
            lab: LAB.into(),
            message: "its contention probes timed different collectives".into(),
        })?;
        // The draws beside the runs, not the probes' own, which sample four moments.
        measured.contention = Some(pooled.with_pace(&pace_draws)?);
        write_cluster(dir, made, &measured, &cluster_path)?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    for config in &mut configs {
        config.compute_scale = compute_scale;
    }
    Ok(LabRuns {
        setting,
        cluster: cluster_name,
        configs,
    })
}

/// Every strategy × compressor the strategy can run on this lab, with its plan.
fn plans(spec: &LabSpec, scenario: &Scenario, cluster: &Path) -> Result<Vec<ConfigRuns>> {
    let mut configs = Vec::new();
    for strategy in &spec.strategies {
        let parsed: Strategy = strategy.parse()?;
        for c in &spec.compressors {
            let options = StrategyOptions {
                compressor: c.compressor.parse::<Compressor>()?,
                memory: c.memory.parse::<Memory>()?,
                ..HorovodFusion::options(spec.horovod.as_ref())?
            };
            let plan: Plan = match parsed
                .plan(scenario, &options)
                .and_then(|p| p.validate(strategy, &scenario.model).map(|()| p))
            {
                Ok(plan) => plan,
                // A combination the strategy cannot run is not part of the matrix.
                Err(_) => continue,
            };
            let mut plan = plan;
            plan.target = Some(Target::new(
                &spec.model,
                &cluster.to_string_lossy(),
                scenario.cluster.nodes,
                scenario.cluster.gpus_per_node,
                None,
                None,
            ));
            configs.push(ConfigRuns {
                strategy: strategy.clone(),
                compressor: c.compressor.clone(),
                memory: c.memory.clone(),
                plan,
                compute_scale: 0.0,
                iteration_ms: Vec::new(),
                failures: Vec::new(),
            });
        }
    }
    Ok(configs)
}

/// One run of a plan over the MPI backend on the lab: its mean measured iteration in ms.
fn run_once(
    spec: &LabSpec,
    made: &super::state::LabState,
    exe: &SelfExe,
    plan: &Path,
    compute_scale: f64,
    interrupted: &AtomicBool,
) -> Result<f64> {
    let timeout = Duration::from_secs(600);
    let mut command = vec![exe.path().to_string_lossy().into_owned()];
    command.extend(
        [
            "exec",
            "--backend",
            "mpi",
            "--format",
            "json",
            "--plan",
            &plan.to_string_lossy(),
            "--iterations",
            &spec.iterations.to_string(),
            "--warmup",
            &spec.warmup.to_string(),
            "--compute-scale",
            &compute_scale.to_string(),
            "--timeout-s",
            "120",
        ]
        .map(String::from),
    );
    let run_spec = RunSpec {
        ranks_per_node: 1,
        mpi: true,
        timeout,
        command,
        master_port: run::DEFAULT_MASTER_PORT,
        output: Output::Capture,
    };
    let outcome = run::run(made, &run_spec, interrupted)?;
    let json = outcome
        .stdout
        .find('{')
        .map(|start| &outcome.stdout[start..])
        .unwrap_or_default();
    let summary: MeasuredSummary = serde_json::from_str(json).map_err(|e| ExecError::Tool {
        command: "syncopate exec --backend mpi".into(),
        message: format!("unreadable summary ({e}): {}", outcome.stdout.trim()),
    })?;
    Ok(summary.iteration_time_ms)
}

/// Writes the lab's cluster file, fitted to what was measured on it.
fn write_cluster(
    dir: &Path,
    made: &super::state::LabState,
    measured: &fit::LabMeasurements,
    path: &Path,
) -> Result<()> {
    let mut cluster = fit::cluster(
        made,
        measured,
        &dir.join(DEVICE).to_string_lossy(),
        &format!("syncopate experiment run {}", dir.display()),
        path,
    )?;
    // Named relative to the cluster file, so that the experiment's directory can move.
    cluster.device = format!("../{DEVICE}");
    write_json(path, &cluster)
}

fn io(path: &Path, source: std::io::Error) -> ExecError {
    ExecError::Io {
        what: format!("cannot write {}", path.display()),
        source,
    }
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| ExecError::Io {
        what: format!("cannot serialize {}", path.display()),
        source: std::io::Error::other(e),
    })? + "\n";
    std::fs::write(path, text).map_err(|e| io(path, e))
}
