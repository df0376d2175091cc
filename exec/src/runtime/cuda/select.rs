//! Device-side exact selection for the sparsifiers: radix selection of the k-th largest |x| and a stable compaction that emits the CPU's indices in the CPU's order.
//!
//! The CPU keeps every |x| > t and the first `ties` elements with |x| == t, in index order
//! (`compress::sparse::emit`). Here t and the ties come from three radix passes (12, 12 and 7
//! bits of |x|, the first being the CPU's 4096 buckets), or from the host for a sampled
//! threshold; the compaction places element i at (larger elements before i) + min(ties, equal
//! elements before i), from per-tile counts and their prefix sums. No step depends on thread
//! timing, so the output is the CPU's byte for byte.

use super::kernels::{cuda_err, grid, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// Elements per compaction tile and threads per block (`SEL_TILE`, `SEL_THREADS` in the .cu).
const TILE: usize = 4096;
const THREADS: u32 = 256;
const BUCKETS: usize = 4096;

fn blocks(count: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (count.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Scratch for selecting among n elements.
pub struct Selector {
    n: usize,
    /// [t, larger, k, ties], as the kernels document.
    state: CudaSlice<u32>,
    /// Radix histogram, zero between uses (`radix_select` clears it).
    hist: CudaSlice<u32>,
    tile_gt: CudaSlice<u32>,
    tile_eq: CudaSlice<u32>,
    count: CudaSlice<u32>,
}

impl Selector {
    pub fn new(n: usize, stream: &Arc<CudaStream>) -> Result<Selector> {
        let alloc = cuda_err("cannot allocate selection scratch");
        let tiles = n.div_ceil(TILE).max(1);
        Ok(Selector {
            n,
            state: stream.alloc_zeros(4).map_err(&alloc)?,
            hist: stream.alloc_zeros(BUCKETS).map_err(&alloc)?,
            tile_gt: stream.alloc_zeros(tiles).map_err(&alloc)?,
            tile_eq: stream.alloc_zeros(tiles).map_err(&alloc)?,
            count: stream.alloc_zeros(1).map_err(&alloc)?,
        })
    }

    fn init(&mut self, k: &Kernels, stream: &Arc<CudaStream>, st: [u32; 4]) -> Result<()> {
        // SAFETY: select_init(st, t, above, k, ties) writes the four words of `state`.
        unsafe {
            stream
                .launch_builder(&k.select_init)
                .arg(&mut self.state)
                .arg(&st[0])
                .arg(&st[1])
                .arg(&st[2])
                .arg(&st[3])
                .launch(LaunchConfig::for_num_elems(1))
        }
        .map(drop)
        .map_err(cuda_err("selection launch failed"))
    }

    /// Enqueues the selection of the `count` largest |x| (1 ≤ count ≤ n), ties by index.
    pub fn kth_largest(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        x: &CudaSlice<f32>,
        count: usize,
    ) -> Result<()> {
        self.init(k, stream, [0, 0, count as u32, 0])?;
        let n = self.n as u32;
        let launch = cuda_err("radix selection launch failed");
        for pass in 0..3i32 {
            // SAFETY: radix_hist reads n elements of x and the state, and adds into the 4096
            // buckets of hist; radix_select reads and clears them and updates the state.
            unsafe {
                stream
                    .launch_builder(&k.radix_hist)
                    .arg(x)
                    .arg(&n)
                    .arg(&self.state)
                    .arg(&pass)
                    .arg(&mut self.hist)
                    .launch(grid(self.n))
            }
            .map_err(&launch)?;
            unsafe {
                stream
                    .launch_builder(&k.radix_select)
                    .arg(&mut self.state)
                    .arg(&pass)
                    .arg(&mut self.hist)
                    .launch(blocks(1))
            }
            .map_err(&launch)?;
        }
        Ok(())
    }

    /// Enqueues the selection of every |x| ≥ t (as f32 bits).
    pub fn at_least(&mut self, k: &Kernels, stream: &Arc<CudaStream>, t: u32) -> Result<()> {
        self.init(k, stream, [t, 0, 0, u32::MAX])
    }

    /// The selected threshold (|x| bits); waits for the stream.
    pub fn threshold(&self, stream: &Arc<CudaStream>) -> Result<u32> {
        let state = stream
            .clone_dtoh(&self.state)
            .map_err(cuda_err("cannot read the selection"))?;
        Ok(state[0])
    }

    /// Enqueues the compaction of the selected elements into `out`: indices as u32 from byte
    /// `idx_at`, values as f32 from byte `val_at` (both multiples of 4), at most `cap`.
    #[allow(clippy::too_many_arguments)]
    pub fn emit(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<u8>,
        idx_at: usize,
        val_at: usize,
        cap: usize,
    ) -> Result<()> {
        let n = self.n as u32;
        let tiles = self.n.div_ceil(TILE);
        if tiles == 0 {
            return Ok(());
        }
        let launch = cuda_err("compaction launch failed");
        let (tiles32, idx_at, val_at, cap) =
            (tiles as u32, idx_at as u64, val_at as u64, cap as u32);
        // SAFETY: select_count / select_emit read n elements of x and write one word per
        // tile; select_scan rewrites the `tiles` words in place; select_emit writes at most
        // `cap` u32 and f32 at the given offsets, which the caller sized `out` for.
        unsafe {
            stream
                .launch_builder(&k.select_count)
                .arg(x)
                .arg(&n)
                .arg(&self.state)
                .arg(&mut self.tile_gt)
                .arg(&mut self.tile_eq)
                .launch(blocks(tiles))
        }
        .map_err(&launch)?;
        unsafe {
            stream
                .launch_builder(&k.select_scan)
                .arg(&mut self.tile_gt)
                .arg(&mut self.tile_eq)
                .arg(&tiles32)
                .launch(blocks(1))
        }
        .map_err(&launch)?;
        unsafe {
            stream
                .launch_builder(&k.select_emit)
                .arg(x)
                .arg(&n)
                .arg(&self.state)
                .arg(&self.tile_gt)
                .arg(&self.tile_eq)
                .arg(out)
                .arg(&idx_at)
                .arg(&val_at)
                .arg(&cap)
                .launch(blocks(tiles))
        }
        .map(drop)
        .map_err(launch)
    }

    /// How many |x| ≥ t; notes the first non-finite element in `bad`. Waits for the stream.
    pub fn count_at_least(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        x: &CudaSlice<f32>,
        t: u32,
        bad: &mut CudaSlice<u32>,
    ) -> Result<usize> {
        let n = self.n as u32;
        stream
            .memset_zeros(&mut self.count)
            .map_err(cuda_err("cannot reset the count"))?;
        // SAFETY: count_at_least reads n elements of x and adds into one u32 of count.
        unsafe {
            stream
                .launch_builder(&k.count_at_least)
                .arg(x)
                .arg(&n)
                .arg(&t)
                .arg(&mut self.count)
                .arg(bad)
                .launch(grid(self.n))
        }
        .map_err(cuda_err("count launch failed"))?;
        let count = stream
            .clone_dtoh(&self.count)
            .map_err(cuda_err("cannot read the count"))?;
        Ok(count[0] as usize)
    }
}
