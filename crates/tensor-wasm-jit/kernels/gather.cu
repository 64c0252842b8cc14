// An indexed gather through the read-only path: out[i] = table[index[i]], or 0 for an index
// past the table.
extern "C" __global__ void gather(const float* __restrict__ table, const int* __restrict__ index,
                                  float* __restrict__ out, int rows, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int j = index[i];
        out[i] = (j >= 0 && j < rows) ? table[j] : 0.0f;
    }
}
