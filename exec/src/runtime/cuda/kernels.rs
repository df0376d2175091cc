//! The CUDA kernels under `exec/kernels/`: one list of their C signatures.
//!
//! From it come the typed launch functions, the NVRTC compilation and the loading.
//!
//! `kernels!` at the end of this file declares every kernel once, with its parameters in the C
//! order and under the C names, written as Rust: `x: &[f32; n]` is a `const float *x` of which
//! the kernel reads at most n elements, `out: &mut [u8; 4 + n]` a `u8 *out` of which it writes
//! (and may read) at most 4 + n, `n: u32` a value. An optional `if` states a condition on the
//! values, and `=>` the launch configuration the kernel is written for. Each entry becomes a
//! method of [`Kernels`] that takes a device buffer (a `CudaSlice` or a view of one) for each
//! pointer, refuses with an error naming the kernel when a buffer is shorter than its length or
//! the condition fails, and launches: the crate's one kernel launch, in `launch!`, with its
//! SAFETY argument. A test compares the list with the `extern "C"` signatures in the sources,
//! so that the two cannot drift apart.

use crate::error::{ExecError, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::Arc;

/// Threads per block of the element-wise kernels; a multiple of the warp (`powersgd_p` works
/// in warps).
pub(crate) const BLOCK: u32 = 256;
/// Grid-stride kernels need no more blocks than this to fill any current GPU.
const MAX_BLOCKS: u32 = 4096;

// Mirrors of the sources' `#define`s that sizes and configurations depend on; the tests check
// them against the sources.
/// Elements per scan chunk (`CHUNK`: the device sums in the CPU's chunks) and threads per chunk
/// of `sign_chunk_sums` (`LANES`, the length of its shared arrays).
pub(crate) use crate::compress::scan::CHUNK;
const LANES: u32 = 16;
/// Threads of the selection kernels (`SEL_THREADS`, their shared arrays' length), elements per
/// thread (`SEL_PER`) and so per tile, and radix buckets (`RADIX_BUCKETS`).
const SEL_THREADS: u32 = 256;
const SEL_PER: usize = 16;
pub(crate) const SEL_TILE: usize = SEL_THREADS as usize * SEL_PER;
pub(crate) const RADIX_BUCKETS: usize = 4096;
/// Lanes of `powersgd_p` per output element (`P_LANES`).
const P_LANES: usize = 8;
/// Side of `gemm`'s square thread blocks and shared tiles (`TILE`).
const GEMM_TILE: u32 = 16;

// The lengths and configurations in the list multiply at most two u32 values and a small
// constant, which a 64-bit usize holds: they cannot overflow.
const _: () = assert!(
    usize::BITS >= 64,
    "the kernel lengths assume a 64-bit usize"
);

pub(crate) fn cuda_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> ExecError + '_ {
    move |e| ExecError::Cuda {
        message: format!("{what}: {e}"),
    }
}

/// A launch covering `n` elements (or bytes) with grid-stride loops.
pub(crate) fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS as usize) as u32;
    blocks_of(blocks, BLOCK)
}

/// `count` blocks (at least one) of `threads`, for kernels that index by block; the list's
/// counts come from u32 element counts divided by at least 16, so they fit.
fn blocks(count: usize, threads: u32) -> LaunchConfig {
    blocks_of(count.max(1) as u32, threads)
}

fn blocks_of(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `gemm`'s launch: one TILE × TILE block per tile of the n × n result.
fn gemm_tiles(n: usize) -> LaunchConfig {
    let tiles = n.div_ceil(GEMM_TILE as usize).max(1) as u32;
    LaunchConfig {
        grid_dim: (tiles, tiles, 1),
        block_dim: (GEMM_TILE, GEMM_TILE, 1),
        shared_mem_bytes: 0,
    }
}

/// A device buffer a kernel reads: a `CudaSlice` or a view of one.
pub trait Input<T> {
    fn view(&self) -> CudaView<'_, T>;
}

impl<T> Input<T> for CudaSlice<T> {
    fn view(&self) -> CudaView<'_, T> {
        self.as_view()
    }
}

impl<T> Input<T> for CudaView<'_, T> {
    fn view(&self) -> CudaView<'_, T> {
        self.slice(..)
    }
}

impl<T> Input<T> for CudaViewMut<'_, T> {
    fn view(&self) -> CudaView<'_, T> {
        self.as_view()
    }
}

/// A device buffer a kernel writes: a `CudaSlice` or a mutable view of one.
pub trait Output<T> {
    fn view_mut(&mut self) -> CudaViewMut<'_, T>;
}

impl<T> Output<T> for CudaSlice<T> {
    fn view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.as_view_mut()
    }
}

impl<T> Output<T> for CudaViewMut<'_, T> {
    fn view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice_mut(..)
    }
}

/// The f32s of a wire-format byte buffer (PowerSGD's payloads are f32 arrays), the last
/// `len % 4` bytes left out. The view must start 4-aligned (an offset that is a multiple of 4
/// into an allocation); a kernel's misaligned access would be a reported launch error.
pub(crate) fn f32s<'a>(bytes: &CudaView<'a, u8>) -> Result<CudaView<'a, f32>> {
    // SAFETY: every bit pattern is a valid f32, and the new view covers no more bytes than
    // the old one (cudarc checks that and returns None otherwise).
    unsafe { bytes.transmute(bytes.len() / 4) }.ok_or_else(|| not_f32s(bytes.len()))
}

/// [`f32s`] of a buffer to write.
pub(crate) fn f32s_mut<'a>(bytes: &'a mut CudaViewMut<'_, u8>) -> Result<CudaViewMut<'a, f32>> {
    let len = bytes.len();
    // SAFETY: as in `f32s`; the new view borrows the old one exclusively.
    unsafe { bytes.transmute_mut(len / 4) }.ok_or_else(|| not_f32s(len))
}

fn not_f32s(len: usize) -> ExecError {
    ExecError::Cuda {
        message: format!("cannot view {len} bytes as f32s"),
    }
}

/// A buffer shorter than the launch touches: an error instead of an out-of-bounds access.
fn need(kernel: &'static str, buffer: &str, len: usize, need: usize, rule: &str) -> Result<()> {
    if len >= need {
        return Ok(());
    }
    Err(ExecError::Kernel {
        kernel,
        message: format!("`{buffer}` holds {len} elements, the launch needs {need} ({rule})"),
    })
}

/// Turns a kernel's parameter list, one parameter at a time, into the parts of its launch
/// function and hands them to `$then!`: the Rust parameters, the values, the buffers and their
/// lengths, the conversions of buffers to views, the launch arguments, the C signature.
macro_rules! parameters {
    // A buffer the kernel only reads (`const T *`).
    ($then:ident $head:tt
     [$($param:tt)*] [$($value:tt)*] [$($len:tt)*] [$($view:tt)*] [$($arg:tt)*] [$($c:tt)*]
     $name:ident: &[$t:ty; $need:expr] $(, $($rest:tt)*)?) => {
        parameters! { $then $head
            [$($param)* $name: &impl Input<$t>,]
            [$($value)*]
            [$($len)* ($name, $need)]
            [$($view)* let $name = $name.view();]
            [$($arg)* &$name,]
            [$($c)* (stringify!($name), Param::Read(stringify!($t))),]
            $($($rest)*)?
        }
    };
    // A buffer the kernel writes and may read (`T *`).
    ($then:ident $head:tt
     [$($param:tt)*] [$($value:tt)*] [$($len:tt)*] [$($view:tt)*] [$($arg:tt)*] [$($c:tt)*]
     $name:ident: &mut [$t:ty; $need:expr] $(, $($rest:tt)*)?) => {
        parameters! { $then $head
            [$($param)* $name: &mut impl Output<$t>,]
            [$($value)*]
            [$($len)* ($name, $need)]
            [$($view)* let mut $name = $name.view_mut();]
            [$($arg)* &mut $name,]
            [$($c)* (stringify!($name), Param::Write(stringify!($t))),]
            $($($rest)*)?
        }
    };
    // A value (`T`).
    ($then:ident $head:tt
     [$($param:tt)*] [$($value:tt)*] [$($len:tt)*] [$($view:tt)*] [$($arg:tt)*] [$($c:tt)*]
     $name:ident: $t:ty $(, $($rest:tt)*)?) => {
        parameters! { $then $head
            [$($param)* $name: $t,]
            [$($value)* $name]
            [$($len)*]
            [$($view)*]
            [$($arg)* &$name,]
            [$($c)* (stringify!($name), Param::Value(stringify!($t))),]
            $($($rest)*)?
        }
    };
    ($then:ident $head:tt $param:tt $value:tt $len:tt $view:tt $arg:tt $c:tt) => {
        $then! { $head $param $value $len $view $arg $c }
    };
}

/// One kernel's launch function, from the parts `parameters!` made.
macro_rules! launch {
    ([$(#[$doc:meta])* $kernel:ident [$($condition:expr)?] $config:expr]
     [$($name:ident: $type:ty,)*] [$($value:ident)*] [$(($buffer:ident, $need:expr))*]
     [$($view:tt)*] [$($arg:expr,)*] $c:tt) => {
        impl Kernels {
            $(#[$doc])*
            #[allow(clippy::too_many_arguments)]
            pub fn $kernel(&self, stream: &CudaStream, $($name: $type),*) -> Result<()> {
                $($view)*
                let config = {
                    // Lengths and configurations count in usize (see the assertion on top).
                    $(#[allow(unused_variables)] let $value = $value as usize;)*
                    $(need(
                        stringify!($kernel),
                        stringify!($buffer),
                        $buffer.len(),
                        $need,
                        stringify!($need),
                    )?;)*
                    $(if !($condition) {
                        return Err(ExecError::Kernel {
                            kernel: stringify!($kernel),
                            message: concat!("refused: needs ", stringify!($condition)).into(),
                        });
                    })?
                    $config
                };
                // SAFETY: this is every kernel launch of the crate. A launch is sound when
                // (1) the arguments match the kernel's C parameters in number, order and type:
                // the list states them once, the arguments are pushed in that order, a value as
                // its Rust type (u32, i32, f32, u64 are the C unsigned int, int, float,
                // unsigned long long) and a buffer as its device pointer to the element type,
                // const exactly when it is borrowed shared (the kernel never writes it), and
                // the test `the_list_matches_the_c_signatures` checks all of it against the
                // sources; (2) every buffer covers what the kernel touches: each kernel touches
                // at most the elements its entry states for these values (where an index comes
                // from data, the kernel bounds-checks it), and the lengths were checked above
                // on views that borrow their allocations for the whole call, a written one
                // exclusively, so it aliases no other argument; (3) the configuration is the
                // one the kernel is written for (exact block shapes where it sizes shared arrays
                // or shuffles by them, block counts where it indexes by block), taken from the
                // list, never from the caller; (4) work on other streams touching these buffers
                // is ordered by cudarc's per-buffer events, which `arg` records, or where a
                // context turned them off (`run.rs`) by that caller, as its SAFETY argument for
                // doing so says. A misaligned access (a byte view cut at an offset that is not a
                // multiple of 4, read as f32) traps on the device and surfaces as a CUDA error.
                unsafe { stream.launch_builder(&self.$kernel)$(.arg($arg))*.launch(config) }
                    .map(drop)
                    .map_err(|e| ExecError::Kernel {
                        kernel: stringify!($kernel),
                        message: format!("launch failed: {e}"),
                    })
            }
        }
    };
}

/// How the list declares one C parameter, for the test against the sources.
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
enum Param {
    /// `const T *`
    Read(&'static str),
    /// `T *`
    Write(&'static str),
    /// `T`
    Value(&'static str),
}

/// One kernel's C parameters, from the parts `parameters!` made.
#[cfg(test)]
macro_rules! signature {
    ($head:tt $param:tt $value:tt $len:tt $view:tt $arg:tt [$($c:expr,)*]) => {
        &[$($c),*]
    };
}

/// Declares every kernel once: the [`Kernels`] fields and typed launch methods, the sources
/// they come from ([`SOURCES`]), the loading, and the signatures the tests check.
macro_rules! kernels {
    ($($file:literal => {
        $(
            $(#[$doc:meta])*
            fn $kernel:ident($($params:tt)*) $(if $condition:expr)? => $config:expr;
        )+
    })+) => {
        /// Every kernel of one context, launched through the typed methods `kernels!` makes.
        pub struct Kernels {
            $($($kernel: CudaFunction,)+)+
        }

        /// Each kernel source under `exec/kernels/` and the entry points loaded from it.
        pub(crate) const SOURCES: &[(&str, &str, &[&str])] = &[$((
            $file,
            include_str!(concat!("../../../kernels/", $file)),
            &[$(stringify!($kernel)),+],
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
                        .load_module(Ptx::from_binary(compile(file, src, &arch)?))
                        .map_err(|e| ExecError::Cuda {
                            message: format!(
                                "cannot load exec/kernels/{file} compiled by NVRTC {} for {arch} (the driver supports CUDA {}): {e}",
                                nvrtc_version(),
                                super::probe::driver_version()
                                    .map_or("of an unknown version".into(), |(a, b)| format!("{a}.{b}"))
                            ),
                        })?;
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
                    $($($kernel: take(stringify!($kernel))?,)+)+
                })
            }
        }

        $($(parameters! {
            launch [$(#[$doc])* $kernel [$($condition)?] $config] [] [] [] [] [] []
            $($params)*
        })+)+

        /// Each kernel's source, name and C parameters as the list states them.
        #[cfg(test)]
        const SIGNATURES: &[(&str, &str, &[(&str, Param)])] = &[$($((
            $file,
            stringify!($kernel),
            parameters! { signature [] [] [] [] [] [] [] $($params)* },
        ),)+)+];
    };
}

kernels! {
    "compress.cu" => {
        /// Casts n f32 to f32 (`kind` 0), fp16 (1) or bf16 (2), flagging non-finite input.
        fn cast_encode(
            x: &[f32; n],
            out: &mut [u8; n * if kind == 0 { 4 } else { 2 }],
            n: u32,
            kind: i32,
            bad: &mut [u32; 1],
        ) => grid(n);
        fn cast_decode_add(
            p: &[u8; n * if kind == 0 { 4 } else { 2 }],
            acc: &mut [f32; n],
            n: u32,
            kind: i32,
        ) => grid(n);
        /// The largest finite |x| as f32 bits into `max_bits`, which starts at 0.
        fn max_abs(x: &[f32; n], n: u32, max_bits: &mut [u32; 1], bad: &mut [u32; 1]) => grid(n);
        fn fp8_encode(
            x: &[f32; n],
            out: &mut [u8; 4 + n],
            n: u32,
            max_bits: &[u32; 1],
            e5m2: i32,
        ) => grid(n);
        fn fp8_decode_add(p: &[u8; 4 + n], acc: &mut [f32; n], n: u32, e5m2: i32) => grid(n);
        fn sign_pack(x: &[f32; n], bits: &mut [u8; n.div_ceil(8)], n: u32, bad: &mut [u32; 1])
            => grid(n.div_ceil(8));
        /// Per-chunk sums in the CPU's order: one block of `LANES` threads per chunk.
        fn sign_chunk_sums(
            x: &[f32; n],
            n: u32,
            kind: i32,
            a_out: &mut [f32; n.div_ceil(CHUNK).max(1)],
            b_out: &mut [f32; n.div_ceil(CHUNK).max(1)],
            neg_out: &mut [u32; n.div_ceil(CHUNK).max(1)],
        ) => blocks(n.div_ceil(CHUNK), LANES);
        /// The chunk sums into the header at `out`: one f32 for `kind` 0 and 2, else two.
        fn sign_finish(
            a: &[f32; chunks],
            b: &[f32; chunks],
            negs: &[u32; chunks],
            chunks: u32,
            n: u32,
            kind: i32,
            out: &mut [u8; if kind == 0 || kind == 2 { 4 } else { 8 }],
        ) => blocks(1, 1);
        fn sign_decode_add(
            p: &[u8; (match header_kind { 1 => 4, 2 => 8, _ => 0 }) + n.div_ceil(8)],
            acc: &mut [f32; n],
            n: u32,
            header_kind: i32,
        ) => grid(n);
        fn check_finite(x: &[f32; n], n: u32, bad: &mut [u32; 1]) => grid(n);
        fn gather_scaled(
            x: &[f32; n],
            n: u32,
            idx: &[u32; k],
            k: u32,
            scale: f32,
            out: &mut [u8; 4 * k],
        ) => grid(k);
        fn scatter_add(p: &[u8; 4 * k], idx: &[u32; k], k: u32, acc: &mut [f32; n], n: u32)
            => grid(k);
        /// Error feedback's input: g (`kind` 0), g + e (1), e + lr·g (2); e is read for 1 and 2.
        fn compensate(
            g: &[f32; n],
            e: &[f32; if kind == 1 || kind == 2 { n } else { 0 }],
            out: &mut [f32; n],
            n: u32,
            kind: i32,
            lr: f32,
        ) => grid(n);
        fn residual_update(
            e: &mut [f32; n],
            compensated: &[f32; n],
            transmitted: &[f32; n],
            n: u32,
        ) => grid(n);
        /// A CaSync-Ring hop: `added_to` = −`sum`, then `sum` += `own`.
        fn ring_hop(sum: &mut [f32; n], own: &[f32; n], added_to: &mut [f32; n], n: u32)
            => grid(n);
        fn scale_copy(src: &[f32; n], dst: &mut [f32; n], n: u32, scale: f32) => grid(n);
        fn scale_in_place(x: &mut [f32; n], n: u32, scale: f32) => grid(n);
        fn select_init(st: &mut [u32; 4], t: u32, above: u32, k: u32, ties: u32) => blocks(1, 1);
        fn radix_hist(
            x: &[f32; n],
            n: u32,
            st: &[u32; 4],
            pass: i32,
            hist: &mut [u32; RADIX_BUCKETS],
        ) => grid(n);
        fn radix_select(st: &mut [u32; 4], pass: i32, hist: &mut [u32; RADIX_BUCKETS])
            => blocks(1, SEL_THREADS);
        /// Per tile of `SEL_TILE` elements (one block each), the counts above and at t.
        fn select_count(
            x: &[f32; n],
            n: u32,
            st: &[u32; 4],
            tile_gt: &mut [u32; n.div_ceil(SEL_TILE).max(1)],
            tile_eq: &mut [u32; n.div_ceil(SEL_TILE).max(1)],
        ) => blocks(n.div_ceil(SEL_TILE), SEL_THREADS);
        fn select_scan(tile_gt: &mut [u32; tiles], tile_eq: &mut [u32; tiles], tiles: u32)
            => blocks(1, SEL_THREADS);
        /// At most `cap` indices at byte `idx_at` of `out` and values at byte `val_at`.
        fn select_emit(
            x: &[f32; n],
            n: u32,
            st: &[u32; 4],
            tile_gt: &[u32; n.div_ceil(SEL_TILE).max(1)],
            tile_eq: &[u32; n.div_ceil(SEL_TILE).max(1)],
            out: &mut [u8; idx_at.max(val_at) + 4 * cap],
            idx_at: u64,
            val_at: u64,
            cap: u32,
        ) if idx_at.is_multiple_of(4) && val_at.is_multiple_of(4)
            => blocks(n.div_ceil(SEL_TILE), SEL_THREADS);
        /// Adds the count of |x| ≥ t (f32 bits) into `count`.
        fn count_at_least(
            x: &[f32; n],
            n: u32,
            t: u32,
            count: &mut [u32; 1],
            bad: &mut [u32; 1],
        ) => grid(n);
        fn gather_abs(x: &[f32; n], n: u32, pos: &[u32; m], m: u32, out: &mut [u32; m])
            => grid(m);
        /// `header` 0: top-k (k indices, k values); otherwise a u32 count, then k slots of each.
        fn sparse_decode_add(
            p: &[u8; (if header != 0 { 4 } else { 0 }) + 8 * k],
            acc: &mut [f32; n],
            n: u32,
            k: u32,
            header: i32,
        ) => grid(k);
        fn tbq_pack(
            x: &[f32; n],
            out: &mut [u8; n.div_ceil(4)],
            n: u32,
            tau: f32,
            bad: &mut [u32; 1],
        ) => grid(n.div_ceil(4));
        /// `header` 0: codes only, ±`tau` (tbq); otherwise an f32 scale first (terngrad).
        fn two_bit_decode_add(
            p: &[u8; (if header != 0 { 4 } else { 0 }) + n.div_ceil(4)],
            acc: &mut [f32; n],
            n: u32,
            header: i32,
            tau: f32,
        ) => grid(n);
        fn signum_pack(
            g: &[f32; n],
            m: &mut [f32; n],
            bits: &mut [u8; n.div_ceil(8)],
            n: u32,
            beta: f32,
            bad: &mut [u32; 1],
        ) => grid(n.div_ceil(8));
        fn terngrad_encode(
            x: &[f32; n],
            key: u64,
            first: u64,
            out: &mut [u8; 4 + n.div_ceil(4)],
            n: u32,
            max_bits: &[u32; 1],
        ) => grid(n.div_ceil(4));
        /// Codes of `bits` bits after the norm already at `out[0..4]`; a code fits 16 bits
        /// (the kernel's per-thread buffer), as every QSGD up to `QSGD_MAX_LEVELS` does.
        fn qsgd_encode(
            x: &[f32; n],
            key: u64,
            first: u64,
            out: &mut [u8; 4 + (n * bits).div_ceil(8)],
            n: u32,
            levels: u32,
            bits: u32,
            bad: &mut [u32; 1],
        ) if bits <= 16 => grid(n.div_ceil(8));
        fn qsgd_decode_add(
            p: &[u8; 4 + (n * bits).div_ceil(8)],
            acc: &mut [f32; n],
            n: u32,
            levels: u32,
            bits: u32,
        ) if bits <= 16 => grid(n);
        fn natural_encode(
            x: &[f32; n],
            key: u64,
            first: u64,
            out: &mut [u8; 4 + n],
            n: u32,
            max_bits: &[u32; 1],
        ) => grid(n);
        fn natural_decode_add(p: &[u8; 4 + n], acc: &mut [f32; n], n: u32) => grid(n);
        /// A count-prefixed payload in the first `len` bytes of `p`; one that does not fit adds
        /// nothing.
        fn threshold_decode_add(p: &[u8; len], len: u64, acc: &mut [f32; n], n: u32) => grid(n);
        fn dgc_compensate(
            g: &[f32; n],
            u: &mut [f32; n],
            v: &mut [f32; n],
            out: &mut [f32; n],
            n: u32,
            m: f32,
        ) => grid(n);
        fn dgc_mask(u: &mut [f32; n], v: &mut [f32; n], transmitted: &[f32; n], n: u32)
            => grid(n);
    }
    "gemm.cu" => {
        /// C = A·B for n × n row-major matrices.
        fn gemm(a: &[f32; n * n], b: &[f32; n * n], c: &mut [f32; n * n], n: u32)
            => gemm_tiles(n);
    }
    "powersgd.cu" => {
        /// P = M·Q for an m of rows × cols and r columns of Q and P.
        fn powersgd_p(
            m: &[f32; rows * cols],
            q: &[f32; cols * r],
            p: &mut [f32; rows * r],
            rows: u32,
            cols: u32,
            r: u32,
        ) => grid(rows * r * P_LANES);
        /// Gram–Schmidt on P's columns in place, by one warp.
        fn powersgd_orthogonalize(p: &mut [f32; rows * r], rows: u32, r: u32) => blocks(1, 32);
        fn powersgd_q(
            m: &[f32; rows * cols],
            p: &[f32; rows * r],
            q: &mut [f32; cols * r],
            rows: u32,
            cols: u32,
            r: u32,
        ) => grid(cols * r);
        fn powersgd_decode_add(
            p: &[f32; rows * r],
            q: &[f32; cols * r],
            acc: &mut [f32; rows * cols],
            rows: u32,
            cols: u32,
            r: u32,
        ) => grid(rows * cols);
        fn powersgd_average(result: &[f32; n], transmitted: &mut [f32; n], n: u32, world: f32)
            => grid(n);
    }
}

/// Compiles one kernel source to machine code (CUBIN) for `arch` (`sm_90`, …); needs NVRTC
/// but no GPU. Machine code, not PTX: a driver JIT-compiles PTX only up to its own CUDA
/// version, so PTX from an NVRTC newer than the driver would not load.
pub(crate) fn compile(file: &str, src: &str, arch: &str) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    let fail = |what: String| ExecError::Cuda {
        message: format!(
            "NVRTC {} cannot compile exec/kernels/{file} for {arch}: {what}",
            nvrtc_version()
        ),
    };
    let src = std::ffi::CString::new(src).map_err(|e| fail(e.to_string()))?;
    let name = std::ffi::CString::new(file).map_err(|e| fail(e.to_string()))?;
    let options = [
        // Byte-exact payloads: no FMA contraction, IEEE division, subnormals kept.
        "--fmad=false".to_string(),
        "--prec-div=true".to_string(),
        "--ftz=false".to_string(),
        format!("--gpu-architecture={arch}"),
    ];
    let program = result::create_program(&src, Some(&name)).map_err(|e| fail(e.to_string()))?;
    // SAFETY: `program` was just created and is destroyed once, below; `src` and `name` outlive
    // it; the CUBIN buffer has the size NVRTC reported for it.
    let cubin = unsafe {
        let cubin = match result::compile_program(program, &options) {
            Ok(()) => {
                let mut size = 0usize;
                let mut cubin = Vec::new();
                sys::nvrtcGetCUBINSize(program, &mut size)
                    .result()
                    .and_then(|()| {
                        cubin.resize(size, 0u8);
                        sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast()).result()
                    })
                    .map(|()| cubin)
                    .map_err(|e| fail(format!("no machine code: {e}")))
            }
            Err(e) => {
                let log = result::get_program_log(program).unwrap_or_default();
                let log: Vec<u8> = log.iter().map(|&c| c as u8).collect();
                let log = String::from_utf8_lossy(&log);
                Err(fail(format!("{e}: {}", log.trim_end_matches('\0').trim())))
            }
        };
        let _ = result::destroy_program(program);
        cubin
    }?;
    if cubin.len() < 4 || cubin[..4] != *b"\x7fELF" {
        return Err(fail(
            "the machine code it returned is not an ELF image".into(),
        ));
    }
    Ok(cubin)
}

/// NVRTC's version as `major.minor`, for messages.
fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC writes two ints.
    match unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }.result() {
        Ok(()) => format!("{major}.{minor}"),
        Err(_) => "(version unknown)".into(),
    }
}

/// For GPU tests: the first GPU's context, its default stream and the compiled kernels, or
/// `None` after printing why the test skips.
#[cfg(test)]
pub(crate) fn gpu_or_skip() -> Option<(Arc<CudaContext>, Arc<CudaStream>, Kernels)> {
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

    /// Needs NVRTC, GPU or not: every source compiles for the architectures we target and
    /// defines every entry point `Kernels::load` asks for. Ignored where NVRTC may be missing,
    /// so that a summary never counts it as passed without running; CI installs the wheel and
    /// runs it with `--ignored`, where a missing NVRTC fails it.
    #[test]
    #[ignore = "needs NVRTC (pip wheel nvidia-cuda-nvrtc-cu12 on LD_LIBRARY_PATH): run with --ignored"]
    fn every_kernel_source_compiles_with_nvrtc() {
        assert!(
            super::super::probe::nvrtc_loads(),
            "NVRTC does not load: pip install nvidia-cuda-nvrtc-cu12 and add its lib to LD_LIBRARY_PATH"
        );
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
                let cubin = compile(file, src, arch).unwrap_or_else(|e| panic!("{e}"));
                // The entry points' names are in the image's string table, each between NULs
                // (so that `compensate` is not found inside `dgc_compensate`).
                for name in names {
                    let entry = [&[0u8][..], name.as_bytes(), &[0u8]].concat();
                    assert!(
                        cubin.windows(entry.len()).any(|w| w == entry),
                        "{file} for {arch} defines no entry point `{name}`"
                    );
                }
            }
        }
    }

    /// One C parameter as the list's test compares it: name, base type (typedefs resolved),
    /// pointer and const.
    #[derive(Debug, PartialEq)]
    struct CParam {
        name: String,
        base: String,
        pointer: bool,
        constant: bool,
    }

    /// `typedef unsigned int u32;` lines as (alias, type).
    fn typedefs(src: &str) -> HashMap<&str, String> {
        src.lines()
            .filter_map(|line| line.trim().strip_prefix("typedef ")?.strip_suffix(';'))
            .filter_map(|decl| {
                let (base, alias) = decl.trim().rsplit_once(' ')?;
                Some((alias, base.trim().to_string()))
            })
            .collect()
    }

    /// What opens each kernel's definition in the sources.
    const KERNEL_START: &str = "extern \"C\" __global__ void ";

    /// Every `extern "C" __global__ void name(params)` of a source, in order.
    fn c_kernels(src: &str) -> Vec<(String, Vec<CParam>)> {
        let aliases = typedefs(src);
        src.split(KERNEL_START)
            .skip(1)
            .map(|rest| {
                let (name, rest) = rest.split_once('(').expect("a parameter list");
                let (params, _) = rest.split_once(')').expect("a closed parameter list");
                let params = params
                    .split(',')
                    .map(|param| {
                        let pointer = param.contains('*');
                        let spaced = param.replace('*', " ");
                        let mut words: Vec<&str> = spaced.split_whitespace().collect();
                        let constant = words.first() == Some(&"const");
                        if constant {
                            words.remove(0);
                        }
                        let name = words.pop().expect("a parameter name").to_string();
                        let base = words.join(" ");
                        let base = aliases.get(base.as_str()).cloned().unwrap_or(base);
                        CParam {
                            name,
                            base,
                            pointer,
                            constant,
                        }
                    })
                    .collect();
                (name.trim().to_string(), params)
            })
            .collect()
    }

    /// The C type of a Rust element or value type in the list.
    fn c_type(rust: &str) -> &'static str {
        match rust {
            "f32" => "float",
            "u8" => "unsigned char",
            "u32" => "unsigned int",
            "i32" => "int",
            "u64" => "unsigned long long",
            other => panic!("the list uses `{other}`, which has no C type here"),
        }
    }

    /// Runs without NVRTC or a GPU: the list declares exactly the kernels of each source, each
    /// with the source's parameters (names, order, types, pointers, const), so that the typed
    /// launches' argument lists are the kernels'.
    #[test]
    fn the_list_matches_the_c_signatures() {
        for &(file, src, _) in SOURCES {
            let defined = c_kernels(src);
            let listed: Vec<_> = SIGNATURES.iter().filter(|s| s.0 == file).collect();
            let mut defined_names: Vec<&str> = defined.iter().map(|k| k.0.as_str()).collect();
            let mut listed_names: Vec<&str> = listed.iter().map(|s| s.1).collect();
            defined_names.sort_unstable();
            listed_names.sort_unstable();
            assert_eq!(listed_names, defined_names, "kernels of {file}");
            for &&(_, kernel, params) in &listed {
                let (_, c) = defined.iter().find(|k| k.0 == kernel).expect("listed");
                let from_list: Vec<CParam> = params
                    .iter()
                    .map(|&(name, param)| {
                        let (rust, pointer, constant) = match param {
                            Param::Read(t) => (t, true, true),
                            Param::Write(t) => (t, true, false),
                            Param::Value(t) => (t, false, false),
                        };
                        CParam {
                            name: name.to_string(),
                            base: c_type(rust).to_string(),
                            pointer,
                            constant,
                        }
                    })
                    .collect();
                assert_eq!(&from_list, c, "{file}: `{kernel}`");
            }
        }
    }

    /// Runs without NVRTC or a GPU: no kernel declares a local of one of its parameters' names,
    /// which would hide the parameter from the rest of its block (qsgd_encode's group start once
    /// hid the generator's counter `first`, so that the GPU drew other uniforms than the CPU).
    #[test]
    fn no_kernel_hides_a_parameter() {
        for &(file, src, _) in SOURCES {
            let src = without_comments(src);
            let aliases = typedefs(&src);
            let types: Vec<&str> = [
                "int", "float", "double", "bool", "size_t", "long", "char", "short", "unsigned",
            ]
            .into_iter()
            .chain(aliases.keys().copied())
            .collect();
            for ((kernel, params), body) in c_kernels(&src).iter().zip(c_kernel_bodies(&src)) {
                for name in body
                    .split([';', '{', '}'])
                    .flat_map(|s| declared(s, &types))
                {
                    assert!(
                        !params.iter().any(|p| p.name == name),
                        "{file}: `{kernel}` declares a local `{name}` that hides its parameter"
                    );
                }
            }
        }
    }

    /// The names a C statement declares: after a leading type (its qualifiers and `for (` too),
    /// the first name and every one after a comma outside brackets. A cast's type ends in `)`,
    /// so it never leads a statement.
    fn declared<'s>(statement: &'s str, types: &[&str]) -> Vec<&'s str> {
        let mut rest = statement.trim();
        if let Some(init) = rest.strip_prefix("for") {
            rest = init
                .trim_start()
                .strip_prefix('(')
                .unwrap_or(rest)
                .trim_start();
        }
        let qualifiers = ["const", "volatile", "__shared__", "static", "register"];
        let mut typed = false;
        loop {
            let word_end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let word = &rest[..word_end];
            if word.is_empty() || !(qualifiers.contains(&word) || types.contains(&word)) {
                break;
            }
            typed |= types.contains(&word);
            rest = rest[word_end..].trim_start();
        }
        if !typed {
            return Vec::new();
        }
        let mut names = Vec::new();
        let (mut depth, mut start) = (0usize, 0usize);
        for (at, c) in rest.char_indices().chain([(rest.len(), ',')]) {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    let declarator = rest[start..at].trim_start_matches(['*', ' ', '&']);
                    let declarator = declarator.strip_prefix("const ").unwrap_or(declarator);
                    let end = declarator
                        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .unwrap_or(declarator.len());
                    names.push(&declarator[..end]);
                    start = at + 1;
                }
                _ => {}
            }
        }
        names
    }

    /// The source without its `//` and `/* */` comments (string literals hold none).
    fn without_comments(src: &str) -> String {
        let mut out = String::with_capacity(src.len());
        let mut rest = src;
        while let Some(at) = rest.find("/") {
            out.push_str(&rest[..at]);
            let after = &rest[at..];
            if let Some(line) = after.strip_prefix("//") {
                rest = line.find('\n').map_or("", |end| &line[end..]);
            } else if let Some(block) = after.strip_prefix("/*") {
                rest = block.find("*/").map_or("", |end| &block[end + 2..]);
                out.push(' ');
            } else {
                out.push('/');
                rest = &after[1..];
            }
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn declarations_are_found_in_lists_loops_and_behind_qualifiers_but_casts_are_not() {
        let types = ["u32", "float", "unsigned", "int"];
        assert_eq!(
            declared(" u32 a = 0, first = f(x, y)", &types),
            ["a", "first"]
        );
        assert_eq!(declared("for(u32 first=0", &types), ["first"]);
        assert_eq!(declared("const float *first = x", &types), ["first"]);
        assert_eq!(declared("unsigned int first(1)", &types), ["first"]);
        assert_eq!(declared("u8 buf[16]", &["u8"]), ["buf"]);
        assert!(declared("x = (u32)first", &types).is_empty());
        assert!(declared("v |= code << (2 * j)", &types).is_empty());
        assert_eq!(
            without_comments("a // b, c\nd /* e */ f / g"),
            "a \nd   f / g"
        );
    }

    /// The body of every `extern "C" __global__` kernel of a source, braces matched, in order.
    fn c_kernel_bodies(src: &str) -> Vec<&str> {
        src.split(KERNEL_START)
            .skip(1)
            .map(|rest| {
                let open = rest.find('{').expect("a kernel body");
                let mut depth = 0usize;
                let close = rest[open..]
                    .char_indices()
                    .find_map(|(at, c)| {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        (depth == 0).then_some(open + at)
                    })
                    .expect("a closed kernel body");
                &rest[open + 1..close]
            })
            .collect()
    }

    /// The Rust mirrors of the sources' `#define`s that sizes and launch shapes depend on.
    #[test]
    fn mirrored_constants_match_the_sources() {
        let define = |file: &str, name: &str| -> usize {
            let (_, src, _) = SOURCES.iter().find(|s| s.0 == file).expect("a source");
            src.lines()
                .find_map(|line| {
                    let mut words = line.split_whitespace();
                    (words.next() == Some("#define") && words.next() == Some(name))
                        .then(|| words.next())?
                })
                .and_then(|value| value.trim_end_matches('u').parse().ok())
                .unwrap_or_else(|| panic!("{file} defines no number `{name}`"))
        };
        assert_eq!(define("compress.cu", "CHUNK"), CHUNK);
        assert_eq!(define("compress.cu", "LANES"), LANES as usize);
        assert_eq!(define("compress.cu", "SEL_THREADS"), SEL_THREADS as usize);
        assert_eq!(define("compress.cu", "SEL_PER"), SEL_PER);
        assert_eq!(define("compress.cu", "RADIX_BUCKETS"), RADIX_BUCKETS);
        assert_eq!(define("powersgd.cu", "P_LANES"), P_LANES);
        assert_eq!(define("gemm.cu", "TILE"), GEMM_TILE as usize);
    }

    /// Runs without a GPU: a buffer shorter than a launch needs is refused before anything
    /// reaches the driver, with an error naming the kernel, the buffer and the rule.
    #[test]
    fn short_buffers_are_refused_naming_the_kernel() {
        let err = need("cast_encode", "out", 10, 12, "n * 2").unwrap_err();
        let text = err.to_string();
        for part in ["cast_encode", "`out`", "10", "12", "n * 2"] {
            assert!(text.contains(part), "{text}");
        }
        assert!(need("cast_encode", "out", 12, 12, "n * 2").is_ok());
    }
}
