//! `syncopate sweep`: a grid of GPU counts × bandwidths × strategies × compressors.
//!
//! The output is a table, CSV and SVG.

use crate::cli::SweepArgs;
use crate::plot;
use anyhow::Context;
use syncopate_sim::codec::CodecSet;
use syncopate_sim::compress::{Compressor, Memory};
use syncopate_sim::inputs::framework::Framework;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::strategy::{Strategy, StrategyOptions};
use syncopate_sim::sweep::table::{self, config_label};
use syncopate_sim::sweep::{self, FrameworkChoice, Grid, Outcome, Row};
use syncopate_sim::SimError;

pub fn run(args: &SweepArgs) -> anyhow::Result<()> {
    let strategies = args
        .strategy
        .iter()
        .map(|s| s.trim().parse())
        .collect::<Result<Vec<Strategy>, _>>()?;
    let compressors = args
        .compressor
        .iter()
        .map(|c| c.trim().parse())
        .collect::<Result<Vec<Compressor>, _>>()?;
    let memory: Memory = args.memory.parse()?;
    if let Some(&zero) = args.nodes.iter().find(|&&n| n == 0) {
        return Err(
            SimError::bad_value("--nodes", zero, "a cluster needs at least one node").into(),
        );
    }
    let inter_gbps = if args.inter_gbps.is_empty() {
        let cluster = Cluster::load(&args.cluster, ClusterOverrides::default())?;
        vec![cluster.inter_node.nic_bandwidth_gbps]
    } else {
        args.inter_gbps.clone()
    };
    let framework = FrameworkChoice::parse(&args.framework);
    if let FrameworkChoice::Named(name) = &framework {
        Framework::named(name).with_context(|| format!("--framework {name}"))?;
    }
    if let Some(name) = &args.codecs {
        CodecSet::named(name).with_context(|| format!("--codecs {name}"))?;
    }
    let grid = Grid {
        model: &args.model,
        cluster: &args.cluster,
        nodes: &args.nodes,
        gpus_per_node: args.gpus_per_node,
        inter_gbps: &inter_gbps,
        strategies: &strategies,
        compressors: &compressors,
        memory,
        codec_calls: args.codec_calls.codec_calls(),
        framework: &framework,
        codecs: args.codecs.as_deref(),
    };
    let rows = sweep::run(&grid.points(), &StrategyOptions::default())?;
    if rows
        .iter()
        .all(|r| matches!(r.outcome, Outcome::Skipped(_)))
    {
        let reasons: Vec<String> = rows
            .iter()
            .filter_map(|r| match &r.outcome {
                Outcome::Skipped(why) => Some(format!("{}: {why}", config_label(r))),
                Outcome::Done(_) => None,
            })
            .collect();
        anyhow::bail!(
            "every combination was skipped, nothing was written:\n  {}",
            reasons.join("\n  ")
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let csv_path = args.out.join("sweep.csv");
    let svg_path = args.out.join("sweep.svg");
    super::write_file(&csv_path, &table::csv(&rows).into_text())?;
    let title = format!("{} on {}", args.model, args.cluster);
    plot::write_svg(&svg_path, &title, &table::panels(&rows, &inter_gbps), 2)?;
    print_table(&rows);
    println!("wrote {} and {}", csv_path.display(), svg_path.display());
    Ok(())
}

fn print_table(rows: &[Row]) {
    println!(
        "{:>8} {:>6} {:>5}  {:<28} {:>10} {:>12} {:>7}",
        "Gb/s", "nodes", "GPUs", "strategy + compressor", "iter ms", "samples/s", "eff %"
    );
    for row in rows {
        let head = format!(
            "{:>8} {:>6} {:>5}  {:<28}",
            row.layout.inter_gbps,
            row.layout.nodes,
            row.layout.gpus(),
            config_label(row)
        );
        match &row.outcome {
            Outcome::Done(s) => println!(
                "{head} {:>10.3} {:>12.1} {:>7.1}",
                s.iteration_time_ms,
                s.throughput_samples_per_s,
                s.scaling_efficiency * 100.0
            ),
            Outcome::Skipped(why) => println!("{head} skipped: {why}"),
        }
    }
}
