// Gradient-compression kernels whose payload bytes equal the CPU reference (exec/src/compress,
// exec/WIRE_FORMAT.md). Compiled by NVRTC with --fmad=false: the CPU rounds every multiply
// and add separately, so no contraction into FMA may change a result bit.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define ABS_MASK 0x7FFFFFFFu
#define MAX_FINITE 0x7F7FFFFFu
// Elements per CPU scan chunk and f32 lanes per chunk (exec/src/compress/scan.rs, sign.rs).
#define CHUNK 4096u
#define LANES 16u

// Keeps the lowest index of a non-finite element; the host initialises *bad to 0xFFFFFFFF.
__device__ __forceinline__ void note_finite(float x, u32 i, u32 *bad) {
    if ((__float_as_uint(x) & ABS_MASK) > MAX_FINITE) atomicMin(bad, i);
}

// Headers may sit at any byte offset inside a gathered buffer: read them bytewise.
__device__ __forceinline__ float load_f32(const u8 *p) {
    u32 w = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
    return __uint_as_float(w);
}

__device__ __forceinline__ void store_f32(u8 *p, float v) {
    u32 w = __float_as_uint(v);
    p[0] = (u8)w; p[1] = (u8)(w >> 8); p[2] = (u8)(w >> 16); p[3] = (u8)(w >> 24);
}

// Port of minifloat::encode: RNE on the bit pattern, saturating at MAX, subnormals by the
// add-a-magic-constant trick (kept as two separately rounded operations).
template <int E, int M, int MAXCODE>
__device__ __forceinline__ u32 mf_encode(float x) {
    const int bias = (1 << (E - 1)) - 1;
    u32 bits = __float_as_uint(x);
    u32 sign = (bits >> 31) << (E + M);
    int a = (int)(bits & ABS_MASK);
    const int shift = 23 - M;
    int rounded = a + ((1 << (shift - 1)) - 1) + ((a >> shift) & 1);
    int normal = (rounded >> shift) - ((127 - bias) << M);
    if (normal > MAXCODE) normal = MAXCODE;
    const int min_normal = (127 - bias + 1) << 23;
    float sub_scale = __uint_as_float((u32)(127 + bias - 1 + M) << 23);
    int sub = (int)__float_as_uint(__fadd_rn(__fmul_rn(__uint_as_float((u32)a), sub_scale), 8388608.0f)) - 0x4B000000;
    int magnitude = a < min_normal ? sub : normal;
    return sign | (u32)magnitude;
}

// Port of minifloat::decode.
template <int E, int M, bool IEEE_SPECIALS>
__device__ __forceinline__ float mf_decode(u32 code) {
    const int bias = (1 << (E - 1)) - 1;
    u32 sign = ((code >> (E + M)) & 1u) << 31;
    u32 magnitude = code & ((1u << (E + M)) - 1u);
    u32 normal = (magnitude << (23 - M)) + ((u32)(127 - bias) << 23);
    float smallest_subnormal = __uint_as_float((u32)(127 - bias + 1 - M) << 23);
    u32 sub = __float_as_uint(__fmul_rn((float)(int)magnitude, smallest_subnormal));
    bool all_ones = (magnitude >> M) == ((1u << E) - 1u);
    u32 special;
    if (IEEE_SPECIALS) special = 0x7F800000u | ((magnitude & ((1u << M) - 1u)) << (23 - M));
    else if (magnitude == (1u << (E + M)) - 1u) special = 0x7FC00000u;
    else special = normal;
    u32 value = magnitude < (1u << M) ? sub : (all_ones ? special : normal);
    return __uint_as_float(value | sign);
}

__device__ __forceinline__ u16 to_bf16(float x) {
    u32 bits = __float_as_uint(x);
    u32 a = bits & ABS_MASK;
    u32 r = (a + 0x7FFFu + ((a >> 16) & 1u)) >> 16;
    if (r > 0x7F7Fu) r = 0x7F7Fu;
    return (u16)(((bits >> 16) & 0x8000u) | r);
}

__device__ __forceinline__ float from_bf16(u16 h) { return __uint_as_float((u32)h << 16); }

// kind: 0 = f32 (none), 1 = fp16, 2 = bf16.
extern "C" __global__ void cast_encode(const float *x, u8 *out, u32 n, int kind, u32 *bad) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        note_finite(v, i, bad);
        if (kind == 0) ((float *)out)[i] = v;
        else if (kind == 1) ((u16 *)out)[i] = (u16)mf_encode<5, 10, 0x7BFF>(v);
        else ((u16 *)out)[i] = to_bf16(v);
    }
}

extern "C" __global__ void cast_decode_add(const u8 *p, float *acc, u32 n, int kind) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v;
        if (kind == 0) v = load_f32(p + 4 * (size_t)i);
        else {
            u16 h = (u16)(p[2 * (size_t)i] | (p[2 * (size_t)i + 1] << 8));
            v = kind == 1 ? mf_decode<5, 10, true>(h) : from_bf16(h);
        }
        acc[i] = __fadd_rn(acc[i], v);
    }
}

// max |x| as the bit pattern (non-negative floats order like their bits), and the finite check.
extern "C" __global__ void max_abs(const float *x, u32 n, u32 *max_bits, u32 *bad) {
    u32 best = 0;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        note_finite(v, i, bad);
        u32 a = __float_as_uint(v) & ABS_MASK;
        if (a <= MAX_FINITE && a > best) best = a;
    }
    for (int off = 16; off > 0; off >>= 1) best = max(best, __shfl_down_sync(0xFFFFFFFFu, best, off));
    if ((threadIdx.x & 31u) == 0) atomicMax(max_bits, best);
}

// out = f32 scale, then n fp8 codes of x / scale; scale = max / MAX, x·(MAX / max) as the CPU.
extern "C" __global__ void fp8_encode(const float *x, u8 *out, u32 n, const u32 *max_bits, int e5m2) {
    float max_repr = e5m2 ? 57344.0f : 448.0f;
    float m = __uint_as_float(*max_bits);
    float scale = m > 0.0f ? __fdiv_rn(m, max_repr) : 0.0f;
    float inv = m > 0.0f ? __fdiv_rn(max_repr, m) : 0.0f;
    if (blockIdx.x == 0 && threadIdx.x == 0) store_f32(out, scale);
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float y = __fmul_rn(x[i], inv);
        out[4 + (size_t)i] = (u8)(e5m2 ? mf_encode<5, 2, 0x7B>(y) : mf_encode<4, 3, 0x7E>(y));
    }
}

extern "C" __global__ void fp8_decode_add(const u8 *p, float *acc, u32 n, int e5m2) {
    float scale = load_f32(p);
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u32 code = p[4 + (size_t)i];
        float v = e5m2 ? mf_decode<5, 2, true>(code) : mf_decode<4, 3, false>(code);
        acc[i] = __fadd_rn(acc[i], __fmul_rn(v, scale));
    }
}

// One bit per element (1 = negative), element i at bit i % 8 of byte i / 8; one thread per byte.
extern "C" __global__ void sign_pack(const float *x, u8 *bits, u32 n, u32 *bad) {
    u32 bytes = (n + 7) / 8;
    for (u32 b = blockIdx.x * blockDim.x + threadIdx.x; b < bytes; b += gridDim.x * blockDim.x) {
        u32 v = 0;
        for (u32 j = 0; j < 8; j++) {
            u32 i = 8 * b + j;
            if (i < n) {
                float e = x[i];
                note_finite(e, i, bad);
                v |= (u32)(e < 0.0f) << j;
            }
        }
        bits[b] = (u8)v;
    }
}

// The CPU's exact summation order for the sign scales (sign.rs fused_chunk): per 4096-element
// chunk, 16 f32 lanes (lane j adds elements j, j + 16, … in order), the lanes summed in order,
// plus the chunk's tail summed in order. One block of 16 threads per chunk. kind 0: |x| into a;
// kind 1: non-negative elements into a, negative ones into b, negatives counted; kind 2: x·x
// into a (QSGD's norm: scan.rs sum_map has this same order).
extern "C" __global__ void sign_chunk_sums(const float *x, u32 n, int kind, float *a_out, float *b_out, u32 *neg_out) {
    __shared__ float la[LANES], lb[LANES];
    __shared__ u32 ln[LANES];
    u32 c = blockIdx.x, j = threadIdx.x;
    u32 start = c * CHUNK;
    u32 len = min(CHUNK, n - start);
    u32 full = len / LANES;
    float a = 0.0f, b = 0.0f;
    u32 negs = 0;
    for (u32 t = 0; t < full; t++) {
        float v = x[start + t * LANES + j];
        if (kind == 0) a = __fadd_rn(a, fabsf(v));
        else if (kind == 2) a = __fadd_rn(a, __fmul_rn(v, v));
        else if (v < 0.0f) { b = __fadd_rn(b, v); negs++; }
        else a = __fadd_rn(a, v);
    }
    la[j] = a; lb[j] = b; ln[j] = negs;
    __syncthreads();
    if (j == 0) {
        float sa = 0.0f, sb = 0.0f, ta = 0.0f, tb = 0.0f;
        u32 count = 0;
        for (u32 l = 0; l < LANES; l++) { sa = __fadd_rn(sa, la[l]); sb = __fadd_rn(sb, lb[l]); count += ln[l]; }
        for (u32 i = start + full * LANES; i < start + len; i++) {
            float v = x[i];
            if (kind == 0) ta = __fadd_rn(ta, fabsf(v));
            else if (kind == 2) ta = __fadd_rn(ta, __fmul_rn(v, v));
            else if (v < 0.0f) { tb = __fadd_rn(tb, v); count++; }
            else ta = __fadd_rn(ta, v);
        }
        a_out[c] = __fadd_rn(sa, ta);
        b_out[c] = __fadd_rn(sb, tb);
        neg_out[c] = count;
    }
}

// Accumulates the chunk sums in f64, in chunk order, as the CPU does, and writes the header:
// kind 0: f32 mean |x|; kind 1: f32 mean of the non-negative, f32 mean of the negative elements;
// kind 2: f32 sqrt of the f64 sum (QSGD's L2 norm).
extern "C" __global__ void sign_finish(const float *a, const float *b, const u32 *negs, u32 chunks, u32 n, int kind, u8 *out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double sa = 0.0, sb = 0.0;
    unsigned long long count = 0;
    for (u32 c = 0; c < chunks; c++) { sa += (double)a[c]; sb += (double)b[c]; count += negs[c]; }
    if (kind == 0) {
        store_f32(out, n > 0 ? (float)(sa / (double)n) : 0.0f);
    } else if (kind == 2) {
        // f64 sqrt is correctly rounded (IEEE) on the device as on the CPU, then RNE to f32.
        store_f32(out, (float)sqrt(sa));
    } else {
        unsigned long long pos = (unsigned long long)n - count;
        store_f32(out, pos > 0 ? (float)(sa / (double)pos) : 0.0f);
        store_f32(out + 4, count > 0 ? (float)(sb / (double)count) : 0.0f);
    }
}

// Adds `one` where the bit is set and `zero` where it is clear; header_kind 0: ±1, 1: ±mean
// (efsignsgd), 2: two means (onebit). `p` points at the payload's start (header included).
extern "C" __global__ void sign_decode_add(const u8 *p, float *acc, u32 n, int header_kind) {
    float zero = 1.0f, one = -1.0f;
    const u8 *bits = p;
    if (header_kind == 1) { float m = load_f32(p); zero = m; one = -m; bits = p + 4; }
    else if (header_kind == 2) { zero = load_f32(p); one = load_f32(p + 4); bits = p + 8; }
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u32 bit = (bits[i / 8] >> (i % 8)) & 1u;
        acc[i] = __fadd_rn(acc[i], bit ? one : zero);
    }
}

extern "C" __global__ void check_finite(const float *x, u32 n, u32 *bad) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) note_finite(x[i], i, bad);
}

// Random-k: the k values x[idx]·scale (indices from the shared seed, chosen on the host, all
// below n; the guard keeps a corrupt one in bounds, as every kernel indexing by data does).
extern "C" __global__ void gather_scaled(const float *x, u32 n, const u32 *idx, u32 k, float scale, u8 *out) {
    for (u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < k; j += gridDim.x * blockDim.x) {
        u32 i = idx[j];
        ((float *)out)[j] = i < n ? __fmul_rn(x[i], scale) : 0.0f;
    }
}

// Indices are distinct, so no two threads add into one element.
extern "C" __global__ void scatter_add(const u8 *p, const u32 *idx, u32 k, float *acc, u32 n) {
    for (u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < k; j += gridDim.x * blockDim.x) {
        u32 i = idx[j];
        if (i < n) acc[i] = __fadd_rn(acc[i], load_f32(p + 4 * (size_t)j));
    }
}

// Error feedback (memory.rs): kind 0 copies g, 1 adds the residual (g + e), 2 is EF-SignSGD (e + lr·g).
extern "C" __global__ void compensate(const float *g, const float *e, float *out, u32 n, int kind, float lr) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = g[i];
        if (kind == 1) v = __fadd_rn(v, e[i]);
        else if (kind == 2) v = __fadd_rn(e[i], __fmul_rn(lr, v));
        out[i] = v;
    }
}

extern "C" __global__ void residual_update(float *e, const float *compensated, const float *transmitted, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        e[i] = __fsub_rn(compensated[i], transmitted[i]);
}

// A CaSync-Ring hop (compressed_ring.rs `hop`): the decoded running sum is kept negated in
// added_to, then this rank's shard is added to it, in the CPU's order and rounding.
extern "C" __global__ void ring_hop(float *sum, const float *own, float *added_to, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = sum[i];
        added_to[i] = -s;
        sum[i] = __fadd_rn(s, own[i]);
    }
}

// dst = src·scale: the synthetic gradient of one tensor for one iteration, and output scaling.
extern "C" __global__ void scale_copy(const float *src, float *dst, u32 n, float scale) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        dst[i] = __fmul_rn(src[i], scale);
}

extern "C" __global__ void scale_in_place(float *x, u32 n, float scale) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], scale);
}

// ---- Exact sparsification (sparse.rs, sampled.rs) ----
// The CPU keeps every |x| > t and the first `ties` elements with |x| == t, in index order.
// Selection state, shared by the kernels below: st[0] = t (|x| bits; during radix selection
// the digits chosen so far), st[1] = elements known to be larger, st[2] = k, st[3] = ties.

#define RADIX_BUCKETS 4096u
#define SEL_THREADS 256u
#define SEL_PER 16u
#define SEL_TILE (SEL_THREADS * SEL_PER)

// Written by a kernel rather than a host copy, so that top-k never waits for the stream.
extern "C" __global__ void select_init(u32 *st, u32 t, u32 above, u32 k, u32 ties) {
    if (blockIdx.x == 0 && threadIdx.x == 0) { st[0] = t; st[1] = above; st[2] = k; st[3] = ties; }
}

// Radix selection of the k-th largest |x|, pass 0..2 over bits 30..19, 18..7 and 6..0 (pass 0
// uses the CPU's 4096 buckets of bits >> 19). Counts the elements whose higher digits equal
// those chosen so far; `hist` is zero on entry.
extern "C" __global__ void radix_hist(const float *x, u32 n, const u32 *st, int pass, u32 *hist) {
    __shared__ u32 local[RADIX_BUCKETS];
    for (u32 b = threadIdx.x; b < RADIX_BUCKETS; b += blockDim.x) local[b] = 0;
    __syncthreads();
    const u32 hi = pass == 0 ? 31u : (pass == 1 ? 19u : 7u);
    const u32 lo = pass == 0 ? 19u : (pass == 1 ? 7u : 0u);
    const u32 mask = (1u << (hi - lo)) - 1u;
    const u32 prefix = st[0];
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u32 a = __float_as_uint(x[i]) & ABS_MASK;
        if ((a >> hi) == prefix) atomicAdd(&local[(a >> lo) & mask], 1u);
    }
    __syncthreads();
    for (u32 b = threadIdx.x; b < RADIX_BUCKETS; b += blockDim.x)
        if (local[b]) atomicAdd(&hist[b], local[b]);
}

// Picks the bucket holding the k-th largest (kth_bucket on the CPU), appends its digit to st[0],
// adds the larger buckets to st[1], sets the ties, and clears `hist`. One block of SEL_THREADS:
// each thread sums SEL_PER buckets from the top, thread 0 walks the sums, then the buckets.
extern "C" __global__ void radix_select(u32 *st, int pass, u32 *hist) {
    __shared__ u32 part[SEL_THREADS];
    const u32 width = pass == 2 ? 7u : 12u;
    const int buckets = 1 << width;
    const u32 per = (u32)(buckets + SEL_THREADS - 1) / SEL_THREADS;
    u32 t = threadIdx.x, s = 0;
    for (u32 j = 0; j < per; j++) {
        int b = buckets - 1 - (int)(t * per + j);
        if (b >= 0) s += hist[b];
    }
    part[t] = s;
    __syncthreads();
    if (t == 0) {
        u32 above = st[1], k = st[2], chosen = 0;
        for (u32 g = 0; g < SEL_THREADS; g++) {
            if (above + part[g] >= k) {
                for (u32 j = 0; j < per; j++) {
                    int b = buckets - 1 - (int)(g * per + j);
                    if (above + hist[b] >= k) { chosen = (u32)b; break; }
                    above += hist[b];
                }
                break;
            }
            above += part[g];
        }
        st[0] = (st[0] << width) | chosen;
        st[1] = above;
        st[3] = k - above;
    }
    __syncthreads();
    for (int b = t; b < buckets; b += SEL_THREADS) hist[b] = 0;
}

// Exclusive scan of SEL_THREADS pairs in shared memory (Hillis-Steele); returns the thread's offsets.
__device__ __forceinline__ void block_scan2(u32 *sa, u32 *sb, u32 a, u32 b, u32 *oa, u32 *ob) {
    u32 t = threadIdx.x;
    sa[t] = a; sb[t] = b;
    __syncthreads();
    for (u32 d = 1; d < SEL_THREADS; d <<= 1) {
        u32 xa = t >= d ? sa[t - d] : 0, xb = t >= d ? sb[t - d] : 0;
        __syncthreads();
        sa[t] += xa; sb[t] += xb;
        __syncthreads();
    }
    *oa = sa[t] - a; *ob = sb[t] - b;
}

// First element of this thread's run of SEL_PER within its block's tile.
__device__ size_t run_first() {
    return (size_t)blockIdx.x * SEL_TILE + (size_t)threadIdx.x * SEL_PER;
}

// How many of this thread's run have |x| > t (gt) and |x| == t (eq).
__device__ void run_counts(const float *x, u32 n, u32 t, u32 *gt, u32 *eq) {
    size_t first = run_first();
    *gt = 0; *eq = 0;
    for (u32 j = 0; j < SEL_PER; j++) {
        size_t i = first + j;
        if (i < n) {
            u32 a = __float_as_uint(x[i]) & ABS_MASK;
            *gt += a > t; *eq += a == t;
        }
    }
}

// Per tile of SEL_TILE elements: how many |x| > t and how many == t.
extern "C" __global__ void select_count(const float *x, u32 n, const u32 *st, u32 *tile_gt, u32 *tile_eq) {
    __shared__ u32 sa[SEL_THREADS], sb[SEL_THREADS];
    const u32 t = st[0];
    u32 gt, eq;
    run_counts(x, n, t, &gt, &eq);
    u32 og, oe;
    block_scan2(sa, sb, gt, eq, &og, &oe);
    if (threadIdx.x == SEL_THREADS - 1) { tile_gt[blockIdx.x] = og + gt; tile_eq[blockIdx.x] = oe + eq; }
}

// In-place exclusive scan of the tile counts; one block of SEL_THREADS, each thread a run of tiles.
extern "C" __global__ void select_scan(u32 *tile_gt, u32 *tile_eq, u32 tiles) {
    __shared__ u32 sa[SEL_THREADS], sb[SEL_THREADS];
    u32 per = (tiles + SEL_THREADS - 1) / SEL_THREADS;
    u32 begin = min(tiles, threadIdx.x * per), end = min(tiles, begin + per);
    u32 gt = 0, eq = 0;
    for (u32 i = begin; i < end; i++) { gt += tile_gt[i]; eq += tile_eq[i]; }
    u32 og, oe;
    block_scan2(sa, sb, gt, eq, &og, &oe);
    for (u32 i = begin; i < end; i++) {
        u32 g = tile_gt[i], e = tile_eq[i];
        tile_gt[i] = og; tile_eq[i] = oe;
        og += g; oe += e;
    }
}

// Writes the selected elements in index order: element i lands at (larger elements before i)
// + min(ties, equal elements before i). Indices as u32 at out + idx_at, values as f32 at
// out + val_at (byte offsets, multiples of 4), at most `cap` of them.
extern "C" __global__ void select_emit(const float *x, u32 n, const u32 *st, const u32 *tile_gt, const u32 *tile_eq,
                                       u8 *out, unsigned long long idx_at, unsigned long long val_at, u32 cap) {
    __shared__ u32 sa[SEL_THREADS], sb[SEL_THREADS];
    const u32 t = st[0], ties = st[3];
    size_t first = run_first();
    u32 gt, eq;
    run_counts(x, n, t, &gt, &eq);
    u32 og, oe;
    block_scan2(sa, sb, gt, eq, &og, &oe);
    gt = tile_gt[blockIdx.x] + og;
    eq = tile_eq[blockIdx.x] + oe;
    u32 *idx = (u32 *)(out + idx_at);
    float *val = (float *)(out + val_at);
    for (u32 j = 0; j < SEL_PER; j++) {
        size_t i = first + j;
        if (i >= n) break;
        float v = x[i];
        u32 a = __float_as_uint(v) & ABS_MASK;
        u32 pos = 0xFFFFFFFFu;
        if (a > t) { pos = gt + min(eq, ties); gt++; }
        else if (a == t) { if (eq < ties) pos = gt + eq; eq++; }
        if (pos < cap) { idx[pos] = (u32)i; val[pos] = v; }
    }
}

// How many |x| ≥ t (DGC's and GradDrop's threshold tests), with the finite check.
extern "C" __global__ void count_at_least(const float *x, u32 n, u32 t, u32 *count, u32 *bad) {
    u32 c = 0;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        note_finite(v, i, bad);
        c += (__float_as_uint(v) & ABS_MASK) >= t;
    }
    for (int off = 16; off > 0; off >>= 1) c += __shfl_down_sync(0xFFFFFFFFu, c, off);
    if ((threadIdx.x & 31u) == 0 && c) atomicAdd(count, c);
}

// |x| bits at the sample positions (chosen on the host with the CPU's seeded generator, all
// below n).
extern "C" __global__ void gather_abs(const float *x, u32 n, const u32 *pos, u32 m, u32 *out) {
    for (u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < m; j += gridDim.x * blockDim.x) {
        u32 i = pos[j];
        out[j] = i < n ? __float_as_uint(x[i]) & ABS_MASK : 0u;
    }
}

// Adds a sparse payload: header 0 is top-k (k indices then k values), header 1 is DGC/GradDrop
// (u32 count, k index slots, k value slots; slots from count on are unused). Indices within a
// payload are distinct, so no two threads add into one element.
extern "C" __global__ void sparse_decode_add(const u8 *p, float *acc, u32 n, u32 k, int header) {
    u32 count = k;
    if (header) {
        count = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
        p += 4;
        if (count > k) count = k;
    }
    for (u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < count; j += gridDim.x * blockDim.x) {
        const u8 *q = p + 4 * (size_t)j;
        u32 i = (u32)q[0] | ((u32)q[1] << 8) | ((u32)q[2] << 16) | ((u32)q[3] << 24);
        // Our own payloads never hold an index ≥ n; the guard keeps a corrupt one in bounds.
        if (i < n) acc[i] = __fadd_rn(acc[i], load_f32(p + 4 * ((size_t)k + j)));
    }
}

// ---- Two-bit codes (quantize.rs tbq/terngrad, bits.rs pack2_codes): element i at bits
// 2·(i % 4) of byte i / 4. One thread per byte. ----

// TBQ: code 1 when x > tau, 2 when x < −tau, else 0.
extern "C" __global__ void tbq_pack(const float *x, u8 *out, u32 n, float tau, u32 *bad) {
    u32 bytes = (n + 3) / 4;
    for (u32 b = blockIdx.x * blockDim.x + threadIdx.x; b < bytes; b += gridDim.x * blockDim.x) {
        u32 v = 0;
        for (u32 j = 0; j < 4; j++) {
            u32 i = 4 * b + j;
            if (i < n) {
                float e = x[i];
                note_finite(e, i, bad);
                u32 code = (u32)(e > tau) | ((u32)(e < -tau) << 1);
                v |= code << (2 * j);
            }
        }
        out[b] = (u8)v;
    }
}

// Adds 0, +m, −m for codes 0, 1, 2 (3 is never written; it adds 0). header 0: m = tau, the codes
// start at p (tbq); header 1: m is the f32 at p, the codes start at p + 4 (terngrad).
extern "C" __global__ void two_bit_decode_add(const u8 *p, float *acc, u32 n, int header, float tau) {
    float m = tau;
    if (header) { m = load_f32(p); p += 4; }
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u32 code = (p[i / 4] >> (2 * (i % 4))) & 3u;
        float v = code == 1 ? m : (code == 2 ? -m : 0.0f);
        acc[i] = __fadd_rn(acc[i], v);
    }
}

// Signum (sign.rs momentum_pack): m ← β·m + (1−β)·g, each product and the sum rounded
// separately as on the CPU, then one sign bit of the new m per element. One thread per byte.
extern "C" __global__ void signum_pack(const float *g, float *m, u8 *bits, u32 n, float beta, u32 *bad) {
    float keep = __fsub_rn(1.0f, beta);
    u32 bytes = (n + 7) / 8;
    for (u32 b = blockIdx.x * blockDim.x + threadIdx.x; b < bytes; b += gridDim.x * blockDim.x) {
        u32 v = 0;
        for (u32 j = 0; j < 8; j++) {
            u32 i = 8 * b + j;
            if (i < n) {
                float e = g[i];
                note_finite(e, i, bad);
                float mi = __fadd_rn(__fmul_rn(beta, m[i]), __fmul_rn(keep, e));
                m[i] = mi;
                v |= (u32)(mi < 0.0f) << j;
            }
        }
        bits[b] = (u8)v;
    }
}

// ---- Stochastic quantizers (quantize.rs). The uniforms come from the CPU's xoshiro256++
// stream, drawn on the host: element i uses draw i / 2, its bits 40..63 when i is even and
// bits 8..31 when i is odd (fill_u24), as an integer u < 2^24 standing for u·2^-24. ----

#define U24_SCALE 5.9604644775390625e-8f

// Element i's 24-bit uniform: draw first + i / 2 of the SplitMix64 stream keyed `key`
// (compress/rng.rs `Counter`), its bits 40..63 when i is even and 8..31 when odd.
__device__ __forceinline__ u32 uniform24(unsigned long long key, unsigned long long first, u32 i) {
    unsigned long long z = key + (first + (unsigned long long)(i / 2) + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (i & 1u) ? (u32)((z >> 8) & 0xFFFFFFull) : (u32)(z >> 40);
}

// 2^k as a double, exact for -1022 ≤ k ≤ 1023; 0 below (never reached by our own payloads).
__device__ __forceinline__ double pow2(int k) {
    if (k < -1022) return 0.0;
    return __longlong_as_double((long long)(1023 + k) << 52);
}

// TernGrad: header f32 max |x|, then code 1 (+max) or 2 (−max) with probability |x|/max, else 0.
extern "C" __global__ void terngrad_encode(const float *x, unsigned long long key, unsigned long long first, u8 *out, u32 n, const u32 *max_bits) {
    float top = __uint_as_float(*max_bits);
    float inv = top > 0.0f ? __fdiv_rn(1.0f, top) : 0.0f;
    if (blockIdx.x == 0 && threadIdx.x == 0) store_f32(out, top);
    u8 *codes = out + 4;
    u32 bytes = (n + 3) / 4;
    for (u32 b = blockIdx.x * blockDim.x + threadIdx.x; b < bytes; b += gridDim.x * blockDim.x) {
        u32 v = 0;
        for (u32 j = 0; j < 4; j++) {
            u32 i = 4 * b + j;
            if (i < n) {
                float e = x[i];
                float u = __fmul_rn((float)uniform24(key, first, i), U24_SCALE);
                bool keep = u < __fmul_rn(fabsf(e), inv);
                u32 code = keep ? 1u + (u32)(e < 0.0f) : 0u;
                v |= code << (2 * j);
            }
        }
        codes[b] = (u8)v;
    }
}

// QSGD: the f32 norm is already at out[0..4] (sign_finish kind 2); codes of `bits` bits, LSB
// first, back to back. One thread per group of 8 elements, which fills exactly `bits` bytes
// (the last group ceil(count·bits / 8)). levels ≤ QSGD_MAX_LEVELS, so r < 2^20 and the CPU's
// i32 path applies: whole = trunc(min(r, 2^20)).
extern "C" __global__ void qsgd_encode(const float *x, unsigned long long key, unsigned long long first, u8 *out, u32 n, u32 levels, u32 bits, u32 *bad) {
    float norm = load_f32(out);
    float scale = norm > 0.0f ? __fdiv_rn(__uint2float_rn(levels), norm) : 0.0f;
    u8 *body = out + 4;
    u32 groups = (n + 7) / 8;
    for (u32 g = blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += gridDim.x * blockDim.x) {
        u8 buf[16];
        for (u32 b = 0; b < 16; b++) buf[b] = 0;
        u32 start = 8 * g;
        u32 count = min(8u, n - start);
        for (u32 j = 0; j < count; j++) {
            u32 i = start + j;
            float e = x[i];
            note_finite(e, i, bad);
            float r = __fmul_rn(fabsf(e), scale);
            int whole = __float2int_rz(fminf(r, 1048576.0f));
            float u = __fmul_rn((float)uniform24(key, first, i), U24_SCALE);
            int up = u < __fsub_rn(r, (float)whole) ? 1 : 0;
            int level = min(whole + up, (int)levels);
            u32 code = (u32)((int)levels + (e < 0.0f ? -level : level));
            u32 pos = j * bits;
            for (u32 k = 0; k < bits; k++)
                if ((code >> k) & 1u) buf[(pos + k) >> 3] |= (u8)(1u << ((pos + k) & 7u));
        }
        u32 nbytes = (count * bits + 7) / 8;
        for (u32 b = 0; b < nbytes; b++) body[(size_t)g * bits + b] = buf[b];
    }
}

// acc += (code − levels)·(norm / levels), rounded step by step as on the CPU.
extern "C" __global__ void qsgd_decode_add(const u8 *p, float *acc, u32 n, u32 levels, u32 bits) {
    float lv = __uint2float_rn(levels);
    float step = __fdiv_rn(load_f32(p), lv);
    const u8 *body = p + 4;
    size_t len = ((size_t)n * bits + 7) / 8;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        size_t pos = (size_t)i * bits;
        size_t byte = pos >> 3;
        u32 w = 0;
        for (u32 t = 0; t < 3; t++)
            if (byte + t < len) w |= (u32)body[byte + t] << (8 * t);
        u32 code = (w >> (pos & 7)) & ((1u << bits) - 1u);
        acc[i] = __fadd_rn(acc[i], __fmul_rn(__fsub_rn((float)code, lv), step));
    }
}

// Natural compression: header i32 `top`, then one byte per element (quantize.rs natural_encode).
extern "C" __global__ void natural_encode(const float *x, unsigned long long key, unsigned long long first, u8 *out, u32 n, const u32 *max_bits) {
    int max_exp = max((int)(*max_bits >> 23) - 127, -126);
    int top = min(max_exp + 1, 127);
    int bottom = top + 1 - 127;
    double low_scale = pow2(24 - bottom);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        u32 w = (u32)top;
        out[0] = (u8)w; out[1] = (u8)(w >> 8); out[2] = (u8)(w >> 16); out[3] = (u8)(w >> 24);
    }
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u32 bits = __float_as_uint(x[i]);
        u32 mag = bits & ABS_MASK;
        u32 sign = (bits >> 31) << 7;
        int biased = (int)(mag >> 23);
        int e = biased - 127;
        u32 u = uniform24(key, first, i);
        u32 d;
        if (mag == 0) {
            d = 0;
        } else if (e < bottom || biased == 0) {
            // Below the range: 2^bottom with probability |x| / 2^bottom (both sides exact in f64).
            d = (double)u < (double)__uint_as_float(mag) * low_scale ? (sign | 127u) : 0u;
        } else {
            int up = ((int)u < (int)(2u * (mag & 0x7FFFFFu)) && e < top) ? 1 : 0;
            d = sign | (u32)(top + 1 - e - up);
        }
        out[4 + (size_t)i] = (u8)d;
    }
}

// Adds ±2^(top + 1 − m) for a byte with m = bits 0..6 (m = 0: ±0), bit 7 the sign.
extern "C" __global__ void natural_decode_add(const u8 *p, float *acc, u32 n) {
    int top = (int)((u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24));
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        u32 code = p[4 + (size_t)i];
        int m = (int)(code & 0x7Fu);
        float v = m == 0 ? 0.0f : (float)pow2(top + 1 - m);
        if (code & 0x80u) v = -v;
        acc[i] = __fadd_rn(acc[i], v);
    }
}

// Threshold (sparse.rs): u32 count c, c indices, c values, the values right after the indices.
// `len` is the bytes available at p; a count that does not fit adds nothing (our own payloads
// always fit). Indices are distinct, so no two threads add into one element.
extern "C" __global__ void threshold_decode_add(const u8 *p, unsigned long long len, float *acc, u32 n) {
    if (len < 4) return;
    u32 count = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
    if (count > n || 4ull + 8ull * (unsigned long long)count > len) return;
    const u8 *idx = p + 4;
    const u8 *val = p + 4 + 4 * (size_t)count;
    for (u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < count; j += gridDim.x * blockDim.x) {
        const u8 *q = idx + 4 * (size_t)j;
        u32 i = (u32)q[0] | ((u32)q[1] << 8) | ((u32)q[2] << 16) | ((u32)q[3] << 24);
        if (i < n) acc[i] = __fadd_rn(acc[i], load_f32(val + 4 * (size_t)j));
    }
}

// ---- DGC error-feedback memory (memory.rs) ----
// Momentum correction and local accumulation: u ← m·u + g, v ← v + u, and v is compressed.
extern "C" __global__ void dgc_compensate(const float *g, float *u, float *v, float *out, u32 n, float m) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float ui = __fadd_rn(__fmul_rn(m, u[i]), g[i]);
        float vi = __fadd_rn(v[i], ui);
        u[i] = ui;
        v[i] = vi;
        out[i] = vi;
    }
}

// Momentum factor masking: where the own payload carried a non-zero value, v and u restart.
// Multiplied by 0 or 1 as the CPU does, so a cleared negative element keeps its −0.
extern "C" __global__ void dgc_mask(float *u, float *v, const float *transmitted, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float keep = transmitted[i] != 0.0f ? 0.0f : 1.0f;
        v[i] = __fmul_rn(v[i], keep);
        u[i] = __fmul_rn(u[i], keep);
    }
}
