//! `syncopate list`: what a user can name on the command line, and the model FLOP/s check.
//!
//! The FLOP/s check is of the model profiles.

use crate::cli::ListWhat;
use anyhow::bail;
use syncopate_sim::base::data::DataKind;
use syncopate_sim::codec::CodecSet;
use syncopate_sim::compress::{self, Memory};
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::flops::{self, Verdict};
use syncopate_sim::inputs::framework::Framework;
use syncopate_sim::inputs::model::{ModelProfile, Precision};
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::strategy;

pub fn run(what: ListWhat) -> anyhow::Result<()> {
    match what {
        ListWhat::Models { check: false, .. } => {
            for name in DataKind::Model.shipped_names() {
                let model = ModelProfile::load(name)?;
                println!(
                    "{name:<20} {:>4} tensors {:>8.1} M params  {}",
                    model.num_tensors(),
                    model.total_numel() as f64 / 1e6,
                    model.description
                );
            }
        }
        ListWhat::Models {
            check: true,
            models,
        } => check_models(&models)?,
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
        ListWhat::Frameworks => {
            for name in DataKind::Framework.shipped_names() {
                let framework = Framework::load(name)?;
                println!("{name:<16} {}", framework.description);
            }
        }
        ListWhat::Codecs => {
            for name in DataKind::Codecs.shipped_names() {
                let set = CodecSet::load(name)?;
                let keys: Vec<&str> = set.codecs.keys().map(String::as_str).collect();
                println!("{name:<16} {} ({})", set.description, keys.join(", "));
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

/// One row per model (`models`, or every shipped one): training FLOPs per iteration over forward +
/// backward time, against the peak of the device the profile was measured on. Fails when a
/// profile implies more than the peak without saying why (`arithmetic.above_peak_reason`).
fn check_models(models: &[String]) -> anyhow::Result<()> {
    let names: Vec<&str> = if models.is_empty() {
        DataKind::Model.shipped_names()
    } else {
        models.iter().map(String::as_str).collect()
    };
    println!(
        "{:<20} {:<16} {:<5} {:>6} {:>11} {:>11} {:>8} {:>8} {:>7} {:>12}  verdict",
        "model",
        "device",
        "prec",
        "batch",
        "GFLOP/iter",
        "fwd+bwd ms",
        "TFLOP/s",
        "peak",
        "% peak",
        "1st grad ms"
    );
    let mut impossible = Vec::new();
    for name in names {
        let model = ModelProfile::load(name)?;
        let device = DeviceProfile::load(&model.device)?;
        let batch = model.batch_size_per_gpu;
        let name = model.name.as_str();
        let (numbers, verdict) = match flops::check(&model, &device) {
            Some(check) => {
                let precision = match check.precision {
                    Precision::Fp32 => "fp32",
                    Precision::Tf32 => "tf32",
                    Precision::Fp16 => "fp16",
                };
                let numbers = format!(
                    "{precision:<5} {batch:>6} {:>11.1} {:>11.1} {:>8.2} {:>8.1} {:>7.0}",
                    check.flops_per_iteration / 1e9,
                    check.compute_seconds * 1e3,
                    check.achieved_tflops,
                    check.peak_tflops,
                    100.0 * check.fraction_of_peak,
                );
                if check.verdict == Verdict::Impossible {
                    impossible.push(name.to_string());
                }
                (numbers, verdict_text(check.verdict))
            }
            None => (
                format!(
                    "{:<5} {batch:>6} {:>11} {:>11} {:>8} {:>8} {:>7}",
                    "-", "-", "-", "-", "-", "-"
                ),
                "not checked: no `arithmetic` section".to_string(),
            ),
        };
        println!(
            "{name:<20} {:<16} {numbers} {:>12.3}  {verdict}",
            model.device,
            model.first_gradient_time().as_us() / 1e3
        );
    }
    if !impossible.is_empty() {
        bail!(
            "{} imply more FLOP/s than their device's peak and give no \
             arithmetic.above_peak_reason: fix the batch, the precision or the timings",
            impossible.join(", ")
        );
    }
    Ok(())
}

fn verdict_text(verdict: Verdict) -> String {
    match verdict {
        Verdict::Plausible => "ok".to_string(),
        Verdict::Suspicious => format!(
            "suspicious: above {:.0} % of peak",
            100.0 * flops::SUSPICIOUS_FRACTION
        ),
        Verdict::AbovePeakExplained => {
            "above peak, explained: see arithmetic.above_peak_reason".to_string()
        }
        Verdict::Impossible => "IMPOSSIBLE: above the device's peak".to_string(),
    }
}
