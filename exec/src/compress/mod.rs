//! CPU gradient-compression kernels behind one `Codec` trait.
//!
//! Each is built by the family the simulator's compressor catalog names.
//!
//! One file per family (`cast`, `sparse`, `sampled`, `quantize`, `sign`, `powersgd`), whose
//! `codec` handles its members: a new compressor of an existing family touches only that file.
//!
//! Every codec writes a real little-endian byte payload (formats in `exec/WIRE_FORMAT.md`), whose
//! length is exactly `Compressor::wire_bytes`. Decoding adds into an accumulator so that
//! aggregating p workers is p `decode_add`s (allgather) or one on a payload summed in its wire
//! type (allreduce).

mod bits;
pub mod calls;
mod cast;
#[cfg(target_arch = "x86_64")]
mod f16c;
pub mod memory;
pub mod minifloat;
pub(crate) mod powersgd;
pub(crate) mod quantize;
pub mod rng;
pub mod sampled;
pub(crate) mod scan;
mod sign;
pub(crate) mod sparse;
pub(crate) mod wire;

use crate::error::{ExecError, Result};
use syncopate_sim::compress::{Aggregation, Compressor, Family};

pub use memory::MemoryState;
pub use scan::check_all as check_finite;

/// One worker's encoder/decoder for one tensor (or fused group). Stateful compressors (signum
/// momentum, PowerSGD's Q, random-k's step counter, DGC's sampling RNG) keep their state here.
pub trait Codec: Send {
    /// The compressor this codec implements.
    fn compressor(&self) -> Compressor;

    /// Encodes this worker's gradient into `out` (replacing its contents). Non-finite input is an
    /// error naming the element.
    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()>;

    /// Encodes into `out`, a buffer of exactly the payload's length (an exchange's, so that
    /// the payload is exchanged where it was written). Codecs that convert element by element
    /// write it in place; the others encode into `scratch` and copy.
    fn encode_into(&mut self, grad: &[f32], out: &mut [u8], scratch: &mut Vec<u8>) -> Result<()> {
        self.encode(grad, scratch)?;
        if scratch.len() != out.len() {
            return Err(wire::bad_payload(
                &self.compressor(),
                format!(
                    "a payload of {} bytes does not fit a buffer of {}",
                    scratch.len(),
                    out.len()
                ),
            ));
        }
        out.copy_from_slice(scratch);
        Ok(())
    }

    /// Adds the decoded payload into `acc`. For allreduce codecs the payload may be the sum of
    /// p payloads; for PowerSGD it is the reduced payload of the last round.
    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()>;

    /// Adds the decoded payload of call `call` alone (its bytes only) into that call's
    /// elements of `acc`, the whole buffer's: what the rank that keeps a chunk decodes of every
    /// rank's payload after an all-to-all reduce-scatter. Only a codec of several calls has one.
    fn decode_call_add(&mut self, call: usize, _payload: &[u8], _acc: &mut [f32]) -> Result<()> {
        Err(ExecError::Protocol {
            compressor: self.compressor().to_string(),
            message: format!("has one codec call, not a call {call} of several"),
        })
    }

    /// Encodes `values`, the elements of call `call` alone, into `out` as that call's codec
    /// does (replacing its contents): what the rank that collects a chunk in a two-hop
    /// all-to-all reduce-scatter sends on of the node's sum. Only a codec of several calls has
    /// one.
    fn encode_call(&mut self, call: usize, _values: &[f32], _out: &mut Vec<u8>) -> Result<()> {
        Err(ExecError::Protocol {
            compressor: self.compressor().to_string(),
            message: format!("has one codec call, not a call {call} of several"),
        })
    }

    /// Adds `other` into `acc` in the wire type, as an allreduce would.
    fn sum_into(&self, _acc: &mut [u8], _other: &[u8]) -> Result<()> {
        Err(ExecError::NotSummable {
            compressor: self.compressor().to_string(),
        })
    }

    /// Multi-round codecs (PowerSGD): from the reduced payload of the previous round, writes
    /// this worker's payload for the next one.
    fn next_round(&mut self, _reduced: &[u8], _out: &mut Vec<u8>) -> Result<()> {
        Err(ExecError::Protocol {
            compressor: self.compressor().to_string(),
            message: "has a single round".into(),
        })
    }
}

/// What a family's constructor builds a codec for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Build<'a> {
    pub compressor: Compressor,
    /// The group's tensors, laid out one after another; none for one flat buffer.
    pub shapes: &'a [&'a [u64]],
    /// Drives the stochastic codecs.
    pub seed: u64,
}

/// A codec for a flat fp32 buffer. `seed` drives the stochastic codecs; workers that must agree
/// (`Compressor::shared_seed`: random-k indices, PowerSGD's initial Q) need the same seed, the
/// others should differ. A flat buffer is 1-D, so PowerSGD sends it raw; use
/// [`codec_for_shapes`] for matrices.
pub fn codec_for(c: &Compressor, seed: u64) -> Box<dyn Codec> {
    codec_for_shapes(c, &[], seed)
}

/// A codec for a fused group of tensors with these shapes, laid out one after another.
/// Only PowerSGD uses the shapes (one low-rank matrix per tensor of two or more dimensions).
/// The catalog's family of the compressor builds it.
pub fn codec_for_shapes(c: &Compressor, shapes: &[&[u64]], seed: u64) -> Box<dyn Codec> {
    let build = Build {
        compressor: *c,
        shapes,
        seed,
    };
    match c.family() {
        Family::Cast => cast::codec(&build),
        Family::Sparse => sparse::codec(&build),
        Family::Sampled => sampled::codec(&build),
        Family::Quantize => quantize::codec(&build),
        Family::Sign => sign::codec(&build),
        Family::PowerSgd => powersgd::codec(&build),
    }
}

/// A family constructor's answer to a compressor of another family: the catalog assigns every
/// compressor one family, and `tests/compression.rs` builds every catalog row's codec.
fn not_in_family(c: Compressor, family: &str) -> ! {
    unreachable!("`{c}` is not in the {family} family (see the compressor catalog)")
}

/// Encodes and decodes one worker's gradient alone (p = 1): what error feedback subtracts.
/// `out` receives decode(encode(grad)); `payload` is scratch and ends holding the last round.
pub fn roundtrip(
    codec: &mut dyn Codec,
    grad: &[f32],
    payload: &mut Vec<u8>,
    out: &mut [f32],
) -> Result<()> {
    codec.encode(grad, payload)?;
    let mut next = Vec::new();
    for _ in 1..codec.compressor().allreduce_rounds() {
        codec.next_round(payload, &mut next)?;
        std::mem::swap(payload, &mut next);
    }
    out.fill(0.0);
    codec.decode_add(payload, out)
}

/// Aggregates p workers' gradients through their real payloads with the compressor's default
/// rule, writing each worker's view of the summed gradient into `outs[w]`. Returns the bytes
/// each worker sent. Allreduce payloads are summed in their wire type; allgathered ones are
/// decoded one by one (every worker decodes the same p payloads, so worker 0's result is copied).
pub fn aggregate(
    codecs: &mut [Box<dyn Codec>],
    grads: &[&[f32]],
    outs: &mut [Vec<f32>],
) -> Result<u64> {
    let Some(first) = codecs.first() else {
        return Ok(0);
    };
    let c = first.compressor();
    if codecs.len() != grads.len() || codecs.len() != outs.len() {
        return Err(ExecError::Protocol {
            compressor: c.to_string(),
            message: format!(
                "{} codecs, {} gradients and {} outputs: one of each per worker",
                codecs.len(),
                grads.len(),
                outs.len()
            ),
        });
    }
    let mut payloads = vec![Vec::new(); codecs.len()];
    for ((codec, grad), payload) in codecs.iter_mut().zip(grads).zip(&mut payloads) {
        codec.encode(grad, payload)?;
    }
    let mut sent: u64 = payloads[0].len() as u64;
    for out in outs.iter_mut() {
        out.fill(0.0);
    }
    match c.aggregation() {
        Aggregation::Allreduce => {
            let mut reduced = sum_payloads(codecs, &payloads)?;
            for _ in 1..c.allreduce_rounds() {
                for (codec, payload) in codecs.iter_mut().zip(&mut payloads) {
                    codec.next_round(&reduced, payload)?;
                }
                sent += payloads[0].len() as u64;
                reduced = sum_payloads(codecs, &payloads)?;
            }
            for (codec, out) in codecs.iter_mut().zip(outs.iter_mut()) {
                codec.decode_add(&reduced, out)?;
            }
        }
        Aggregation::Allgather | Aggregation::ParameterServer => {
            let (first, rest) = outs.split_at_mut(1);
            for payload in &payloads {
                codecs[0].decode_add(payload, &mut first[0])?;
            }
            for out in rest {
                out.copy_from_slice(&first[0]);
            }
        }
    }
    Ok(sent)
}

fn sum_payloads(codecs: &[Box<dyn Codec>], payloads: &[Vec<u8>]) -> Result<Vec<u8>> {
    let mut reduced = payloads[0].clone();
    for other in &payloads[1..] {
        codecs[0].sum_into(&mut reduced, other)?;
    }
    Ok(reduced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate_sim::compress::catalog;

    /// Encoding into an exchange's buffer writes the same bytes as encoding into a payload, for
    /// every catalog example (the in-place casts and the others' copy alike); a buffer of
    /// another length is refused.
    #[test]
    fn encode_into_writes_the_payloads_bytes() {
        let grad: Vec<f32> = (0..4099).map(|i| ((i as f32) * 0.61).sin() * 2.5).collect();
        for entry in catalog() {
            let c: Compressor = entry.example.parse().unwrap();
            let mut payload = Vec::new();
            codec_for(&c, 7).encode(&grad, &mut payload).unwrap();
            let mut out = vec![0xAAu8; payload.len()];
            let mut scratch = Vec::new();
            codec_for(&c, 7)
                .encode_into(&grad, &mut out, &mut scratch)
                .unwrap();
            assert_eq!(out, payload, "{c}");
            let mut short = vec![0u8; payload.len() - 1];
            let err = codec_for(&c, 7).encode_into(&grad, &mut short, &mut scratch);
            assert!(err.is_err(), "{c}: a short buffer was accepted");
        }
    }
}
