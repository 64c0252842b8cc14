// C = A (m x k) * B (k x n), row-major, in 16 x 16 tiles staged in shared memory; k is a
// multiple of 16. Each product is accumulated by one fused multiply-add in k order.
#define TILE 16
extern "C" __global__ void matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k) {
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < k; t += TILE) {
        ta[threadIdx.y][threadIdx.x] = row < m ? a[row * k + t + threadIdx.x] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = col < n ? b[(t + threadIdx.y) * n + col] : 0.0f;
        __syncthreads();
        for (int s = 0; s < TILE; s++) acc += ta[threadIdx.y][s] * tb[s][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) c[row * n + col] = acc;
}
