//! `syncopate lower`: writes the Schedule a plan means (the steps every engine runs) as JSON.

use super::shared::plan_file::{load_plan, plan_cluster};
use crate::cli::LowerArgs;
use anyhow::Context;
use syncopate_sim::inputs::topology::Cluster;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::predict::simulate::schedule;

pub fn run(args: &LowerArgs) -> anyhow::Result<()> {
    let (plan, model) = load_plan(&args.run.plan, args.run.model.as_deref())?;
    let (name, overrides) = plan_cluster(&args.cluster, &plan)?;
    let scenario = Scenario::new(model, Cluster::load(&name, overrides)?)?;
    let schedule = schedule(&scenario, &plan)?;
    let text = serde_json::to_string_pretty(&schedule)? + "\n";
    match &args.out {
        Some(path) => super::write_atomically(path, &text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{text}"),
    }
    let collectives = schedule.collectives_per_iteration();
    eprintln!(
        "{}: {} steps per iteration ({} collectives, {} pieces) on {} × {} ranks",
        plan.strategy,
        schedule.steps.len(),
        collectives,
        schedule.pieces.len(),
        schedule.world.nodes,
        schedule.world.ranks_per_node
    );
    Ok(())
}
