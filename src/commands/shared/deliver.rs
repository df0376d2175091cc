//! Writing a framework's settings, priced as it runs them, and the plan they come from.

use super::plan_target;
use crate::cli::Format;
use crate::commands::{ms, print_json, write_atomically};
use anyhow::Context;
use serde::Serialize;
use std::path::Path;
use syncopate_sim::export::{Settings, Target};
use syncopate_sim::predict::evaluate::steady_iteration_time;
use syncopate_sim::predict::scenario::Scenario;

/// The model and cluster as the user named them, for the command that reproduces a time.
pub struct Names {
    pub model: String,
    pub cluster: String,
    pub inter_gbps: Option<f64>,
}

/// What the exported settings are compared with.
#[derive(Serialize)]
pub struct Reference {
    pub label: String,
    pub iteration_ms: f64,
}

/// Where an export goes.
pub struct Outputs<'a> {
    pub out: Option<&'a Path>,
    /// Without `out`, print the settings' file on stdout (`export`) or not (`tune`).
    pub print_settings: bool,
    pub save_plan: Option<&'a Path>,
    pub format: Format,
}

#[derive(Serialize)]
struct Report {
    framework: &'static str,
    model: String,
    cluster: String,
    world_size: u32,
    settings: String,
    /// The settings' iteration as the framework runs them.
    iteration_ms: f64,
    compared_with: Reference,
    /// What of the plan the framework cannot express.
    not_expressed: Vec<String>,
    /// `syncopate simulate` that reproduces `iteration_ms`.
    simulate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    written: Option<String>,
    /// The file's text when it went to stdout (JSON reports carry it here).
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

/// Prices `settings` as their framework runs them, writes the framework's file (and the plan,
/// when asked) and reports the time next to `reference`.
pub fn deliver(
    base: &Scenario,
    names: &Names,
    settings: &Settings,
    not_expressed: Vec<String>,
    reference: Reference,
    outputs: &Outputs,
) -> anyhow::Result<()> {
    let (scenario, mut plan) = settings.scenario_and_plan(base)?;
    let time = ms(steady_iteration_time(&scenario, &plan)?);
    let cluster = &base.cluster;
    if let Some(path) = outputs.save_plan {
        plan.target = Some(plan_target::target(
            &names.model,
            &names.cluster,
            names.inter_gbps,
            cluster,
            None,
        ));
        let text = serde_json::to_string_pretty(&plan)? + "\n";
        write_atomically(path, &text)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let simulate = match (settings.simulate_flags(), outputs.save_plan) {
        (Some(flags), _) => {
            let mut words = vec![
                "syncopate simulate --model".to_string(),
                names.model.clone(),
                "--cluster".to_string(),
                names.cluster.clone(),
                "--nodes".to_string(),
                cluster.nodes.to_string(),
                "--gpus-per-node".to_string(),
                cluster.gpus_per_node.to_string(),
            ];
            if let Some(gbps) = names.inter_gbps {
                words.extend(["--inter-gbps".to_string(), gbps.to_string()]);
            }
            words.extend(flags);
            Some(words.join(" "))
        }
        (None, Some(path)) => Some(format!("syncopate simulate --plan {}", path.display())),
        (None, None) => None,
    };
    let framework = settings.target().name();
    let mut header = vec![
        format!(
            "Syncopate export for {}: {} on {}, {} nodes x {} GPUs.",
            title(settings.target()),
            base.model.name,
            cluster.name,
            cluster.nodes,
            cluster.gpus_per_node
        ),
        format!("Settings: {}.", settings.describe()),
        format!(
            "Predicted iteration as {framework} runs these settings: {time:.3} ms ({}: {:.3} ms).",
            reference.label, reference.iteration_ms
        ),
    ];
    match &simulate {
        Some(command) => header.push(format!("Reproduce: {command}")),
        None => header.push(
            "Reproduce: export again with --save-plan FILE, then syncopate simulate --plan FILE"
                .to_string(),
        ),
    }
    if !not_expressed.is_empty() {
        header.push(format!("Not expressed in {framework}:"));
        header.extend(not_expressed.iter().map(|note| format!("  - {note}")));
    }
    let text = settings.render(&base.model, &header);
    let written = match outputs.out {
        Some(path) => {
            write_atomically(path, &text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Some(path.display().to_string())
        }
        None => None,
    };
    let report = Report {
        framework,
        model: base.model.name.clone(),
        cluster: cluster.name.clone(),
        world_size: cluster.world_size(),
        settings: settings.describe(),
        iteration_ms: time,
        compared_with: reference,
        not_expressed,
        simulate,
        text: match (&written, outputs.format) {
            (None, Format::Json) if outputs.print_settings => Some(text.clone()),
            _ => None,
        },
        written,
    };
    match outputs.format {
        Format::Json => print_json(&report),
        Format::Text => {
            // The settings go to stdout when no file is named, so the report goes to stderr.
            let lines = report_lines(&report);
            if report.written.is_none() && outputs.print_settings {
                print!("{text}");
                eprintln!("{lines}");
            } else {
                println!("{lines}");
            }
            Ok(())
        }
    }
}

fn report_lines(report: &Report) -> String {
    let mut lines = vec![
        format!(
            "{} settings for {} on {} ({} GPUs): {}",
            report.framework, report.model, report.cluster, report.world_size, report.settings
        ),
        format!(
            "predicted iteration: {:.3} ms as {} runs them; {}: {:.3} ms",
            report.iteration_ms,
            report.framework,
            report.compared_with.label,
            report.compared_with.iteration_ms
        ),
    ];
    if !report.not_expressed.is_empty() {
        lines.push(format!("not expressed in {}:", report.framework));
        lines.extend(report.not_expressed.iter().map(|n| format!("  - {n}")));
    }
    if let Some(command) = &report.simulate {
        lines.push(format!("reproduce: {command}"));
    }
    if let Some(path) = &report.written {
        lines.push(format!("written: {path}"));
    }
    lines.join("\n")
}

fn title(target: Target) -> &'static str {
    match target {
        Target::Ddp => "PyTorch DistributedDataParallel",
        Target::Horovod => "Horovod (PyTorch)",
        Target::DeepSpeed => "DeepSpeed",
        Target::BytePs => "BytePS (PyTorch)",
        Target::Fsdp => "PyTorch FSDP2 (fully_shard)",
    }
}
