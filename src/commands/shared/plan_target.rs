//! The scenario a saved plan records, so that `--plan` alone brings back its model and cluster.

use syncopate_sim::inputs::topology::Cluster;
use syncopate_sim::plan::Target;

/// What a saved plan records about the scenario it was made for.
pub fn target(
    model: &str,
    cluster_name: &str,
    inter_gbps: Option<f64>,
    cluster: &Cluster,
    cpu_compression: Option<&str>,
) -> Target {
    Target::new(
        model,
        cluster_name,
        cluster.nodes,
        cluster.gpus_per_node,
        inter_gbps,
        cpu_compression,
    )
}
