/*
 * wasi_nn.h — wasi-nn for C core modules (wasm32-wasi, clang): the `wasi_ephemeral_nn`
 * imports, with the ABI wasmtime and WasmEdge serve them (graph builders and tensors as
 * records in linear memory, results through pointers, an nn_errno returned).
 *
 * TensorWasm loads ONNX models (encoding NN_ENCODING_ONNX) and runs them on its own kernels,
 * with the same bytes on the CPU backend and on a GPU (target NN_TARGET_GPU on a CUDA host).
 * Tensors are f32; an index input (Gather's) may be i32 or i64. docs/models.md lists the
 * supported operators, the limits and the errors.
 *
 * tw_nn_last_error() (TensorWasm's own `tensor_wasm_nn` import) copies the message of the
 * last refused call, which an nn_errno cannot carry.
 *
 * Build:  clang --target=wasm32-wasi -O2 -I sdk/c guest.c -o guest.wasm
 */
#ifndef WASI_NN_H
#define WASI_NN_H

#include <stdint.h>

typedef uint32_t nn_graph;
typedef uint32_t nn_context;

/* nn_errno */
enum {
    NN_SUCCESS = 0,
    NN_INVALID_ARGUMENT = 1,
    NN_INVALID_ENCODING = 2,
    NN_MISSING_MEMORY = 3,
    NN_BUSY = 4,
    NN_RUNTIME_ERROR = 5,
    NN_UNSUPPORTED_OPERATION = 6,
    NN_TOO_LARGE = 7,
    NN_NOT_FOUND = 8,
};

/* graph_encoding */
enum { NN_ENCODING_OPENVINO = 0, NN_ENCODING_ONNX = 1 };
/* execution_target */
enum { NN_TARGET_CPU = 0, NN_TARGET_GPU = 1, NN_TARGET_TPU = 2 };
/* tensor_type */
enum { NN_TYPE_F16 = 0, NN_TYPE_F32 = 1, NN_TYPE_F64 = 2, NN_TYPE_U8 = 3, NN_TYPE_I32 = 4, NN_TYPE_I64 = 5 };

/* A graph builder: the bytes of a model. */
typedef struct {
    const uint8_t *data;
    uint32_t len;
} nn_graph_builder;

/* A tensor: its dimensions, its element type (one byte, then padding) and its bytes. */
typedef struct {
    const uint32_t *dims;
    uint32_t dims_len;
    uint8_t type;
    const uint8_t *data;
    uint32_t data_len;
} nn_tensor;

#define NN_IMPORT(name) __attribute__((import_module("wasi_ephemeral_nn"), import_name(name)))

NN_IMPORT("load")
uint32_t nn_load(const nn_graph_builder *builders, uint32_t count, uint32_t encoding,
                 uint32_t target, nn_graph *graph);
NN_IMPORT("load_by_name")
uint32_t nn_load_by_name(const char *name, uint32_t len, nn_graph *graph);
NN_IMPORT("init_execution_context")
uint32_t nn_init_execution_context(nn_graph graph, nn_context *context);
NN_IMPORT("set_input")
uint32_t nn_set_input(nn_context context, uint32_t index, const nn_tensor *tensor);
NN_IMPORT("compute")
uint32_t nn_compute(nn_context context);
NN_IMPORT("get_output")
uint32_t nn_get_output(nn_context context, uint32_t index, uint8_t *out, uint32_t out_len,
                       uint32_t *written);

/* Copies the message of the last refused call into buf (at most len bytes); returns the bytes
 * written, or -1 when there is none to give. */
__attribute__((import_module("tensor_wasm_nn"), import_name("last_error")))
int32_t tw_nn_last_error(char *buf, uint32_t len);

#endif
