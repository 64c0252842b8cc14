// A 2-D convolution of one h x w image with a 3 x 3 filter, zero padding, one output per
// thread on a 2-D grid; taps accumulated by fused multiply-adds, row by row.
extern "C" __global__ void conv2d(const float* image, const float* filter, float* out, int h, int w) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= w || y >= h) return;
    float acc = 0.0f;
    for (int dy = -1; dy <= 1; dy++) {
        for (int dx = -1; dx <= 1; dx++) {
            int sy = y + dy, sx = x + dx;
            float v = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? image[sy * w + sx] : 0.0f;
            acc += v * filter[(dy + 1) * 3 + dx + 1];
        }
    }
    out[y * w + x] = acc;
}
