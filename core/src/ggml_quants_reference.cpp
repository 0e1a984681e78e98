// ggml_quants_reference.cpp: the float64 dequantization reference of llama.cpp's block formats (ggml_quants.h).
//
// Written from the layouts alone and value by value: every output element finds its own bytes (its block, its
// sub-block's scale, its bits) rather than walking the blocks the way a fast decoder does, and f16 scales are
// decoded here from their sign, exponent and mantissa (not with dtype.h's conversion, which the fast paths use), so
// a mistake shared with a fast path cannot hide. Every product below is exact in double (ggml_quants.h says why).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "rotary/error.h"
#include "rotary/ggml_quants.h"

namespace rotary {
namespace {

// IEEE binary16 from its bits: (-1)^s 2^(e - 15) (1 + m / 1024) for a normal half, 2^-14 (m / 1024) for a
// subnormal one (e = 0), infinity or NaN for e = 31.
double half_value(const uint8_t* p) {
  const unsigned bits = unsigned(p[0]) | (unsigned(p[1]) << 8);
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const int exponent = int((bits >> 10) & 31u);
  const unsigned mantissa = bits & 1023u;
  if (exponent == 31) return mantissa ? std::nan("") : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(double(mantissa), -24);
  return sign * std::ldexp(double(1024u + mantissa), exponent - 25);
}

// bfloat16: the top half of a float32's bits.
double bf16_value(const uint8_t* p, int) {
  const uint32_t bits = (uint32_t(p[0]) | (uint32_t(p[1]) << 8)) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

double f32_value(const uint8_t* p, int) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// Q8_0: value e of a block.
double q8_0_value(const uint8_t* block, int e) {
  return half_value(block) * double(int8_t(block[2 + e]));
}

// Q4_0: values 0..15 in the low nibbles of qs[0..15], 16..31 in the high ones.
double q4_0_value(const uint8_t* block, int e) {
  const uint8_t byte = block[2 + e % 16];
  const int nibble = e < 16 ? (byte & 15) : (byte >> 4);
  return half_value(block) * double(nibble - 8);
}

// Q4_1: Q4_0's nibbles, unsigned, plus the min m (the f16 after d).
double q4_1_value(const uint8_t* block, int e) {
  const uint8_t byte = block[4 + e % 16];
  const int nibble = e < 16 ? (byte & 15) : (byte >> 4);
  return half_value(block) * double(nibble) + half_value(block + 2);
}

// Q5_0 / Q5_1: value e's low four bits as Q4_0's nibbles (from qs), its fifth bit at bit e of the little-endian
// uint32 qh - byte e / 8, bit e % 8.
int q5_quant(const uint8_t* qh, const uint8_t* qs, int e) {
  const uint8_t byte = qs[e % 16];
  const int nibble = e < 16 ? (byte & 15) : (byte >> 4);
  return nibble | (((qh[e / 8] >> (e % 8)) & 1) << 4);
}
// Q5_0: f16 d, qh[4], qs[16]; x = d (q - 16).
double q5_0_value(const uint8_t* block, int e) {
  return half_value(block) * double(q5_quant(block + 2, block + 6, e) - 16);
}
// Q5_1: f16 d, f16 m, qh[4], qs[16]; x = d q + m.
double q5_1_value(const uint8_t* block, int e) {
  return half_value(block) * double(q5_quant(block + 4, block + 8, e)) + half_value(block + 2);
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block, from its 12 packed bytes.
void k_scale_min(const uint8_t* packed, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
    return;
  }
  *scale = (packed[j + 4] & 15) | ((packed[j - 4] >> 6) << 4);
  *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
}

// Q4_K (bits = 4) and Q5_K (bits = 5): value e of a block, x = d sc q - dmin m.
double q45_k_value(const uint8_t* block, int e, int bits) {
  const uint8_t* packed = block + 4;
  const uint8_t* qh = block + 16;                    // Q5_K only
  const uint8_t* qs = block + (bits == 5 ? 48 : 16);
  const int sub = e / 32, lane = e % 32;
  const uint8_t byte = qs[32 * (sub / 2) + lane];
  int q = sub % 2 == 0 ? (byte & 15) : (byte >> 4);
  if (bits == 5 && ((qh[lane] >> sub) & 1)) q += 16;
  int scale = 0, min = 0;
  k_scale_min(packed, sub, &scale, &min);
  return half_value(block) * scale * q - half_value(block + 2) * min;
}
double q4_k_value(const uint8_t* block, int e) { return q45_k_value(block, e, 4); }
double q5_k_value(const uint8_t* block, int e) { return q45_k_value(block, e, 5); }

// Q6_K: value e = 128 h + 32 g + l, x = d scales[e / 16] (q - 32).
double q6_k_value(const uint8_t* block, int e) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
  const int h = e / 128, g = (e % 128) / 32, l = e % 32;
  const uint8_t low_byte = ql[64 * h + 32 * (g & 1) + l];
  const int low = g < 2 ? (low_byte & 15) : (low_byte >> 4);
  const int high = (qh[32 * h + l] >> (2 * g)) & 3;
  return half_value(block + 208) * double(scales[e / 16]) * double((low | (high << 4)) - 32);
}

// IEEE binary16 as a one-value block.
double f16_value(const uint8_t* p, int) { return half_value(p); }

}  // namespace

void ggml_dequantize_reference(GgmlType type, const void* blocks, int64_t n, double* out) {
  double (*value)(const uint8_t* block, int e) = nullptr;
  switch (type) {
    case GgmlType::F32: value = f32_value; break;
    case GgmlType::F16: value = f16_value; break;
    case GgmlType::BF16: value = bf16_value; break;
    case GgmlType::Q8_0: value = q8_0_value; break;
    case GgmlType::Q4_0: value = q4_0_value; break;
    case GgmlType::Q4_1: value = q4_1_value; break;
    case GgmlType::Q5_0: value = q5_0_value; break;
    case GgmlType::Q5_1: value = q5_1_value; break;
    case GgmlType::Q4_K: value = q4_k_value; break;
    case GgmlType::Q5_K: value = q5_k_value; break;
    case GgmlType::Q6_K: value = q6_k_value; break;
    default: fail("type", ggml_type_name(type), ggml_quants_types());
  }
  if (ggml_row_bytes(type, n) == 0) return;  // n a whole number of blocks; none: the pointers may be null
  const GgmlTypeInfo& info = *ggml_type_info(uint32_t(type));
  const auto* bytes = static_cast<const uint8_t*>(blocks);
  for (int64_t i = 0; i < n; ++i)
    out[i] = value(bytes + i / info.block_size * info.type_size, int(i % info.block_size));
}

}  // namespace rotary
