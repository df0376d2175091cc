//! Little-endian field access and payload-length validation shared by every wire format.

use crate::error::{ExecError, Result};
use syncopate_sim::compress::Compressor;

pub(super) fn bad_payload(c: &Compressor, message: impl Into<String>) -> ExecError {
    ExecError::BadPayload {
        compressor: c.to_string(),
        message: message.into(),
    }
}

/// Checks a fixed-size payload against the simulator's byte count: the one specification.
pub(super) fn expect_len(c: &Compressor, payload: &[u8], numel: usize) -> Result<()> {
    let want = c.wire_bytes(numel as u64);
    if payload.len() as u64 == want {
        Ok(())
    } else {
        Err(bad_payload(
            c,
            format!(
                "{} bytes for a tensor of {numel} elements, expected {want}",
                payload.len()
            ),
        ))
    }
}

/// Reads 4 bytes at `at`; callers have validated the length, and a short read is still an error
/// rather than a panic.
pub(super) fn get4(c: &Compressor, payload: &[u8], at: usize) -> Result<[u8; 4]> {
    payload
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| bad_payload(c, format!("truncated at byte {at}")))
}

pub(super) fn get_f32(c: &Compressor, payload: &[u8], at: usize) -> Result<f32> {
    Ok(f32::from_le_bytes(get4(c, payload, at)?))
}

pub(super) fn get_u32(c: &Compressor, payload: &[u8], at: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(get4(c, payload, at)?))
}

/// Reinterprets whole 4-byte groups as f32 values.
pub(crate) fn f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Writes f32 values into 4-byte groups.
pub(crate) fn put_f32s(dst: &mut [u8], values: impl IntoIterator<Item = f32>) {
    for (d, v) in dst.chunks_exact_mut(4).zip(values) {
        d.copy_from_slice(&v.to_le_bytes());
    }
}

/// Sums two equally long f32 payloads in place (fp32, random-k and PowerSGD allreduce).
pub(super) fn sum_f32_payloads(c: &Compressor, acc: &mut [u8], other: &[u8]) -> Result<()> {
    if acc.len() != other.len() || !acc.len().is_multiple_of(4) {
        return Err(bad_payload(
            c,
            format!(
                "cannot sum payloads of {} and {} bytes",
                acc.len(),
                other.len()
            ),
        ));
    }
    for (a, b) in acc.chunks_exact_mut(4).zip(other.chunks_exact(4)) {
        let s = f32::from_le_bytes([a[0], a[1], a[2], a[3]])
            + f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        a.copy_from_slice(&s.to_le_bytes());
    }
    Ok(())
}
