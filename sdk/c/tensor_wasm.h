/*
 * tensor_wasm.h — the TensorWasm guest SDK for C (wasm32-wasi, clang).
 *
 * Guests launch kernels on their own linear memory through the host module
 * "wasi:cuda". Every call returns a negative TW_ERR_* code on failure;
 * tw_last_error() copies the message of the last failure.
 *
 * Semantics:
 *   - tw_launch() returns when the kernel has completed, so guest memory is
 *     never touched by a kernel while guest code runs; tw_sync() is a barrier
 *     that always succeeds.
 *   - Buffers are (pointer, length) ranges of guest memory; the host checks
 *     every one against the instance's memory before anything reaches a device.
 *   - Built-in kernels (descriptors): "vector_add" (a, b, out, n),
 *     "scale" (x, out, alpha, n), "matmul" (a, b, c, m, n, k), all f32,
 *     row-major, bounds-checked by the host. On a CUDA host they run on the
 *     GPU over CUDA managed memory; elsewhere on the CPU backend with the same
 *     results.
 *   - Blueprints (tw_kernel_from_blueprint): generated, bounds-checked kernels
 *     with the same bits on the GPU and the CPU backend, named by a descriptor
 *     "NAME[PARAMS]" with an optional ":f32" (default) or ":i32":
 *       elementwise[add|sub|mul|div|max|min|relu|scale|fma]   (a, b.., out, [alpha,] n)
 *       elementwise[exp|tanh|sigmoid|rsqrt|erf|gelu]          (x, out, n), f32
 *       vector_add[N]  reduce[sum|max]  matmul[TMxTNxTK]  conv2d[RxS,sT,pP]
 *       bmm[nn|nt|tn|tt] (a, b, c, batch, m, n, k)
 *       softmax[axis]    (x, out, outer, n, inner), f32
 *       layernorm[rows]  (x, scale, bias, out, rows, cols, epsilon), f32
 *       concat[N] permute[P] gather[rows] maxpool[RxS,sT,pP] avgpool[RxS,sT,pP]
 *       chain[OP.OP..] 2-4 of elementwise's ops + neg  (x, b.., out, n), f32
 *       dwconv2d[RxS,sT,pP] (input, weight, output, n, c, h, w), depthwise
 *     Arguments go in the order shown, buffers first; every kind's contract,
 *     grid and numeric definition: docs/kernels.md.
 *   - tw_kernel_from_ptx() without the raw_ptx capability verifies and fences
 *     the PTX (it stays inside the function's memory and ends at its deadline;
 *     refused PTX is TW_ERR_INVALID_ARGUMENT); CPU hosts run it in the PTX
 *     interpreter. With raw_ptx (granted by the operator to trusted tenants
 *     only) it runs unfenced.
 *
 * Build:  clang --target=wasm32-wasi -O2 -I sdk/c guest.c -o guest.wasm
 */
#ifndef TENSOR_WASM_H
#define TENSOR_WASM_H

#include <stdint.h>
#include <string.h>

#define TW_IMPORT(name) __attribute__((import_module("wasi:cuda"), import_name(name)))

/* Error codes (negative results). */
#define TW_OK 0
#define TW_ERR_INVALID_ARGUMENT (-1)
#define TW_ERR_NOT_AVAILABLE (-2)
#define TW_ERR_PERMISSION_DENIED (-3)
#define TW_ERR_BAD_HANDLE (-4)
#define TW_ERR_LIMIT_EXCEEDED (-5)
#define TW_ERR_DEVICE (-6)

/* Argument record tags. */
#define TW_TAG_I32 1u
#define TW_TAG_U32 2u
#define TW_TAG_I64 3u
#define TW_TAG_U64 4u
#define TW_TAG_F32 5u
#define TW_TAG_F64 6u
#define TW_TAG_BUFFER 7u

/* One kernel argument: 16 bytes, little-endian. */
typedef struct tw_arg {
    uint32_t tag;
    uint32_t aux;   /* buffer length in bytes; 0 for scalars */
    uint64_t value; /* scalar bits, or the buffer's guest address */
} tw_arg;

/* Raw imports. */
TW_IMPORT("kernel_from_blueprint") int32_t tw_kernel_from_blueprint_raw(const char *desc, int32_t len);
TW_IMPORT("kernel_from_ptx") int32_t tw_kernel_from_ptx_raw(const char *ptx, int32_t ptx_len, const char *entry, int32_t entry_len);
TW_IMPORT("kernel_from_cuda") int32_t tw_kernel_from_cuda_raw(const char *src, int32_t src_len, const char *entry, int32_t entry_len);
TW_IMPORT("launch") int32_t tw_launch_raw(int32_t kernel, int32_t gx, int32_t gy, int32_t gz,
                                          int32_t bx, int32_t by, int32_t bz, int32_t shared_bytes,
                                          const tw_arg *args, int32_t args_len);
TW_IMPORT("sync") int32_t tw_sync(void);
TW_IMPORT("last_error") int32_t tw_last_error(char *buf, int32_t len);

/* A kernel handle from a descriptor such as "vector_add". */
static inline int32_t tw_kernel_from_blueprint(const char *desc) {
    return tw_kernel_from_blueprint_raw(desc, (int32_t)strlen(desc));
}

/* A kernel from PTX text and an entry name (fenced unless raw_ptx). */
static inline int32_t tw_kernel_from_ptx(const char *ptx, const char *entry) {
    return tw_kernel_from_ptx_raw(ptx, (int32_t)strlen(ptx), entry, (int32_t)strlen(entry));
}

/* Argument builders. */
static inline tw_arg tw_i32(int32_t v) { tw_arg a = {TW_TAG_I32, 0, (uint32_t)v}; return a; }
static inline tw_arg tw_u32(uint32_t v) { tw_arg a = {TW_TAG_U32, 0, v}; return a; }
static inline tw_arg tw_i64(int64_t v) { tw_arg a = {TW_TAG_I64, 0, (uint64_t)v}; return a; }
static inline tw_arg tw_u64(uint64_t v) { tw_arg a = {TW_TAG_U64, 0, v}; return a; }
static inline tw_arg tw_f32(float v) {
    uint32_t bits; memcpy(&bits, &v, sizeof bits);
    tw_arg a = {TW_TAG_F32, 0, bits}; return a;
}
static inline tw_arg tw_f64(double v) {
    uint64_t bits; memcpy(&bits, &v, sizeof bits);
    tw_arg a = {TW_TAG_F64, 0, bits}; return a;
}
static inline tw_arg tw_buffer(const void *ptr, uint32_t len_bytes) {
    tw_arg a = {TW_TAG_BUFFER, len_bytes, (uint32_t)(uintptr_t)ptr}; return a;
}

/* Launches `kernel` on a grid of blocks and waits for it. */
static inline int32_t tw_launch(int32_t kernel, uint32_t gx, uint32_t gy, uint32_t gz,
                                uint32_t bx, uint32_t by, uint32_t bz, uint32_t shared_bytes,
                                const tw_arg *args, uint32_t nargs) {
    return tw_launch_raw(kernel, (int32_t)gx, (int32_t)gy, (int32_t)gz, (int32_t)bx, (int32_t)by,
                         (int32_t)bz, (int32_t)shared_bytes, args, (int32_t)(nargs * sizeof(tw_arg)));
}

/*
 * Guest spans ("tw:trace"): a function's own spans, joined to its invocation's
 * trace (docs/observability.md). tw_span_start returns a handle (>= 0) or a
 * TW_ERR_* code; a span is a child of the innermost span still open, else of
 * the invocation's. Ending a span ends the spans started inside it; the
 * invocation's end ends whatever is left. Limits: 256 spans per invocation, 32
 * attributes per span, names and keys of at most 128 bytes, values of at most
 * 1024 (TW_ERR_LIMIT_EXCEEDED); keys under "faas.", "tensor_wasm." and "otel."
 * are the host's (TW_ERR_PERMISSION_DENIED). Without trace export the calls
 * succeed and record nothing.
 */
#define TW_TRACE_IMPORT(name) __attribute__((import_module("tw:trace"), import_name(name)))

TW_TRACE_IMPORT("span_start") int32_t tw_span_start_n(const char *name, uint32_t len);
TW_TRACE_IMPORT("span_set")
int32_t tw_span_set_n(int32_t span, const char *key, uint32_t key_len, const char *value,
                      uint32_t value_len);
TW_TRACE_IMPORT("span_end") int32_t tw_span_end(int32_t span);

static inline int32_t tw_span_start(const char *name) {
    return tw_span_start_n(name, (uint32_t)strlen(name));
}

static inline int32_t tw_span_set(int32_t span, const char *key, const char *value) {
    return tw_span_set_n(span, key, (uint32_t)strlen(key), value, (uint32_t)strlen(value));
}

#endif /* TENSOR_WASM_H */
