//! Compiles the CUDA sources under `exec/kernels/` with NVRTC at start-up and loads their functions into a context.

use crate::error::{ExecError, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, LaunchConfig};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::sync::Arc;

const COMPRESS_SRC: &str = include_str!("../../../kernels/compress.cu");
const GEMM_SRC: &str = include_str!("../../../kernels/gemm.cu");

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

/// Every kernel of one context.
pub struct Kernels {
    pub cast_encode: CudaFunction,
    pub cast_decode_add: CudaFunction,
    pub max_abs: CudaFunction,
    pub fp8_encode: CudaFunction,
    pub fp8_decode_add: CudaFunction,
    pub sign_pack: CudaFunction,
    pub sign_chunk_sums: CudaFunction,
    pub sign_finish: CudaFunction,
    pub sign_decode_add: CudaFunction,
    pub check_finite: CudaFunction,
    pub gather_scaled: CudaFunction,
    pub scatter_add: CudaFunction,
    pub compensate: CudaFunction,
    pub residual_update: CudaFunction,
    pub scale_copy: CudaFunction,
    pub scale_in_place: CudaFunction,
    pub select_init: CudaFunction,
    pub radix_hist: CudaFunction,
    pub radix_select: CudaFunction,
    pub select_count: CudaFunction,
    pub select_scan: CudaFunction,
    pub select_emit: CudaFunction,
    pub count_at_least: CudaFunction,
    pub gather_abs: CudaFunction,
    pub sparse_decode_add: CudaFunction,
    pub tbq_pack: CudaFunction,
    pub two_bit_decode_add: CudaFunction,
    pub signum_pack: CudaFunction,
    pub terngrad_encode: CudaFunction,
    pub qsgd_encode: CudaFunction,
    pub qsgd_decode_add: CudaFunction,
    pub natural_encode: CudaFunction,
    pub natural_decode_add: CudaFunction,
    pub threshold_decode_add: CudaFunction,
    pub gemm: CudaFunction,
}

fn compile(ctx: &Arc<CudaContext>, name: &str, src: &str) -> Result<Arc<CudaModule>> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(cuda_err("cannot read the compute capability"))?;
    // NVRTC wants a static string; the few architectures are leaked once per process and name.
    let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
    let options = CompileOptions {
        // Byte-exact payloads: no FMA contraction, IEEE division, subnormals kept.
        fmad: Some(false),
        prec_div: Some(true),
        ftz: Some(false),
        arch: Some(arch),
        name: Some(name.to_string()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(src, options).map_err(|e| ExecError::Cuda {
        message: format!("NVRTC cannot compile exec/kernels/{name} for {arch}: {e}"),
    })?;
    ctx.load_module(ptx)
        .map_err(cuda_err("cannot load the compiled kernels"))
}

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        let compress = compile(ctx, "compress.cu", COMPRESS_SRC)?;
        let gemm = compile(ctx, "gemm.cu", GEMM_SRC)?;
        let f = |module: &Arc<CudaModule>, name: &str| {
            module.load_function(name).map_err(|e| ExecError::Cuda {
                message: format!("kernel `{name}` missing from the compiled module: {e}"),
            })
        };
        Ok(Kernels {
            cast_encode: f(&compress, "cast_encode")?,
            cast_decode_add: f(&compress, "cast_decode_add")?,
            max_abs: f(&compress, "max_abs")?,
            fp8_encode: f(&compress, "fp8_encode")?,
            fp8_decode_add: f(&compress, "fp8_decode_add")?,
            sign_pack: f(&compress, "sign_pack")?,
            sign_chunk_sums: f(&compress, "sign_chunk_sums")?,
            sign_finish: f(&compress, "sign_finish")?,
            sign_decode_add: f(&compress, "sign_decode_add")?,
            check_finite: f(&compress, "check_finite")?,
            gather_scaled: f(&compress, "gather_scaled")?,
            scatter_add: f(&compress, "scatter_add")?,
            compensate: f(&compress, "compensate")?,
            residual_update: f(&compress, "residual_update")?,
            scale_copy: f(&compress, "scale_copy")?,
            scale_in_place: f(&compress, "scale_in_place")?,
            select_init: f(&compress, "select_init")?,
            radix_hist: f(&compress, "radix_hist")?,
            radix_select: f(&compress, "radix_select")?,
            select_count: f(&compress, "select_count")?,
            select_scan: f(&compress, "select_scan")?,
            select_emit: f(&compress, "select_emit")?,
            count_at_least: f(&compress, "count_at_least")?,
            gather_abs: f(&compress, "gather_abs")?,
            sparse_decode_add: f(&compress, "sparse_decode_add")?,
            tbq_pack: f(&compress, "tbq_pack")?,
            two_bit_decode_add: f(&compress, "two_bit_decode_add")?,
            signum_pack: f(&compress, "signum_pack")?,
            terngrad_encode: f(&compress, "terngrad_encode")?,
            qsgd_encode: f(&compress, "qsgd_encode")?,
            qsgd_decode_add: f(&compress, "qsgd_decode_add")?,
            natural_encode: f(&compress, "natural_encode")?,
            natural_decode_add: f(&compress, "natural_decode_add")?,
            threshold_decode_add: f(&compress, "threshold_decode_add")?,
            gemm: f(&gemm, "gemm")?,
        })
    }
}
