//! CSV documents (RFC 4180 quoting) built row by row, for sweep and experiment results.

use std::fmt::Write as _;

/// A CSV document built row by row.
pub struct Csv {
    text: String,
}

impl Csv {
    /// Starts a document whose first row is `header`.
    pub fn new(header: &[&str]) -> Csv {
        let mut csv = Csv {
            text: String::new(),
        };
        csv.row(header.iter().map(|h| h.to_string()));
        csv
    }

    /// Appends one row, quoting fields that hold a comma, quote or line break.
    pub fn row(&mut self, fields: impl IntoIterator<Item = String>) {
        let line: Vec<String> = fields.into_iter().map(quote).collect();
        let _ = writeln!(self.text, "{}", line.join(","));
    }

    /// The document, one line per row, each ending in a line break.
    pub fn into_text(self) -> String {
        self.text
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_fields_that_need_it() {
        let mut csv = Csv::new(&["a", "b"]);
        csv.row(["1".to_string(), "skipped: x, y".to_string()]);
        csv.row(["say \"hi\"".to_string(), "two\nlines".to_string()]);
        assert_eq!(
            csv.into_text(),
            "a,b\n1,\"skipped: x, y\"\n\"say \"\"hi\"\"\",\"two\nlines\"\n"
        );
    }
}
