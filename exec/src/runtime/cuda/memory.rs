//! Error-feedback memory on the device: the CPU `MemoryState`'s arithmetic, in its operation order.
//!
//! It covers the residual, EF-SignSGD and DGC (momentum correction, accumulation, masking).

use super::kernels::{cuda_err, Kernels};
use crate::error::{ExecError, Result};
use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use std::sync::Arc;
use syncopate_sim::compress::Memory;

/// One rank's memory for one piece of `n` elements.
pub(super) struct GpuMemory {
    spec: Memory,
    n: u32,
    /// Residual e (residual, efsignsgd) or DGC's velocity v; one element when unused.
    residual: CudaSlice<f32>,
    /// DGC's momentum u; one element otherwise.
    momentum: CudaSlice<f32>,
}

impl GpuMemory {
    pub(super) fn new(spec: Memory, n: usize, stream: &Arc<CudaStream>) -> Result<GpuMemory> {
        let count = u32::try_from(n).map_err(|_| ExecError::Cuda {
            message: format!("a piece of {n} elements exceeds the kernels' 32-bit indexing"),
        })?;
        let alloc = cuda_err("cannot allocate error-feedback memory");
        let sized = |used: bool| if used { n.max(1) } else { 1 };
        Ok(GpuMemory {
            spec,
            n: count,
            residual: stream
                .alloc_zeros(sized(spec != Memory::None))
                .map_err(&alloc)?,
            momentum: stream
                .alloc_zeros(sized(matches!(spec, Memory::Dgc { .. })))
                .map_err(&alloc)?,
        })
    }

    /// Enqueues the vector to compress this step, from the gradient `grad`, into `out`.
    pub(super) fn compensate(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        grad: &CudaView<'_, f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let n = self.n;
        if let Memory::Dgc { momentum, .. } = self.spec {
            let m = momentum as f32;
            return k.dgc_compensate(
                stream,
                grad,
                &mut self.momentum,
                &mut self.residual,
                out,
                n,
                m,
            );
        }
        // `compensate` reads e only for kinds 1 and 2.
        let (kind, lr) = match self.spec {
            Memory::Residual => (1, 0.0),
            Memory::EfSignSgd { lr } => (2, lr as f32),
            _ => (0, 0.0),
        };
        k.compensate(stream, grad, &self.residual, out, n, kind, lr)
    }

    /// Enqueues keeping what was not transmitted: `transmitted` is this rank's own payload
    /// decoded. DGC clears velocity and momentum where it is non-zero.
    pub(super) fn update(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        compensated: &CudaSlice<f32>,
        transmitted: &CudaSlice<f32>,
    ) -> Result<()> {
        match self.spec {
            Memory::None => Ok(()),
            Memory::Residual | Memory::EfSignSgd { .. } => {
                k.residual_update(stream, &mut self.residual, compensated, transmitted, self.n)
            }
            Memory::Dgc { .. } => k.dgc_mask(
                stream,
                &mut self.momentum,
                &mut self.residual,
                transmitted,
                self.n,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::gpu_or_skip;
    use super::*;
    use crate::compress::MemoryState;

    /// Over a few steps the device memory compresses the same bits as the CPU's, with the
    /// coordinates of a fake payload masked or subtracted.
    #[test]
    fn gpu_memory_matches_the_cpu() {
        let Some((_ctx, stream, kernels)) = gpu_or_skip() else {
            return;
        };
        let n = 10_007;
        for spec in [
            "none",
            "residual",
            "efsignsgd:0.3",
            "dgc:0.9:0",
            "dgc:0.5:0",
        ] {
            let spec: Memory = spec.parse().unwrap();
            let mut cpu = MemoryState::new(spec, n);
            let mut gpu = GpuMemory::new(spec, n, &stream).unwrap();
            let mut want = Vec::new();
            let mut out = stream.alloc_zeros::<f32>(n).unwrap();
            for step in 0..4 {
                let grad: Vec<f32> = (0..n)
                    .map(|i| ((i * 7919 + step * 31) % 1000) as f32 / 97.0 - 5.0)
                    .collect();
                cpu.compensate(&grad, &mut want).unwrap();
                let g = stream.clone_htod(&grad).unwrap();
                gpu.compensate(&kernels, &stream, &g.slice(..), &mut out)
                    .unwrap();
                let got = stream.clone_dtoh(&out).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{spec} step {step}");
                // A payload that carried every third coordinate, rounded to a coarser value.
                let sent: Vec<f32> = want
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| if (i + step) % 3 == 0 { p.round() } else { 0.0 })
                    .collect();
                cpu.update(&want, &sent).unwrap();
                let sent = stream.clone_htod(&sent).unwrap();
                gpu.update(&kernels, &stream, &out, &sent).unwrap();
            }
        }
    }
}
