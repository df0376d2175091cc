//! Writing CSV files (RFC 4180 quoting) for sweeps and experiments.

use anyhow::Context;
use std::fmt::Write as _;
use std::path::Path;

/// A CSV document built row by row.
pub struct Csv {
    text: String,
}

impl Csv {
    pub fn new(header: &[&str]) -> Csv {
        let mut csv = Csv {
            text: String::new(),
        };
        csv.row(header.iter().map(|h| h.to_string()));
        csv
    }

    pub fn row(&mut self, fields: impl IntoIterator<Item = String>) {
        let line: Vec<String> = fields.into_iter().map(quote).collect();
        let _ = writeln!(self.text, "{}", line.join(","));
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, &self.text).with_context(|| format!("cannot write {}", path.display()))
    }
}

/// Quotes a field only when it holds a comma, quote or line break (skip reasons do).
fn quote(field: String) -> String {
    if field.contains([',', '"', '\n']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field
    }
}
