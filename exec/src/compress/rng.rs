//! Small portable RNGs: the same seed gives the same payload bytes everywhere.
//!
//! SplitMix64 seeds a xoshiro256++ stream; the stochastic quantizers draw from SplitMix64 as a
//! counter-based generator, whose every draw a GPU thread computes from its index.

/// xoshiro256++ (Blackman & Vigna): fast, statistically strong, and trivially portable, so a
/// payload does not depend on the version of an external crate.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

/// SplitMix64's increment (Steele, Lea and Flood, OOPSLA 2014): the golden ratio's 64 bits.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GAMMA);
    finalize(*state)
}

/// SplitMix64's output function (`kernels/compress.cu`'s `uniform24` writes it again).
#[inline(always)]
fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64 read as a counter-based generator: draw k of the stream keyed `key` is
/// SplitMix64's k-th output from state `key`, `finalize(key + (k + 1)·GAMMA)`, computed from k
/// alone. A quantizer's GPU kernels draw element i's uniform in the thread that quantizes it,
/// the same bits the CPU draws, with nothing made on the host or uploaded.
#[derive(Clone, Debug)]
pub struct Counter {
    key: u64,
    next: u64,
}

impl Counter {
    /// The stream for `seed` (its key spread by the finalizer, so that seeds 1 apart do not
    /// share most of their states), at draw 0.
    pub fn new(seed: u64) -> Counter {
        Counter {
            key: finalize(seed),
            next: 0,
        }
    }

    /// The stream's key and the index of its next draw, for a kernel that draws `count` of them
    /// itself; the stream moves past them.
    pub fn take(&mut self, count: u64) -> (u64, u64) {
        let at = (self.key, self.next);
        self.next = self.next.wrapping_add(count);
        at
    }

    /// Fills `out` with the next `out.len()` draws.
    #[inline(always)]
    pub fn fill_u64(&mut self, out: &mut [u64]) {
        let (key, first) = self.take(out.len() as u64);
        for (k, o) in (first..).zip(out) {
            *o = finalize(key.wrapping_add(k.wrapping_add(1).wrapping_mul(GAMMA)));
        }
    }
}

impl Rng {
    /// A generator seeded from `seed` through SplitMix64.
    pub fn new(seed: u64) -> Rng {
        let mut sm = seed;
        Rng {
            s: [
                splitmix64(&mut sm),
                splitmix64(&mut sm),
                splitmix64(&mut sm),
                splitmix64(&mut sm),
            ],
        }
    }

    /// An independent stream for (seed, stream), e.g. one per training step, so that workers
    /// sharing a seed draw the same values at the same step without communicating.
    pub fn for_stream(seed: u64, stream: u64) -> Rng {
        let mut sm = stream ^ 0xD1B5_4A32_D192_ED03;
        Rng::new(seed ^ splitmix64(&mut sm))
    }

    /// The next 64 bits of the xoshiro256++ stream.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Fills `out` with the next `out.len()` outputs, exactly as that many [`Rng::next_u64`]
    /// calls would, with the state held in registers for the whole block.
    #[inline(always)]
    pub fn fill_u64(&mut self, out: &mut [u64]) {
        let [mut s0, mut s1, mut s2, mut s3] = self.s;
        for o in out {
            *o = s0.wrapping_add(s3).rotate_left(23).wrapping_add(s0);
            let t = s1 << 17;
            s2 ^= s0;
            s3 ^= s1;
            s1 ^= s2;
            s0 ^= s3;
            s2 ^= t;
            s3 = s3.rotate_left(45);
        }
        self.s = [s0, s1, s2, s3];
    }

    /// Two uniform floats in [0, 1) from one draw (24 bits each: every value is exact in f32).
    pub fn next_f32_pair(&mut self) -> (f32, f32) {
        let x = self.next_u64();
        let scale = 1.0 / (1u32 << 24) as f32;
        (
            ((x >> 40) as u32) as f32 * scale,
            (((x >> 8) & 0xFF_FFFF) as u32) as f32 * scale,
        )
    }

    /// A uniform float in [0, 1) from the top 53 bits of one draw.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in 0..bound (Lemire's multiply-shift; the bias is below 2^-32 for our bounds).
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A standard normal draw (Box–Muller), for PowerSGD's initial Q.
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::for_stream(7, 3);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::for_stream(7, 3);
        assert!(a.iter().all(|&x| x == r.next_u64()));
        assert_ne!(Rng::for_stream(7, 4).next_u64(), a[0]);
        let mut r = Rng::for_stream(7, 3);
        let mut block = [0u64; 3];
        r.fill_u64(&mut block);
        assert_eq!(block[..], a[..3]);
        assert_eq!(r.next_u64(), a[3]);
    }

    #[test]
    fn a_counter_draws_splitmix64s_outputs_at_any_index() {
        let mut counter = Counter::new(9);
        let mut state = finalize(9);
        let mut block = [0u64; 5];
        counter.fill_u64(&mut block[..2]);
        counter.fill_u64(&mut block[2..]);
        for draw in block {
            assert_eq!(draw, splitmix64(&mut state));
        }
        // A kernel taking the next three draws starts where the fills stopped.
        assert_eq!(counter.take(3), (finalize(9), 5));
        let mut after = [0u64; 1];
        counter.fill_u64(&mut after);
        for _ in 0..3 {
            splitmix64(&mut state);
        }
        assert_eq!(after[0], splitmix64(&mut state));
        assert_ne!(Counter::new(10).take(1).0, finalize(9));
    }

    #[test]
    fn uniform_ranges() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let (a, b) = r.next_f32_pair();
            assert!((0.0..1.0).contains(&a) && (0.0..1.0).contains(&b));
            assert!(r.below(10) < 10);
        }
    }
}
