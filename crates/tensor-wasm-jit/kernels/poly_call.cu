// A kernel calling a device function that is not inlined: Horner's rule, one rounding per
// step, over coefficients that odd blocks first stage in shared memory and even blocks read
// from global memory, so the function reads them through a generic pointer.
__device__ __noinline__ float horner(const float* coeffs, int degree, float x) {
    float acc = coeffs[degree];
    for (int d = degree - 1; d >= 0; d--) acc = __fadd_rn(__fmul_rn(acc, x), coeffs[d]);
    return acc;
}

extern "C" __global__ void poly_call(const float* x, const float* coeffs, float* out, int degree, int n) {
    __shared__ float staged[32];
    int d = min(max(degree, 0), 31);
    if (threadIdx.x <= d) staged[threadIdx.x] = coeffs[threadIdx.x];
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = horner((blockIdx.x & 1) ? staged : coeffs, d, x[i]);
}
