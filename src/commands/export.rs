//! `syncopate export`: a plan's nearest framework settings, priced as the framework runs them.
//!
//! The settings are written in the file that framework reads.

use super::ms;
use super::shared::deliver::{deliver, Names, Outputs, Reference};
use super::shared::plan_file::{load_plan, plan_cluster, plan_model};
use crate::cli::ExportArgs;
use anyhow::Context;
use syncopate_sim::codec::CodecSet;
use syncopate_sim::export::{self, Target};
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::framework::Framework;
use syncopate_sim::inputs::topology::Cluster;
use syncopate_sim::plan::Plan;
use syncopate_sim::predict::evaluate::steady_iteration_time;
use syncopate_sim::predict::scenario::Scenario;

pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let target: Target = args.to.parse()?;
    let (plan, model) = load_plan(&args.run.plan, args.run.model.as_deref())?;
    let (cluster_name, overrides) = plan_cluster(&args.cluster, &plan)?;
    let names = Names {
        model: plan_model(&plan, args.run.model.as_deref()),
        cluster: cluster_name,
        inter_gbps: overrides.inter_gbps,
    };
    let mut base = Scenario::new(model, Cluster::load(&names.cluster, overrides)?)?;
    if let Some(host) = plan
        .target
        .as_ref()
        .and_then(|t| t.cpu_compression.as_deref())
    {
        base = base.with_host_codec(DeviceProfile::load(host)?)?;
    }
    let label = args.run.plan.display().to_string();
    let own = steady_iteration_time(&plan_scenario(&base, &plan, &label)?, &plan)?;
    let near = export::nearest(target, &plan, &base.model);
    let reference = Reference {
        label: "the plan's own".to_string(),
        iteration_ms: ms(own),
    };
    deliver(
        &base,
        &names,
        &near.settings,
        near.unexpressed,
        reference,
        &Outputs {
            out: args.out.as_deref(),
            print_settings: true,
            save_plan: args.save_plan.as_deref(),
            format: args.format,
        },
    )
}

/// `base` under the framework and codecs the plan names, as `simulate --plan` prices it.
fn plan_scenario(base: &Scenario, plan: &Plan, label: &str) -> anyhow::Result<Scenario> {
    let framework = match &plan.framework {
        Some(name) => Framework::named(name)
            .with_context(|| format!("{label}: framework"))?
            .map(|(_, f)| f),
        None => None,
    };
    let codecs = match &plan.codecs {
        Some(name) => CodecSet::named(name)
            .with_context(|| format!("{label}: codecs"))?
            .map(|(_, set)| set),
        None => None,
    };
    base.clone()
        .with_framework(framework)
        .with_codecs(codecs)
        .with_context(|| format!("{label}: codecs"))
}
