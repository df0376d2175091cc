//! Finds the CUDA libraries before any cudarc call, and makes a pip-style `libnccl.so.2` loadable.
//!
//! The libraries are libcuda, libnvrtc and libnccl, found first because cudarc panics when a
//! library is missing.
//!
//! cudarc opens NCCL by bare names (`libnccl.so`, `libnccl.so.12`, …; see
//! `cudarc::get_lib_name_candidates`) through the dynamic loader, whose search path is read
//! once at process start, and honours no variable of its own. Python NCCL wheels ship only
//! `libnccl.so.2`. So when `SYNCOPATE_NCCL_LIB` names such a file, we link it as `libnccl.so`
//! in a private directory, prepend that directory to LD_LIBRARY_PATH and re-execute this
//! program once, so that the loader (and cudarc) find it.

use crate::error::{ExecError, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Names a user can set to point at NCCL.
pub const NCCL_ENV: &str = "SYNCOPATE_NCCL_LIB";
/// Set on the re-executed process, so that a failure there is reported instead of looping.
const REEXEC_ENV: &str = "SYNCOPATE_NCCL_REEXEC";

fn loads(name: impl AsRef<std::ffi::OsStr>) -> bool {
    let name = name.as_ref();
    // SAFETY: loading a shared library runs its initializers; the CUDA, NVRTC and NCCL
    // libraries probed here are the ones cudarc loads next anyway, and we unload nothing the
    // program keeps pointers into (the handle is dropped without any symbol taken from it).
    unsafe { libloading::Library::new(name) }.is_ok()
}

fn find(lib: &str) -> Option<String> {
    cudarc::get_lib_name_candidates(lib)
        .into_iter()
        .find(|name| loads(name))
}

fn missing(lib: &str, hint: &str) -> ExecError {
    ExecError::NoGpu {
        reason: format!(
            "lib{lib} not found under the names cudarc tries ({}); {hint}",
            cudarc::get_lib_name_candidates(lib)
                .into_iter()
                .take(3)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Whether NVRTC loads: compiling the kernels needs it, a GPU does not.
pub fn nvrtc_loads() -> bool {
    find("nvrtc").is_some()
}

/// Checks that the driver, NVRTC and NCCL libraries load and that a GPU exists. Returns the
/// number of visible GPUs. May re-execute the program once (see the module comment).
pub fn probe() -> Result<usize> {
    find("cuda").ok_or_else(|| missing("cuda", "no NVIDIA driver on this machine"))?;
    find("nvrtc").ok_or_else(|| {
        missing(
            "nvrtc",
            "install the CUDA runtime compiler (e.g. pip install nvidia-cuda-nvrtc-cu12) and add it to LD_LIBRARY_PATH",
        )
    })?;
    if find("nccl").is_none() {
        expose_nccl()?;
    }
    cudarc::driver::result::init().map_err(|e| ExecError::NoGpu {
        reason: format!("the CUDA driver failed to initialize: {e}"),
    })?;
    let count = cudarc::driver::result::device::get_count().map_err(|e| ExecError::NoGpu {
        reason: format!("cannot count CUDA devices: {e}"),
    })?;
    if count <= 0 {
        return Err(ExecError::NoGpu {
            reason: "the CUDA driver sees no device".into(),
        });
    }
    Ok(count as usize)
}

/// Makes `$SYNCOPATE_NCCL_LIB` loadable under cudarc's name by re-executing with a private
/// LD_LIBRARY_PATH entry; returns only on failure.
fn expose_nccl() -> Result<()> {
    let hint = format!(
        "set {NCCL_ENV}=/path/to/libnccl.so.2 (e.g. from pip's nvidia-nccl-cu12) or add NCCL to LD_LIBRARY_PATH"
    );
    let Some(path) = std::env::var_os(NCCL_ENV) else {
        return Err(missing("nccl", &hint));
    };
    let path = PathBuf::from(path);
    if std::env::var_os(REEXEC_ENV).is_some() {
        return Err(ExecError::NoGpu {
            reason: format!(
                "{NCCL_ENV}={} is on LD_LIBRARY_PATH as libnccl.so, yet libnccl still does not load",
                path.display()
            ),
        });
    }
    if !loads(&path) {
        return Err(ExecError::NoGpu {
            reason: format!(
                "{NCCL_ENV}={} does not load as a shared library",
                path.display()
            ),
        });
    }
    let dir = link_dir(&path)?;
    let mut search = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        search.push(":");
        search.push(old);
    }
    let exe = std::env::current_exe().map_err(|source| ExecError::Io {
        what: "cannot find this program to re-execute it with NCCL on the library path".into(),
        source,
    })?;
    use std::os::unix::process::CommandExt;
    let source = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", search)
        .env(REEXEC_ENV, "1")
        .exec();
    Err(ExecError::Io {
        what: "cannot re-execute with NCCL on the library path".into(),
        source,
    })
}

/// A private directory holding `libnccl.so` → `path`.
fn link_dir(path: &Path) -> Result<PathBuf> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| ExecError::Io { what, source }
    };
    let target = std::fs::canonicalize(path).map_err(io("cannot resolve SYNCOPATE_NCCL_LIB"))?;
    let dir = std::env::temp_dir().join(format!("syncopate-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io("cannot create the NCCL link directory"))?;
    let link = dir.join("libnccl.so");
    // A leftover link from an earlier process with the same pid may point elsewhere.
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&target, &link).map_err(io("cannot link libnccl.so"))?;
    Ok(dir)
}
