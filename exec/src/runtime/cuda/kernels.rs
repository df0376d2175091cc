//! Compiles the CUDA sources under `exec/kernels/` with NVRTC at start-up and loads their functions into a context.

use crate::error::{ExecError, Result};
use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::collections::HashMap;
use std::sync::Arc;

/// Threads per block of the element-wise kernels.
pub const BLOCK: u32 = 256;
/// Grid-stride kernels need no more blocks than this to fill any current GPU.
const MAX_BLOCKS: u32 = 4096;

pub fn cuda_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> ExecError + '_ {
    move |e| ExecError::Cuda {
        message: format!("{what}: {e}"),
    }
}

/// A launch covering `n` elements (or bytes) with grid-stride loops.
pub fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS as usize) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Declares every kernel once: the [`Kernels`] fields, the sources they come from
/// ([`SOURCES`]) and the loading, so that a name cannot be in one and not the others.
macro_rules! kernels {
    ($($file:literal => [$($name:ident),+ $(,)?])+) => {
        /// Every kernel of one context.
        pub struct Kernels {
            $($(pub $name: CudaFunction,)+)+
        }

        /// Each kernel source under `exec/kernels/` and the entry points loaded from it.
        pub const SOURCES: &[(&str, &str, &[&str])] = &[$((
            $file,
            include_str!(concat!("../../../kernels/", $file)),
            &[$(stringify!($name)),+],
        )),+];

        impl Kernels {
            /// Compiles every source for this context's GPU and loads its entry points.
            pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
                let (major, minor) = ctx
                    .compute_capability()
                    .map_err(cuda_err("cannot read the compute capability"))?;
                let arch = format!("sm_{major}{minor}");
                let mut loaded = HashMap::new();
                for &(file, src, names) in SOURCES {
                    let module = ctx
                        .load_module(compile(file, src, &arch)?)
                        .map_err(cuda_err("cannot load the compiled kernels"))?;
                    for &name in names {
                        let function = module.load_function(name).map_err(|e| ExecError::Cuda {
                            message: format!("kernel `{name}` missing from exec/kernels/{file}: {e}"),
                        })?;
                        loaded.insert(name, function);
                    }
                }
                let mut take = |name: &str| {
                    loaded.remove(name).ok_or_else(|| ExecError::Cuda {
                        message: format!("kernel `{name}` was not loaded"),
                    })
                };
                Ok(Kernels {
                    $($($name: take(stringify!($name))?,)+)+
                })
            }
        }
    };
}

kernels! {
    "compress.cu" => [
        cast_encode, cast_decode_add, max_abs, fp8_encode, fp8_decode_add, sign_pack,
        sign_chunk_sums, sign_finish, sign_decode_add, check_finite, gather_scaled, scatter_add,
        compensate, residual_update, scale_copy, scale_in_place, select_init, radix_hist,
        radix_select, select_count, select_scan, select_emit, count_at_least, gather_abs,
        sparse_decode_add, tbq_pack, two_bit_decode_add, signum_pack, terngrad_encode,
        qsgd_encode, qsgd_decode_add, natural_encode, natural_decode_add, threshold_decode_add,
        dgc_compensate, dgc_mask,
    ]
    "gemm.cu" => [gemm]
    "powersgd.cu" => [
        powersgd_p, powersgd_orthogonalize, powersgd_q, powersgd_decode_add, powersgd_average,
    ]
}

/// Compiles one kernel source to PTX for `arch` (`sm_90`, …); needs NVRTC but no GPU.
pub fn compile(file: &str, src: &str, arch: &str) -> Result<Ptx> {
    let options = CompileOptions {
        // Byte-exact payloads: no FMA contraction, IEEE division, subnormals kept.
        fmad: Some(false),
        prec_div: Some(true),
        ftz: Some(false),
        // As a plain option: the `arch` field wants a `&'static str`.
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some(file.to_string()),
        ..Default::default()
    };
    compile_ptx_with_opts(src, options).map_err(|e| ExecError::Cuda {
        message: format!("NVRTC cannot compile exec/kernels/{file} for {arch}: {e}"),
    })
}

/// For GPU tests: the first GPU's context, its default stream and the compiled kernels, or
/// `None` after printing why the test skips.
#[cfg(test)]
pub fn gpu_or_skip() -> Option<(Arc<CudaContext>, Arc<cudarc::driver::CudaStream>, Kernels)> {
    if let Err(e) = super::probe::probe() {
        println!("skipped: no CUDA device ({e})");
        return None;
    }
    let ctx = CudaContext::new(0).expect("a CUDA context on device 0");
    let stream = ctx.default_stream();
    let kernels = Kernels::load(&ctx).expect("the kernels compile");
    Some((ctx, stream, kernels))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `sm_XY` numbers this NVRTC compiles for.
    fn supported_archs() -> Vec<i32> {
        use cudarc::nvrtc::sys;
        let mut count = 0;
        // SAFETY: NVRTC writes one int, then `count` ints into a buffer of that length.
        unsafe {
            assert_eq!(
                sys::nvrtcGetNumSupportedArchs(&mut count),
                sys::nvrtcResult::NVRTC_SUCCESS
            );
            let mut archs = vec![0; count.max(0) as usize];
            assert_eq!(
                sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()),
                sys::nvrtcResult::NVRTC_SUCCESS
            );
            archs
        }
    }

    /// Runs wherever NVRTC loads (CI installs the pip wheel), GPU or not: every source compiles
    /// for the architectures we target and defines every entry point `Kernels::load` asks for.
    #[test]
    fn every_kernel_source_compiles_with_nvrtc() {
        if !super::super::probe::nvrtc_loads() {
            println!("skipped: no NVRTC library (pip install nvidia-cuda-nvrtc-cu12, add its lib to LD_LIBRARY_PATH)");
            return;
        }
        // NVRTC 13 dropped Volta: every one of these this NVRTC supports, at least two.
        let supported = supported_archs();
        let archs: Vec<String> = [70, 80, 90]
            .into_iter()
            .filter(|a| supported.contains(a))
            .map(|a| format!("sm_{a}"))
            .collect();
        assert!(archs.len() >= 2, "NVRTC supports only {supported:?}");
        for arch in &archs {
            for &(file, src, names) in SOURCES {
                let ptx = compile(file, src, arch)
                    .unwrap_or_else(|e| panic!("{e}"))
                    .to_src();
                assert!(
                    ptx.contains(&format!(".target {arch}")),
                    "{file} was not compiled for {arch}"
                );
                for name in names {
                    assert!(
                        ptx.contains(&format!(".entry {name}(")),
                        "{file} for {arch} defines no entry point `{name}`"
                    );
                }
            }
        }
    }
}
