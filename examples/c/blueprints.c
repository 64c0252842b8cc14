/* blueprints: a WASI command that runs JIT blueprints through the wasi:cuda
 * ABI (GPU on CUDA hosts, CPU backend elsewhere) and compares each result
 * with a plain loop in the guest.
 *
 * stdin: "N" (problem size scale, default 100). stdout: one JSON object with
 * the number of mismatching elements per blueprint (0 expected everywhere).
 *
 * Build: clang --target=wasm32-wasi -O2 -I sdk/c examples/c/blueprints.c -o examples/c/blueprints.wasm
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_wasm.h"

static void fail(const char *what, int32_t rc) {
    char msg[512];
    int32_t n = tw_last_error(msg, (int32_t)sizeof msg - 1);
    if (n < 0) n = 0;
    if (n > (int32_t)sizeof msg - 1) n = (int32_t)sizeof msg - 1;
    msg[n] = 0;
    printf("{\"error\": \"%s failed (%d): %s\"}\n", what, rc, msg);
    exit(2);
}

static void *buffer(size_t bytes) {
    size_t rounded = (bytes + 15) / 16 * 16;
    void *p = aligned_alloc(16, rounded ? rounded : 16);
    if (!p) {
        printf("{\"error\": \"out of memory\"}\n");
        exit(1);
    }
    memset(p, 0, rounded ? rounded : 16);
    return p;
}

static int32_t kernel(const char *desc) {
    int32_t k = tw_kernel_from_blueprint(desc);
    if (k < 0) fail(desc, k);
    return k;
}

static void launch(const char *what, int32_t k, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t bx,
                   uint32_t by, const tw_arg *args, uint32_t nargs) {
    int32_t rc = tw_launch(k, gx, gy, gz, bx, by, 1, 0, args, nargs);
    if (rc < 0) fail(what, rc);
}

static unsigned vector_add4(unsigned n) {
    float *a = buffer(4 * n), *b = buffer(4 * n), *out = buffer(4 * n);
    for (unsigned i = 0; i < n; i++) {
        a[i] = (float)i * 0.5f;
        b[i] = (float)(n - i) * 0.25f;
    }
    tw_arg args[4] = {tw_buffer(a, 4 * n), tw_buffer(b, 4 * n), tw_buffer(out, 4 * n), tw_u32(n)};
    unsigned threads = (n + 3) / 4;
    launch("vector_add[4]", kernel("vector_add[4]"), (threads + 255) / 256, 1, 1, 256, 1, args, 4);
    unsigned bad = 0;
    for (unsigned i = 0; i < n; i++) bad += out[i] != a[i] + b[i];
    return bad;
}

static unsigned relu(unsigned n) {
    float *x = buffer(4 * n), *out = buffer(4 * n);
    for (unsigned i = 0; i < n; i++) x[i] = (float)((int)(i % 17) - 8) * 1.5f;
    tw_arg args[3] = {tw_buffer(x, 4 * n), tw_buffer(out, 4 * n), tw_u32(n)};
    launch("elementwise[relu]", kernel("elementwise[relu]"), (n + 255) / 256, 1, 1, 256, 1, args, 3);
    unsigned bad = 0;
    for (unsigned i = 0; i < n; i++) bad += out[i] != (x[i] > 0.0f ? x[i] : 0.0f);
    return bad;
}

static unsigned reduce_sum_i32(unsigned rows, unsigned cols) {
    int32_t *x = buffer(4 * rows * cols), *out = buffer(4 * rows);
    for (unsigned i = 0; i < rows * cols; i++) x[i] = (int32_t)(i * 2654435761u >> 7) - (1 << 23);
    tw_arg args[4] = {tw_buffer(x, 4 * rows * cols), tw_buffer(out, 4 * rows), tw_u32(rows),
                      tw_u32(cols)};
    launch("reduce[sum]:i32", kernel("reduce[sum]:i32"), rows, 1, 1, 256, 1, args, 4);
    unsigned bad = 0;
    for (unsigned r = 0; r < rows; r++) {
        uint32_t acc = 0; /* i32 sums wrap */
        for (unsigned c = 0; c < cols; c++) acc += (uint32_t)x[r * cols + c];
        bad += (int32_t)acc != out[r];
    }
    return bad;
}

static unsigned matmul(unsigned m, unsigned n, unsigned k) {
    float *a = buffer(4 * m * k), *b = buffer(4 * k * n), *c = buffer(4 * m * n);
    for (unsigned i = 0; i < m * k; i++) a[i] = (float)((i * 7u) % 13u) - 6.0f;
    for (unsigned i = 0; i < k * n; i++) b[i] = (float)((i * 5u) % 11u) * 0.5f;
    tw_arg args[6] = {tw_buffer(a, 4 * m * k), tw_buffer(b, 4 * k * n), tw_buffer(c, 4 * m * n),
                      tw_u32(m), tw_u32(n), tw_u32(k)};
    launch("matmul[16x16x16]", kernel("matmul[16x16x16]"), (n + 15) / 16, (m + 15) / 16, 1, 16, 16,
           args, 6);
    unsigned bad = 0;
    for (unsigned i = 0; i < m; i++)
        for (unsigned j = 0; j < n; j++) {
            float acc = 0.0f;
            for (unsigned p = 0; p < k; p++) acc = acc + a[i * k + p] * b[p * n + j];
            bad += acc != c[i * n + j];
        }
    return bad;
}

/* conv2d[3x3,s1,p1]: input [N,C,H,W], weight [K,C,3,3], output [N,K,H,W]. */
static unsigned conv2d(unsigned nn, unsigned cc, unsigned h, unsigned w, unsigned kk) {
    unsigned in_len = nn * cc * h * w, w_len = kk * cc * 9, out_len = nn * kk * h * w;
    float *in = buffer(4 * in_len), *wt = buffer(4 * w_len), *out = buffer(4 * out_len);
    for (unsigned i = 0; i < in_len; i++) in[i] = (float)((i * 3u) % 7u) - 3.0f;
    for (unsigned i = 0; i < w_len; i++) wt[i] = (float)((i * 5u) % 9u) * 0.25f - 1.0f;
    tw_arg args[8] = {tw_buffer(in, 4 * in_len), tw_buffer(wt, 4 * w_len), tw_buffer(out, 4 * out_len),
                      tw_u32(nn), tw_u32(cc), tw_u32(h), tw_u32(w), tw_u32(kk)};
    launch("conv2d[3x3,s1,p1]", kernel("conv2d[3x3,s1,p1]"), (h * w + 255) / 256, kk, nn, 256, 1,
           args, 8);
    unsigned bad = 0;
    for (unsigned n = 0; n < nn; n++)
        for (unsigned k = 0; k < kk; k++)
            for (unsigned y = 0; y < h; y++)
                for (unsigned x = 0; x < w; x++) {
                    float acc = 0.0f;
                    for (unsigned c = 0; c < cc; c++)
                        for (unsigned r = 0; r < 3; r++)
                            for (unsigned s = 0; s < 3; s++) {
                                int iy = (int)y + (int)r - 1, ix = (int)x + (int)s - 1;
                                if (iy < 0 || ix < 0 || iy >= (int)h || ix >= (int)w) continue;
                                acc = acc + in[((n * cc + c) * h + (unsigned)iy) * w + (unsigned)ix] *
                                                wt[((k * cc + c) * 3 + r) * 3 + s];
                            }
                    bad += acc != out[((n * kk + k) * h + y) * w + x];
                }
    return bad;
}

/* |got - want| within atol + rtol * |want|: the model kernels' numeric contracts are exact
 * between the CPU and the GPU, not with this guest's libm. */
static unsigned off(float got, double want, double atol, double rtol) {
    return !(fabs((double)got - want) <= atol + rtol * fabs(want));
}

static unsigned softmax(unsigned rows, unsigned n) {
    float *x = buffer(4 * rows * n), *out = buffer(4 * rows * n);
    for (unsigned i = 0; i < rows * n; i++) x[i] = (float)((int)((i * 37u) % 101u) - 50) * 0.1f;
    tw_arg args[5] = {tw_buffer(x, 4 * rows * n), tw_buffer(out, 4 * rows * n), tw_u32(rows),
                      tw_u32(n), tw_u32(1)};
    launch("softmax[axis]", kernel("softmax[axis]"), rows, 1, 1, 256, 1, args, 5);
    unsigned bad = 0;
    for (unsigned r = 0; r < rows; r++) {
        const float *row = x + r * n;
        double m = row[0], s = 0.0;
        for (unsigned j = 1; j < n; j++) m = row[j] > m ? row[j] : m;
        for (unsigned j = 0; j < n; j++) s += exp(row[j] - m);
        for (unsigned j = 0; j < n; j++) bad += off(out[r * n + j], exp(row[j] - m) / s, 0.0, 1e-5);
    }
    return bad;
}

static unsigned layernorm(unsigned rows, unsigned cols) {
    float *x = buffer(4 * rows * cols), *scale = buffer(4 * cols), *bias = buffer(4 * cols),
          *out = buffer(4 * rows * cols);
    for (unsigned i = 0; i < rows * cols; i++) x[i] = (float)((int)((i * 29u) % 83u) - 40) * 0.05f;
    for (unsigned j = 0; j < cols; j++) {
        scale[j] = 1.0f + (float)(j % 5) * 0.25f;
        bias[j] = (float)(j % 3) - 1.0f;
    }
    tw_arg args[7] = {tw_buffer(x, 4 * rows * cols), tw_buffer(scale, 4 * cols),
                      tw_buffer(bias, 4 * cols), tw_buffer(out, 4 * rows * cols), tw_u32(rows),
                      tw_u32(cols), tw_f32(1e-5f)};
    launch("layernorm[rows]", kernel("layernorm[rows]"), rows, 1, 1, 256, 1, args, 7);
    unsigned bad = 0;
    for (unsigned r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        double mean = 0.0, var = 0.0;
        for (unsigned j = 0; j < cols; j++) mean += row[j];
        mean /= cols;
        for (unsigned j = 0; j < cols; j++) var += (row[j] - mean) * (row[j] - mean);
        double inv = 1.0 / sqrt(var / cols + 1e-5);
        for (unsigned j = 0; j < cols; j++)
            bad += off(out[r * cols + j], (row[j] - mean) * inv * scale[j] + bias[j], 1e-5, 1e-5);
    }
    return bad;
}

static unsigned gelu(unsigned n) {
    float *x = buffer(4 * n), *out = buffer(4 * n);
    for (unsigned i = 0; i < n; i++) x[i] = (float)((int)(i % 97u) - 48) * 0.125f;
    tw_arg args[3] = {tw_buffer(x, 4 * n), tw_buffer(out, 4 * n), tw_u32(n)};
    launch("elementwise[gelu]", kernel("elementwise[gelu]"), (n + 255) / 256, 1, 1, 256, 1, args, 3);
    unsigned bad = 0;
    for (unsigned i = 0; i < n; i++)
        bad += off(out[i], 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0))), 1e-6, 1e-5);
    return bad;
}

int main(void) {
    unsigned scale = 100;
    if (scanf("%u", &scale) != 1 || scale == 0 || scale > 4096) scale = 100;
    unsigned v = vector_add4(scale * 10 + 3);
    unsigned r = relu(scale * 10 + 1);
    unsigned s = reduce_sum_i32(scale / 10 + 1, scale * 3 + 7);
    unsigned m = matmul(scale / 3 + 1, scale / 2 + 3, scale / 4 + 5);
    unsigned c = conv2d(2, 3, scale / 10 + 3, scale / 8 + 4, 4);
    unsigned sm = softmax(scale / 10 + 2, scale + 5);
    unsigned ln = layernorm(scale / 10 + 2, scale + 3);
    unsigned g = gelu(scale * 10 + 1);
    printf("{\"vector_add[4]\": %u, \"elementwise[relu]\": %u, \"reduce[sum]:i32\": %u, "
           "\"matmul[16x16x16]\": %u, \"conv2d[3x3,s1,p1]\": %u, \"softmax[axis]\": %u, "
           "\"layernorm[rows]\": %u, \"elementwise[gelu]\": %u}\n",
           v, r, s, m, c, sm, ln, g);
    return v + r + s + m + c + sm + ln + g == 0 ? 0 : 1;
}
