//! Sampled-threshold sparsifiers on the device: DGC and GradDrop (`compress/sampled.rs`).
//!
//! Their sample positions, threshold and DGC's adaptation are decided on the host with the CPU's
//! code; the counts, k-th largest and compaction run on the device.
//!
//! The host decides from device counts, so each step synchronizes the stream a few times.

use super::scan::first_non_finite;
use super::select::Selector;
use super::sparse::write_count;
use super::{no_kernel, Build, Family};
use crate::compress::rng::Rng;
use crate::compress::sampled::{
    dgc_adapt_with, dgc_band, dgc_positions, graddrop_positions, sample_threshold, Estimate,
    Sampling,
};
use crate::error::Result;
use crate::runtime::cuda::kernels::{cuda_err, Kernels};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use std::cell::RefCell;
use std::sync::Arc;
use syncopate_sim::compress::{sparse_count, Compressor};

/// Whether this family has kernels for `c`.
pub(super) fn supports(c: &Compressor) -> bool {
    matches!(c, Compressor::Dgc { .. } | Compressor::GradDrop { .. })
}

pub(super) fn new(b: &Build) -> Result<Box<dyn Family>> {
    let (c, n, stream) = (b.compressor, b.count, b.stream);
    Ok(match c {
        Compressor::Dgc { ratio } => {
            Box::new(Sampled::new(c, n, ratio, Sampling::Dgc, b.seed, stream)?)
        }
        Compressor::GradDrop { ratio } => Box::new(Sampled::new(
            c,
            n,
            ratio,
            Sampling::GradDrop,
            b.seed,
            stream,
        )?),
        other => return Err(no_kernel(&other)),
    })
}

/// What a sampled sparsifier sends this step, as `sampled.rs` decides it.
enum Choice {
    /// Every |x| ≥ t: `selected` of them, at most k.
    AtLeast { t: u32, selected: u32 },
    /// Exactly the k largest, ties by index.
    TopK,
}

/// DGC or GradDrop: a u32 count c ≤ k, then k index slots and k value slots.
pub(super) struct Sampled {
    c: Compressor,
    n: u32,
    ratio: f64,
    /// The k slots.
    k: u32,
    sampling: Sampling,
    /// The sampling generator, seeded as the CPU codec's.
    rng: Rng,
    select: Selector,
}

impl Sampled {
    pub(super) fn new(
        c: Compressor,
        n: u32,
        ratio: f64,
        sampling: Sampling,
        seed: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<Sampled> {
        Ok(Sampled {
            c,
            n,
            ratio,
            k: sparse_count(u64::from(n), ratio) as u32,
            sampling,
            rng: Rng::new(seed),
            select: Selector::new(n, stream)?,
        })
    }

    /// The sample's threshold: |x| at the positions the CPU's generator picks, their
    /// `sample_threshold` decided on the host.
    fn sample(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
    ) -> Result<u32> {
        let (n, ratio) = (self.n as usize, self.ratio);
        let positions = match self.sampling {
            Sampling::Dgc => dgc_positions(n, ratio, &mut self.rng),
            Sampling::GradDrop => graddrop_positions(n, ratio, &mut self.rng),
        };
        let io = cuda_err("cannot gather the threshold sample");
        let pos = stream.clone_htod(&positions).map_err(&io)?;
        let mut samples = stream.alloc_zeros::<u32>(positions.len()).map_err(&io)?;
        let m = positions.len() as u32;
        k.gather_abs(stream, input, self.n, &pos, m, &mut samples)?;
        let mut samples = stream.clone_dtoh(&samples).map_err(&io)?;
        Ok(sample_threshold(&mut samples, ratio))
    }
}

impl Family for Sampled {
    fn compressor(&self) -> Compressor {
        self.c
    }

    /// The branches of `Sampled::encode` in `compress/sampled.rs`, with the passes over the
    /// tensor (counts, k-th largest, compaction) on the device.
    fn encode(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, f32>,
        out: &mut CudaSlice<u8>,
        bad: &mut CudaSlice<u32>,
    ) -> Result<()> {
        let slots = self.k as usize;
        stream
            .memset_zeros(out)
            .map_err(cuda_err("cannot clear the payload"))?;
        if slots == 0 {
            return Ok(());
        }
        let t = self.sample(k, stream, input)?;
        let dgc = matches!(self.sampling, Sampling::Dgc);
        let select = RefCell::new(&mut self.select);
        let bad = RefCell::new(bad);
        let count = |t: u32| {
            select
                .borrow_mut()
                .count_at_least(k, stream, input, t, &mut bad.borrow_mut())
                .map(|c| c as usize)
        };
        let selected = count(t)?;
        if first_non_finite(stream, &bad.borrow())?.is_some() {
            // Non-finite input: `check_finite` reports it; the CPU sends nothing either.
            return Ok(());
        }
        let (low, high) = dgc_band(slots);
        let cap = high.max(slots);
        let in_band = !dgc || (low..=high).contains(&selected);
        let choice = if in_band && selected <= slots {
            Choice::AtLeast {
                t,
                selected: selected as u32,
            }
        } else if in_band && selected <= cap {
            Choice::TopK
        } else {
            let estimate = if dgc {
                dgc_adapt_with(slots, t, selected, count, || {
                    let mut select = select.borrow_mut();
                    select.kth_largest(k, stream, input, self.k)?;
                    select.threshold(stream)
                })?
            } else {
                Estimate {
                    threshold: t,
                    selected,
                }
            };
            if estimate.selected > slots {
                Choice::TopK
            } else {
                Choice::AtLeast {
                    t: estimate.threshold,
                    selected: estimate.selected as u32,
                }
            }
        };
        let mut select = select.borrow_mut();
        let sent = match choice {
            Choice::AtLeast { t, selected } => {
                select.at_least(k, stream, t)?;
                selected
            }
            Choice::TopK => {
                select.kth_largest(k, stream, input, self.k)?;
                self.k
            }
        };
        select.emit(k, stream, input, out, 4, 4 + 4 * slots, self.k)?;
        write_count(stream, sent, out)
    }

    fn decode_add(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        payload: &CudaView<'_, u8>,
        acc: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        k.sparse_decode_add(stream, payload, acc, self.n, self.k, 1)
    }
}
