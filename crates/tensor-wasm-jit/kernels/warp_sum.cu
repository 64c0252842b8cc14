// One sum per warp by shuffles: a tree of __shfl_down_sync over the 32 lanes; lanes past the
// end contribute 0. Lane 0 writes its warp's sum.
extern "C" __global__ void warp_sum(const float* x, float* sums, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    if ((threadIdx.x & 31) == 0) sums[i / 32] = v;
}
