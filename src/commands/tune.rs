//! `syncopate tune`: the fastest plan found, every baseline next to it, and a lower bound.

use crate::cli::{Format, TuneArgs};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::io::IsTerminal;
use std::time::Instant;
use syncopate_sim::compress::{auto_specs, Compressor};
use syncopate_sim::model::ModelProfile;
use syncopate_sim::plan::Plan;
use syncopate_sim::scenario::Scenario;
use syncopate_sim::search::{tune, Choice, SearchSpace, TuneRequest};
use syncopate_sim::strategy::StrategyOptions;
use syncopate_sim::topology::Cluster;

#[derive(Serialize)]
struct BaselineJson {
    strategy: String,
    iteration_time_ms: f64,
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

fn ms(time: syncopate_sim::time::SimTime) -> f64 {
    (time.as_ms() * 1e6).round() / 1e6
}

pub fn run(args: &TuneArgs) -> anyhow::Result<()> {
    let model = ModelProfile::load(&args.model)?;
    let cluster = Cluster::load(&args.cluster.cluster, args.cluster.overrides())?;
    let space: SearchSpace = args.search.parse()?;
    let compressors = choices(args)?;
    if space != SearchSpace::Fusion && compressors.is_empty() {
        anyhow::bail!(
            "--search {} chooses compressors: pass --compressor SPEC or --compressor auto",
            args.search
        );
    }
    let base = Scenario::new(model, cluster)?;
    let request = TuneRequest {
        space,
        compressors,
        options: StrategyOptions::default(),
    };
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(ProgressStyle::with_template(
            "{spinner} {pos} plans evaluated ({per_sec}) {elapsed}",
        )?);
        bar
    } else {
        ProgressBar::hidden()
    };
    let started = Instant::now();
    let result = tune(&base, &request, &|done| bar.set_position(done))?;
    let search_ms = started.elapsed().as_secs_f64() * 1e3;
    bar.finish_and_clear();
    if let Some(path) = &args.out {
        let mut plan = result.plan.clone();
        plan.target = Some(super::simulate::target(
            &args.model,
            &args.cluster,
            &base.cluster,
            None,
        ));
        let text = serde_json::to_string_pretty(&plan)? + "\n";
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let report = Report {
        model: &base.model.name,
        cluster: &base.cluster.name,
        world_size: base.cluster.world_size(),
        search: &args.search,
        best_iteration_time_ms: ms(result.iteration_time),
        lower_bound_ms: ms(result.lower_bound),
        plans_evaluated: result.plans_evaluated,
        search_ms: (search_ms * 1e3).round() / 1e3,
        baselines: result
            .baselines
            .iter()
            .map(|b| BaselineJson {
                strategy: b.strategy.clone(),
                iteration_time_ms: ms(b.iteration_time),
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
                println!("{:<28} {:>12.3}", b.strategy, b.iteration_time_ms);
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
            Ok(())
        }
    }
}
