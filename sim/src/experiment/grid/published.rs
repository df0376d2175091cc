//! A paper's published numbers beside a grid's predictions.
//!
//! It gives each value's error, and whether the paper's best method at each setup is ours.

use super::results::Cell;
use super::GridSpec;
use crate::base::csv::Csv;
use crate::base::data;
use crate::base::error::{Result, SimError};
use crate::base::stats::{median, percentile};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// A grid experiment's `published.json`: values read from a paper's figures, tables or plotting
/// scripts, each block citing where.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Published {
    format_version: u32,
    /// The paper, as cited.
    paper: String,
    /// Source id → where the values were read and how (figure, table, script; digitized or exact).
    sources: BTreeMap<String, String>,
    blocks: Vec<Block>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Block {
    /// Panel titles of the spec; with several, a value is the largest over them, as a paper's
    /// "up to" is.
    panels: Vec<String>,
    metric: Metric,
    source: String,
    gpus: Vec<u32>,
    /// Config label → one value per GPU count, `null` where the paper has none.
    values: BTreeMap<String, Vec<Option<f64>>>,
    /// Configs whose values here calibrated a parameter (the README names it): shown, but not
    /// held out.
    #[serde(default)]
    fitted: Vec<String>,
}

#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Metric {
    /// Throughput over the GPU count times one GPU's throughput alone, in percent.
    ScalingPercent,
    /// Throughput over the spec baseline's at the same panel and GPU count.
    Speedup,
    /// Throughput over the best other config's at the same panel and GPU count.
    SpeedupOverBestOther,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::ScalingPercent => "scaling %",
            Metric::Speedup => "speedup",
            Metric::SpeedupOverBestOther => "over best other",
        }
    }

    /// The metric of `config` among `cells`, those of one panel at one GPU count; `None` if it
    /// was skipped.
    fn of(self, cells: &[&Cell], config: &str) -> Option<f64> {
        let cell = cells.iter().find(|c| c.config.label == config)?;
        match self {
            Metric::ScalingPercent => cell.row.summary().map(|s| s.scaling_efficiency * 100.0),
            Metric::Speedup => cell.speedup,
            Metric::SpeedupOverBestOther => {
                let best_other = cells
                    .iter()
                    .filter(|c| c.config.label != config)
                    .filter_map(|c| c.throughput())
                    .max_by(f64::total_cmp)?;
                Some(cell.throughput()? / best_other)
            }
        }
    }
}

/// One published value with the prediction of the same quantity.
struct Pair<'a> {
    /// The block's index, that keys its setups.
    index: usize,
    block: &'a Block,
    gpus: u32,
    config: &'a str,
    published: f64,
    predicted: Option<f64>,
}

impl Pair<'_> {
    /// The prediction's error relative to the published value, in percent.
    fn error_percent(&self) -> Option<f64> {
        self.predicted.map(|p| (p / self.published - 1.0) * 100.0)
    }

    /// Whether a fit used the value (its config is among the block's `fitted`).
    fn fitted(&self) -> bool {
        self.block.fitted.iter().any(|c| c == self.config)
    }

    fn role(&self) -> &'static str {
        if self.fitted() {
            "fitted"
        } else {
            "held out"
        }
    }
}

impl Published {
    /// Reads and checks `path` against the grid it describes.
    pub(super) fn load(path: &Path, spec: &GridSpec) -> Result<Published> {
        let label = path.display().to_string();
        let published: Published = data::parse_json(&label, &data::read_text(path)?)?;
        published.check(&label, spec)?;
        Ok(published)
    }

    /// Every block names spec panels and configs, a cited source and one layout per GPU count,
    /// with one positive value per GPU count.
    fn check(&self, label: &str, spec: &GridSpec) -> Result<()> {
        data::check_format_version(label, self.format_version)?;
        if self.blocks.is_empty() {
            return Err(SimError::invalid(
                label,
                "blocks",
                "needs at least one entry",
            ));
        }
        for (b, block) in self.blocks.iter().enumerate() {
            let field = |name: &str| format!("blocks[{b}].{name}");
            let bad = |name: &str, why: String| Err(SimError::invalid(label, field(name), why));
            if block.panels.is_empty() {
                return bad("panels", "needs at least one panel title".into());
            }
            if let Some(p) = block
                .panels
                .iter()
                .find(|p| !spec.panels.iter().any(|s| &s.title == *p))
            {
                return bad("panels", format!("`{p}` is not the title of a spec panel"));
            }
            if block.metric == Metric::Speedup && spec.baseline.is_none() {
                return bad("metric", "`speedup` needs the spec's baseline".into());
            }
            if !self.sources.contains_key(&block.source) {
                return bad("source", format!("`{}` is not in `sources`", block.source));
            }
            if block.gpus.is_empty() {
                return bad("gpus", "needs at least one GPU count".into());
            }
            for &gpus in &block.gpus {
                let layouts = spec.layouts.iter().filter(|l| l.gpus() == Some(gpus));
                if layouts.count() != 1 {
                    return bad(
                        "gpus",
                        format!("{gpus} GPUs must match exactly one spec layout"),
                    );
                }
            }
            if let Some(c) = block.fitted.iter().find(|c| !block.values.contains_key(*c)) {
                return bad("fitted", format!("`{c}` has no values in this block"));
            }
            for (config, values) in &block.values {
                let name = format!("values.{config}");
                if !spec.configs.iter().any(|c| &c.label == config) {
                    return bad(&name, format!("`{config}` is not the label of a config"));
                }
                if values.len() != block.gpus.len() {
                    return bad(
                        &name,
                        format!("needs {} values, one per GPU count", block.gpus.len()),
                    );
                }
                if let Some(v) = values
                    .iter()
                    .flatten()
                    .find(|v| !(v.is_finite() && **v > 0.0))
                {
                    return bad(&name, format!("{v} is not a positive number"));
                }
            }
        }
        Ok(())
    }

    /// Each published value beside its prediction, block by block in the spec's config order.
    fn pairs<'a>(&'a self, spec: &'a GridSpec, cells: &[Cell]) -> Vec<Pair<'a>> {
        let mut pairs = Vec::new();
        for (index, block) in self.blocks.iter().enumerate() {
            for (i, &gpus) in block.gpus.iter().enumerate() {
                for config in &spec.configs {
                    let Some(Some(published)) = block.values.get(&config.label).map(|v| v[i])
                    else {
                        continue;
                    };
                    let predicted = block
                        .panels
                        .iter()
                        .filter_map(|panel| {
                            let at: Vec<&Cell> = cells
                                .iter()
                                .filter(|c| &c.panel.title == panel && c.row.layout.gpus() == gpus)
                                .collect();
                            block.metric.of(&at, &config.label)
                        })
                        .max_by(f64::total_cmp);
                    pairs.push(Pair {
                        index,
                        block,
                        gpus,
                        config: &config.label,
                        published,
                        predicted,
                    });
                }
            }
        }
        pairs
    }

    /// The comparison as CSV and as the Markdown that follows the grid's table.
    pub(super) fn report(&self, spec: &GridSpec, cells: &[Cell]) -> (String, String) {
        let pairs = self.pairs(spec, cells);
        let mut csv = Csv::new(&[
            "panels",
            "gpus",
            "config",
            "metric",
            "published",
            "predicted",
            "error_percent",
            "role",
            "source",
        ]);
        let mut md = format!(
            "\n### Against the paper\n\n{}\n\n| setup | GPUs | config | metric | paper | here | error | role |\n|---|---|---|---|---|---|---|---|\n",
            self.paper
        );
        for pair in &pairs {
            let setup = pair.block.panels.join(" / ");
            let role = pair.role();
            let predicted = pair
                .predicted
                .map(|p| format!("{p:.3}"))
                .unwrap_or_default();
            let error = pair.error_percent();
            csv.row([
                setup.clone(),
                pair.gpus.to_string(),
                pair.config.to_string(),
                pair.block.metric.name().to_string(),
                format!("{}", pair.published),
                predicted,
                error.map(|e| format!("{e:.1}")).unwrap_or_default(),
                role.to_string(),
                pair.block.source.clone(),
            ]);
            let _ = writeln!(
                md,
                "| {setup} | {} | {} | {} | {} | {} | {} | {role} |",
                pair.gpus,
                pair.config,
                pair.block.metric.name(),
                pair.published,
                pair.predicted
                    .map(|p| format!("{p:.2}"))
                    .unwrap_or_else(|| "skipped".into()),
                error.map(|e| format!("{e:+.1} %")).unwrap_or_default(),
            );
        }
        md.push_str(&summary(&pairs));
        md.push_str("\nSources:\n\n");
        for (id, text) in &self.sources {
            let _ = writeln!(md, "- `{id}`: {text}");
        }
        (csv.into_text(), md)
    }
}

/// The held-out error's median and 90th percentile, and at how many setups (block and GPU
/// count with two or more predicted configs) the paper's best config is the predicted best.
fn summary(pairs: &[Pair]) -> String {
    let held_out: Vec<&Pair> = pairs.iter().filter(|p| !p.fitted()).collect();
    let mut errors: Vec<f64> = held_out
        .iter()
        .filter_map(|p| p.error_percent().map(f64::abs))
        .collect();
    errors.sort_by(f64::total_cmp);
    let mut setups: BTreeMap<(usize, u32), Vec<&Pair>> = BTreeMap::new();
    for pair in held_out.iter().filter(|p| p.predicted.is_some()) {
        setups
            .entry((pair.index, pair.gpus))
            .or_default()
            .push(pair);
    }
    let ranked: Vec<&Vec<&Pair>> = setups.values().filter(|s| s.len() >= 2).collect();
    let agree = ranked.iter().filter(|s| best_agrees(s)).count();
    let mut text = format!(
        "\nHeld out: {} values, {} predicted",
        held_out.len(),
        errors.len()
    );
    if let Some(m) = median(&errors) {
        let _ = write!(
            text,
            "; median |error| {m:.1} %, 90th percentile {:.1} %",
            percentile(&errors, 0.9)
        );
    }
    let _ = writeln!(
        text,
        "; the paper's best config is the predicted best at {agree} of {} setups.",
        ranked.len()
    );
    let fitted: Vec<f64> = pairs
        .iter()
        .filter(|p| p.fitted())
        .filter_map(|p| p.error_percent().map(f64::abs))
        .collect();
    if let Some(m) = median(&fitted) {
        let _ = writeln!(
            text,
            "Fitted: {} values, median |error| {m:.1} %.",
            fitted.len()
        );
    }
    text
}

/// Whether the config predicted best is one the paper reports best (ties in the paper count).
fn best_agrees(setup: &[&Pair]) -> bool {
    let best_published = setup.iter().map(|p| p.published).fold(f64::MIN, f64::max);
    setup
        .iter()
        .max_by(|a, b| {
            a.predicted
                .unwrap_or(0.0)
                .total_cmp(&b.predicted.unwrap_or(0.0))
        })
        .is_some_and(|p| p.published == best_published)
}

#[cfg(test)]
mod tests {
    use super::super::run;
    use super::*;

    const SPEC: &str = r#"{
        "format_version": 1,
        "title": "t",
        "panels": [{ "title": "ResNet-50", "model": "resnet50", "cluster": "v100-10gbe" }],
        "layouts": [{ "nodes": 1, "gpus_per_node": 1 }, { "nodes": 2, "gpus_per_node": 1 }],
        "configs": [
            { "label": "dense", "strategy": "horovod", "compressor": "none" },
            { "label": "half", "strategy": "horovod", "compressor": "fp16" }
        ],
        "baseline": "dense",
        "published": "published.json"
    }"#;

    /// A published file with one block whose fields after `"panels"` are `block`.
    fn published(block: &str) -> String {
        format!(
            r#"{{ "format_version": 1, "paper": "p", "sources": {{ "fig": "figure 1" }},
                 "blocks": [{{ "panels": ["ResNet-50"], {block} }}] }}"#
        )
    }

    /// The grid run with `text` as its published file, in a directory of its own.
    fn run_with(name: &str, text: &str) -> Result<crate::experiment::Results> {
        let dir =
            std::env::temp_dir().join(format!("syncopate-published-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("published.json"), text).unwrap();
        let spec: GridSpec = data::parse_json("spec.json", SPEC).unwrap();
        let results = run(&spec, "spec.json", &dir);
        std::fs::remove_dir_all(&dir).unwrap();
        results
    }

    #[test]
    fn each_value_is_compared_with_the_same_quantity_predicted() {
        let text = published(
            r#""metric": "speedup", "source": "fig", "gpus": [2],
               "values": { "dense": [2.0], "half": [0.5] }"#,
        );
        let results = run_with("speedup", &text).unwrap();
        let csv = results.comparison.unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3, "{csv}");
        // The baseline's predicted speedup is 1 by definition: half the published 2.
        assert!(
            lines[1].starts_with("ResNet-50,2,dense,speedup,2,1.000,-50.0,held out,fig"),
            "{}",
            lines[1]
        );
        assert!(results.table.contains("### Against the paper"));
        assert!(results.table.contains("of 1 setups"), "{}", results.table);
        assert!(results.table.contains("- `fig`: figure 1"));
    }

    #[test]
    fn the_best_agrees_when_the_predicted_best_is_a_published_best() {
        let block: Block = data::parse_json(
            "block",
            r#"{ "panels": ["p"], "metric": "speedup", "source": "s", "gpus": [2], "values": {} }"#,
        )
        .unwrap();
        let pair = |config, published, predicted| Pair {
            index: 0,
            block: &block,
            gpus: 2,
            config,
            published,
            predicted: Some(predicted),
        };
        let (a, b, c) = (
            pair("a", 2.0, 1.0),
            pair("b", 2.0, 3.0),
            pair("c", 1.0, 2.0),
        );
        assert!(best_agrees(&[&a, &b, &c]), "a tie in the paper counts");
        assert!(!best_agrees(&[&a, &c]));
        assert_eq!(b.error_percent(), Some(50.0));
    }

    #[test]
    fn fitted_values_are_shown_but_not_held_out() {
        let text = published(
            r#""metric": "speedup", "source": "fig", "gpus": [2], "fitted": ["dense"],
               "values": { "dense": [2.0], "half": [1.0] }"#,
        );
        let results = run_with("fitted", &text).unwrap();
        let csv = results.comparison.unwrap();
        assert!(
            csv.contains(",dense,speedup,2,1.000,-50.0,fitted,"),
            "{csv}"
        );
        assert!(csv.contains(",half,speedup,1,"), "{csv}");
        assert!(
            results.table.contains("Held out: 1 values")
                && results
                    .table
                    .contains("Fitted: 1 values, median |error| 50.0 %"),
            "{}",
            results.table
        );
        let unknown = text.replace(r#"["dense"]"#, r#"["sparse"]"#);
        let err = run_with("fitted-unknown", &unknown)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("fitted") && err.contains("`sparse`"), "{err}");
    }

    #[test]
    fn scaling_is_the_simulated_scaling_efficiency() {
        let text = published(
            r#""metric": "scaling_percent", "source": "fig", "gpus": [1],
               "values": { "dense": [100.0] }"#,
        );
        let csv = run_with("scaling", &text).unwrap().comparison.unwrap();
        // One GPU alone scales perfectly.
        assert!(
            csv.contains("ResNet-50,1,dense,scaling %,100,100.000,0.0,"),
            "{csv}"
        );
    }

    #[test]
    fn a_block_naming_what_the_grid_lacks_is_an_error_naming_it() {
        let cases = [
            (
                r#""metric": "speedup", "source": "fig", "gpus": [2], "values": { "sparse": [1.0] }"#,
                "`sparse`",
            ),
            (
                r#""metric": "speedup", "source": "table", "gpus": [2], "values": {}"#,
                "`table`",
            ),
            (
                r#""metric": "speedup", "source": "fig", "gpus": [4], "values": {}"#,
                "4 GPUs",
            ),
            (
                r#""metric": "speedup", "source": "fig", "gpus": [2], "values": { "dense": [1.0, 2.0] }"#,
                "values.dense",
            ),
            (
                r#""metric": "speedup", "source": "fig", "gpus": [2], "values": { "dense": [-1.0] }"#,
                "-1 is not a positive number",
            ),
            (
                r#""metric": "goodput", "source": "fig", "gpus": [2], "values": {}"#,
                "goodput",
            ),
        ];
        for (i, (block, named)) in cases.into_iter().enumerate() {
            let err = run_with(&format!("bad{i}"), &published(block))
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains(named), "{named}: {err}");
        }
        let other_panel =
            published(r#""metric": "speedup", "source": "fig", "gpus": [2], "values": {}"#)
                .replace(r#"["ResNet-50"]"#, r#"["VGG-16"]"#);
        let err = run_with("panel", &other_panel).err().unwrap().to_string();
        assert!(err.contains("`VGG-16`"), "{err}");
    }
}
