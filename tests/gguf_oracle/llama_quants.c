/* tests/gguf_oracle/llama_quants.c: llama.cpp's own reference quantizers and dequantizers (ggml-quants.c of the
 * unpacked llama.cpp tree, which test_ggml_quants_oracle.py compiles with this file at test time; nothing of
 * llama.cpp is in this repository) behind ggml_quants_dump's interface:
 *   llama_quants quantize TYPE IN OUT     IN: float32 values; OUT: quantize_row_<type>_ref's blocks
 *   llama_quants dequantize TYPE IN OUT   IN: blocks; OUT: dequantize_row_<type>'s float32 values
 * TYPE: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K. The four ggml.c functions ggml-quants.c refers to outside
 * the reference quantizers (its importance-matrix and IQ paths) are stubbed below; the functions used here never
 * call them. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-quants.h"

void ggml_abort(const char * file, int line, const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "ggml_abort at %s:%d: ", file, line);
    vfprintf(stderr, fmt, args);
    va_end(args);
    abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void) type; (void) ne; abort(); }
const char * ggml_type_name(enum ggml_type type) { (void) type; return "?"; }
size_t ggml_type_size(enum ggml_type type) { (void) type; abort(); }

typedef void (*quantize_fn)(const float * x, void * y, int64_t k);
typedef void (*dequantize_fn)(const void * x, float * y, int64_t k);

struct type_row {
    const char * name;
    int64_t block, bytes;
    quantize_fn quantize;
    dequantize_fn dequantize;
};

static const struct type_row types[] = {
    {"Q4_0", QK4_0, sizeof(block_q4_0), (quantize_fn) quantize_row_q4_0_ref, (dequantize_fn) dequantize_row_q4_0},
    {"Q4_1", QK4_1, sizeof(block_q4_1), (quantize_fn) quantize_row_q4_1_ref, (dequantize_fn) dequantize_row_q4_1},
    {"Q5_0", QK5_0, sizeof(block_q5_0), (quantize_fn) quantize_row_q5_0_ref, (dequantize_fn) dequantize_row_q5_0},
    {"Q5_1", QK5_1, sizeof(block_q5_1), (quantize_fn) quantize_row_q5_1_ref, (dequantize_fn) dequantize_row_q5_1},
    {"Q8_0", QK8_0, sizeof(block_q8_0), (quantize_fn) quantize_row_q8_0_ref, (dequantize_fn) dequantize_row_q8_0},
    {"Q4_K", QK_K, sizeof(block_q4_K), (quantize_fn) quantize_row_q4_K_ref, (dequantize_fn) dequantize_row_q4_K},
    {"Q5_K", QK_K, sizeof(block_q5_K), (quantize_fn) quantize_row_q5_K_ref, (dequantize_fn) dequantize_row_q5_K},
    {"Q6_K", QK_K, sizeof(block_q6_K), (quantize_fn) quantize_row_q6_K_ref, (dequantize_fn) dequantize_row_q6_K},
};

static void * read_all(const char * path, size_t * size) {
    FILE * f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    *size = (size_t) ftell(f);
    fseek(f, 0, SEEK_SET);
    void * data = malloc(*size + 1);
    if (fread(data, 1, *size, f) != *size) { perror(path); exit(1); }
    fclose(f);
    return data;
}

static void write_all(const char * path, const void * data, size_t size) {
    FILE * f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) { perror(path); exit(1); }
}

int main(int argc, char ** argv) {
    if (argc != 5) { fprintf(stderr, "usage: llama_quants quantize|dequantize TYPE IN OUT\n"); return 2; }
    const struct type_row * t = NULL;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); ++i)
        if (strcmp(types[i].name, argv[2]) == 0) t = &types[i];
    if (!t) { fprintf(stderr, "unknown type %s\n", argv[2]); return 2; }
    size_t size = 0;
    void * in = read_all(argv[3], &size);
    if (strcmp(argv[1], "quantize") == 0) {
        const int64_t n = (int64_t) (size / sizeof(float));
        if (n % t->block) { fprintf(stderr, "%lld values: not whole blocks\n", (long long) n); return 1; }
        const size_t bytes = (size_t) (n / t->block * t->bytes);
        void * out = malloc(bytes + 1);
        t->quantize((const float *) in, out, n);
        write_all(argv[4], out, bytes);
    } else if (strcmp(argv[1], "dequantize") == 0) {
        if ((int64_t) size % t->bytes) { fprintf(stderr, "%zu bytes: not whole blocks\n", size); return 1; }
        const int64_t n = (int64_t) size / t->bytes * t->block;
        float * out = malloc((size_t) n * sizeof(float) + 1);
        t->dequantize(in, out, n);
        write_all(argv[4], out, (size_t) n * sizeof(float));
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    return 0;
}
