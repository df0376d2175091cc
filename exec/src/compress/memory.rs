//! Error-feedback memories: residual, DGC momentum correction, EF-SignSGD's scaled residual.
//!
//! DGC's momentum correction comes with masking; EF-SignSGD's residual is scaled by the learning
//! rate.
//!
//! A step is `compensate(g) → p`, compress p, `update(p, transmitted)` where `transmitted` is
//! this worker's own decoded payload; what was not transmitted is kept for the next step.

use super::scan::check_all;
use crate::error::{ExecError, Result};
use syncopate_sim::compress::Memory;

/// One worker's memory for one tensor.
#[derive(Clone, Debug)]
pub struct MemoryState {
    spec: Memory,
    /// Residual e (residual, efsignsgd) or DGC's velocity v (accumulated corrected gradient).
    residual: Vec<f32>,
    /// DGC's momentum u.
    momentum: Vec<f32>,
}

impl MemoryState {
    /// A zeroed memory of kind `spec` for a tensor of `numel` elements; buffers only where
    /// `spec` needs them.
    pub fn new(spec: Memory, numel: usize) -> MemoryState {
        let dgc = matches!(spec, Memory::Dgc { .. });
        MemoryState {
            spec,
            residual: if spec == Memory::None {
                Vec::new()
            } else {
                vec![0.0; numel]
            },
            momentum: if dgc { vec![0.0; numel] } else { Vec::new() },
        }
    }

    /// The memory kind this state implements.
    pub fn spec(&self) -> Memory {
        self.spec
    }

    /// What the memory still holds back (e, or DGC's velocity).
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// The factor to apply to the aggregated result: EF-SignSGD compresses lr·g, so the sum is
    /// divided by lr to hand the optimizer a gradient again; 1 otherwise.
    pub fn output_scale(&self) -> f32 {
        match self.spec {
            Memory::EfSignSgd { lr } => (1.0 / lr) as f32,
            _ => 1.0,
        }
    }

    fn check_len(&self, got: usize) -> Result<()> {
        if self.spec == Memory::None || got == self.residual.len() {
            Ok(())
        } else {
            Err(ExecError::LengthMismatch {
                compressor: format!("memory {}", self.spec),
                expected: self.residual.len(),
                got,
            })
        }
    }

    /// Writes the vector to compress this step into `out`.
    pub fn compensate(&mut self, grad: &[f32], out: &mut Vec<f32>) -> Result<()> {
        self.check_len(grad.len())?;
        check_all(grad)?;
        out.clear();
        match self.spec {
            Memory::None => out.extend_from_slice(grad),
            Memory::Residual => out.extend(grad.iter().zip(&self.residual).map(|(g, e)| g + e)),
            Memory::EfSignSgd { lr } => {
                let lr = lr as f32;
                out.extend(grad.iter().zip(&self.residual).map(|(g, e)| e + lr * g));
            }
            Memory::Dgc { momentum, .. } => {
                // Momentum correction: u ← m·u + g, v ← v + u; v is what gets sparsified.
                let m = momentum as f32;
                for ((u, v), &g) in self.momentum.iter_mut().zip(&mut self.residual).zip(grad) {
                    *u = m * *u + g;
                    *v += *u;
                }
                out.extend_from_slice(&self.residual);
            }
        }
        Ok(())
    }

    /// Keeps what was not transmitted. For DGC the transmitted coordinates (non-zero entries of
    /// `transmitted`) are cleared from both velocity and momentum (momentum factor masking).
    pub fn update(&mut self, compensated: &[f32], transmitted: &[f32]) -> Result<()> {
        self.check_len(compensated.len())?;
        self.check_len(transmitted.len())?;
        match self.spec {
            Memory::None => {}
            Memory::Residual | Memory::EfSignSgd { .. } => {
                for ((e, &p), &t) in self.residual.iter_mut().zip(compensated).zip(transmitted) {
                    *e = p - t;
                }
            }
            Memory::Dgc { .. } => {
                for ((v, u), &t) in self
                    .residual
                    .iter_mut()
                    .zip(&mut self.momentum)
                    .zip(transmitted)
                {
                    let keep = if t != 0.0 { 0.0 } else { 1.0 };
                    *v *= keep;
                    *u *= keep;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dgc_accumulates_with_momentum_and_masks() {
        let mut m = MemoryState::new(
            Memory::Dgc {
                momentum: 0.5,
                warmup_epochs: 0,
            },
            2,
        );
        let mut p = Vec::new();
        m.compensate(&[1.0, 2.0], &mut p).unwrap();
        assert_eq!(p, [1.0, 2.0]);
        m.update(&p, &[0.0, 2.0]).unwrap();
        m.compensate(&[1.0, 2.0], &mut p).unwrap();
        // u = 0.5·1 + 1 = 1.5, v = 1 + 1.5; the second coordinate restarted from zero.
        assert_eq!(p, [2.5, 2.0]);
    }

    #[test]
    fn efsignsgd_scales_by_lr() {
        let mut m = MemoryState::new(Memory::EfSignSgd { lr: 0.5 }, 1);
        let mut p = Vec::new();
        m.compensate(&[4.0], &mut p).unwrap();
        assert_eq!(p, [2.0]);
        m.update(&p, &[1.5]).unwrap();
        assert_eq!(m.residual(), [0.5]);
        assert_eq!(m.output_scale(), 2.0);
        assert!(m.compensate(&[f32::NAN], &mut p).is_err());
    }
}
