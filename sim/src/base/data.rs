//! Loading versioned JSON data files by shipped name or by path, with errors that name the
//! file, line and field; writing files whole or not at all.

use crate::base::error::{Result, SimError};
use serde::de::DeserializeOwned;
use std::path::Path;

mod shipped {
    include!(concat!(env!("OUT_DIR"), "/shipped.rs"));
}

/// The only data-file format version this build reads.
pub const FORMAT_VERSION: u32 = 1;

/// The kinds of data file a user can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataKind {
    /// A model profile (`profiles/models`).
    Model,
    /// A device profile (`profiles/devices`).
    Device,
    /// A cluster topology (`topologies`).
    Cluster,
    /// A framework profile (`profiles/frameworks`).
    Framework,
    /// A codec set (`profiles/codecs`).
    Codecs,
}

impl DataKind {
    /// The kind's name in messages, e.g. `codec set`.
    pub fn label(self) -> &'static str {
        match self {
            DataKind::Model => "model",
            DataKind::Device => "device",
            DataKind::Cluster => "cluster",
            DataKind::Framework => "framework",
            DataKind::Codecs => "codec set",
        }
    }

    fn shipped(self) -> &'static [(&'static str, &'static str)] {
        match self {
            DataKind::Model => shipped::SHIPPED_MODELS,
            DataKind::Device => shipped::SHIPPED_DEVICES,
            DataKind::Cluster => shipped::SHIPPED_CLUSTERS,
            DataKind::Framework => shipped::SHIPPED_FRAMEWORKS,
            DataKind::Codecs => shipped::SHIPPED_CODECS,
        }
    }

    /// Names of the files shipped with this build, sorted.
    pub fn shipped_names(self) -> Vec<&'static str> {
        self.shipped().iter().map(|(name, _)| *name).collect()
    }

    /// Where a shipped file lives in the source tree (used in error messages).
    fn shipped_dir(self) -> &'static str {
        match self {
            DataKind::Model => "profiles/models",
            DataKind::Device => "profiles/devices",
            DataKind::Cluster => "topologies",
            DataKind::Framework => "profiles/frameworks",
            DataKind::Codecs => "profiles/codecs",
        }
    }
}

/// The text of a data file and the label to use for it in error messages.
pub struct Source {
    /// The path given, or the shipped file's path in the source tree.
    pub label: String,
    /// The file's contents.
    pub text: String,
}

/// Finds a data file: an existing path, or else a shipped name. Anything that looks like a path
/// but does not exist is reported as a missing file rather than an unknown name.
pub fn locate(kind: DataKind, name_or_path: &str) -> Result<Source> {
    let path = Path::new(name_or_path);
    let looks_like_path = name_or_path.contains('/') || name_or_path.ends_with(".json");
    if path.is_file() || looks_like_path {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        return Ok(Source {
            label: name_or_path.to_string(),
            text,
        });
    }
    match kind
        .shipped()
        .iter()
        .find(|(name, _)| *name == name_or_path)
    {
        Some((name, text)) => Ok(Source {
            label: format!("{}/{}.json", kind.shipped_dir(), name),
            text: (*text).to_string(),
        }),
        None => Err(SimError::UnknownName {
            kind: kind.label(),
            name: name_or_path.to_string(),
            valid: kind.shipped_names().join(", "),
        }),
    }
}

/// A data file of `kind` by shipped name or path, parsed and checked by `validate` (which
/// gets the file's label for its errors).
pub fn load<T: DeserializeOwned>(
    kind: DataKind,
    name_or_path: &str,
    validate: impl FnOnce(&T, &str) -> Result<()>,
) -> Result<T> {
    let source = locate(kind, name_or_path)?;
    let value: T = parse_json(&source.label, &source.text)?;
    validate(&value, &source.label)?;
    Ok(value)
}

/// A data file as a plan records it: a shipped name as it is, a path made absolute so that
/// the plan can move.
pub fn absolute(name: &str) -> String {
    let path = std::path::Path::new(name);
    if path.is_file() {
        std::fs::canonicalize(path)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| name.to_string())
    } else {
        name.to_string()
    }
}

/// The text of the file at `path`, or an error naming it.
pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses JSON into `T`, reporting the line, column and field path of the first error.
pub fn parse_json<T: DeserializeOwned>(label: &str, text: &str) -> Result<T> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let field = err.path().to_string();
        let inner = err.into_inner();
        SimError::Json {
            file: label.to_string(),
            line: inner.line(),
            column: inner.column(),
            field: if field.is_empty() {
                "(top level)".to_string()
            } else {
                field
            },
            message: inner.to_string(),
        }
    })
}

/// Checks the `format_version` field shared by every data file.
pub fn check_format_version(label: &str, version: u32) -> Result<()> {
    if version == FORMAT_VERSION {
        Ok(())
    } else {
        Err(SimError::invalid(
            label,
            "format_version",
            format!("this build reads format_version {FORMAT_VERSION}, the file has {version}"),
        ))
    }
}

/// A zero a data file leaves out (`skip_serializing_if`): an absent optional number reads
/// back as 0.
pub(crate) fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// Checks that a measured number is finite and strictly positive.
pub fn check_positive(label: &str, field: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(SimError::invalid(
            label,
            field,
            format!("must be a positive number, got {value}"),
        ))
    }
}

/// Checks that a measured number is finite and not negative.
pub fn check_non_negative(label: &str, field: &str, value: f64) -> Result<()> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(SimError::invalid(
            label,
            field,
            format!("must be zero or positive, got {value}"),
        ))
    }
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename, so
/// that a failure never leaves a partial file behind.
pub fn write_atomically(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir
        .unwrap_or(std::path::Path::new("."))
        .join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&temp, text)
        .and_then(|()| std::fs::rename(&temp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&temp);
        })
}
