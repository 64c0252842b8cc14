/* matmul: a WASI command that multiplies two matrices through the wasi:cuda
 * ABI (the built-in "matmul" kernel: GPU on CUDA hosts, CPU backend
 * elsewhere) and checks the result against a plain loop in the guest.
 *
 * stdin: "M N K" (defaults 64 64 64). stdout: JSON with the shape, a checksum
 * of C and the number of elements that differ from the reference (0 expected).
 *
 * Build: clang --target=wasm32-wasi -O2 -I sdk/c examples/c/matmul.c -o examples/c/matmul.wasm
 */
#include <stdio.h>
#include <stdlib.h>

#include "tensor_wasm.h"

static void fail(const char *what, int32_t rc) {
    char msg[256];
    int32_t n = tw_last_error(msg, (int32_t)sizeof msg - 1);
    msg[n < 0 ? 0 : (n < (int32_t)sizeof msg - 1 ? n : (int32_t)sizeof msg - 1)] = 0;
    printf("{\"error\": \"%s failed (%d): %s\"}\n", what, rc, msg);
    exit(2);
}

int main(void) {
    unsigned m = 64, n = 64, k = 64;
    if (scanf("%u %u %u", &m, &n, &k) != 3) {
        m = n = k = 64;
    }
    float *a = malloc(sizeof(float) * m * k);
    float *b = malloc(sizeof(float) * k * n);
    float *c = calloc((size_t)m * n, sizeof(float));
    if (!a || !b || !c) {
        printf("{\"error\": \"out of memory\"}\n");
        return 1;
    }
    for (unsigned i = 0; i < m * k; i++) a[i] = (float)((i * 7u) % 13u) - 6.0f;
    for (unsigned i = 0; i < k * n; i++) b[i] = (float)((i * 5u) % 11u) * 0.5f;

    int32_t kernel = tw_kernel_from_blueprint("matmul");
    if (kernel < 0) fail("kernel_from_blueprint", kernel);
    tw_arg args[6] = {
        tw_buffer(a, sizeof(float) * m * k), tw_buffer(b, sizeof(float) * k * n),
        tw_buffer(c, sizeof(float) * m * n), tw_u32(m), tw_u32(n), tw_u32(k),
    };
    int32_t rc = tw_launch(kernel, (n + 15) / 16, (m + 15) / 16, 1, 16, 16, 1, 0, args, 6);
    if (rc < 0) fail("launch", rc);
    if ((rc = tw_sync()) < 0) fail("sync", rc);

    unsigned mismatches = 0;
    double checksum = 0.0;
    for (unsigned row = 0; row < m; row++) {
        for (unsigned col = 0; col < n; col++) {
            float acc = 0.0f;
            for (unsigned p = 0; p < k; p++) acc = acc + a[row * k + p] * b[p * n + col];
            if (acc != c[row * n + col]) mismatches++;
            checksum += c[row * n + col];
        }
    }
    printf("{\"m\": %u, \"n\": %u, \"k\": %u, \"checksum\": %.1f, \"mismatches\": %u}\n", m, n, k,
           checksum, mismatches);
    return mismatches == 0 ? 0 : 1;
}
