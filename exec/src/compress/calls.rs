//! A fused buffer compressed tensor by tensor: one codec per tensor, their payloads in sequence.
//!
//! The payloads follow one after another; this is a plan's `codec_calls: tensor`.
//!
//! Horovod's `Compression`, GRACE and MergeComp's layer-wise baseline compress each gradient
//! before the fused collective carries it. Every call's payload keeps its own format and
//! headers (`exec/WIRE_FORMAT.md`), so the buffer's payload is their concatenation and each
//! call's bytes are `Compressor::wire_bytes` of its elements: no length prefix is needed (plans
//! refuse the one compressor whose length depends on the data, `Compressor::splits_into_calls`).

use super::{wire, Codec};
use crate::error::Result;
use std::ops::Range;
use syncopate_sim::compress::Compressor;

/// Each call's elements of the buffer and bytes of the payload, for calls of `numels` elements
/// of `compressor` one after another.
pub fn call_ranges(compressor: &Compressor, numels: &[u64]) -> Vec<(Range<usize>, Range<usize>)> {
    let (mut elements, mut bytes) = (0usize, 0usize);
    numels
        .iter()
        .map(|&n| {
            let (n, size) = (n as usize, compressor.wire_bytes(n) as usize);
            let ranges = (elements..elements + n, bytes..bytes + size);
            (elements, bytes) = (ranges.0.end, ranges.1.end);
            ranges
        })
        .collect()
}

/// One call: its elements of the buffer, its bytes of the payload, its codec.
struct Call {
    elements: Range<usize>,
    bytes: Range<usize>,
    codec: Box<dyn Codec>,
}

/// Codecs over consecutive tensors of one buffer.
pub struct PerTensor {
    compressor: Compressor,
    calls: Vec<Call>,
    elements: usize,
    bytes: usize,
    scratch: Vec<u8>,
}

impl PerTensor {
    /// Codecs of `compressor` over consecutive tensors of `numels` elements, the i-th made by
    /// `codec(i)`.
    pub fn new(
        compressor: Compressor,
        numels: &[u64],
        mut codec: impl FnMut(usize) -> Box<dyn Codec>,
    ) -> PerTensor {
        let calls: Vec<Call> = call_ranges(&compressor, numels)
            .into_iter()
            .enumerate()
            .map(|(i, (elements, bytes))| Call {
                elements,
                bytes,
                codec: codec(i),
            })
            .collect();
        let (elements, bytes) = calls
            .last()
            .map_or((0, 0), |c| (c.elements.end, c.bytes.end));
        PerTensor {
            compressor,
            calls,
            elements,
            bytes,
            scratch: Vec::new(),
        }
    }

    /// Call `call`, or an error naming it, when what it is given (`len` of them) is its `part`.
    fn call(
        &mut self,
        call: usize,
        (len, what): (usize, &str),
        part: impl Fn(&Call) -> &Range<usize>,
    ) -> Result<&mut Call> {
        let calls = self.calls.len();
        let bad = |message| wire::bad_payload(&self.compressor, message);
        let Some(found) = self.calls.get(call) else {
            return Err(bad(format!("no call {call}: the buffer has {calls}")));
        };
        let want = part(found).len();
        if len != want {
            return Err(bad(format!("{len} {what} for a call of {want} {what}")));
        }
        Ok(&mut self.calls[call])
    }

    /// An error unless `payload` holds every call's bytes and `values` every call's elements.
    fn check(&self, payload: usize, values: usize) -> Result<()> {
        if payload == self.bytes && values == self.elements {
            return Ok(());
        }
        Err(wire::bad_payload(
            &self.compressor,
            format!(
                "{payload} bytes for {values} elements, where its {} tensors take {} bytes for {} elements",
                self.calls.len(),
                self.bytes,
                self.elements
            ),
        ))
    }
}

impl Codec for PerTensor {
    fn compressor(&self) -> Compressor {
        self.compressor
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        out.resize(self.bytes, 0);
        let mut scratch = std::mem::take(&mut self.scratch);
        let encoded = self.encode_into(grad, out, &mut scratch);
        self.scratch = scratch;
        encoded
    }

    fn encode_into(&mut self, grad: &[f32], out: &mut [u8], scratch: &mut Vec<u8>) -> Result<()> {
        self.check(out.len(), grad.len())?;
        for call in &mut self.calls {
            call.codec.encode_into(
                &grad[call.elements.clone()],
                &mut out[call.bytes.clone()],
                scratch,
            )?;
        }
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        self.check(payload.len(), acc.len())?;
        for call in &mut self.calls {
            call.codec.decode_add(
                &payload[call.bytes.clone()],
                &mut acc[call.elements.clone()],
            )?;
        }
        Ok(())
    }

    fn encode_call(&mut self, call: usize, values: &[f32], out: &mut Vec<u8>) -> Result<()> {
        let call = self.call(call, (values.len(), "elements"), |c| &c.elements)?;
        call.codec.encode(values, out)
    }

    fn decode_call_add(&mut self, call: usize, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        self.check(self.bytes, acc.len())?;
        let call = self.call(call, (payload.len(), "bytes"), |c| &c.bytes)?;
        call.codec
            .decode_add(payload, &mut acc[call.elements.clone()])
    }

    /// A summable payload is its wire type's elements and nothing else (fp16, bf16, random-k's
    /// values), so the calls' payloads one after another sum element by element as one: any
    /// call's codec sums any run of them, as a ring sums its chunks.
    fn sum_into(&self, acc: &mut [u8], other: &[u8]) -> Result<()> {
        match self.calls.first() {
            Some(call) => call.codec.sum_into(acc, other),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::codec_for;

    fn gradient(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect()
    }

    /// Each tensor's part of the payload and of the result is what a codec of that tensor
    /// alone makes: per-tensor headers, scales and top-k selections.
    #[test]
    fn each_tensor_is_compressed_as_if_alone() {
        let numels = [1000u64, 37, 4096];
        let grad = gradient(5133);
        for spec in [
            "topk:0.01",
            "efsignsgd",
            "qsgd:256",
            "fp16",
            "onebit",
            "int8:100",
        ] {
            let c: Compressor = spec.parse().unwrap();
            let mut fused = PerTensor::new(c, &numels, |i| codec_for(&c, i as u64));
            let mut payload = Vec::new();
            fused.encode(&grad, &mut payload).unwrap();
            let mut result = vec![0.0; grad.len()];
            fused.decode_add(&payload, &mut result).unwrap();
            let (mut at, mut byte) = (0, 0);
            for (i, &n) in numels.iter().enumerate() {
                let n = n as usize;
                let mut alone = codec_for(&c, i as u64);
                let mut own = Vec::new();
                alone.encode(&grad[at..at + n], &mut own).unwrap();
                assert_eq!(
                    payload[byte..byte + own.len()],
                    own[..],
                    "{spec} tensor {i}"
                );
                let mut decoded = vec![0.0; n];
                alone.decode_add(&own, &mut decoded).unwrap();
                assert_eq!(result[at..at + n], decoded[..], "{spec} tensor {i}");
                // A call alone encodes as it does among the others, and its payload alone
                // decodes into its elements and nowhere else.
                let mut again = Vec::new();
                let mut fresh = PerTensor::new(c, &numels, |i| codec_for(&c, i as u64));
                fresh.encode_call(i, &grad[at..at + n], &mut again).unwrap();
                assert_eq!(again, own, "{spec} tensor {i}");
                let mut one = vec![0.0; grad.len()];
                fused.decode_call_add(i, &own, &mut one).unwrap();
                assert_eq!(one[at..at + n], decoded[..], "{spec} tensor {i}");
                assert!(one[..at].iter().chain(&one[at + n..]).all(|&x| x == 0.0));
                at += n;
                byte += own.len();
            }
            assert_eq!(byte, payload.len(), "{spec}");
            let mut acc = vec![0.0; grad.len()];
            assert!(fused.decode_call_add(3, &[], &mut acc).is_err());
            assert!(fused.decode_call_add(0, &payload, &mut acc).is_err());
        }
    }

    #[test]
    fn summable_payloads_sum_tensor_by_tensor() {
        let c = Compressor::Fp16;
        let numels = [3u64, 5];
        let codec = PerTensor::new(c, &numels, |_| codec_for(&c, 0));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut encoder = PerTensor::new(c, &numels, |_| codec_for(&c, 0));
        encoder.encode(&[1.0; 8], &mut a).unwrap();
        encoder.encode(&[2.0; 8], &mut b).unwrap();
        codec.sum_into(&mut a, &b).unwrap();
        let mut sum = vec![0.0; 8];
        encoder.decode_add(&a, &mut sum).unwrap();
        assert_eq!(sum, vec![3.0; 8]);
    }

    #[test]
    fn a_payload_of_another_size_is_an_error_naming_the_sizes() {
        let c = Compressor::SignSgd;
        let mut codec = PerTensor::new(c, &[10, 20], |_| codec_for(&c, 0));
        let err = codec.decode_add(&[0u8; 3], &mut [0.0; 30]).unwrap_err();
        assert!(err.to_string().contains("3 bytes for 30 elements"), "{err}");
        let err = codec.encode(&[0.0; 29], &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("29 elements"), "{err}");
    }
}
