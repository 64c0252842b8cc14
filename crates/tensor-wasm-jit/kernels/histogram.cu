// A 64-bin histogram of the low six bits of each word: bins per block in shared memory
// (atomicAdd on shared), then one atomicAdd per bin into the global result.
extern "C" __global__ void histogram(const unsigned int* x, unsigned int* bins, unsigned int n) {
    __shared__ unsigned int local[64];
    for (unsigned int b = threadIdx.x; b < 64; b += blockDim.x) local[b] = 0;
    __syncthreads();
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&local[x[i] & 63], 1u);
    __syncthreads();
    for (unsigned int b = threadIdx.x; b < 64; b += blockDim.x) {
        if (local[b] != 0) atomicAdd(&bins[b], local[b]);
    }
}
