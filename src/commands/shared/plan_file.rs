//! A plan file: loading it, and the model and cluster it names.

use crate::cli::{RunArgs, RunClusterArgs};
use syncopate_exec::runtime;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::ClusterOverrides;
use syncopate_sim::plan::Plan;
use syncopate_sim::SimError;

/// The plan and the model it was made for: `--model`, else the model the plan records.
pub fn load_plan(
    path: &std::path::Path,
    model: Option<&str>,
) -> anyhow::Result<(Plan, ModelProfile)> {
    let label = path.to_string_lossy().into_owned();
    let plan = Plan::load(&label)?;
    let model = ModelProfile::load(&plan_model(&plan, model))?;
    plan.validate(&label, &model)?;
    Ok((plan, model))
}

/// The plan of `--plan` and its model, for a run by the executors: a plan that names another
/// runtime's framework or codecs is said to run without them.
pub fn load_plan_to_run(run: &RunArgs) -> anyhow::Result<(Plan, ModelProfile)> {
    let loaded = load_plan(&run.plan, run.model.as_deref())?;
    if let Some(note) = runtime::other_runtime_note(&loaded.0) {
        eprintln!("{note}");
    }
    Ok(loaded)
}

/// The model a plan runs with: `--model`, else the one the plan records, else its name.
pub fn plan_model(plan: &Plan, model: Option<&str>) -> String {
    model
        .map(str::to_string)
        .or_else(|| plan.target.as_ref().map(|t| t.model.clone()))
        .unwrap_or_else(|| plan.model.clone())
}

/// The cluster a plan runs on: `--cluster` and the overrides, else what the plan records.
pub fn plan_cluster(
    args: &RunClusterArgs,
    plan: &Plan,
) -> anyhow::Result<(String, ClusterOverrides)> {
    let target = plan.target.as_ref();
    let name = args
        .cluster
        .clone()
        .or_else(|| target.map(|t| t.cluster.clone()))
        .ok_or_else(|| {
            SimError::bad_value(
                "--cluster",
                "(none)",
                "the plan does not record the cluster it was made for (an older plan): name one",
            )
        })?;
    let overrides = ClusterOverrides {
        nodes: args.nodes.or(target.map(|t| t.nodes)),
        gpus_per_node: args.gpus_per_node.or(target.map(|t| t.gpus_per_node)),
        inter_gbps: args.inter_gbps.or(target.and_then(|t| t.inter_gbps)),
    };
    Ok((name, overrides))
}
