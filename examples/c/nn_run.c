/*
 * nn_run — runs an ONNX model through wasi-nn (a WASI command; sdk/c/wasi_nn.h).
 *
 * stdin, little-endian u32s: target (0 cpu, 1 gpu), the model's length and bytes (or 0, then
 * the length and bytes of a model's name: the model is loaded by name), the number of inputs, then per input in the model's order: its name's length and bytes (unused here),
 * its tensor type (1 f32, 4 i32, 5 i64), its number of dimensions and the dimensions, its
 * data's length and bytes.
 * stdout: the number of outputs, then per output its length and bytes.
 * A refused call prints "wasi-nn: <call>: errno N: <message>" on stderr and exits with
 * 10 + N.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wasi_nn.h"

static uint8_t *input;
static size_t input_len, at;

static uint32_t take_u32(void) {
    if (at + 4 > input_len) {
        fprintf(stderr, "nn_run: stdin ends early\n");
        exit(2);
    }
    uint32_t v;
    memcpy(&v, input + at, 4);
    at += 4;
    return v;
}

static const uint8_t *take_bytes(uint32_t len) {
    if (len > input_len - at) {
        fprintf(stderr, "nn_run: stdin ends early\n");
        exit(2);
    }
    const uint8_t *p = input + at;
    at += len;
    return p;
}

static void check(uint32_t errno_, const char *call) {
    if (errno_ == NN_SUCCESS) return;
    char message[1024];
    int32_t n = tw_nn_last_error(message, sizeof message - 1);
    message[n < 0 ? 0 : n] = 0;
    fprintf(stderr, "wasi-nn: %s: errno %u: %s\n", call, errno_, message);
    exit(10 + (int)errno_);
}

static void write_u32(uint32_t v) { fwrite(&v, 4, 1, stdout); }

int main(void) {
    size_t cap = 1 << 16;
    input = malloc(cap);
    for (size_t n; (n = fread(input + input_len, 1, cap - input_len, stdin)) > 0;) {
        input_len += n;
        if (input_len == cap) input = realloc(input, cap *= 2);
    }
    uint32_t target = take_u32();
    uint32_t model_len = take_u32();
    nn_graph graph;
    if (model_len == 0) {
        uint32_t name_len = take_u32();
        const char *name = (const char *)take_bytes(name_len);
        check(nn_load_by_name(name, name_len, &graph), "load_by_name");
    } else {
        nn_graph_builder builder = {take_bytes(model_len), model_len};
        check(nn_load(&builder, 1, NN_ENCODING_ONNX, target, &graph), "load");
    }
    nn_context context;
    check(nn_init_execution_context(graph, &context), "init_execution_context");
    uint32_t inputs = take_u32();
    for (uint32_t i = 0; i < inputs; i++) {
        take_bytes(take_u32()); /* the name: core modules set inputs by index */
        nn_tensor t;
        t.type = (uint8_t)take_u32();
        t.dims_len = take_u32();
        t.dims = (const uint32_t *)take_bytes(4 * t.dims_len);
        t.data_len = take_u32();
        t.data = take_bytes(t.data_len);
        check(nn_set_input(context, i, &t), "set_input");
    }
    check(nn_compute(context), "compute");
    /* Outputs until the index is past the last (invalid_argument). */
    static uint8_t out[2 << 20];
    uint32_t lens[64], count = 0;
    uint8_t *starts[64];
    size_t used = 0;
    for (; count < 64; count++) {
        uint32_t written = 0;
        uint32_t e = nn_get_output(context, count, out + used, sizeof out - used, &written);
        if (e == NN_INVALID_ARGUMENT) break;
        check(e, "get_output");
        starts[count] = out + used;
        lens[count] = written;
        used += written;
    }
    write_u32(count);
    for (uint32_t i = 0; i < count; i++) {
        write_u32(lens[i]);
        fwrite(starts[i], 1, lens[i], stdout);
    }
    return 0;
}
