// core/src/linear_kernel.h (internal): what linear.cpp hands the Highway kernels of linear_hwy.cpp - a validated
// call with the thread count resolved.
#pragma once

#include <cstdint>

#include "rotary/linear.h"

namespace rotary::linear_detail {

// Activation bytes a prefill chunk keeps in L2 while the weight rows stream past (chunk tokens x cols floats).
inline constexpr int64_t kChunkBytes = 256 * 1024;
// Decode reads a weight row as one stream while its sum waits on one multiply-add per vector: past this many bytes
// a row (32 KB of bf16 at 16384 columns) no longer overlaps with the next row's start and that chain bounds it, so
// longer rows go 4 at a time (4 chains; the streams are long enough for the hardware prefetcher), shorter ones one
// at a time (docs/engine.md: 896-wide rows 20 -> 33 GB/s row by row; 16384-wide 30 -> 23).
inline constexpr int64_t kLongRowBytes = 16 * 1024;
// The byte-product kernels (AVX2) run a small batch - decode's one token, a few sequences' steps: up to this many
// tokens - row by row, each thread's weights one sequential stream, which the prefetcher follows (2026-11-28, Zen 3,
// one thread, 4864x1024 past the caches, q8 / q4_k: one token 1070-1400 -> 820-890 / 1100-1430 -> 500-600 us, four
// tokens 1920-1960 -> 1160-1560 / 2360-2480 -> 1680-1700 us, 4 rows at a time -> row by row); more tokens as a
// prefill, in panels of kPanelRows rows.
inline constexpr int64_t kSmallBatch = 8;
// Rows of a panel: the block formats' prefill on x86's byte products (linear_blocks-inl.h) holds 8 rows in one
// register's 32-bit lanes, and linear_hwy.cpp hands those jobs' rows out in panels.
inline constexpr int kPanelRows = 8;

// p rounded up to the next 64-byte boundary (a cache line: a 512-bit load across two costs two). Buffers that hand
// out such pointers hold 64 bytes more than they use.
template <class T>
inline T* aligned_to_64(T* p) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + 63) / 64 * 64);
}

// std::round (nearest, ties away from zero) of r, |r| < 2^23, as an int without a call into libm: the truncation,
// then a step away from zero where the remainder (exact) is at least one half.
inline int round_away(float r) {
  const int t = int(r);
  const float f = r - float(t);
  return t + int(f >= 0.5f) - int(f <= -0.5f);
}

// An x quantized for q8 activations (ActivationFormat::Q8), as the kernels read it: per token, `blocks` =
// q8_blocks(cols) blocks of kQ8Block elements (the last one zero-padded, and a zero block more when `blocks` is
// odd: the int8 kernel reads a pair of blocks at a time). Beside the quants and scales, what that kernel takes per
// pair of blocks: vpdpbusd multiplies unsigned by signed bytes, so it multiplies each weight plus 128 (unsigned) by
// x's quant and starts from -128 times the sum of the four quants of each lane, which leaves exactly the sum of
// weight x quant; and the two blocks' scales spread over the 16 lanes their sums land in.
struct Q8Activations {
  int8_t* quants = nullptr;         // [tokens, stride]
  int32_t* corrections = nullptr;   // [tokens, stride / 4]: lane i of a pair, -128 (q[4i] + ... + q[4i + 3])
  float* scale_pairs = nullptr;     // [tokens, stride / 4]: lanes 0-7 the pair's first block's scale, 8-15 its second's
  float* scales = nullptr;          // [tokens, blocks]
  int32_t* sums = nullptr;          // [tokens, blocks]: the sum of the block's quants (Q4_0's and Q5_0's offset)
  float* scaled_sums = nullptr;     // [tokens, blocks]: scale x the sum of the block's quants (one rounding), the
                                    // min term's activation side (Q4_1, Q5_1, Q4_K, Q5_K)
  int64_t blocks = 0;
  int64_t stride = 0;  // quants between tokens: blocks rounded up to even, times kQ8Block
};
inline int64_t q8_activation_stride(int64_t cols) { return (q8_blocks(cols) + 1) / 2 * 2 * kQ8Block; }

struct Job {
  WeightFormat format = WeightFormat::F32;
  const void* w = nullptr;
  int64_t rows = 0, cols = 0, row_stride = 0;
  const uint16_t* scales = nullptr;  // q8: f16 bits
  int64_t scale_stride = 0;
  const float* bias = nullptr;
  int64_t tokens = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  bool accumulate = false;
  ActivationFormat activations = ActivationFormat::F32;
  // ActivationFormat::BF16: x rounded to bf16 into xb ([tokens, cols], row stride cols) by the first job that
  // reads this x (round_x); the kernels read xb instead of x.
  uint16_t* xb = nullptr;
  bool round_x = false;
  // ActivationFormat::Q8: x quantized into xq by the first job that reads this x (quantize_x); the kernels read xq.
  Q8Activations xq;
  bool quantize_x = false;
  // This call's number (every job of one linear_forward_group call has the same, no two calls the same): copies a
  // kernel makes of x hold for the call (linear_hwy.cpp's chain-order activations), never past it.
  uint64_t call = 0;
};

// Writes (or adds) an nt x nr tile of sums (sums[t * nr + r]) plus the bias into y at tokens t0.., rows r0...
inline void store_tile(const Job& j, int64_t t0, int64_t r0, int nt, int nr, const float* sums) {
  for (int t = 0; t < nt; ++t) {
    float* yrow = j.y + (t0 + t) * j.y_stride + r0;
    for (int r = 0; r < nr; ++r) {
      const float v = j.bias ? sums[t * nr + r] + j.bias[r0 + r] : sums[t * nr + r];
      yrow[r] = j.accumulate ? yrow[r] + v : v;
    }
  }
}

// The bf16 dot-product kernels (linear_bf16_dot.cpp): whether this CPU has AVX512-BF16 (x86-64 builds; false
// elsewhere), and tokens [t0, t1) x rows [r0, r1) of a bf16-weight job with xb filled, on vdpbf16ps. Called only
// from AVX-512 dispatch targets (the OS saves the vector state those need).
bool bf16_dot_supported();
void bf16_dot_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1);

// The int8 dot-product kernels (linear_q8_dot.cpp): whether this CPU has AVX512-VNNI (x86-64 builds; false
// elsewhere), and tokens [t0, t1) x rows [r0, r1) of a q8-weight job with xq filled, on vpdpbusd. Called only from
// AVX-512 dispatch targets.
bool q8_dot_supported();
void q8_dot_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1);

// The AVX2 byte-product kernels for q8 activations (linear_q8_avx2.cpp): whether this CPU has AVX2, FMA and F16C
// (x86-64 builds; false elsewhere), and tokens [t0, t1) x rows [r0, r1) of a q8-weight job with xq filled, on
// vpmaddubsw. Called only from x86 dispatch targets from AVX2 up, where the int8 dot products above are not used.
bool q8_avx2_supported();
void q8_avx2_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1);

// The block formats' (Q8_0 and every format after it) products with q8 activations on AVX2's byte products
// (linear_blocks-inl.h compiled in linear_blocks_avx2.cpp): tokens [t0, t1) x rows [r0, r1) with xq filled. Called
// where q8_avx2_supported() and not the VNNI kernels below.
void blocks_avx2_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1);
// The same on AVX512-VNNI's vpdpbusd (linear_blocks_vnni.cpp), the same bits. Called where q8_dot_supported(), from
// AVX-512 dispatch targets.
void blocks_vnni_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1);
// The same on AVX-VNNI's vpdpbusd (linear_blocks_avx_vnni.cpp), the same bits: whether this CPU has AVX2, FMA, F16C
// and AVX-VNNI (x86-64 builds; false elsewhere), and the block. Called where avx_vnni_supported() and
// detail::avx_vnni_allowed() (simd_targets.h), from x86 dispatch targets from AVX2 up where the AVX512-VNNI kernels
// are not used.
bool avx_vnni_supported();
void blocks_avx_vnni_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1);
// q8 weights' prefill (more than kSmallBatch tokens) on the block formats' panels (linear_blocks-inl.h): the
// same bits as q8_avx2_block's tiles, rows [r0, r1) in panels of kPanelRows.
void q8_avx2_panels(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1);

// Throws rotary::Error naming the field for params linear_forward does not take (linear.cpp).
void validate(const LinearParams& p);

// Runs `count` jobs as one, their row groups shared among `threads` threads, at the SIMD target dispatch selects.
void run(const Job* jobs, int count, int threads);

}  // namespace rotary::linear_detail
