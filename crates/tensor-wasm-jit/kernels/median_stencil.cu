// A 1-D stencil: each thread copies its 7-wide neighbourhood (clamped at the ends) into a
// per-thread array, sorts it by insertion (dynamic indices: the array lives in local memory),
// and blends the three middle values with flush-to-zero arithmetic written as inline PTX:
// subnormal inputs and results of the blend become zeros of their sign.
extern "C" __global__ void median_stencil(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float w[7];
    for (int k = 0; k < 7; k++) {
        int j = min(max(i + k - 3, 0), n - 1);
        w[k] = x[j];
    }
    for (int k = 1; k < 7; k++) {
        float v = w[k];
        int m = k - 1;
        while (m >= 0 && w[m] > v) {
            w[m + 1] = w[m];
            m--;
        }
        w[m + 1] = v;
    }
    float r;
    asm("mul.ftz.f32 %0, %1, 0f3E800000;" : "=f"(r) : "f"(w[2]));
    asm("fma.rn.ftz.f32 %0, %1, 0f3F000000, %2;" : "=f"(r) : "f"(w[3]), "f"(r));
    asm("fma.rn.ftz.f32 %0, %1, 0f3E800000, %2;" : "=f"(r) : "f"(w[4]), "f"(r));
    out[i] = r;
}
