//! `syncopate tune`: the fastest plan found, every baseline next to it, and a lower bound.

use super::ms;
use super::shared::deliver::{deliver, Names, Outputs, Reference};
use super::shared::plan_target;
use crate::cli::{Format, TuneArgs};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::io::IsTerminal;
use std::time::Instant;
use syncopate_sim::codec::CodecSet;
use syncopate_sim::compress::{auto_specs, Compressor};
use syncopate_sim::export::{self, tune_settings, Target};
use syncopate_sim::inputs::framework::Framework;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::Cluster;
use syncopate_sim::plan::{CodecCalls, Plan};
use syncopate_sim::predict::memory::check_plan_fits;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::search::{tune, Choice, SearchSpace, TuneRequest};
use syncopate_sim::strategy::{per_tensor_plan, StrategyOptions};
use syncopate_sim::SimError;

#[derive(Serialize)]
struct BaselineJson {
    strategy: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    iteration_time_ms: Option<f64>,
    /// Why the strategy cannot run this scenario (with this compressor).
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize)]
struct Report<'a> {
    model: &'a str,
    cluster: &'a str,
    world_size: u32,
    search: &'a str,
    best_iteration_time_ms: f64,
    lower_bound_ms: f64,
    plans_evaluated: u64,
    /// Candidates that could not run and were skipped.
    #[serde(skip_serializing_if = "is_zero")]
    candidates_skipped: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_skipped_because: Option<String>,
    search_ms: f64,
    baselines: Vec<BaselineJson>,
    plan: &'a Plan,
}

fn choices(args: &TuneArgs) -> anyhow::Result<Vec<Choice>> {
    let specs: Vec<&str> = match args.compressor.as_str() {
        "auto" => auto_specs(),
        "none" => Vec::new(),
        spec => vec![spec],
    };
    specs
        .into_iter()
        .map(|spec| {
            let compressor: Compressor = spec.parse()?;
            let memory = match &args.memory {
                Some(memory) => memory.parse()?,
                None => compressor.default_memory(),
            };
            Ok((compressor, memory))
        })
        .collect()
}

/// The choices that can run with `codec_calls`: per-tensor calls leave out the compressors that
/// cannot be split into them (`auto`'s PowerSGD); one named with `--compressor` is an error.
fn splittable(
    choices: Vec<Choice>,
    args: &TuneArgs,
    codec_calls: CodecCalls,
) -> anyhow::Result<Vec<Choice>> {
    if codec_calls == CodecCalls::Group {
        return Ok(choices);
    }
    if args.compressor != "auto" {
        if let Some(why) = choices.iter().find_map(|(c, _)| c.why_one_call()) {
            return Err(SimError::bad_value(
                "--codec-calls",
                codec_calls.name(),
                format!("--compressor: {why}; use `group`"),
            )
            .into());
        }
    }
    Ok(choices
        .into_iter()
        .filter(|(c, _)| c.splits_into_calls())
        .collect())
}

/// How often `tune` prints a progress line when stderr is not a terminal.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The search's progress: a bar on a terminal, else a line every few seconds (CI, a log
/// file), so that a long search shows it is alive.
struct Progress {
    bar: ProgressBar,
    terminal: bool,
    started: Instant,
    last_line: std::sync::Mutex<Instant>,
}

impl Progress {
    fn new() -> anyhow::Result<Progress> {
        let terminal = std::io::stderr().is_terminal();
        let bar = if terminal {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(ProgressStyle::with_template(
                "{spinner} {pos} plans evaluated ({per_sec}) {elapsed}",
            )?);
            bar
        } else {
            ProgressBar::hidden()
        };
        let started = Instant::now();
        Ok(Progress {
            bar,
            terminal,
            started,
            last_line: std::sync::Mutex::new(started),
        })
    }

    fn update(&self, done: u64) {
        self.bar.set_position(done);
        let mut last = self.last_line.lock().expect("the progress lock");
        if !self.terminal && last.elapsed() >= PROGRESS_EVERY {
            *last = Instant::now();
            eprintln!(
                "tune: {done} plans evaluated so far, {:.0} s",
                self.started.elapsed().as_secs_f64()
            );
        }
    }

    /// Clears the bar; the search's time in ms.
    fn finish(&self) -> f64 {
        self.bar.finish_and_clear();
        self.started.elapsed().as_secs_f64() * 1e3
    }
}

/// An error when `plan`'s model states per rank do not fit the scenario's device.
fn check_fits(scenario: &Scenario, plan: &Plan) -> anyhow::Result<()> {
    Ok(check_plan_fits(scenario, plan, "tune")?)
}

pub fn run(args: &TuneArgs) -> anyhow::Result<()> {
    // A codec set is code of its own running on the framework (MergeComp's compressors on
    // Horovod): then every plan is searched, priced under the framework's costs.
    let native = args.framework.as_deref().and_then(Target::of_framework);
    if let (Some(target), None) = (native, &args.codecs) {
        return run_native(args, target);
    }
    if let Some(path) = &args.export {
        anyhow::bail!(
            "--export {}: needs --framework ddp or horovod, without --codecs (the framework whose settings it writes)",
            path.display()
        );
    }
    let model = ModelProfile::load(&args.model)?;
    let cluster = Cluster::load(&args.cluster.cluster, args.cluster.overrides())?;
    let space: SearchSpace = args.search.parse()?;
    let codec_calls = args.codec_calls.codec_calls();
    let compressors = splittable(choices(args)?, args, codec_calls)?;
    if space != SearchSpace::Fusion && compressors.is_empty() {
        anyhow::bail!(
            "--search {} chooses compressors: pass --compressor SPEC or --compressor auto",
            args.search
        );
    }
    let framework = match args.framework.as_deref() {
        Some(name) => Framework::named(name).with_context(|| format!("--framework {name}"))?,
        None => None,
    };
    let framework_name = framework.as_ref().map(|(name, _)| name.clone());
    let codecs = match args.codecs.as_deref() {
        Some(name) => CodecSet::named(name).with_context(|| format!("--codecs {name}"))?,
        None => None,
    };
    // Without --memory, a compressor the set writes with its source's memory runs with it.
    let compressors: Vec<Choice> = match (&codecs, &args.memory) {
        (Some((_, set)), None) => compressors
            .into_iter()
            .map(|(c, memory)| (c, set.memory_of(&c).unwrap_or(memory)))
            .collect(),
        _ => compressors,
    };
    // `auto` picks among the compressors the codec set writes; a named one must be among them.
    let compressors = match &codecs {
        Some((_, set)) if args.compressor == "auto" => compressors
            .into_iter()
            .filter(|(c, memory)| *c != Compressor::None && set.writes(c, memory))
            .collect(),
        _ => compressors,
    };
    if let Some((name, set)) = &codecs {
        set.check_compressors(compressors.iter().map(|(c, memory)| (c, memory)))
            .with_context(|| format!("--codecs {name}"))?;
    }
    let codecs_name = codecs.as_ref().map(|(name, _)| name.clone());
    let base = Scenario::new(model, cluster)?
        .with_framework(framework.map(|(_, f)| f))
        .with_codecs(codecs.map(|(_, set)| set))
        .with_context(|| format!("--codecs {}", args.codecs.as_deref().unwrap_or_default()))?;
    let request = TuneRequest {
        space,
        compressors,
        options: StrategyOptions::default(),
        codec_calls,
    };
    // Replicated plans keep the whole model's states on every rank: refuse to search when they
    // cannot fit, whatever the grouping.
    check_fits(&base, &per_tensor_plan(&base.model))?;
    let progress = Progress::new()?;
    let mut result = tune(&base, &request, &|done| progress.update(done))?;
    check_fits(&base, &result.plan)?;
    result.plan.framework = framework_name;
    result.plan.codecs = codecs_name;
    let search_ms = progress.finish();
    if let Some(path) = &args.out {
        let mut plan = result.plan.clone();
        plan.target = Some(plan_target::target(
            &args.model,
            &args.cluster.cluster,
            args.cluster.inter_gbps,
            &base.cluster,
            None,
        ));
        let text = serde_json::to_string_pretty(&plan)? + "\n";
        super::write_atomically(path, &text)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let report = Report {
        model: &base.model.name,
        cluster: &base.cluster.name,
        world_size: base.cluster.world_size(),
        search: &args.search,
        best_iteration_time_ms: ms(result.iteration_time),
        lower_bound_ms: ms(result.lower_bound),
        plans_evaluated: result.plans_evaluated,
        candidates_skipped: result.infeasible,
        first_skipped_because: result.infeasible_example.clone(),
        search_ms: (search_ms * 1e3).round() / 1e3,
        baselines: result
            .baselines
            .iter()
            .map(|b| BaselineJson {
                strategy: b.strategy.clone(),
                iteration_time_ms: b.iteration_time.as_ref().ok().map(|&t| ms(t)),
                skipped: b.iteration_time.as_ref().err().cloned(),
            })
            .collect(),
        plan: &result.plan,
    };
    match args.format {
        Format::Json => super::print_json(&report),
        Format::Text => {
            println!(
                "{} on {} ({} GPUs), search {}",
                report.model, report.cluster, report.world_size, report.search
            );
            println!("{:<28} {:>12}", "plan", "iteration ms");
            println!("{:<28} {:>12.3}", "tuned", report.best_iteration_time_ms);
            for b in &report.baselines {
                match (b.iteration_time_ms, &b.skipped) {
                    (Some(ms), _) => println!("{:<28} {:>12.3}", b.strategy, ms),
                    (None, why) => println!(
                        "{:<28} {:>12}   ({})",
                        b.strategy,
                        "skipped",
                        why.as_deref().unwrap_or_default()
                    ),
                }
            }
            println!("{:<28} {:>12.3}", "lower bound", report.lower_bound_ms);
            let compressed = result
                .plan
                .groups
                .iter()
                .filter(|g| g.compressor != Compressor::None)
                .count();
            println!(
                "tuned plan: {} groups, {compressed} compressed; {} plans evaluated in {:.0} ms",
                result.plan.groups.len(),
                report.plans_evaluated,
                report.search_ms
            );
            if let Some(why) = &report.first_skipped_because {
                println!(
                    "{} candidate plans could not run and were skipped, the first because: {why}",
                    report.candidates_skipped
                );
            }
            Ok(())
        }
    }
}

/// `tune --framework ddp|horovod|byteps|deepspeed`: only that framework's settings, each priced as it runs
/// them, the fastest exported as `export` would.
fn run_native(args: &TuneArgs, target: Target) -> anyhow::Result<()> {
    let name = target.name();
    if args.codec_calls.codec_calls() != CodecCalls::Group {
        anyhow::bail!(
            "--codec-calls: with --framework {name}, the framework's own codec calls are used"
        );
    }
    let model = ModelProfile::load(&args.model)?;
    let cluster = Cluster::load(&args.cluster.cluster, args.cluster.overrides())?;
    let space: SearchSpace = args.search.parse()?;
    let compressors = choices(args)?;
    // A compressor named on its own must be one the framework has (`auto` keeps those it has).
    if !matches!(args.compressor.as_str(), "auto" | "none") {
        if let Some((compressor, memory)) =
            compressors.iter().find(|&&c| !export::expresses(target, c))
        {
            return Err(SimError::bad_value(
                "--compressor",
                compressor.to_string(),
                format!("{name} has no such compression with {memory} memory (ddp: fp16, bf16, powersgd:R with none or residual memory; horovod: fp16; deepspeed: fp16, bf16, int4:B for ZeRO++ at stage 3; fsdp: bf16, fp8:e4m3 for torchao's float8 gathers)"),
            )
            .into());
        }
    }
    let base = Scenario::new(model, cluster)?;
    let progress = Progress::new()?;
    let tuned = tune_settings(&base, target, space, &compressors, &|done| {
        progress.update(done)
    })?;
    let search_ms = progress.finish();
    if args.format == Format::Text {
        println!(
            "{} on {} ({} GPUs), {name} settings, search {}",
            base.model.name,
            base.cluster.name,
            base.cluster.world_size(),
            args.search
        );
        println!(
            "defaults  {:>12.3} ms   {}",
            ms(tuned.default_time),
            tuned.default.describe()
        );
        println!(
            "tuned     {:>12.3} ms   {}",
            ms(tuned.best_time),
            tuned.best.describe()
        );
        println!(
            "{} settings evaluated in {:.0} ms",
            tuned.evaluated, search_ms
        );
    }
    let names = Names {
        model: args.model.clone(),
        cluster: args.cluster.cluster.clone(),
        inter_gbps: args.cluster.inter_gbps,
    };
    let reference = Reference {
        label: format!("{name}'s defaults"),
        iteration_ms: ms(tuned.default_time),
    };
    deliver(
        &base,
        &names,
        &tuned.best,
        export::caveats(&tuned.best, &base.model),
        reference,
        &Outputs {
            out: args.export.as_deref(),
            print_settings: false,
            save_plan: args.out.as_deref(),
            format: args.format,
        },
    )
}
