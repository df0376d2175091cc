//! `syncopate experiment run DIR`: runs DIR/spec.json, then writes its results.
//!
//! It writes results.csv, against-paper.csv when it has published numbers, the calibrated inputs,
//! the SVG plots and the README's results table.

use crate::cli::ExperimentRunArgs;
use crate::plot;
use anyhow::Context;
use syncopate_sim::experiment;

pub fn run(args: &ExperimentRunArgs) -> anyhow::Result<()> {
    let dir = &args.dir;
    // A lab experiment measures first (root, the `mpi` feature), unless its shipped
    // measurements are reused; its predictions are made like every experiment's.
    if let (Some(spec), false) = (experiment::lab_spec(dir)?, args.reuse_fit) {
        if !cfg!(feature = "mpi") {
            return Err(super::without_mpi_error());
        }
        syncopate_exec::lab::experiment::measure(dir, &spec, &|line| eprintln!("{line}"))?;
    }
    let results = experiment::run(dir, args.reuse_fit)?;
    for (file, input) in &results.inputs {
        super::write_json(&dir.join(file), input)?;
    }
    super::write_file(&dir.join("results.csv"), &results.csv)?;
    if let Some(comparison) = &results.comparison {
        super::write_file(&dir.join("against-paper.csv"), comparison)?;
    }
    for chart in &results.charts {
        plot::write_svg(
            &dir.join(&chart.file),
            &chart.title,
            &chart.panels,
            chart.columns,
        )?;
    }
    let readme = dir.join("README.md");
    let text = std::fs::read_to_string(&readme)
        .with_context(|| format!("cannot read {}", readme.display()))?;
    let updated =
        experiment::replace_results(&readme.display().to_string(), &text, &results.table)?;
    super::write_file(&readme, &updated)?;
    println!("{}", results.table);
    println!(
        "wrote {}, its SVG plots and the results in {}",
        dir.join("results.csv").display(),
        readme.display()
    );
    Ok(())
}
