//! The wire types an MPI allreduce sums in, whose payload bytes MPI takes as they are.
//!
//! f32 uses MPI's own sum; fp16 and bf16 use user-defined reductions that add through the codec's
//! `sum_into`.

use crate::compress::{codec_for, Codec};
use crate::error::{ExecError, Result};
use mpi::collective::UnsafeUserOperation;
use mpi::ffi;
use std::os::raw::{c_int, c_void};
use syncopate_sim::compress::{Aggregation, Compressor};

/// What the elements of a summable payload are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireType {
    /// fp32 (none, shared-seed random-k, PowerSGD): MPI's MPI_SUM on MPI_FLOAT, which is the
    /// same IEEE addition as the codecs' `sum_into`.
    F32,
    /// IEEE half precision, summed by this transport's own MPI operation.
    F16,
    /// bfloat16, summed by this transport's own MPI operation.
    Bf16,
}

impl WireType {
    /// The wire type of `codec`'s payloads of `element`-byte elements, or an error if they are
    /// not summed by allreduce.
    pub fn of(codec: &dyn Codec, element: usize) -> Result<WireType> {
        let c = codec.compressor();
        if c.aggregation() != Aggregation::Allreduce {
            return Err(ExecError::NotSummable {
                compressor: c.to_string(),
            });
        }
        let wire = match c {
            Compressor::Fp16 => WireType::F16,
            Compressor::Bf16 => WireType::Bf16,
            _ => WireType::F32,
        };
        if wire.bytes() != element {
            return Err(ExecError::Protocol {
                compressor: c.to_string(),
                message: format!(
                    "payload elements of {element} bytes, its wire type has {}",
                    wire.bytes()
                ),
            });
        }
        Ok(wire)
    }

    /// Bytes per element on the wire.
    pub fn bytes(self) -> usize {
        match self {
            WireType::F32 => 4,
            WireType::F16 | WireType::Bf16 => 2,
        }
    }
}

/// The user-defined reductions of one communication stream.
pub struct HalfSums {
    /// Sums fp16 elements sent as MPI_UINT16_T.
    pub fp16: UnsafeUserOperation,
    /// Sums bf16 elements sent as MPI_UINT16_T.
    pub bf16: UnsafeUserOperation,
}

impl HalfSums {
    /// Registers both reductions with MPI.
    pub fn new() -> HalfSums {
        // SAFETY: both functions read `*len` u16 elements from `invec` and write as many to
        // `inoutvec`, which is what MPI passes for the MPI_UINT16_T buffers this transport
        // uses them on, and they never unwind into MPI (see `sum_halves`).
        unsafe {
            HalfSums {
                fp16: UnsafeUserOperation::commutative(sum_fp16),
                bf16: UnsafeUserOperation::commutative(sum_bf16),
            }
        }
    }
}

impl Default for HalfSums {
    fn default() -> HalfSums {
        HalfSums::new()
    }
}

thread_local! {
    static FP16: Box<dyn Codec> = codec_for(&Compressor::Fp16, 0);
    static BF16: Box<dyn Codec> = codec_for(&Compressor::Bf16, 0);
}

unsafe extern "C" fn sum_fp16(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut ffi::MPI_Datatype,
) {
    // SAFETY: forwarded from MPI's call, see `sum_halves`.
    unsafe { sum_halves(&FP16, invec, inoutvec, len) }
}

unsafe extern "C" fn sum_bf16(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut ffi::MPI_Datatype,
) {
    // SAFETY: forwarded from MPI's call, see `sum_halves`.
    unsafe { sum_halves(&BF16, invec, inoutvec, len) }
}

/// `inoutvec[i] = invec[i] + inoutvec[i]` in the codec's arithmetic (add in f32, round to the
/// half type), as the host backend's ring sums. Addition of two values is commutative, so
/// MPI's choice of which operand is `inoutvec` does not change a bit.
///
/// # Safety
/// `invec` and `inoutvec` must point to `*len` u16 elements each, not overlapping.
unsafe fn sum_halves(
    codec: &'static std::thread::LocalKey<Box<dyn Codec>>,
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
) {
    // SAFETY: the caller's contract.
    let (other, acc) = unsafe {
        let n = usize::try_from(*len).unwrap_or(0) * 2;
        (
            std::slice::from_raw_parts(invec.cast::<u8>(), n),
            std::slice::from_raw_parts_mut(inoutvec.cast::<u8>(), n),
        )
    };
    // Unwinding out of an `extern "C"` function called by MPI is undefined behaviour; a
    // panic here (none is expected) ends the process instead.
    let summed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        codec.with(|c| c.sum_into(acc, other).is_ok())
    }));
    // `sum_into` fails only on payloads of different lengths, which these are not.
    if !matches!(summed, Ok(true)) {
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_types_follow_the_compressor() {
        let fp16 = codec_for(&Compressor::Fp16, 0);
        assert_eq!(WireType::of(&*fp16, 2).unwrap(), WireType::F16);
        assert!(WireType::of(&*fp16, 4).is_err());
        let none = codec_for(&Compressor::None, 0);
        assert_eq!(WireType::of(&*none, 4).unwrap(), WireType::F32);
        let topk = codec_for(&Compressor::TopK { ratio: 0.1 }, 0);
        assert!(matches!(
            WireType::of(&*topk, 4),
            Err(ExecError::NotSummable { .. })
        ));
    }

    #[test]
    fn half_sums_match_the_codec() {
        let a: Vec<u8> = [1.5f32, -2.25, 1000.0]
            .iter()
            .flat_map(|&x| crate::compress::minifloat::f32_to_f16(x).to_le_bytes())
            .collect();
        let b: Vec<u8> = [0.25f32, 2.25, 0.5]
            .iter()
            .flat_map(|&x| crate::compress::minifloat::f32_to_f16(x).to_le_bytes())
            .collect();
        let mut expected = a.clone();
        codec_for(&Compressor::Fp16, 0)
            .sum_into(&mut expected, &b)
            .unwrap();
        let mut inout = a.clone();
        let mut input = b.clone();
        let mut len: c_int = 3;
        // SAFETY: both buffers hold 3 u16 elements.
        unsafe {
            sum_fp16(
                input.as_mut_ptr().cast(),
                inout.as_mut_ptr().cast(),
                &mut len,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(inout, expected);
    }
}
