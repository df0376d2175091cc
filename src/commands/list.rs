//! `syncopate list`: what a user can name on the command line.

use crate::cli::ListWhat;
use syncopate_sim::compress::{self, Memory};
use syncopate_sim::data::DataKind;
use syncopate_sim::device::DeviceProfile;
use syncopate_sim::model::ModelProfile;
use syncopate_sim::strategy;
use syncopate_sim::topology::{Cluster, ClusterOverrides};

pub fn run(what: ListWhat) -> anyhow::Result<()> {
    match what {
        ListWhat::Models => {
            for name in DataKind::Model.shipped_names() {
                let model = ModelProfile::load(name)?;
                println!(
                    "{name:<14} {:>4} tensors {:>8.1} M params  {}",
                    model.num_tensors(),
                    model.total_numel() as f64 / 1e6,
                    model.description
                );
            }
        }
        ListWhat::Devices => {
            for name in DataKind::Device.shipped_names() {
                let device = DeviceProfile::load(name)?;
                println!("{name:<16} {}", device.model);
            }
        }
        ListWhat::Clusters => {
            for name in DataKind::Cluster.shipped_names() {
                let cluster = Cluster::load(name, ClusterOverrides::default())?;
                println!(
                    "{name:<20} {:>3} x {} GPUs  {}",
                    cluster.nodes, cluster.gpus_per_node, cluster.description
                );
            }
        }
        ListWhat::Compressors => {
            for entry in compress::catalog() {
                println!("{:<16} {}", entry.form, entry.description);
            }
            println!("\nmemories (--memory):");
            for entry in Memory::memory_catalog() {
                println!("{:<16} {}", entry.form, entry.description);
            }
        }
        ListWhat::Strategies => {
            for entry in strategy::catalog() {
                println!("{:<30} {}", entry.form, entry.description);
            }
        }
    }
    Ok(())
}
