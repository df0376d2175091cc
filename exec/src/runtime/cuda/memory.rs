//! Error-feedback memory on the device: the CPU `MemoryState`'s residual, EF-SignSGD and DGC (momentum correction, accumulation, masking) arithmetic, in its operation order.

use super::kernels::{cuda_err, grid, Kernels};
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};
use std::sync::Arc;
use syncopate_sim::compress::Memory;

/// One rank's memory for one piece of `n` elements.
pub struct GpuMemory {
    spec: Memory,
    n: usize,
    /// Residual e (residual, efsignsgd) or DGC's velocity v; one element when unused.
    residual: CudaSlice<f32>,
    /// DGC's momentum u; one element otherwise.
    momentum: CudaSlice<f32>,
}

impl GpuMemory {
    pub fn new(spec: Memory, n: usize, stream: &Arc<CudaStream>) -> Result<GpuMemory> {
        let alloc = cuda_err("cannot allocate error-feedback memory");
        let sized = |used: bool| if used { n.max(1) } else { 1 };
        Ok(GpuMemory {
            spec,
            n,
            residual: stream
                .alloc_zeros(sized(spec != Memory::None))
                .map_err(&alloc)?,
            momentum: stream
                .alloc_zeros(sized(matches!(spec, Memory::Dgc { .. })))
                .map_err(&alloc)?,
        })
    }

    /// Enqueues the vector to compress this step, from the gradient `grad`, into `out`.
    pub fn compensate(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        grad: &CudaView<'_, f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let n = self.n as u32;
        let failed = cuda_err("error-feedback kernel failed");
        // SAFETY: both kernels touch n elements of each buffer; the used state holds n.
        if let Memory::Dgc { momentum, .. } = self.spec {
            let m = momentum as f32;
            unsafe {
                stream
                    .launch_builder(&k.dgc_compensate)
                    .arg(grad)
                    .arg(&mut self.momentum)
                    .arg(&mut self.residual)
                    .arg(&mut *out)
                    .arg(&n)
                    .arg(&m)
                    .launch(grid(self.n))
            }
            .map_err(failed)?;
            return Ok(());
        }
        // `compensate` reads e only for kinds 1 and 2.
        let (kind, lr) = match self.spec {
            Memory::Residual => (1i32, 0.0f32),
            Memory::EfSignSgd { lr } => (2, lr as f32),
            _ => (0, 0.0),
        };
        unsafe {
            stream
                .launch_builder(&k.compensate)
                .arg(grad)
                .arg(&self.residual)
                .arg(&mut *out)
                .arg(&n)
                .arg(&kind)
                .arg(&lr)
                .launch(grid(self.n))
        }
        .map_err(failed)?;
        Ok(())
    }

    /// Enqueues keeping what was not transmitted: `transmitted` is this rank's own payload
    /// decoded. DGC clears velocity and momentum where it is non-zero.
    pub fn update(
        &mut self,
        k: &Kernels,
        stream: &Arc<CudaStream>,
        compensated: &CudaSlice<f32>,
        transmitted: &CudaSlice<f32>,
    ) -> Result<()> {
        let n = self.n as u32;
        let failed = cuda_err("error-feedback update failed");
        // SAFETY: both kernels touch n elements of each buffer; the used state holds n.
        match self.spec {
            Memory::None => Ok(()),
            Memory::Residual | Memory::EfSignSgd { .. } => unsafe {
                stream
                    .launch_builder(&k.residual_update)
                    .arg(&mut self.residual)
                    .arg(compensated)
                    .arg(transmitted)
                    .arg(&n)
                    .launch(grid(self.n))
            }
            .map(drop)
            .map_err(failed),
            Memory::Dgc { .. } => unsafe {
                stream
                    .launch_builder(&k.dgc_mask)
                    .arg(&mut self.momentum)
                    .arg(&mut self.residual)
                    .arg(transmitted)
                    .arg(&n)
                    .launch(grid(self.n))
            }
            .map(drop)
            .map_err(failed),
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
