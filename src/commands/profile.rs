//! `syncopate profile`: measures this machine into a device profile the simulator can use.

use crate::cli::{ProfileArgs, ProfileBackend};
use anyhow::Context;
use syncopate_exec::profile_host::{profile_host, HostProfileOptions};

pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    let name = match &args.name {
        Some(name) => name.clone(),
        None => args
            .out
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .context("--out needs a file name")?,
    };
    let profile = match args.backend {
        ProfileBackend::Host => profile_host(&HostProfileOptions {
            name,
            repeats: args.repeats.max(1),
            ..HostProfileOptions::default()
        })?,
    };
    let text = serde_json::to_string_pretty(&profile)? + "\n";
    std::fs::write(&args.out, text)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!(
        "measured {} compressors; wrote {}",
        profile.compression.len(),
        args.out.display()
    );
    Ok(())
}
