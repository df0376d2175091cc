//! Device-side exact selection for the sparsifiers: radix selection and a stable compaction.
//!
//! Radix selection finds the k-th largest |x|, and the compaction emits the CPU's indices in the
//! CPU's order.
//!
//! The CPU keeps every |x| > t and the first `ties` elements with |x| == t, in index order
//! (`compress::sparse::emit`). Here t and the ties come from three radix passes (12, 12 and 7
//! bits of |x|, the first being the CPU's 4096 buckets), or from the host for a sampled
//! threshold; the compaction places element i at (larger elements before i) + min(ties, equal
//! elements before i), from per-tile counts and their prefix sums. No step depends on thread
//! timing, so the output is the CPU's byte for byte.

use crate::error::Result;
use crate::runtime::cuda::kernels::{cuda_err, Kernels, RADIX_BUCKETS, SEL_TILE};
use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use std::sync::Arc;

/// Scratch for selecting among n elements.
pub(super) struct Selector {
    n: u32,
    /// [t, larger, k, ties], as the kernels document.
    state: CudaSlice<u32>,
    /// Radix histogram, zero between uses (`radix_select` clears it).
    hist: CudaSlice<u32>,
    tile_gt: CudaSlice<u32>,
    tile_eq: CudaSlice<u32>,
    count: CudaSlice<u32>,
}

impl Selector {
    pub(super) fn new(n: u32, stream: &Arc<CudaStream>) -> Result<Selector> {
        let alloc = cuda_err("cannot allocate selection scratch");
        let tiles = (n as usize).div_ceil(SEL_TILE).max(1);
        Ok(Selector {
            n,
            state: stream.alloc_zeros(4).map_err(&alloc)?,
            hist: stream.alloc_zeros(RADIX_BUCKETS).map_err(&alloc)?,
            tile_gt: stream.alloc_zeros(tiles).map_err(&alloc)?,
            tile_eq: stream.alloc_zeros(tiles).map_err(&alloc)?,
            count: stream.alloc_zeros(1).map_err(&alloc)?,
        })
    }

    /// Enqueues the selection of the `count` largest |x| (1 ≤ count ≤ n), ties by index: three
    /// radix passes, each a histogram of the candidates' next digit and the choice of the
    /// bucket holding the k-th largest.
    pub(super) fn kth_largest(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, f32>,
        count: u32,
    ) -> Result<()> {
        k.select_init(stream, &mut self.state, 0, 0, count, 0)?;
        for pass in 0..3 {
            k.radix_hist(stream, x, self.n, &self.state, pass, &mut self.hist)?;
            k.radix_select(stream, &mut self.state, pass, &mut self.hist)?;
        }
        Ok(())
    }

    /// Enqueues the selection of every |x| ≥ t (as f32 bits).
    pub(super) fn at_least(&mut self, k: &Kernels, stream: &Arc<CudaStream>, t: u32) -> Result<()> {
        k.select_init(stream, &mut self.state, t, 0, 0, u32::MAX)
    }

    /// The selected threshold (|x| bits); waits for the stream.
    pub(super) fn threshold(&self, stream: &Arc<CudaStream>) -> Result<u32> {
        let state = stream
            .clone_dtoh(&self.state)
            .map_err(cuda_err("cannot read the selection"))?;
        Ok(state[0])
    }

    /// Enqueues the compaction of the selected elements into `out`: indices as u32 from byte
    /// `idx_at`, values as f32 from byte `val_at` (both multiples of 4), at most `cap`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        idx_at: usize,
        val_at: usize,
        cap: u32,
    ) -> Result<()> {
        if self.n == 0 {
            return Ok(());
        }
        let tiles = self.n.div_ceil(SEL_TILE as u32);
        k.select_count(
            stream,
            x,
            self.n,
            &self.state,
            &mut self.tile_gt,
            &mut self.tile_eq,
        )?;
        k.select_scan(stream, &mut self.tile_gt, &mut self.tile_eq, tiles)?;
        k.select_emit(
            stream,
            x,
            self.n,
            &self.state,
            &self.tile_gt,
            &self.tile_eq,
            out,
            idx_at as u64,
            val_at as u64,
            cap,
        )
    }

    /// How many |x| ≥ t; notes the first non-finite element in `bad`. Waits for the stream.
    pub(super) fn count_at_least(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, f32>,
        t: u32,
        bad: &mut CudaSlice<u32>,
    ) -> Result<u32> {
        stream
            .memset_zeros(&mut self.count)
            .map_err(cuda_err("cannot reset the count"))?;
        k.count_at_least(stream, x, self.n, t, &mut self.count, bad)?;
        let count = stream
            .clone_dtoh(&self.count)
            .map_err(cuda_err("cannot read the count"))?;
        Ok(count[0])
    }
}
