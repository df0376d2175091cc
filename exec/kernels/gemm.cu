// Busy work of a known duration for the compute stream: a shared-memory tiled FMA GEMM,
// C = A·B for n × n row-major matrices, 16 × 16 threads per 16 × 16 tile of C.

#define TILE 16

extern "C" __global__ void gemm(const float *a, const float *b, float *c, unsigned int n) {
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    unsigned int tx = threadIdx.x, ty = threadIdx.y;
    unsigned int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (unsigned int t = 0; t < n; t += TILE) {
        ta[ty][tx] = (row < n && t + tx < n) ? a[(size_t)row * n + t + tx] : 0.0f;
        tb[ty][tx] = (t + ty < n && col < n) ? b[(size_t)(t + ty) * n + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc = fmaf(ta[ty][k], tb[k][tx], acc);
        __syncthreads();
    }
    if (row < n && col < n) c[(size_t)row * n + col] = acc;
}
