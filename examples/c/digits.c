/*
 * digits — classifies an 8 x 8 handwritten digit with the model a tenant stored as `digits`
 * (POST /models?name=digits: the digits CNN of scripts/onnx/models.py), through wasi-nn
 * (a WASI command; sdk/c/wasi_nn.h).
 *
 * stdin: the 64 pixels, row by row, each 0 to 16 (scikit-learn's digits data set), as text
 * separated by anything that is not part of a number: spaces, commas, a JSON array.
 * stdout: {"digit":D,"probabilities":[p0,...,p9]}.
 * Bad input prints a message on stderr and exits with 2; a refused wasi-nn call prints
 * "wasi-nn: <call>: errno N: <message>" and exits with 10 + N.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wasi_nn.h"

#define PIXELS 64
#define CLASSES 10

static void check(uint32_t errno_, const char *call) {
    if (errno_ == NN_SUCCESS) return;
    char message[1024];
    int32_t n = tw_nn_last_error(message, sizeof message - 1);
    message[n < 0 ? 0 : n] = 0;
    fprintf(stderr, "wasi-nn: %s: errno %u: %s\n", call, errno_, message);
    exit(10 + (int)errno_);
}

static int starts_number(int c) { return (c >= '0' && c <= '9') || c == '.' || c == '-'; }

int main(void) {
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, stdin);
    text[len] = 0;
    float pixels[PIXELS];
    int count = 0;
    for (char *p = text; *p;) {
        if (!starts_number((unsigned char)*p)) {
            p++;
            continue;
        }
        char *end;
        float value = strtof(p, &end);
        if (end == p) {
            p++;
            continue;
        }
        if (count == PIXELS) {
            fprintf(stderr, "digits: more than %d pixels\n", PIXELS);
            return 2;
        }
        if (!(value >= 0.0f && value <= 16.0f)) {
            fprintf(stderr, "digits: pixel %d is %g, not within 0 to 16\n", count, value);
            return 2;
        }
        /* The model was trained on pixel / 16. */
        pixels[count++] = value / 16.0f;
        p = end;
    }
    if (count != PIXELS) {
        fprintf(stderr, "digits: %d pixels, want %d (8 rows of 8, each 0 to 16)\n", count, PIXELS);
        return 2;
    }
    nn_graph graph;
    check(nn_load_by_name("digits", 6, &graph), "load_by_name");
    nn_context context;
    check(nn_init_execution_context(graph, &context), "init_execution_context");
    static const uint32_t dims[4] = {1, 1, 8, 8};
    nn_tensor tensor = {dims, 4, NN_TYPE_F32, (const uint8_t *)pixels, sizeof pixels};
    check(nn_set_input(context, 0, &tensor), "set_input");
    check(nn_compute(context), "compute");
    float probabilities[CLASSES];
    uint32_t written = 0;
    check(nn_get_output(context, 0, (uint8_t *)probabilities, sizeof probabilities, &written),
          "get_output");
    if (written != sizeof probabilities) {
        fprintf(stderr, "digits: the model gave %u bytes, want %zu (is `digits` the digits CNN?)\n",
                written, sizeof probabilities);
        return 2;
    }
    int best = 0;
    for (int i = 1; i < CLASSES; i++)
        if (probabilities[i] > probabilities[best]) best = i;
    printf("{\"digit\":%d,\"probabilities\":[", best);
    for (int i = 0; i < CLASSES; i++) printf("%s%.4f", i ? "," : "", probabilities[i]);
    printf("]}\n");
    return 0;
}
