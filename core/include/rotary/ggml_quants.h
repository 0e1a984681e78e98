// rotary/ggml_quants.h: llama.cpp's block formats as numbers - a float64 dequantization reference and quantizers
// that write the bytes llama.cpp's reference quantizers write.
//
// The formats (ggml-common.h; every number little-endian, every scale an IEEE binary16 "f16"). A row of n values is
// n / block_size blocks (rotary::ggml_type_info, gguf.h, has each type's block size and bytes), value i of a row in
// block i / block_size:
//   Q8_0  (32 values, 34 bytes):  f16 d, int8 q[32];                      x = d q
//   Q4_0  (32 values, 18 bytes):  f16 d, uint8 qs[16];                    x[j] = d (low nibble of qs[j] - 8),
//                                                                         x[j + 16] = d (high nibble of qs[j] - 8)
//   Q4_1  (32 values, 20 bytes):  f16 d, f16 m, uint8 qs[16];             x[j] = d (low nibble of qs[j]) + m,
//                                                                         x[j + 16] = d (high nibble of qs[j]) + m
//   Q5_0  (32 values, 22 bytes):  f16 d, uint8 qh[4], uint8 qs[16];       x[j] = d (q[j] - 16), q[j] in [0, 31]: the
//         nibbles as Q4_0's (value j < 16 low nibble of qs[j], value j + 16 high nibble of qs[j]) with the fifth
//         bit of value j (0..31) at bit j of qh read as one little-endian uint32
//   Q5_1  (32 values, 24 bytes):  f16 d, f16 m, uint8 qh[4], uint8 qs[16]; x[j] = d q[j] + m, q[j] as Q5_0's
//   Q4_K  (256 values, 144 bytes): f16 d, f16 dmin, uint8 scales[12], uint8 qs[128]; eight sub-blocks of 32, each
//         with a 6-bit scale sc and a 6-bit min m packed into scales[12]: x = d sc q - dmin m, q in [0, 15].
//         The packing: for sub-block j < 4, sc = scales[j] & 63 and m = scales[j + 4] & 63; for j >= 4 the low four
//         bits of sc and m are scales[j + 4]'s low and high nibbles and their top two bits the top two bits of
//         scales[j - 4] (sc) and scales[j] (m). The quants: 64 values share 32 bytes, sub-block 2c in the low
//         nibbles of qs[32c .. 32c + 31], sub-block 2c + 1 in their high nibbles.
//   Q5_K  (256 values, 176 bytes): f16 d, f16 dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128]; as Q4_K with a
//         fifth bit: value l of sub-block j adds 16 when bit j of qh[l] is set (q in [0, 31]).
//   Q6_K  (256 values, 210 bytes): uint8 ql[128], uint8 qh[64], int8 scales[16], f16 d; sixteen sub-blocks of 16
//         with one int8 scale each: x[e] = d scales[e / 16] (q - 32), q in [0, 63]. Value e = 128 h + 32 g + l
//         (h < 2, g < 4, l < 32) has its low four bits in ql[64 h + 32 (g & 1) + l] (the low nibble for g < 2, the
//         high one for g >= 2) and its top two bits in bits 2g, 2g + 1 of qh[32 h + l].
//   F32, F16, BF16 (1 value a "block"): the value itself, 4 or 2 bytes.
//
// Why a float64 reference: every one of these formulas is exact in float64 (an f16 has 11 significant bits and is a
// multiple of 2^-24 below 2^16, so d sc q and dmin m are multiples of 2^-24 below 2^28: at most 52 bits), so the
// reference holds the formula's exact value and rounding it to float32 once gives what llama.cpp's dequantize_row_*
// and gguf-py's gguf.quants.dequantize compute (one rounding at most, in the addition or subtraction of a min: Q4_1,
// Q5_1, Q4_K, Q5_K; d q + m is a multiple of 2^-24 below 2^22, exact in float64 as well), bit for bit
// (tests/gguf_oracle/test_ggml_quants_oracle.py checks both). It shares no code with any fast path: its own f16
// decoding and unpacking, value by value.
//
// Why the quantizers follow llama.cpp's float32 arithmetic operation by operation: their output is a search
// (k-quants try 16 to 21 candidate scales and keep the one with the least weighted error), so an operation done in
// another order or precision picks another candidate and writes other bytes (and the 32-value formats' quants are
// truncations of float32 products, which move with an ulp too). They do what quantize_row_q8_0_ref,
// quantize_row_q4_0_ref, quantize_row_q4_1_ref, quantize_row_q5_0_ref, quantize_row_q5_1_ref,
// quantize_row_q4_K_ref, quantize_row_q5_K_ref and quantize_row_q6_K_ref (ggml-quants.c, no importance matrix) do,
// in that order, without contraction into fused multiply-adds (the file is compiled with -ffp-contract=off, as
// llama.cpp's ggml-base is on x86-64, where it has no FMA), and give the same bytes for any finite input (checked
// against llama.cpp's own C compiled at test time, and against gguf-py's Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / F16 /
// BF16 quantizers). One exception, of no numeric consequence: a block of a 32-value format whose scale is below
// about 2^-128 (Q8_0, Q4_0, Q5_0: largest |x| below about 2^-121; Q4_1, Q5_1: max - min below about 2^-124) has a
// scale whose reciprocal overflows float32, and llama.cpp then converts infinities to int8 (undefined in C: its
// bytes depend on its compiler); the scale stored is f16 zero, so every value decodes to zero (Q4_1 / Q5_1: to m)
// either way, and rotary writes the quants x86's scalar conversion gives.
#pragma once

#include <cstdint>

#include "rotary/gguf.h"
#include "rotary/linear.h"

namespace rotary {

// The bytes of a row of n values of `type`: n / block_size x bytes per block. rotary::Error naming n for n < 0 or n
// not a multiple of the type's block size, and naming the type for one rotary does not know (gguf.h's list).
int64_t ggml_row_bytes(GgmlType type, int64_t n);

// The types each function takes: "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16" (for messages
// and tests).
const char* ggml_quants_types();

// Decodes n values of `type` from `blocks` (ggml_row_bytes(type, n) bytes) into out[0, n), each the exact value of
// the format's formula (above) in float64. Types: ggml_quants_types(). rotary::Error naming the type for any other,
// or n (and the block size) for n < 0 or n not a whole number of blocks. An f16 scale that is infinite or NaN
// decodes as IEEE arithmetic says (inf x 0 is NaN).
void ggml_dequantize_reference(GgmlType type, const void* blocks, int64_t n, double* out);

// Encodes n float32 values x[0, n) as `type` into `blocks` (ggml_row_bytes(type, n) bytes): the bytes llama.cpp's
// reference quantizer of that type writes (no importance matrix); F16 rounds to nearest even (overflow to infinity),
// BF16 as ggml_compute_fp32_to_bf16. Types: ggml_quants_types(). rotary::Error naming the type for any other, n as
// above, or the first element that is not finite ("x[17] = nan"): llama.cpp's quantizers take NaN and infinity
// without a word and write blocks that decode to NaN or to garbage; one rule for every type keeps a poisoned row from
// being written at all. Nothing is written when the input is refused.
void ggml_quantize(GgmlType type, const float* x, int64_t n, void* blocks);

// The GGUF tensor type a block weight format is stored as (WeightFormat::Q8_0 -> GgmlType::Q8_0, ...). rotary::Error
// naming `format` for an element format (f32, f16, bf16, q8), which has no block type.
GgmlType ggml_type_of(WeightFormat format);

}  // namespace rotary
