// PowerSGD kernels whose results equal the CPU reference's bits (exec/src/compress/powersgd.rs):
// every output element is a chain of separately rounded multiplies and adds in the CPU's order
// (compiled with --fmad=false; the explicit __f*_rn make the roundings visible). A matrix is
// rows × cols row-major, P rows × r, Q cols × r (the wire layout); one launch per matrix.

typedef unsigned int u32;

#define FULL_MASK 0xFFFFFFFFu
// f32 lanes of the CPU's row · column products (powersgd.rs `dots`, its AVX2 width).
#define P_LANES 8u
// Outputs per warp in powersgd_p: one per group of P_LANES lanes.
#define P_GROUPS (32u / P_LANES)

// P = M·Q. Output (i, j) is dots(): lane l sums M[i][c]·Q[c][j] over c ≡ l (mod 8) below the
// last whole group of 8 columns, from +0; the 8 lane sums are added in order from -0 (Rust's
// f32 Sum), then the tail's in-order sum (also from -0). A group of 8 lanes computes one
// output, so the lanes' loads of a row are contiguous. Warps walk the outputs in steps of 4;
// a group past the end repeats the last output without writing it, so that the whole warp
// takes part in every shuffle.
extern "C" __global__ void powersgd_p(const float *m, const float *q, float *p, u32 rows, u32 cols, u32 r) {
    u32 lane = threadIdx.x & 31u, group = lane / P_LANES, l = lane % P_LANES;
    u32 outputs = rows * r;
    u32 warps = gridDim.x * blockDim.x / 32u;
    u32 whole = cols / P_LANES * P_LANES;
    for (u32 base = (blockIdx.x * blockDim.x + threadIdx.x) / 32u * P_GROUPS; base < outputs; base += warps * P_GROUPS) {
        u32 out = min(base + group, outputs - 1u);
        u32 i = out / r, j = out % r;
        const float *row = m + (size_t)i * cols;
        float acc = 0.0f;
        for (u32 c = l; c < whole; c += P_LANES) acc = __fadd_rn(acc, __fmul_rn(row[c], q[(size_t)c * r + j]));
        float sum = -0.0f;
        for (u32 k = 0; k < P_LANES; k++) sum = __fadd_rn(sum, __shfl_sync(FULL_MASK, acc, group * P_LANES + k));
        float tail = -0.0f;
        for (u32 c = whole; c < cols; c++) tail = __fadd_rn(tail, __fmul_rn(row[c], q[(size_t)c * r + j]));
        if (l == 0 && base + group < outputs) p[out] = __fadd_rn(sum, tail);
    }
}

// Σᵢ p[i][a]·p[i][b] as powersgd.rs `column_dot`: lane k sums the rows i ≡ k (mod 32) in order
// from +0, then the 32 lane sums are added in order from -0. Every lane gets the total.
__device__ float column_dot(const float *p, u32 rows, u32 r, u32 a, u32 b) {
    float acc = 0.0f;
    for (u32 i = threadIdx.x; i < rows; i += 32u) acc = __fadd_rn(acc, __fmul_rn(p[(size_t)i * r + a], p[(size_t)i * r + b]));
    float sum = -0.0f;
    for (u32 k = 0; k < 32u; k++) sum = __fadd_rn(sum, __shfl_sync(FULL_MASK, acc, k));
    return sum;
}

// Modified Gram–Schmidt on P's columns in place (powersgd.rs `orthogonalize`), one warp
// (launch 1 × 32). Lane k owns rows i ≡ k (mod 32) in the dots and the updates alike, so every
// row it reads was last written by itself and the shuffles order the rest.
extern "C" __global__ void powersgd_orthogonalize(float *p, u32 rows, u32 r) {
    for (u32 j = 0; j < r; j++) {
        for (u32 l = 0; l < j; l++) {
            float dot = column_dot(p, rows, r, j, l);
            for (u32 i = threadIdx.x; i < rows; i += 32u) {
                size_t at = (size_t)i * r;
                p[at + j] = __fsub_rn(p[at + j], __fmul_rn(dot, p[at + l]));
            }
        }
        float norm = __fsqrt_rn(column_dot(p, rows, r, j, j));
        // As on the CPU, a vanished column (or a NaN norm) is left undivided.
        if (norm > 0.0f) {
            for (u32 i = threadIdx.x; i < rows; i += 32u) p[(size_t)i * r + j] = __fdiv_rn(p[(size_t)i * r + j], norm);
        }
    }
}

// Q = Mᵀ·P: Q[c][j] sums M[i][c]·P[i][j] over the rows in order from +0, as q_product (its
// four-row steps add in row order too). Consecutive threads take consecutive columns of M.
extern "C" __global__ void powersgd_q(const float *m, const float *p, float *q, u32 rows, u32 cols, u32 r) {
    u32 outputs = cols * r;
    for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < outputs; t += gridDim.x * blockDim.x) {
        u32 j = t / cols, c = t % cols;
        float acc = 0.0f;
        for (u32 i = 0; i < rows; i++) acc = __fadd_rn(acc, __fmul_rn(m[(size_t)i * cols + c], p[(size_t)i * r + j]));
        q[(size_t)c * r + j] = acc;
    }
}

// acc += P·Qᵀ: element (i, c) adds Σⱼ P[i][j]·Q[c][j], summed in order from -0, as decode_add.
extern "C" __global__ void powersgd_decode_add(const float *p, const float *q, float *acc, u32 rows, u32 cols, u32 r) {
    u32 n = rows * cols;
    for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
        u32 i = t / cols, c = t % cols;
        float sum = -0.0f;
        for (u32 j = 0; j < r; j++) sum = __fadd_rn(sum, __fmul_rn(p[(size_t)i * r + j], q[(size_t)c * r + j]));
        acc[t] = __fadd_rn(acc[t], sum);
    }
}

// Error feedback's transmitted part: the averaged result, divided as the host backend does.
extern "C" __global__ void powersgd_average(const float *result, float *transmitted, u32 n, float world) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        transmitted[i] = __fdiv_rn(result[i], world);
    }
}
