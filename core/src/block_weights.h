// core/src/block_weights.h (internal): llama.cpp's block formats (WeightFormat::Q8_0 ... Q5_1; their bytes in
// rotary/ggml_quants.h) read by the linear layers' portable paths - weight_row (an embedding's row) and the float32
// kernel of linear_hwy.cpp (targets below AVX2, and float32 or bf16 activations). A block is read in units of 32
// weights (the k-quants' 256 are 8 units), each as its float32 values. Each value is the format's formula taken in
// float, which is exact here but for one rounding (d x sc x q is at most 11 + 8 + 6 significant bits; Q4_1's and
// Q5_1's d q + m and Q4_K's and Q5_K's d sc q - dmin m round once, in the addition or subtraction; so a compiler
// contracting them into a fused multiply-add changes no bit): the same float as the float64 reference rounded once
// (ggml_dequantize_reference), and as llama.cpp's dequantize_row_*. The byte-product kernels (linear_blocks-inl.h) read
// the same bytes as integers.
#pragma once

#include <cstdint>
#include <cstring>

#include "rotary/dtype.h"
#include "rotary/linear.h"

namespace rotary::linear_detail {

inline constexpr int kUnit = 32;  // weights per unit; every block format's block is whole units

// Row r's first block of a block-format matrix (row_stride in weights, whole blocks).
inline const uint8_t* block_row(WeightFormat f, const void* data, int64_t row_stride, int64_t r) {
  return static_cast<const uint8_t*>(data) + (r * row_stride / weight_block_size(f)) * weight_block_bytes(f);
}

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_float(h);
}

// The k-quants' (Q4_K, Q5_K) 6-bit scale and min of sub-block j (0..7) from their 12 packed bytes.
inline void k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63, m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The 32 float values of unit u of the row whose first block is `row` (unit u of the row: block u / units-per-block).
inline void unit_values(WeightFormat f, const uint8_t* row, int64_t u, float* out) {
  switch (f) {
    case WeightFormat::Q8_0: {
      const uint8_t* b = row + u * 34;
      const float d = f16_at(b);
      const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
      for (int i = 0; i < 32; ++i) out[i] = d * float(q[i]);
      return;
    }
    case WeightFormat::Q4_0: {
      const uint8_t* b = row + u * 18;
      const float d = f16_at(b);
      for (int i = 0; i < 16; ++i) {
        out[i] = d * float((b[2 + i] & 0x0F) - 8);
        out[i + 16] = d * float((b[2 + i] >> 4) - 8);
      }
      return;
    }
    case WeightFormat::Q4_1: {
      const uint8_t* b = row + u * 20;
      const float d = f16_at(b), m = f16_at(b + 2);
      for (int i = 0; i < 16; ++i) {
        out[i] = d * float(b[4 + i] & 0x0F) + m;
        out[i + 16] = d * float(b[4 + i] >> 4) + m;
      }
      return;
    }
    case WeightFormat::Q5_0:
    case WeightFormat::Q5_1: {
      // Q5_0: d, qh[4], qs[16], x = d (q - 16); Q5_1: d, m, qh[4], qs[16], x = d q + m. The fifth bit of value i
      // is bit i of qh as a little-endian uint32.
      const bool with_min = f == WeightFormat::Q5_1;
      const uint8_t* b = row + u * (with_min ? 24 : 22);
      const float d = f16_at(b), m = with_min ? f16_at(b + 2) : 0.0f;
      const uint8_t* qh = b + (with_min ? 4 : 2);
      const uint8_t* qs = qh + 4;
      const uint32_t high = uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
      for (int i = 0; i < 16; ++i) {
        const int q0 = (qs[i] & 0x0F) | int((high >> i) & 1) << 4;
        const int q1 = (qs[i] >> 4) | int((high >> (i + 16)) & 1) << 4;
        // (Q5_0 adds no zero min: d x 0 keeps d's sign, as the reference's value does)
        out[i] = with_min ? d * float(q0) + m : d * float(q0 - 16);
        out[i + 16] = with_min ? d * float(q1) + m : d * float(q1 - 16);
      }
      return;
    }
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K: {
      const bool five = f == WeightFormat::Q5_K;
      const uint8_t* b = row + (u / 8) * (five ? 176 : 144);
      const int j = int(u % 8);
      const float d = f16_at(b), dmin = f16_at(b + 2);
      int sc = 0, m = 0;
      k_scale_min(b + 4, j, sc, m);
      const float scale = d * float(sc), min = dmin * float(m);
      const uint8_t* qh = b + 16;             // Q5_K: the fifth bits, bit j of qh[l]
      const uint8_t* qs = b + (five ? 48 : 16) + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        int q = (qs[l] >> shift) & 0x0F;
        if (five && (qh[l] >> j) & 1) q += 16;
        out[l] = scale * float(q) - min;
      }
      return;
    }
    case WeightFormat::Q6_K: {
      const uint8_t* b = row + (u / 8) * 210;
      const int unit = int(u % 8), h = unit / 4, g = unit % 4;
      const uint8_t* ql = b + 64 * h + 32 * (g & 1);
      const uint8_t* qh = b + 128 + 32 * h;
      const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
      const float d = f16_at(b + 208);
      for (int l = 0; l < 32; ++l) {
        const int q = ((ql[l] >> (g >= 2 ? 4 : 0)) & 0x0F) | (((qh[l] >> (2 * g)) & 3) << 4);
        out[l] = d * float(scales[2 * unit + l / 16]) * float(q - 32);
      }
      return;
    }
    default: return;
  }
}

}  // namespace rotary::linear_detail
