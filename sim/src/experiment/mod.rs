//! Reproducible studies: an experiment directory's spec.json run into its results.
//!
//! The results are its table, CSV, chart data and calibrated inputs.

mod framework;
mod grace;
mod grid;
pub mod lab;

use crate::base::chart::Chart;
use crate::base::data;
use crate::base::error::{Result, SimError};
use crate::inputs::device::DeviceProfile;
use crate::inputs::model::ModelProfile;
use crate::inputs::topology::Cluster;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// An experiment's spec.json: what kind of study it is and its parameters.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Spec {
    /// Simulations over panels × layouts × configurations.
    Grid(grid::GridSpec),
    /// Calibration against GRACE's measured throughputs.
    Grace(grace::GraceSpec),
    /// Predictions of plans measured on emulated clusters (`syncopate lab`).
    Lab(lab::LabSpec),
    /// A framework's costs against published runs of it.
    Framework(framework::FrameworkSpec),
}

/// Everything an experiment run produces, for the caller to write into the experiment directory
/// in this order: the calibrated inputs, `results.csv`, `against-paper.csv`, the charts, then the
/// README's table.
pub struct Results {
    /// Inputs a fit calibrated (file name in the directory, content); empty when nothing was fitted.
    pub inputs: Vec<(String, Input)>,
    /// The text of `results.csv`.
    pub csv: String,
    /// The text of `against-paper.csv`: published values beside their predictions, when the
    /// experiment has them.
    pub comparison: Option<String>,
    /// The charts to draw.
    pub charts: Vec<Chart>,
    /// The Markdown that goes between the README's result markers.
    pub table: String,
}

/// A calibrated data file; it serializes as the profile or cluster it holds.
#[derive(Serialize)]
#[serde(untagged)]
pub enum Input {
    /// A calibrated device profile.
    Device(DeviceProfile),
    /// A calibrated cluster.
    Cluster(Cluster),
    /// A calibrated model profile.
    Model(ModelProfile),
}

/// The README lines between which the results table stands.
pub const BEGIN: &str = "<!-- results:begin -->";
/// The README line after the results table.
pub const END: &str = "<!-- results:end -->";

/// The spec of a lab experiment in `dir`, if that is what it holds (it is measured first).
pub fn lab_spec(dir: &Path) -> Result<Option<lab::LabSpec>> {
    let spec_path = dir.join("spec.json");
    let text = std::fs::read_to_string(&spec_path).map_err(|source| SimError::Io {
        path: spec_path.clone(),
        source,
    })?;
    Ok(
        match data::parse_json(&spec_path.display().to_string(), &text)? {
            Spec::Lab(spec) => Some(spec),
            _ => None,
        },
    )
}

/// Reads `dir/spec.json` and runs the experiment it describes. `reuse_fit` evaluates the
/// calibrated inputs already in the directory instead of fitting them again.
pub fn run(dir: &Path, reuse_fit: bool) -> Result<Results> {
    let spec_path = dir.join("spec.json");
    let label = spec_path.display().to_string();
    let text = std::fs::read_to_string(&spec_path).map_err(|source| SimError::Io {
        path: spec_path.clone(),
        source,
    })?;
    match data::parse_json(&label, &text)? {
        Spec::Grid(spec) => grid::run(&spec, &label, dir),
        Spec::Grace(spec) => grace::run(&spec, &label, dir, reuse_fit),
        Spec::Lab(spec) => lab::run(&spec, &label, dir),
        Spec::Framework(spec) => framework::run(&spec, &label, dir),
    }
}

/// The README `text` (labelled `readme` in errors) with what stands between its result markers
/// replaced by `table`.
pub fn replace_results(readme: &str, text: &str, table: &str) -> Result<String> {
    let missing = || {
        SimError::invalid(
            readme,
            "results markers",
            format!("needs a line `{BEGIN}` followed by a line `{END}`"),
        )
    };
    let start = text.find(BEGIN).ok_or_else(missing)? + BEGIN.len();
    let end = start + text[start..].find(END).ok_or_else(missing)?;
    Ok(format!(
        "{}\n{}\n{}",
        &text[..start],
        table.trim_end(),
        &text[end..]
    ))
}

/// A shipped name stays a name; a path is taken relative to the experiment directory.
fn resolve(dir: &Path, name_or_path: &str) -> String {
    if name_or_path.ends_with(".json") || name_or_path.contains('/') {
        dir.join(name_or_path).to_string_lossy().into_owned()
    } else {
        name_or_path.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_replace_only_the_text_between_the_markers() {
        let text = format!("intro\n{BEGIN}\nold\ntable\n{END}\nafter\n");
        let updated = replace_results("README.md", &text, "| new |\n\n").unwrap();
        assert_eq!(updated, format!("intro\n{BEGIN}\n| new |\n{END}\nafter\n"));
    }

    #[test]
    fn a_readme_without_markers_is_an_error_naming_them() {
        let err = replace_results("README.md", "no markers", "x").unwrap_err();
        assert!(err.to_string().contains("results markers"), "{err}");
        let err = replace_results("README.md", BEGIN, "x").unwrap_err();
        assert!(err.to_string().contains(END), "{err}");
    }

    #[test]
    fn names_stay_names_and_paths_are_relative_to_the_experiment() {
        let dir = Path::new("experiments/x");
        assert_eq!(resolve(dir, "resnet50"), "resnet50");
        assert_eq!(resolve(dir, "model.json"), "experiments/x/model.json");
        assert_eq!(resolve(dir, "../y/c"), "experiments/x/../y/c");
    }
}
