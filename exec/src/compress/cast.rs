//! Cast codecs: fp32 as is, fp16 and bf16 (summable), fp8 e4m3/e5m2 with a per-tensor scale,
//! int8 and int4 with a scale per block.
//!
//! Wire formats: `none` n × f32; `fp16`/`bf16` n × u16; `fp8` f32 scale then n × u8 codes,
//! value = fp8(code) · scale with scale = max|x| / max-representable; `int8:B` one f32 scale
//! per block of B elements (max|x| / 127 over the block), then n × i8 codes, value = code ·
//! its block's scale; `int4:B` the same with max|x| / 7 and two's-complement 4-bit codes, two a
//! byte, the first in the low half.

#[cfg(target_arch = "x86_64")]
use super::f16c;
use super::minifloat::{self, E4M3_MAX, E5M2_MAX};
use super::scan::{check_finite, max_abs, CHUNK};
use super::wire::{bad_payload, expect_len, f32s, get_f32, put_f32s, sum_f32_payloads};
use super::{not_in_family, Build, Codec};
use crate::error::Result;
use syncopate_sim::compress::{Compressor, Element, Fp8Format};

pub(crate) fn codec(build: &Build) -> Box<dyn Codec> {
    match build.compressor {
        c @ (Compressor::None | Compressor::Fp16 | Compressor::Bf16) => Box::new(Cast { c }),
        Compressor::Fp8(format) => Box::new(Fp8::new(format)),
        Compressor::Int8 { block } => Box::new(IntBlocks {
            c: build.compressor,
            block: block as usize,
            bits: 8,
        }),
        Compressor::Int4 { block } => Box::new(IntBlocks {
            c: build.compressor,
            block: block as usize,
            bits: 4,
        }),
        other => not_in_family(other, "cast"),
    }
}

/// none, fp16 and bf16: element-wise casts whose payloads sum in their wire type.
struct Cast {
    c: Compressor,
}

/// Encodes chunk by chunk so the finiteness check and the conversion share one pass over memory;
/// `out` holds exactly `W` bytes per element.
fn encode_elements<const W: usize>(
    grad: &[f32],
    out: &mut [u8],
    convert: impl Fn(f32) -> [u8; W],
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2.
        return unsafe { encode_elements_avx2(grad, out, convert) };
    }
    encode_elements_impl(grad, out, convert)
}

/// [`encode_elements_impl`] compiled for AVX2: the same integer arithmetic in wider lanes, so
/// the same bytes (three times faster than the baseline target's on the lab's CPU).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn encode_elements_avx2<const W: usize>(
    grad: &[f32],
    out: &mut [u8],
    convert: impl Fn(f32) -> [u8; W],
) -> Result<()> {
    encode_elements_impl(grad, out, convert)
}

#[inline(always)]
fn encode_elements_impl<const W: usize>(
    grad: &[f32],
    out: &mut [u8],
    convert: impl Fn(f32) -> [u8; W],
) -> Result<()> {
    encode_checked::<W>(grad, out, |src, dst| {
        for (d, &x) in dst.chunks_exact_mut(W).zip(src) {
            d.copy_from_slice(&convert(x));
        }
    })
}

/// Runs `kernel` on `grad` and `out` chunk by chunk, each chunk checked finite first (while it
/// is in L1 for the kernel); `out` holds `W` bytes per element.
#[inline(always)]
fn encode_checked<const W: usize>(
    grad: &[f32],
    out: &mut [u8],
    kernel: impl Fn(&[f32], &mut [u8]),
) -> Result<()> {
    for (c, (src, dst)) in grad
        .chunks(CHUNK)
        .zip(out.chunks_mut(CHUNK * W))
        .enumerate()
    {
        check_finite(src, c * CHUNK)?;
        kernel(src, dst);
    }
    Ok(())
}

/// fp16 codes of `grad`: the F16C instructions where the CPU has them (same bytes).
fn encode_half(grad: &[f32], out: &mut [u8]) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if f16c::available() {
        // SAFETY: the CPU supports F16C and AVX.
        return encode_checked::<2>(grad, out, |src, dst| unsafe { f16c::encode(src, dst) });
    }
    encode_elements(grad, out, half_encode)
}

/// Adds the fp16 codes of `payload` to `acc`: the F16C instructions where the CPU has them
/// (same sums).
fn decode_half(payload: &[u8], acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if f16c::available() {
        // SAFETY: the CPU supports F16C and AVX.
        return unsafe { f16c::decode_add(payload, acc) };
    }
    decode_elements(payload, acc, half_decode)
}

fn decode_elements<const W: usize>(
    payload: &[u8],
    acc: &mut [f32],
    convert: impl Fn([u8; W]) -> f32,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2.
        return unsafe { decode_elements_avx2(payload, acc, convert) };
    }
    decode_elements_impl(payload, acc, convert)
}

/// [`decode_elements_impl`] compiled for AVX2: the same arithmetic, so the same sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_elements_avx2<const W: usize>(
    payload: &[u8],
    acc: &mut [f32],
    convert: impl Fn([u8; W]) -> f32,
) {
    decode_elements_impl(payload, acc, convert)
}

#[inline(always)]
fn decode_elements_impl<const W: usize>(
    payload: &[u8],
    acc: &mut [f32],
    convert: impl Fn([u8; W]) -> f32,
) {
    for (a, b) in acc.iter_mut().zip(payload.chunks_exact(W)) {
        let mut word = [0u8; W];
        word.copy_from_slice(b);
        *a += convert(word);
    }
}

#[inline(always)]
fn half_encode(x: f32) -> [u8; 2] {
    minifloat::f32_to_f16(x).to_le_bytes()
}

#[inline(always)]
fn half_decode(b: [u8; 2]) -> f32 {
    minifloat::f16_to_f32(u16::from_le_bytes(b))
}

#[inline(always)]
fn brain_encode(x: f32) -> [u8; 2] {
    minifloat::f32_to_bf16(x).to_le_bytes()
}

#[inline(always)]
fn brain_decode(b: [u8; 2]) -> f32 {
    minifloat::bf16_to_f32(u16::from_le_bytes(b))
}

/// Sums two 16-bit payloads as NCCL does for half types: add in f32, round back (saturating).
fn sum16(acc: &mut [u8], other: &[u8], dec: fn([u8; 2]) -> f32, enc: fn(f32) -> [u8; 2]) {
    for (a, b) in acc.chunks_exact_mut(2).zip(other.chunks_exact(2)) {
        let s = dec([a[0], a[1]]) + dec([b[0], b[1]]);
        a.copy_from_slice(&enc(s));
    }
}

impl Codec for Cast {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        out.resize(self.c.wire_bytes(grad.len() as u64) as usize, 0);
        self.encode_into(grad, out, &mut Vec::new())
    }

    fn encode_into(&mut self, grad: &[f32], out: &mut [u8], _scratch: &mut Vec<u8>) -> Result<()> {
        expect_len(&self.c, out, grad.len())?;
        match self.c {
            Compressor::Fp16 => encode_half(grad, out),
            Compressor::Bf16 => encode_elements(grad, out, brain_encode),
            _ => encode_elements(grad, out, f32::to_le_bytes),
        }
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        expect_len(&self.c, payload, acc.len())?;
        match self.c {
            Compressor::Fp16 => decode_half(payload, acc),
            Compressor::Bf16 => decode_elements(payload, acc, brain_decode),
            _ => decode_elements(payload, acc, f32::from_le_bytes),
        }
        Ok(())
    }

    fn sum_into(&self, acc: &mut [u8], other: &[u8]) -> Result<()> {
        if acc.len() != other.len() {
            return Err(bad_payload(
                &self.c,
                format!(
                    "cannot sum payloads of {} and {} bytes",
                    acc.len(),
                    other.len()
                ),
            ));
        }
        // In the element type the catalog names, as NCCL sums the same payload on the GPU.
        match self.c.summed_as() {
            Some(Element::F16) => sum16(acc, other, half_decode, half_encode),
            Some(Element::Bf16) => sum16(acc, other, brain_decode, brain_encode),
            _ => return sum_f32_payloads(&self.c, acc, other),
        }
        Ok(())
    }
}

/// fp8 with a per-tensor scale; decoding goes through a 256-entry table.
struct Fp8 {
    c: Compressor,
    format: Fp8Format,
    table: [f32; 256],
}

impl Fp8 {
    fn new(format: Fp8Format) -> Fp8 {
        let mut table = [0.0f32; 256];
        for (code, v) in table.iter_mut().enumerate() {
            *v = match format {
                Fp8Format::E4m3 => minifloat::e4m3_to_f32(code as u8),
                Fp8Format::E5m2 => minifloat::e5m2_to_f32(code as u8),
            };
        }
        Fp8 {
            c: Compressor::Fp8(format),
            format,
            table,
        }
    }
}

fn encode_scaled(src: &[f32], dst: &mut [u8], inv: f32, convert: impl Fn(f32) -> u8) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = convert(x * inv);
    }
}

impl Codec for Fp8 {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        let max_repr = match self.format {
            Fp8Format::E4m3 => E4M3_MAX,
            Fp8Format::E5m2 => E5M2_MAX,
        };
        let max = max_abs(grad)?;
        // A zero tensor gets scale 0 and all-zero codes; otherwise max|x| maps to the largest
        // finite fp8 value (the product may round just above it and then saturates).
        let (scale, inv) = if max > 0.0 {
            (max / max_repr, max_repr / max)
        } else {
            (0.0, 0.0)
        };
        out.resize(4 + grad.len(), 0);
        out[..4].copy_from_slice(&scale.to_le_bytes());
        let body = &mut out[4..];
        match self.format {
            Fp8Format::E4m3 => encode_scaled(grad, body, inv, minifloat::f32_to_e4m3),
            Fp8Format::E5m2 => encode_scaled(grad, body, inv, minifloat::f32_to_e5m2),
        }
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        expect_len(&self.c, payload, acc.len())?;
        let scale = get_f32(&self.c, payload, 0)?;
        for (a, &code) in acc.iter_mut().zip(&payload[4..]) {
            *a += self.table[code as usize] * scale;
        }
        Ok(())
    }
}

/// int8 or int4 with a scale per block of `block` elements, symmetric: the block's max|x| maps
/// to the largest code (127, 7).
struct IntBlocks {
    c: Compressor,
    block: usize,
    bits: u32,
}

impl IntBlocks {
    fn largest(&self) -> f32 {
        ((1 << (self.bits - 1)) - 1) as f32
    }

    /// Code `i` of `codes`.
    fn code(&self, codes: &[u8], i: usize) -> i8 {
        match self.bits {
            8 => codes[i] as i8,
            // Sign-extend the half byte.
            _ => ((codes[i / 2] >> (4 * (i % 2))) << 4) as i8 >> 4,
        }
    }
}

impl Codec for IntBlocks {
    fn compressor(&self) -> Compressor {
        self.c
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) -> Result<()> {
        let blocks = grad.len().div_ceil(self.block);
        out.clear();
        out.resize(self.c.wire_bytes(grad.len() as u64) as usize, 0);
        let (scales, codes) = out.split_at_mut(4 * blocks);
        let largest = self.largest();
        let mut block_scales = Vec::with_capacity(blocks);
        for (b, block) in grad.chunks(self.block).enumerate() {
            let max = max_abs(block)?;
            // A zero block gets scale 0 and zero codes; otherwise |x| ≤ max rounds into range.
            let (scale, inv) = match max > 0.0 {
                true => (max / largest, largest / max),
                false => (0.0, 0.0),
            };
            block_scales.push(scale);
            for (j, &x) in block.iter().enumerate() {
                let code = (x * inv).round_ties_even().clamp(-largest, largest) as i8 as u8;
                let i = b * self.block + j;
                match self.bits {
                    8 => codes[i] = code,
                    _ => codes[i / 2] |= (code & 0xF) << (4 * (i % 2)),
                }
            }
        }
        put_f32s(scales, block_scales);
        Ok(())
    }

    fn decode_add(&mut self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        expect_len(&self.c, payload, acc.len())?;
        let (scales, codes) = payload.split_at(4 * acc.len().div_ceil(self.block));
        for (b, (acc, scale)) in acc.chunks_mut(self.block).zip(f32s(scales)).enumerate() {
            for (j, a) in acc.iter_mut().enumerate() {
                *a += f32::from(self.code(codes, b * self.block + j)) * scale;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cast(c: Compressor) -> Box<dyn Codec> {
        codec(&Build {
            compressor: c,
            shapes: &[],
            seed: 0,
        })
    }

    /// Finite f32 bit patterns of both signs (every 4099th) and the largest magnitudes, which
    /// saturate in fp16: what the fast conversion loops are checked on.
    #[cfg(target_arch = "x86_64")]
    fn swept_f32s() -> Vec<f32> {
        let mut grad: Vec<f32> = (0..0x7F80_0000u32)
            .step_by(4099)
            .flat_map(|bits| [f32::from_bits(bits), -f32::from_bits(bits)])
            .collect();
        grad.extend([f32::MAX, -f32::MAX, 65504.0, 65519.99, 65520.0]);
        grad
    }

    /// The AVX2 build of the conversion loops gives the baseline build's bytes and sums: every
    /// 16-bit code decoded, and a sweep of finite f32 bit patterns (every 4099th, plus the
    /// largest magnitudes, which saturate) encoded.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_loops_match_the_baseline() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("skipped: no AVX2");
            return;
        }
        let grad = swept_f32s();
        let codes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        type Encode = fn(f32) -> [u8; 2];
        type Decode = fn([u8; 2]) -> f32;
        let pairs: [(Encode, Decode); 2] =
            [(half_encode, half_decode), (brain_encode, brain_decode)];
        for (encode, decode) in pairs {
            let mut fast = vec![0u8; grad.len() * 2];
            let mut base = vec![0u8; grad.len() * 2];
            // SAFETY: the CPU supports AVX2 (checked above).
            unsafe { encode_elements_avx2(&grad, &mut fast, encode) }.unwrap();
            encode_elements_impl(&grad, &mut base, encode).unwrap();
            assert_eq!(fast, base);
            let mut fast = vec![1.5f32; codes.len() / 2];
            let mut base = fast.clone();
            // SAFETY: as above.
            unsafe { decode_elements_avx2(&codes, &mut fast, decode) };
            decode_elements_impl(&codes, &mut base, decode);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&base));
        }
    }

    /// The fp16 codec's F16C path gives the integer arithmetic's bytes and sums: every 16-bit
    /// code decoded (onto an accumulator, as decode does), a sweep of finite f32 bit patterns
    /// encoded (every 4099th, the largest magnitudes, which saturate, and every tie between
    /// subnormals), and lengths that leave a tail shorter than a block. (Every finite f32 was
    /// checked once outside the tests.)
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16c_loops_match_the_integer_arithmetic() {
        if !f16c::available() {
            eprintln!("skipped: no F16C");
            return;
        }
        let mut grad = swept_f32s();
        grad.extend([-65520.0, 0.0, -0.0]);
        // Halfway between neighbouring fp16 subnormals, up to the smallest normal value.
        grad.extend((0..1024).map(|k| (k as f32 + 0.5) * 2f32.powi(-24)));
        for len in [grad.len(), grad.len() - 3, 7] {
            let grad = &grad[..len];
            let mut fast = vec![0u8; len * 2];
            let mut base = vec![0u8; len * 2];
            encode_half(grad, &mut fast).unwrap();
            encode_elements_impl(grad, &mut base, half_encode).unwrap();
            assert_eq!(fast, base, "{len} elements");
        }
        let codes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        for len in [codes.len() / 2, codes.len() / 2 - 5] {
            let mut fast = vec![1.5f32; len];
            let mut base = fast.clone();
            decode_half(&codes[..len * 2], &mut fast);
            decode_elements_impl(&codes[..len * 2], &mut base, half_decode);
            for (i, (f, b)) in fast.iter().zip(&base).enumerate() {
                assert!(
                    f.to_bits() == b.to_bits() || (f.is_nan() && b.is_nan()),
                    "code {i}: {f} {b}"
                );
            }
        }
    }

    fn roundtrip(c: Compressor, g: &[f32]) -> Vec<f32> {
        let mut codec = cast(c);
        let mut payload = Vec::new();
        codec.encode(g, &mut payload).unwrap();
        assert_eq!(payload.len() as u64, c.wire_bytes(g.len() as u64));
        let mut out = vec![0.0; g.len()];
        codec.decode_add(&payload, &mut out).unwrap();
        out
    }

    #[test]
    fn relative_errors_within_format_precision() {
        let g: Vec<f32> = (0..5000).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        assert_eq!(roundtrip(Compressor::None, &g), g);
        let max = 3.0f32;
        for (c, rel) in [
            (Compressor::Fp16, 2f32.powi(-11)),
            (Compressor::Bf16, 2f32.powi(-8)),
        ] {
            for (x, y) in g.iter().zip(roundtrip(c, &g)) {
                assert!((x - y).abs() <= x.abs() * rel + 1e-7, "{c} {x} {y}");
            }
        }
        // fp8: relative 2^-(M+1) in the normal range, absolute half a subnormal step below it.
        for (c, rel, tiny) in [
            (
                Compressor::Fp8(Fp8Format::E4m3),
                2f32.powi(-4),
                max / 448.0 * 2f32.powi(-10),
            ),
            (
                Compressor::Fp8(Fp8Format::E5m2),
                2f32.powi(-3),
                max / 57344.0 * 2f32.powi(-17),
            ),
        ] {
            for (x, y) in g.iter().zip(roundtrip(c, &g)) {
                assert!((x - y).abs() <= x.abs() * rel + tiny, "{c} {x} {y}");
            }
        }
    }

    #[test]
    fn zero_tensor_and_sums() {
        let z = vec![0.0f32; 9];
        assert_eq!(roundtrip(Compressor::Fp8(Fp8Format::E4m3), &z), z);
        let c = Compressor::Fp16;
        let codec = cast(c);
        let mut a = vec![0u8; 4];
        let mut b = vec![0u8; 4];
        a[..2].copy_from_slice(&half_encode(60000.0));
        b[..2].copy_from_slice(&half_encode(60000.0));
        codec.sum_into(&mut a, &b).unwrap();
        assert_eq!(half_decode([a[0], a[1]]), 65504.0, "saturates, never inf");
        assert!(codec.sum_into(&mut a, &b[..2]).is_err());
    }

    /// Each block keeps its own scale: an element is within half its block's step
    /// (max|x| / 254 in int8, / 14 in int4) of its value, a block's largest magnitude comes back
    /// exactly up to the f32 rounding of its scale, and a zero block stays zero beside a large
    /// one. An odd count leaves int4's last half byte empty.
    #[test]
    fn int_blocks_round_to_half_their_own_step() {
        let block = 100;
        for (c, steps) in [
            (Compressor::Int8 { block: 100 }, 254.0),
            (Compressor::Int4 { block: 100 }, 14.0),
        ] {
            int_blocks_round(c, block, steps);
        }
    }

    fn int_blocks_round(c: Compressor, block: usize, steps: f32) {
        let mut g: Vec<f32> = (0..1051).map(|i| ((i as f32) * 0.37).sin()).collect();
        for (b, chunk) in g.chunks_mut(block).enumerate() {
            chunk
                .iter_mut()
                .for_each(|x| *x *= 10f32.powi(b as i32 % 5 - 2));
        }
        g[200..300].iter_mut().for_each(|x| *x = 0.0);
        let y = roundtrip(c, &g);
        for (xs, ys) in g.chunks(block).zip(y.chunks(block)) {
            let max = xs.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            for (x, y) in xs.iter().zip(ys) {
                assert!(
                    (x - y).abs() <= max / steps * (1.0 + 1e-5),
                    "{c} {x} {y} {max}"
                );
            }
            let top = xs
                .iter()
                .zip(ys)
                .max_by(|a, b| a.0.abs().total_cmp(&b.0.abs()));
            let (x, y) = top.unwrap();
            assert!((x - y).abs() <= x.abs() * 1e-6, "{x} {y}");
        }
        assert!(y[200..300].iter().all(|&v| v == 0.0));
        let mut bad = g.clone();
        bad[7] = f32::NAN;
        assert!(cast(c).encode(&bad, &mut Vec::new()).is_err());
        let mut out = vec![0.0; g.len()];
        assert!(cast(c).decode_add(&[0; 10], &mut out).is_err());
    }
}
