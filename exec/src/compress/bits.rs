//! Bit packing: 1-bit and 2-bit codes and a b-bit little-endian stream.
//!
//! The 1-bit and 2-bit codes are packed LSB first within each byte.

/// Packs one bit per element, element i at bit i % 8 of byte i / 8. `bit` must return 0 or 1.
/// `dst` holds exactly ceil(src.len() / 8) bytes.
#[inline(always)]
pub(super) fn pack1(src: &[f32], dst: &mut [u8], bit: impl Fn(f32) -> u8) {
    let mut blocks = src.chunks_exact(8);
    for (byte, block) in dst.iter_mut().zip(&mut blocks) {
        let mut b = 0u8;
        for (j, &x) in block.iter().enumerate() {
            b |= bit(x) << j;
        }
        *byte = b;
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut b = 0u8;
        for (j, &x) in tail.iter().enumerate() {
            b |= bit(x) << j;
        }
        dst[src.len() / 8] = b;
    }
}

/// Adds `one` where the bit is set and `zero` where it is clear, for `acc.len()` elements.
#[inline(always)]
pub(super) fn unpack1_add(src: &[u8], acc: &mut [f32], zero: f32, one: f32) {
    for (block, &byte) in acc.chunks_mut(8).zip(src) {
        for (j, a) in block.iter_mut().enumerate() {
            *a += if (byte >> j) & 1 == 1 { one } else { zero };
        }
    }
}

/// Packs 2-bit codes, element i at bits 2·(i % 4) of byte i / 4; `code` returns 0..=3.
/// Codes are computed a block at a time into a byte buffer (a loop that vectorizes when `code`
/// is branch-free), then folded four to a byte.
#[inline(always)]
pub(super) fn pack2(src: &[f32], dst: &mut [u8], mut code: impl FnMut(usize, f32) -> u8) {
    const BLOCK: usize = 1024;
    let mut codes = [0u8; BLOCK];
    for (b, (block, out)) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK / 4)).enumerate() {
        for (j, (c, &x)) in codes.iter_mut().zip(block).enumerate() {
            *c = code(BLOCK * b + j, x);
        }
        pack2_codes(&codes[..block.len()], out);
    }
}

/// Packs 2-bit codes (one per byte, values 0..=3) four to a byte, element i at bits 2·(i % 4).
/// Four codes are read as one little-endian word and folded, which vectorizes on SSE2.
#[inline(always)]
pub(super) fn pack2_codes(codes: &[u8], dst: &mut [u8]) {
    let whole = codes.len() / 4;
    for (d, q) in dst[..whole].iter_mut().zip(codes.chunks_exact(4)) {
        let w = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
        *d = (w | (w >> 6) | (w >> 12) | (w >> 18)) as u8;
    }
    let tail = &codes[4 * whole..];
    if !tail.is_empty() {
        let mut v = 0u8;
        for (j, &c) in tail.iter().enumerate() {
            v |= c << (2 * j);
        }
        dst[codes.len() / 4] = v;
    }
}

/// Adds `values[code]` for each 2-bit code; returns false if a code is 3 (never written).
#[inline(always)]
pub(super) fn unpack2_add(src: &[u8], acc: &mut [f32], values: [f32; 3]) -> bool {
    let table = [values[0], values[1], values[2], 0.0];
    let mut invalid = 0u8;
    for (block, &byte) in acc.chunks_mut(4).zip(src) {
        for (j, a) in block.iter_mut().enumerate() {
            let code = (byte >> (2 * j)) & 3;
            invalid |= u8::from(code == 3);
            *a += table[code as usize];
        }
    }
    invalid == 0
}

/// Writes `bits`-wide codes (≤ 16) back to back, LSB first, into exactly ceil(n·bits/8) bytes.
pub(super) struct BitWriter<'a> {
    dst: &'a mut [u8],
    pos: usize,
    acc: u64,
    filled: u32,
}

impl<'a> BitWriter<'a> {
    pub(super) fn new(dst: &'a mut [u8]) -> Self {
        BitWriter {
            dst,
            pos: 0,
            acc: 0,
            filled: 0,
        }
    }

    #[inline(always)]
    pub(super) fn put(&mut self, code: u32, bits: u32) {
        self.acc |= u64::from(code) << self.filled;
        self.filled += bits;
        // Flush whole 32-bit words: a word is flushed only once 32 bits are written, so it
        // always fits in a buffer sized for the total.
        if self.filled >= 32 {
            self.dst[self.pos..self.pos + 4].copy_from_slice(&(self.acc as u32).to_le_bytes());
            self.pos += 4;
            self.acc >>= 32;
            self.filled -= 32;
        }
    }

    pub(super) fn finish(mut self) {
        while self.filled > 0 {
            self.dst[self.pos] = self.acc as u8;
            self.pos += 1;
            self.acc >>= 8;
            self.filled = self.filled.saturating_sub(8);
        }
    }
}

/// Reads codes written by [`BitWriter`]; reading past the end yields zero bits.
pub(super) struct BitReader<'a> {
    src: &'a [u8],
    pos: usize,
    acc: u64,
    filled: u32,
}

impl<'a> BitReader<'a> {
    pub(super) fn new(src: &'a [u8]) -> Self {
        BitReader {
            src,
            pos: 0,
            acc: 0,
            filled: 0,
        }
    }

    #[inline(always)]
    pub(super) fn get(&mut self, bits: u32) -> u32 {
        if self.filled < bits {
            let mut word = [0u8; 4];
            let end = (self.pos + 4).min(self.src.len());
            let n = end.saturating_sub(self.pos);
            word[..n].copy_from_slice(&self.src[self.pos..end]);
            self.pos = end;
            self.acc |= u64::from(u32::from_le_bytes(word)) << self.filled;
            self.filled += 32;
        }
        let code = (self.acc & ((1u64 << bits) - 1)) as u32;
        self.acc >>= bits;
        self.filled -= bits;
        code
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_stream_round_trips() {
        for bits in [2u32, 5, 9, 10, 16] {
            let codes: Vec<u32> = (0..1001u32)
                .map(|i| i.wrapping_mul(2654435761) & ((1 << bits) - 1))
                .collect();
            let mut buf = vec![0u8; (codes.len() * bits as usize).div_ceil(8)];
            let mut w = BitWriter::new(&mut buf);
            for &c in &codes {
                w.put(c, bits);
            }
            w.finish();
            let mut r = BitReader::new(&buf);
            assert!(codes.iter().all(|&c| r.get(bits) == c), "{bits}");
        }
    }

    #[test]
    fn one_and_two_bit_round_trip() {
        let x: Vec<f32> = (0..13)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let mut b = vec![0u8; 2];
        pack1(&x, &mut b, |v| u8::from(v < 0.0));
        let mut acc = vec![0.0; 13];
        unpack1_add(&b, &mut acc, 1.0, -1.0);
        assert_eq!(acc, x);
        let mut b2 = vec![0u8; 4];
        pack2(&x, &mut b2, |_, v| if v < 0.0 { 2 } else { 1 });
        let mut acc2 = vec![0.0; 13];
        assert!(unpack2_add(&b2, &mut acc2, [0.0, 1.0, -1.0]));
        assert_eq!(acc2, x);
    }
}
