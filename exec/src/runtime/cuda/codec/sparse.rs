//! Exact sparsifiers on the device: top-k, threshold, random-k shared-seed or indexed (`compress/sparse.rs`).
//!
//! Top-k and threshold use radix selection and a stable compaction (`select.rs`); random-k's
//! indices are drawn on the host by the CPU's sampler.

use super::scan::first_non_finite;
use super::select::Selector;
use super::{no_kernel, Build, Family};
use crate::compress::{rng::Rng, sparse::random_subset};
use crate::error::{ExecError, Result};
use crate::runtime::cuda::kernels::{cuda_err, Kernels};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use std::sync::Arc;
use syncopate_sim::compress::{sparse_count, Compressor};

/// Whether this family has kernels for `c`.
pub(super) fn supports(c: &Compressor) -> bool {
    matches!(
        c,
        Compressor::TopK { .. }
            | Compressor::Threshold { .. }
            | Compressor::RandomK { .. }
            | Compressor::RandomKIndexed { .. }
    )
}

pub(super) fn new(b: &Build) -> Result<Box<dyn Family>> {
    let (c, n, stream) = (b.compressor, b.count, b.stream);
    Ok(match c {
        Compressor::TopK { ratio } => Box::new(TopK::new(c, n, ratio, stream)?),
        Compressor::Threshold { value } => Box::new(Threshold::new(c, n, value as f32, stream)?),
        Compressor::RandomK { ratio } | Compressor::RandomKIndexed { ratio } => {
            Box::new(RandomK::new(c, n, ratio, b.seed, stream)?)
        }
        other => return Err(no_kernel(&other)),
    })
}

/// The k of a sparsifier with `ratio` over n elements (at most n, so it fits a u32).
fn k_of(n: u32, ratio: f64) -> u32 {
    sparse_count(u64::from(n), ratio) as u32
}

/// Top-k: the k largest |x|, ties by index: k indices, then k values.
pub(super) struct TopK {
    c: Compressor,
    n: u32,
    k: u32,
    select: Selector,
}

impl TopK {
    pub(super) fn new(c: Compressor, n: u32, ratio: f64, stream: &Arc<CudaStream>) -> Result<TopK> {
        Ok(TopK {
            c,
            n,
            k: k_of(n, ratio),
            select: Selector::new(n, stream)?,
        })
    }
}

impl Family for TopK {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        bad: &mut CudaSlice<u32>,
    ) -> Result<()> {
        k.check_finite(stream, input, self.n, bad)?;
        if self.k == 0 {
            return Ok(());
        }
        self.select.kth_largest(k, stream, input, self.k)?;
        self.select
            .emit(k, stream, input, out, 0, 4 * self.k as usize, self.k)
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        k.sparse_decode_add(stream, payload, acc, self.n, self.k, 0)
    }
}

/// Threshold: every |x| ≥ the value, a variable count. The CPU's payload is 4 + 8·count
/// bytes; here it is the prefix of a `wire_bytes` block whose rest is zero.
pub(super) struct Threshold {
    c: Compressor,
    n: u32,
    /// The threshold's f32 bits.
    t: u32,
    select: Selector,
}

impl Threshold {
    pub(super) fn new(
        c: Compressor,
        n: u32,
        value: f32,
        stream: &Arc<CudaStream>,
    ) -> Result<Threshold> {
        Ok(Threshold {
            c,
            n,
            t: value.to_bits(),
            select: Selector::new(n, stream)?,
        })
    }
}

impl Family for Threshold {
    fn compressor(&self) -> Compressor {
        self.c
    }

    /// Counts |x| ≥ t on the device (one synchronization, for the count), then compacts them
    /// in index order into the CPU's layout (count, indices, values).
    fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        bad: &mut CudaSlice<u32>,
    ) -> Result<()> {
        stream
            .memset_zeros(out)
            .map_err(cuda_err("cannot clear the payload"))?;
        let count = self.select.count_at_least(k, stream, input, self.t, bad)?;
        if first_non_finite(stream, bad)?.is_some() {
            // Non-finite input: `check_finite` reports it; the CPU sends nothing either.
            return Ok(());
        }
        write_count(stream, count, out)?;
        if count == 0 {
            return Ok(());
        }
        self.select.at_least(k, stream, self.t)?;
        self.select
            .emit(k, stream, input, out, 4, 4 + 4 * count as usize, count)
    }

    /// The CPU's 4 + 8·count bytes, or a whole `wire_bytes` block.
    fn takes(&self, len: usize, wire: usize) -> bool {
        (4..=wire).contains(&len)
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        k.threshold_decode_add(stream, payload, payload.len() as u64, acc, self.n)
    }
}

/// Writes the u32 count header of a count-prefixed payload (threshold, DGC, GradDrop).
pub(super) fn write_count(
    stream: &Arc<CudaStream>,
    count: u32,
    out: &mut CudaSlice<u8>,
) -> Result<()> {
    stream
        .memcpy_htod(&count.to_le_bytes(), &mut out.slice_mut(..4))
        .map_err(cuda_err("cannot write the count"))
}

/// Random-k: k values x·n/k at indices every rank draws alike from the shared seed and the
/// step, with the CPU codec's own sampler on the host; no indices are sent. Indexed (MergeComp's):
/// each rank's own indices, sent before the unscaled values as top-k sends them.
pub(super) struct RandomK {
    c: Compressor,
    indexed: bool,
    n: u32,
    k: u32,
    seed: u64,
    step: u64,
    /// This step's indices, on the host and on the device.
    host: Vec<u32>,
    indices: CudaSlice<u32>,
}

impl RandomK {
    pub(super) fn new(
        c: Compressor,
        n: u32,
        ratio: f64,
        seed: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<RandomK> {
        let k = k_of(n, ratio);
        Ok(RandomK {
            c,
            indexed: matches!(c, Compressor::RandomKIndexed { .. }),
            n,
            k,
            seed,
            step: 0,
            host: Vec::new(),
            indices: stream
                .alloc_zeros((k as usize).max(1))
                .map_err(cuda_err("cannot allocate the random-k indices"))?,
        })
    }
}

impl Family for RandomK {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        bad: &mut CudaSlice<u32>,
    ) -> Result<()> {
        let mut rng = Rng::for_stream(self.seed, self.step);
        self.step += 1;
        random_subset(&mut rng, self.n as usize, self.k as usize, &mut self.host);
        if self.k > 0 {
            stream
                .memcpy_htod(&self.host, &mut self.indices)
                .map_err(cuda_err("cannot upload the random-k indices"))?;
        }
        k.check_finite(stream, input, self.n, bad)?;
        if self.indexed {
            let bytes: Vec<u8> = self.host.iter().flat_map(|i| i.to_le_bytes()).collect();
            let (mut head, mut values) = out.split_at_mut(4 * self.k as usize);
            stream
                .memcpy_htod(&bytes, &mut head)
                .map_err(cuda_err("cannot write the random-k indices"))?;
            return k.gather_scaled(
                stream,
                input,
                self.n,
                &self.indices,
                self.k,
                1.0,
                &mut values,
            );
        }
        let scale = if self.k > 0 {
            self.n as f32 / self.k as f32
        } else {
            0.0
        };
        k.gather_scaled(stream, input, self.n, &self.indices, self.k, scale, out)
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        if self.indexed {
            return k.sparse_decode_add(stream, payload, acc, self.n, self.k, 0);
        }
        if self.host.len() != self.k as usize {
            return Err(ExecError::Protocol {
                compressor: self.c.to_string(),
                message: "decode needs this worker's encode of the same step first (the indices come from the shared seed)".into(),
            });
        }
        k.scatter_add(stream, payload, &self.indices, self.k, acc, self.n)
    }
}
