//! Embeds the shipped data files (profiles/models, profiles/devices, profiles/frameworks,
//! profiles/codecs, topologies) into the library, so that a shipped name resolves wherever the binary runs.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = String::new();
    for (constant, dir) in [
        ("SHIPPED_MODELS", "profiles/models"),
        ("SHIPPED_DEVICES", "profiles/devices"),
        ("SHIPPED_CLUSTERS", "topologies"),
        ("SHIPPED_FRAMEWORKS", "profiles/frameworks"),
        ("SHIPPED_CODECS", "profiles/codecs"),
    ] {
        let dir = root.join(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.retain(|p| p.extension().is_some_and(|e| e == "json"));
        entries.sort();
        writeln!(out, "pub(crate) static {constant}: &[(&str, &str)] = &[").unwrap();
        for path in entries {
            println!("cargo:rerun-if-changed={}", path.display());
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let abs = path.canonicalize().unwrap();
            writeln!(
                out,
                "    ({name:?}, include_str!({:?})),",
                abs.display().to_string()
            )
            .unwrap();
        }
        writeln!(out, "];").unwrap();
    }
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("shipped.rs");
    std::fs::write(dest, out).unwrap();
}
