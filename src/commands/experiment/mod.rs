//! `syncopate experiment run DIR`: reads DIR/spec.json, regenerates results.csv, the SVG plots and the README's results table.

mod grace;
mod grid;

use crate::cli::ExperimentRunArgs;
use anyhow::Context;
use serde::Deserialize;
use std::path::Path;
use syncopate_sim::data;
use syncopate_sim::SimError;

/// An experiment's spec.json: what kind of study it is and its parameters.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Spec {
    /// Simulations over panels × layouts × configurations.
    Grid(grid::GridSpec),
    /// Calibration against GRACE's measured throughputs.
    Grace(grace::GraceSpec),
}

const BEGIN: &str = "<!-- results:begin -->";
const END: &str = "<!-- results:end -->";

pub fn run(args: &ExperimentRunArgs) -> anyhow::Result<()> {
    let dir = &args.dir;
    let spec_path = dir.join("spec.json");
    let label = spec_path.display().to_string();
    let text = std::fs::read_to_string(&spec_path).map_err(|source| SimError::Io {
        path: spec_path.clone(),
        source,
    })?;
    let spec: Spec = data::parse_json(&label, &text)?;
    let table = match spec {
        Spec::Grid(spec) => grid::run(&spec, &label, dir)?,
        Spec::Grace(spec) => grace::run(&spec, &label, dir, args.reuse_fit)?,
    };
    let readme = dir.join("README.md");
    replace_results(&readme, &table)?;
    println!("{table}");
    println!(
        "wrote {}, its SVG plots and the results in {}",
        dir.join("results.csv").display(),
        readme.display()
    );
    Ok(())
}

/// Checks a spec's `format_version`.
fn check_version(label: &str, version: u32) -> anyhow::Result<()> {
    Ok(data::check_format_version(label, version)?)
}

/// Replaces the text between the README's result markers with `table`.
fn replace_results(readme: &Path, table: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(readme)
        .with_context(|| format!("cannot read {}", readme.display()))?;
    let missing = || {
        SimError::invalid(
            &readme.display().to_string(),
            "results markers",
            format!("needs a line `{BEGIN}` followed by a line `{END}`"),
        )
    };
    let start = text.find(BEGIN).ok_or_else(missing)? + BEGIN.len();
    let end = start + text[start..].find(END).ok_or_else(missing)?;
    let updated = format!("{}\n{}\n{}", &text[..start], table.trim_end(), &text[end..]);
    std::fs::write(readme, updated).with_context(|| format!("cannot write {}", readme.display()))
}
