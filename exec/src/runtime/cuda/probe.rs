//! Finds the CUDA libraries before any cudarc call: by the loader's names, else in pip's wheels.
//!
//! The libraries are libcuda, libnvrtc and libnccl, found first because cudarc panics when a
//! library is missing.
//!
//! cudarc opens each library by bare names (`libnccl.so`, `libnvrtc.so.12`, …; see
//! `cudarc::get_lib_name_candidates`) through the dynamic loader, whose search path is read
//! once at process start. Pip's wheels, which PyTorch's CUDA builds install, ship names it may
//! not try: NCCL as `nvidia/nccl/lib/libnccl.so.2`, CUDA 13's NVRTC as
//! `nvidia/cu13/lib/libnvrtc.so.13` (tried only by a `cuda-13` build), and NVRTC opens its
//! builtins library (`libnvrtc-builtins.so.13.0`) by name from the loader's path. So a library
//! the loader does not find is looked for where `SYNCOPATE_NVRTC_LIB` / `SYNCOPATE_NCCL_LIB`
//! point, else in the site-packages of `python3` (or `$SYNCOPATE_PYTHON`); then it is linked
//! under cudarc's first name in a private directory, that directory and the library's own go
//! first on LD_LIBRARY_PATH, and this program re-executes once.

use crate::error::{ExecError, Result};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

/// Names a user can set to point at NCCL (`libnccl.so.2`).
pub const NCCL_ENV: &str = "SYNCOPATE_NCCL_LIB";
/// Names a user can set to point at NVRTC (`libnvrtc.so.12` or `.13`).
pub const NVRTC_ENV: &str = "SYNCOPATE_NVRTC_LIB";
/// The Python whose site-packages are searched (default `python3`).
const PYTHON_ENV: &str = "SYNCOPATE_PYTHON";
/// Set on the re-executed process, so that a failure there is reported instead of looping.
const REEXEC_ENV: &str = "SYNCOPATE_CUDA_REEXEC";

/// A library cudarc loads, and where pip's wheels put it.
struct Wanted {
    lib: &'static str,
    env: &'static str,
    /// Paths under a site-packages directory, the build's CUDA major version first.
    wheel_paths: &'static [&'static str],
    hint: &'static str,
}

const NVRTC: Wanted = Wanted {
    lib: "nvrtc",
    env: NVRTC_ENV,
    wheel_paths: if cfg!(feature = "cuda-13") {
        &[
            "nvidia/cu13/lib/libnvrtc.so.13",
            "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
        ]
    } else {
        &[
            "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            "nvidia/cu13/lib/libnvrtc.so.13",
        ]
    },
    hint: "pip install nvidia-cuda-nvrtc (CUDA 13) or nvidia-cuda-nvrtc-cu12 (CUDA 12)",
};

const NCCL: Wanted = Wanted {
    lib: "nccl",
    env: NCCL_ENV,
    wheel_paths: &["nvidia/nccl/lib/libnccl.so.2"],
    hint: "pip install nvidia-nccl-cu13 or nvidia-nccl-cu12 (PyTorch's CUDA wheels bring it)",
};

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
    let mut located = Vec::new();
    let mut sites = None;
    for wanted in [&NVRTC, &NCCL] {
        if find(wanted.lib).is_none() {
            let sites = sites.get_or_insert_with(site_packages);
            located.push((wanted, locate(wanted, sites)?));
        }
    }
    if !located.is_empty() {
        reexec(&located)?;
    }
    devices()
}

/// The probe of a process that cannot re-execute itself (a Python interpreter that loaded
/// syncopate.torch): checks that the driver loads and, when the loader does not find NVRTC by
/// name, loads it and its builtins from pip's wheels under `sites` (or `SYNCOPATE_NVRTC_LIB`)
/// and keeps them loaded, so that cudarc's and NVRTC's later opens by name find them (the
/// loader matches a loaded library's soname). NCCL is left to PyTorch. Returns the number of
/// visible GPUs.
pub fn probe_in_process(sites: &[PathBuf]) -> Result<usize> {
    find("cuda").ok_or_else(|| missing("cuda", "no NVIDIA driver on this machine"))?;
    if find(NVRTC.lib).is_none() {
        let path = locate(&NVRTC, sites)?;
        let dir = path.parent().map(PathBuf::from).unwrap_or_default();
        keep_loaded(&path)?;
        let entries = std::fs::read_dir(&dir).map_err(|err| ExecError::NoGpu {
            reason: format!("cannot list {}: {err}", dir.display()),
        })?;
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("libnvrtc-builtins.so")
            {
                keep_loaded(&entry.path())?;
            }
        }
    }
    devices()
}

/// Loads the library at `path` for the rest of the process.
fn keep_loaded(path: &std::path::Path) -> Result<()> {
    // SAFETY: as in `loads`; the handle is leaked, so the library stays loaded.
    let library = unsafe { libloading::Library::new(path) }.map_err(|err| ExecError::NoGpu {
        reason: format!("{} does not load: {err}", path.display()),
    })?;
    std::mem::forget(library);
    Ok(())
}

/// Initializes the driver; the number of visible GPUs, refused when none or when the driver is
/// older than the build's CUDA API.
fn devices() -> Result<usize> {
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
    // A CUDA 13 build calls the CUDA 13 driver API, which an older driver lacks.
    let driver = driver_version();
    if cfg!(feature = "cuda-13") && driver.is_some_and(|(major, _)| major < 13) {
        let (major, minor) = driver.unwrap_or_default();
        return Err(ExecError::NoGpu {
            reason: format!(
                "this build binds CUDA 13 (feature cuda-13) and the driver supports CUDA {major}.{minor}: use a build with the default cuda-12 feature, or a driver of release 580 or newer"
            ),
        });
    }
    Ok(count as usize)
}

/// The CUDA version the driver supports, as (major, minor); `None` before it loads.
pub(crate) fn driver_version() -> Option<(i32, i32)> {
    let mut version = 0;
    // SAFETY: the driver writes one int.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    (status == cudarc::driver::sys::CUresult::CUDA_SUCCESS)
        .then_some((version / 1000, version % 1000 / 10))
}

/// The file for `wanted`: its variable's, else the first wheel path under a site directory.
fn locate(wanted: &Wanted, sites: &[PathBuf]) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(wanted.env) {
        let path = PathBuf::from(path);
        if !loads(&path) {
            return Err(ExecError::NoGpu {
                reason: format!(
                    "{}={} does not load as a shared library",
                    wanted.env,
                    path.display()
                ),
            });
        }
        return Ok(path);
    }
    sites
        .iter()
        .flat_map(|site| wanted.wheel_paths.iter().map(move |p| site.join(p)))
        .find(|path| loads(path))
        .ok_or_else(|| {
            missing(
                wanted.lib,
                &format!(
                    "{}, or set {}=/path/to/the/library",
                    wanted.hint, wanted.env
                ),
            )
        })
}

/// The site-packages directories of `$SYNCOPATE_PYTHON` (default `python3`); none when there
/// is no such Python or it does not answer within the tools' bound.
fn site_packages() -> Vec<PathBuf> {
    let python = std::env::var(PYTHON_ENV).unwrap_or_else(|_| "python3".into());
    let script =
        "import site\nfor d in site.getsitepackages() + [site.getusersitepackages()]: print(d)";
    match crate::tool::output(&python, &["-c", script]) {
        Ok((status, stdout, _)) if status.success() => stdout.lines().map(PathBuf::from).collect(),
        _ => Vec::new(),
    }
}

/// Re-executes this program with each located library linked under cudarc's first name and
/// its own directory on LD_LIBRARY_PATH; returns only on failure.
fn reexec(located: &[(&Wanted, PathBuf)]) -> Result<()> {
    if std::env::var_os(REEXEC_ENV).is_some() {
        let (wanted, path) = &located[0];
        return Err(ExecError::NoGpu {
            reason: format!(
                "{} is on LD_LIBRARY_PATH as lib{}.so, yet lib{} still does not load",
                path.display(),
                wanted.lib,
                wanted.lib
            ),
        });
    }
    let links = link_dir()?;
    let mut search = OsString::from(links.as_os_str());
    for (wanted, path) in located {
        let target = std::fs::canonicalize(path).map_err(|source| ExecError::Io {
            what: format!("cannot resolve {}", path.display()),
            source,
        })?;
        let link = links.join(format!("lib{}.so", wanted.lib));
        std::os::unix::fs::symlink(&target, &link).map_err(|source| ExecError::Io {
            what: format!("cannot link {}", link.display()),
            source,
        })?;
        if let Some(dir) = target.parent() {
            search.push(":");
            search.push(dir);
        }
    }
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        search.push(":");
        search.push(old);
    }
    let exe = std::env::current_exe().map_err(|source| ExecError::Io {
        what:
            "cannot find this program to re-execute it with the CUDA libraries on the library path"
                .into(),
        source,
    })?;
    use std::os::unix::process::CommandExt;
    let source = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", search)
        .env(REEXEC_ENV, "1")
        .exec();
    Err(ExecError::Io {
        what: "cannot re-execute with the CUDA libraries on the library path".into(),
        source,
    })
}

/// A fresh private directory for the links, made by this process alone (its name has the pid
/// and the time, and creating it fails if it exists).
fn link_dir() -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("syncopate-cuda-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|source| ExecError::Io {
        what: format!("cannot create {}", dir.display()),
        source,
    })?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library is found under a site directory at the wheel's path, the build's CUDA major
    /// version first; nothing there gives an error naming the variable to set.
    /// Removes the test's site directory however the test ends.
    struct Site(PathBuf);

    impl Drop for Site {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_library_is_located_in_a_wheel_layout() {
        if std::env::var_os(NCCL_ENV).is_some() {
            println!("skipped: {NCCL_ENV} is set, and takes precedence over the site directories");
            return;
        }
        let guard =
            Site(std::env::temp_dir().join(format!("syncopate-probe-{}", std::process::id())));
        let site = guard.0.clone();
        let err = locate(&NCCL, std::slice::from_ref(&site))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(NCCL_ENV) && err.contains("nvidia-nccl"),
            "{err}"
        );
        // A real shared library under the wheel's name: libc, which every Linux has.
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/libc.so.6",
            "/usr/lib/libc.so.6",
        ]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
        let Some(libc) = libc else {
            println!("skipped: no libc.so.6 at the usual paths");
            return;
        };
        let at = site.join(NCCL.wheel_paths[0]);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&at);
        std::os::unix::fs::symlink(libc, &at).unwrap();
        assert_eq!(locate(&NCCL, std::slice::from_ref(&site)).unwrap(), at);
    }
}
