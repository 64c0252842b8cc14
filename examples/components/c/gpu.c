/* The GPU from C through tensor-wasm:gpu (world ../gpu-demo.wit, bindings by wit-bindgen):
 * the same three exports as ../python/gpu_app.py, checked against the guest's own arithmetic.
 * A misuse answers "Error_<Case>: <message>", as the Python one does. */
#include <stdlib.h>
#include <string.h>

#include "gpu_demo.h"

typedef tensor_wasm_gpu_buffers_own_buffer_t buffer_t;
typedef tensor_wasm_gpu_kernels_own_kernel_t kernel_t;
typedef tensor_wasm_gpu_types_error_t gpu_error_t;

/* "Error_<Case>: <message>" of a GPU error, into `out`. */
static void describe(const gpu_error_t *e, gpu_demo_string_t *out) {
    static const char *names[] = {"Error_InvalidArgument", "Error_NotAvailable",
                                  "Error_PermissionDenied", "Error_LimitExceeded",
                                  "Error_Device"};
    const char *name = e->tag < 5 ? names[e->tag] : "Error_Unknown";
    /* Every case carries a string: the union's members share one layout. */
    const gpu_demo_string_t *message = &e->val.invalid_argument;
    size_t n = strlen(name);
    out->len = n + 2 + message->len;
    out->ptr = malloc(out->len);
    memcpy(out->ptr, name, n);
    memcpy(out->ptr + n, ": ", 2);
    memcpy(out->ptr + n + 2, message->ptr, message->len);
}

/* Evaluates a GPU call; on failure describes its error into `err` and returns false. */
#define GPU(call)                       \
    do {                                \
        gpu_error_t e_;                 \
        if (!(call)) {                  \
            describe(&e_, err);         \
            return false;               \
        }                               \
    } while (0)
#define GPU_ERR &e_

static tensor_wasm_gpu_buffers_borrow_buffer_t b(buffer_t buffer) {
    return tensor_wasm_gpu_buffers_borrow_buffer(buffer);
}

static tensor_wasm_gpu_kernels_arg_t buf(buffer_t buffer) {
    tensor_wasm_gpu_kernels_arg_t arg = {.tag = TENSOR_WASM_GPU_KERNELS_ARG_BUFFER};
    arg.val.buffer = b(buffer);
    return arg;
}

static tensor_wasm_gpu_kernels_arg_t u32(uint32_t v) {
    tensor_wasm_gpu_kernels_arg_t arg = {.tag = TENSOR_WASM_GPU_KERNELS_ARG_U32};
    arg.val.u32 = v;
    return arg;
}

static tensor_wasm_gpu_kernels_arg_t f32(float v) {
    tensor_wasm_gpu_kernels_arg_t arg = {.tag = TENSOR_WASM_GPU_KERNELS_ARG_F32};
    arg.val.f32 = v;
    return arg;
}

static bool kernel(const char *descriptor, kernel_t *k, gpu_demo_string_t *err) {
    gpu_demo_string_t d = {(uint8_t *)descriptor, strlen(descriptor)};
    GPU(tensor_wasm_gpu_kernels_static_kernel_from_blueprint(&d, k, GPU_ERR));
    return true;
}

static bool launch(kernel_t k, uint32_t gx, uint32_t gy, uint32_t bx, uint32_t by,
                   tensor_wasm_gpu_kernels_arg_t *args, size_t nargs, gpu_demo_string_t *err) {
    tensor_wasm_gpu_kernels_dim3_t grid = {gx, gy, 1}, block = {bx, by, 1};
    tensor_wasm_gpu_kernels_list_arg_t list = {args, nargs};
    GPU(tensor_wasm_gpu_kernels_launch(tensor_wasm_gpu_kernels_borrow_kernel(k), &grid, &block,
                                       0, &list, GPU_ERR));
    return true;
}

static bool upload(uint64_t bytes, const void *data, buffer_t *out, gpu_demo_string_t *err) {
    GPU(tensor_wasm_gpu_buffers_static_buffer_allocate(bytes, out, GPU_ERR));
    if (data) {
        gpu_demo_list_u8_t list = {(uint8_t *)data, bytes};
        GPU(tensor_wasm_gpu_buffers_method_buffer_write(b(*out), 0, &list, GPU_ERR));
    }
    return true;
}

static bool download(buffer_t buffer, uint64_t bytes, void *into, gpu_demo_string_t *err) {
    gpu_demo_list_u8_t list;
    GPU(tensor_wasm_gpu_buffers_method_buffer_read(b(buffer), 0, bytes, &list, GPU_ERR));
    memcpy(into, list.ptr, bytes);
    free(list.ptr);
    return true;
}

bool exports_gpu_demo_add_then_scale(uint32_t n, float factor, gpu_demo_chained_t *ret,
                                     gpu_demo_string_t *err) {
    float *a = malloc(4 * (size_t)n), *x = malloc(4 * (size_t)n), *out = malloc(4 * (size_t)n);
    for (uint32_t i = 0; i < n; i++) {
        a[i] = (float)i * 0.5f;
        x[i] = (float)(n - i) * 0.25f;
    }
    buffer_t da, dx, sum, scaled;
    kernel_t add, scale;
    if (!upload(4 * (uint64_t)n, a, &da, err) || !upload(4 * (uint64_t)n, x, &dx, err) ||
        !upload(4 * (uint64_t)n, NULL, &sum, err) || !upload(4 * (uint64_t)n, NULL, &scaled, err) ||
        !kernel("vector_add", &add, err) || !kernel("scale", &scale, err))
        return false;
    uint32_t blocks = (n + 255) / 256;
    tensor_wasm_gpu_kernels_arg_t add_args[] = {buf(da), buf(dx), buf(sum), u32(n)};
    /* The sum stays on the device: `scale` reads it where `vector_add` wrote it. */
    tensor_wasm_gpu_kernels_arg_t scale_args[] = {buf(sum), buf(scaled), f32(factor), u32(n)};
    if (!launch(add, blocks, 1, 256, 1, add_args, 4, err) ||
        !launch(scale, blocks, 1, 256, 1, scale_args, 4, err) ||
        !download(scaled, 4 * (uint64_t)n, out, err))
        return false;
    uint32_t mismatches = 0;
    for (uint32_t i = 0; i < n; i++) {
        float s = a[i] + x[i];
        mismatches += out[i] != s * factor;
    }
    size_t shown = n < 4 ? n : 4;
    ret->first.ptr = malloc(4 * shown);
    memcpy(ret->first.ptr, out, 4 * shown);
    ret->first.len = shown;
    ret->mismatches = mismatches;
    return true;
}

bool exports_gpu_demo_matmul_check(uint32_t m, uint32_t k, uint32_t n, float *ret,
                                   gpu_demo_string_t *err) {
    float *a = malloc(4 * (size_t)m * k), *x = malloc(4 * (size_t)k * n),
          *c = malloc(4 * (size_t)m * n);
    for (uint32_t i = 0; i < m * k; i++) a[i] = (float)((i * 7) % 13) - 6.0f;
    for (uint32_t i = 0; i < k * n; i++) x[i] = (float)((i * 5) % 11) * 0.5f;
    buffer_t da, dx, dc;
    kernel_t mm;
    if (!upload(4 * (uint64_t)m * k, a, &da, err) || !upload(4 * (uint64_t)k * n, x, &dx, err) ||
        !upload(4 * (uint64_t)m * n, NULL, &dc, err) || !kernel("matmul", &mm, err))
        return false;
    tensor_wasm_gpu_kernels_arg_t args[] = {buf(da), buf(dx), buf(dc), u32(m), u32(n), u32(k)};
    if (!launch(mm, (n + 15) / 16, (m + 15) / 16, 16, 16, args, 6, err) ||
        !download(dc, 4 * (uint64_t)m * n, c, err))
        return false;
    double worst = 0.0;
    for (uint32_t row = 0; row < m; row++)
        for (uint32_t col = 0; col < n; col++) {
            double want = 0.0;
            for (uint32_t i = 0; i < k; i++) want += (double)a[row * k + i] * x[i * n + col];
            double diff = c[row * n + col] - want;
            if (diff < 0) diff = -diff;
            if (diff > worst) worst = diff;
        }
    *ret = (float)worst;
    return true;
}

/* Runs one misuse; true when the host refused it (its error described into `answer`). */
static bool refused(const char *what, gpu_demo_string_t *answer) {
    gpu_demo_string_t *err = answer; /* where the helpers describe a failure */
    buffer_t buffer;
    kernel_t k;
    if (strcmp(what, "oversized") == 0) {
        return !upload((uint64_t)1 << 40, NULL, &buffer, err);
    } else if (strcmp(what, "out-of-range") == 0) {
        if (!upload(16, NULL, &buffer, err)) return false;
        gpu_demo_list_u8_t data = {(uint8_t *)"12345678", 8};
        gpu_error_t e;
        if (!tensor_wasm_gpu_buffers_method_buffer_write(b(buffer), 12, &data, &e)) {
            describe(&e, answer);
            return true;
        }
    } else if (strcmp(what, "unknown-blueprint") == 0) {
        return !kernel("no_such_kernel", &k, err);
    } else if (strcmp(what, "raw-ptx") == 0) {
        gpu_demo_string_t ptx = {(uint8_t *)".version 7.0", 12}, entry = {(uint8_t *)"k", 1};
        gpu_error_t e;
        if (!tensor_wasm_gpu_kernels_static_kernel_from_ptx(&ptx, &entry, &k, &e)) {
            describe(&e, answer);
            return true;
        }
    } else if (strcmp(what, "bad-args") == 0) {
        if (!upload(16, NULL, &buffer, err) || !kernel("vector_add", &k, err)) return false;
        tensor_wasm_gpu_kernels_arg_t args[] = {buf(buffer), u32(4)};
        return !launch(k, 1, 1, 1, 1, args, 2, err);
    } else if (strcmp(what, "hog") == 0) {
        for (int i = 0; i < 4096; i++)
            if (!upload(1 << 20, NULL, &buffer, err)) return true;
    }
    return false;
}

bool exports_gpu_demo_misuse(gpu_demo_string_t *what, gpu_demo_string_t *ret,
                             gpu_demo_string_t *err) {
    char name[64] = "";
    size_t n = what->len < sizeof name - 1 ? what->len : sizeof name - 1;
    memcpy(name, what->ptr, n);
    gpu_demo_string_free(what);
    if (refused(name, ret)) return true;
    gpu_demo_string_dup(err, "the host accepted it, or no such misuse");
    return false;
}
