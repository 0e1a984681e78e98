// rotary/linear.h: the linear layers of a checkpoint, y = x W^T (+ bias) (+ y), with W used in place in its stored
// format - f32, f16, bf16, or q8 (int8 in blocks of 32 along a row with one f16 scale per block: llama.cpp's Q8_0,
// 34 bytes per 32 weights) - and float32 activations and accumulation. One call serves decode (tokens = 1: a matrix-vector product that
// streams every weight once, so its speed is the memory bus's) and prefill (tokens > 1: register tiles of 4 weight
// rows x 4 tokens reuse each loaded weight four times). Highway SIMD with runtime dispatch, OpenMP over weight rows.
//
//   x  [tokens, in]   float32, row stride x_stride (>= in)
//   W  [out, in]      WeightMatrix: row r at data + r * row_stride (elements; q8: int8 quants, scales per block)
//   y  [tokens, out]  float32, row stride y_stride (>= out); written, or added to when `accumulate` (a residual)
//
// linear_forward_reference is the float64 oracle: every product and sum in double, rounded once to float at the
// end; it shares no code with the fast path (docs/linear.md gives the tolerance).
//
// With bf16 weights the activations may be rounded to bf16 first (ActivationFormat::BF16, as llama.cpp's bf16
// products do): each product of two bf16 values is exact in float32, so what changes is only x itself (by at most
// 2^-9 of each element), and the products can run on the CPU's bf16 dot-product instruction (AVX512-BF16's
// vdpbf16ps: 32 multiply-adds into 16 float lanes, twice an f32 FMA's), used where the CPU has it and the
// dispatched target is AVX-512; elsewhere the same products are taken in float32 lanes.
//
// With q8 weights the activations may be quantized to q8 as well (ActivationFormat::Q8, as llama.cpp's Q8_0
// products do): each token's x in blocks of kQ8Block by q8_quantize_block (the weights' rule, its scale kept in
// float), so a block's products are products of integers, summed exactly, and scaled once by the two blocks'
// scales. Where the CPU has
// AVX512-VNNI and the dispatched target is AVX-512 the integer products run on its int8 dot-product instruction
// (vpdpbusd: 32 byte products into 8 int32 lanes, no widening of the weights); elsewhere in float32 lanes, where a
// block's integer sums are exact as well.
#pragma once

#include <cstdint>
#include <string_view>

#include "rotary/dtype.h"

namespace rotary {

// How a weight matrix is stored. F32 / F16 / BF16: the checkpoint's own elements (safetensors' F32, F16, BF16),
// used in place. Q8: made at load by quantize_q8 from any of those. Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K:
// llama.cpp's block formats (GGUF files' tensors, used in place; rotary/ggml_quants.h describes their bytes): each
// row is whole blocks (32 weights for Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1, 256 for the k-quants) of quants with their
// scales inside the block. Q4_1, Q5_0 and Q5_1 come last, after Q6_K, though they belong with Q4_0: the values of
// the earlier formats stay as they were (the engine folds a block format's value into Model::weights_hash, which
// runs recorded before keep).
enum class WeightFormat : uint8_t { F32, F16, BF16, Q8, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, Q4_1, Q5_0, Q5_1 };
inline constexpr WeightFormat kLastWeightFormat = WeightFormat::Q5_1;  // the largest value (validation)

inline constexpr int kQ8Block = 32;  // q8: weights per scale (one block along a row; the last may be shorter)

// "f32", "f16", "bf16", "q8", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_1", "q5_0", "q5_1"
const char* weight_format_name(WeightFormat f);
// Parses those names; throws rotary::Error naming `field` otherwise.
WeightFormat parse_weight_format(std::string_view name, std::string_view field = "weight format");
// Whether f is one of llama.cpp's block formats (Q8_0 and every format after it).
inline constexpr bool is_block_format(WeightFormat f) { return f >= WeightFormat::Q8_0; }
// Weights per block of a block format (32 or 256); 1 for the others.
inline constexpr int64_t weight_block_size(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K:
    case WeightFormat::Q6_K: return 256;
    default: return is_block_format(f) ? 32 : 1;
  }
}
// Bytes per block of a block format (Q8_0 34, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24, Q4_K 144, Q5_K 176, Q6_K 210).
inline constexpr int64_t weight_block_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q8_0: return 34;
    case WeightFormat::Q4_0: return 18;
    case WeightFormat::Q4_1: return 20;
    case WeightFormat::Q5_0: return 22;
    case WeightFormat::Q5_1: return 24;
    case WeightFormat::Q4_K: return 144;
    case WeightFormat::Q5_K: return 176;
    case WeightFormat::Q6_K: return 210;
    default: return 0;
  }
}
// Bytes per weight element of the element formats (q8: 1; its scales come on top: weight_matrix_bytes); 0 for the
// block formats, whose bytes are per block (weight_row_bytes).
inline constexpr int64_t weight_element_size(WeightFormat f) {
  return f == WeightFormat::F32 ? 4 : f == WeightFormat::Q8 ? 1 : is_block_format(f) ? 0 : 2;
}
// q8: scales per row of `cols` weights, ceil(cols / kQ8Block).
inline constexpr int64_t q8_blocks(int64_t cols) { return (cols + kQ8Block - 1) / kQ8Block; }
// Bytes of `elements` consecutive weights of a row in format f (q8: its quants; a block format: elements / block
// size whole blocks).
inline constexpr int64_t weight_row_bytes(WeightFormat f, int64_t elements) {
  return is_block_format(f) ? elements / weight_block_size(f) * weight_block_bytes(f) : elements * weight_element_size(f);
}
// Bytes of a [rows, cols] matrix stored in format f: its elements or blocks, and q8's f16 block scales (2 bytes each).
inline constexpr int64_t weight_matrix_bytes(WeightFormat f, int64_t rows, int64_t cols) {
  return rows * weight_row_bytes(f, cols) + (f == WeightFormat::Q8 ? rows * q8_blocks(cols) * 2 : 0);
}
// The storage format of a tensor dtype (F64 has none: the engine converts it at load).
WeightFormat weight_format_of(DType t);

// A [rows, cols] weight matrix, row-major with a row stride, in place in its storage (a checkpoint's mapped file,
// or q8 buffers). Block formats: `data` is row 0's first block, row r starts row_stride / block size blocks later
// (cols and row_stride whole blocks), `scales` is unused. Q8: `data` holds int8 quants (row r at r * row_stride), `scales` one IEEE half (f16 bits, as
// Q8_0 stores its scale: a decode step reads 2 bytes of scale per 32 weights, not 4) per block of kQ8Block along each
// row (row r's at r * scale_stride); weight (r, c) = quants[r][c] * f16_to_float(scales[r][c / kQ8Block]).
struct WeightMatrix {
  WeightFormat format = WeightFormat::F32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0;  // elements between rows, >= cols
  const uint16_t* scales = nullptr;  // q8 only: f16 bits
  int64_t scale_stride = 0;          // q8 only: scales between rows' scales, >= q8_blocks(cols)
};

// The precision of the activations x in the products. F32: as given. BF16: each element rounded to bfloat16
// (nearest even; NaN stays NaN) before its products; bf16 weights only. Q8: each token's x quantized in blocks of
// kQ8Block along its row (q8_quantize_block: scale = max |x| / 127, quant = round(x / scale)); q8 weights and the
// block formats (as llama.cpp's products with Q8_0 / Q4_0 / Q5_0 / ... / k-quant weights quantize x to 8 bits).
enum class ActivationFormat : uint8_t { F32, BF16, Q8 };
const char* activation_format_name(ActivationFormat f);  // "f32", "bf16", "q8"
// Parses "f32", "bf16", "q8"; throws rotary::Error naming `field` otherwise.
ActivationFormat parse_activation_format(std::string_view name, std::string_view field = "activation format");

// The q8 rule for one block of n (1..kQ8Block) floats, ActivationFormat::Q8's (and the q8 KV cache's, whose scales
// stay float: they are made per token, not read per token by every product): scale = max |v| / 127 (in float), quant = round(v / scale) (float division, ties away from zero) clamped to
// +-127, every quant 0 when the scale is 0. Non-finite values (activations only: quantize_q8 refuses them before):
// a NaN makes the scale NaN, so every product of the block turns NaN; an infinity makes it infinite, with quant
// +-127 at the infinity and 0 elsewhere, so the block's sum turns infinite or NaN as float products would. Returns
// the scale. Throws rotary::Error naming `n` outside [1, kQ8Block] or a null pointer.
float q8_quantize_block(const float* v, int64_t n, int8_t* quants);

struct LinearParams {
  WeightMatrix w;
  const float* bias = nullptr;  // [w.rows] or null
  int64_t tokens = 0;           // rows of x and y; 0 is a no-op
  const float* x = nullptr;     // [tokens, w.cols], row stride x_stride
  int64_t x_stride = 0;
  float* y = nullptr;           // [tokens, w.rows], row stride y_stride; must not overlap x or the weights
  int64_t y_stride = 0;
  bool accumulate = false;      // y += x W^T (+ bias) instead of y = ...
  // BF16: x rounded to bf16 first (w.format must be BF16); Q8: x quantized per block (w.format Q8 or a block
  // format).
  ActivationFormat activations = ActivationFormat::F32;
  int threads = 0;              // 0 = all OpenMP threads
};

// out[0, w.cols) = row r of w as float32 (q8: quant x scale): an embedding table's row, in any format.
void weight_row(const WeightMatrix& w, int64_t r, float* out);

// y = x W^T + bias (+ y). Throws rotary::Error naming the field for bad params, before anything is written.
void linear_forward(const LinearParams& p);
// Several products as one call: their weight rows are shared among one team of threads, as one product's rows
// would be (decode's q, k and v, or gate and up, wake the threads once, and the small k and v share the large q's
// work instead of running alone). Each product is checked as linear_forward checks it (a message names
// products[i]); no product's y may overlap another's x, y, weights or bias; every `threads` must be equal. Each
// product's result has the bits linear_forward gives it.
void linear_forward_group(const LinearParams* products, int count);
// The float64 oracle: the same contract, every product and sum in double.
void linear_forward_reference(const LinearParams& p);
// Whether linear_forward runs bf16-activation products on the CPU's bf16 dot-product instruction now (the CPU has
// AVX512-BF16 and dispatch is at an AVX-512 target); false: in float32 lanes. Results differ only in rounding.
bool linear_uses_bf16_dot();
// Whether linear_forward runs q8-activation products on the CPU's int8 dot-product instruction now (the CPU has
// AVX512-VNNI and dispatch is at an AVX-512 target); false: in float32 lanes. Results differ only in rounding.
bool linear_uses_q8_dot();
// How q8-activation products run now: "int8 dot products (AVX512-VNNI)" (linear_uses_q8_dot), "int8 dot products
// (AVX-VNNI) for the block formats, byte products (AVX2) for q8 weights" (x86 targets from AVX2 up of a CPU with
// AVX-VNNI, without the former), "byte products (AVX2)" (vpmaddubsw: x86 targets from AVX2 up without either), or
// "float32 lanes" (below AVX2). For reports.
const char* linear_q8_products();

// Quantizes a [rows, cols] matrix stored as `src_dtype` (any DType; row r at src + r * src_row_stride elements)
// into q8: per block of kQ8Block weights along a row (w as float), the scale s = float_to_f16(max |w| / 127) and
// quant = round(w / s) (float division, ties away from zero) clamped to +-127, every quant 0 where s is 0. The
// quants are made against the stored (rounded) scale, so every weight is within max(s / 2, 127 x 2^-25) of quant x s:
// s / 2 where s is a normal half (largest |w| >= 127 x 2^-14, about 0.0078), since a rounded-down s clamps the
// largest |w| only 2^-11 of it away; in smaller blocks s is subnormal and its rounding is 2^-25 absolute, at most
// 127 x 2^-25 (3.8e-6) at the clamp. (llama.cpp's Q8_0 stores an f16 scale too, but makes its quants against the
// unrounded one.) quants: [rows, cols] row stride cols; scales: [rows, q8_blocks(cols)], f16 bits. Refused
// (rotary::Error naming the weight's row and column), before anything is written: a non-finite weight (q8 cannot hold
// it), and |w| > 127 x 65504 (its block's scale would overflow f16). OpenMP over rows.
void quantize_q8(const void* src, DType src_dtype, int64_t rows, int64_t cols, int64_t src_row_stride, int8_t* quants,
                 uint16_t* scales, int threads = 0);

// The q8 weights' scale bound: a block whose largest |w| exceeds this has no f16 scale (127 x f16's largest finite).
inline constexpr double kQ8MaxWeight = 127.0 * 65504.0;

}  // namespace rotary
