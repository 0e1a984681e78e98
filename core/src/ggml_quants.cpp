// ggml_quants.cpp: quantizers writing llama.cpp's block formats byte for byte (ggml_quants.h), and row sizes.
//
// Each quantizer does the float32 operations of llama.cpp's reference quantizer of its type (ggml-quants.c:
// quantize_row_<type>_ref, no importance matrix) in the same order: a different association, a double where they
// keep a float, or a fused multiply-add where they round twice changes which candidate scale a k-quant search keeps
// and so the bytes. core/CMakeLists.txt compiles this file with -ffp-contract=off for that reason. Expressions such
// as (w * l) * x below keep their parentheses implicit on purpose: left to right, as C evaluates them.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "rotary/dtype.h"
#include "rotary/error.h"
#include "rotary/ggml_quants.h"

namespace rotary {
namespace {

constexpr int kSuperBlock = 256;  // QK_K: the k-quants' block
// Below this largest |x| a group of values is all zero to the k-quant searches (ggml-quants.c's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest (ties to even) by adding 1.5 x 2^23: the sum's low 22 mantissa bits then hold the integer plus
// 2^22. This is llama.cpp's nearest_int, kept to the bit: past |x| = 2^22 it wraps instead of saturating, and that
// is what its quantizers then clamp.
int nearest_int(float x) {
  const float shifted = x + 12582912.f;
  int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// float32 -> int8 as x86's scalar conversion does it (cvttss2si: truncation, INT32_MIN for NaN and out-of-range),
// keeping the low byte: llama.cpp's (int8_t) casts of a Q8_0 / Q4_0 / Q4_1 / Q5_0 quant, and its (uint8_t) cast of a
// Q5_1 quant (the same low byte). Only a block whose scale's reciprocal overflowed (ggml_quants.h) reaches the
// out-of-range case.
int8_t to_int8_like_x86(float v) {
  const int32_t i = (v > -2147483648.f && v < 2147483648.f) ? int32_t(v) : INT32_MIN;
  return int8_t(uint8_t(uint32_t(i) & 0xffu));
}

void put_half(uint8_t* p, float v) {
  const uint16_t h = float_to_f16(v);
  p[0] = uint8_t(h & 0xff);
  p[1] = uint8_t(h >> 8);
}
float get_half(const uint8_t* p) { return f16_to_float(uint16_t(p[0] | (p[1] << 8))); }

// ---- Q8_0 and Q4_0: one scale per 32 values ------------------------------------------------------------------

void quantize_q8_0_block(const float* x, uint8_t* block) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(block, d);
  for (int j = 0; j < 32; ++j) block[2 + j] = uint8_t(to_int8_like_x86(std::round(x[j] * id)));
}

// The value of largest magnitude among a block's 32, with its sign (the first such one): Q4_0 and Q5_0 map it to
// their lowest level, q = 0 (-8 d, -16 d).
float signed_max(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void quantize_q4_0_block(const float* x, uint8_t* block) {
  const float d = signed_max(x) / -8;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(block, d);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min<int>(15, to_int8_like_x86(x[j] * id + 8.5f));
    const int hi = std::min<int>(15, to_int8_like_x86(x[j + 16] * id + 8.5f));
    block[2 + j] = uint8_t(uint8_t(lo) | (uint8_t(hi) << 4));
  }
}

// ---- Q4_1, Q5_0, Q5_1: one scale (and a min) per 32 values, 4 or 5 bits ---------------------------------------

// The smallest and largest of a block's 32 values (the first of equals: -0 and +0 kept as met, as llama.cpp's
// `if (v < min)` does), from FLT_MAX / -FLT_MAX as llama.cpp starts.
void block_min_max(const float* x, float* min, float* max) {
  *min = FLT_MAX, *max = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

// Q4_1's and Q5_1's scale and min: d = (max - min) / levels and the block's min, stored as the f16 d and m of the
// block's first 4 bytes; returns the reciprocal the quants are made with (of the unrounded d; 0 for d = 0) and sets
// *min (unrounded, as the quants take it).
float put_scale_and_min(const float* x, int levels, uint8_t* block, float* min) {
  float max = 0;
  block_min_max(x, min, &max);
  const float d = (max - *min) / float(levels);
  put_half(block, d);
  put_half(block + 2, *min);
  return d != 0.0f ? 1.0f / d : 0.0f;
}

// Q4_1: d = (max - min) / 15, the min stored as it is; quants against the unrounded d and min, truncated after
// adding 1/2 (llama.cpp's (int8_t)(x + 0.5f), then MIN(15, ...)).
void quantize_q4_1_block(const float* x, uint8_t* block) {
  float min = 0;
  const float id = put_scale_and_min(x, 15, block, &min);
  for (int j = 0; j < 16; ++j) {
    const float x0 = (x[j] - min) * id;
    const float x1 = (x[j + 16] - min) * id;
    const uint8_t lo = uint8_t(std::min<int>(15, to_int8_like_x86(x0 + 0.5f)));
    const uint8_t hi = uint8_t(std::min<int>(15, to_int8_like_x86(x1 + 0.5f)));
    block[4 + j] = uint8_t(lo | (hi << 4));
  }
}

// The fifth bits of a Q5_0 / Q5_1 block's 32 quants as qh's 4 bytes: bit j of the little-endian uint32 is value j's.
void put_fifth_bits(uint8_t* qh, const uint8_t* q) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= uint32_t((q[j] & 0x10u) >> 4) << j;
  for (int i = 0; i < 4; ++i) qh[i] = uint8_t(bits >> (8 * i));
}

// Q5_0: as Q4_0 with 32 levels - d = max / -16 (max: the value of largest magnitude, the first such), quants
// MIN(31, (int8_t)(x / d + 16.5f)); the low four bits in the nibbles, the fifth in qh.
void quantize_q5_0_block(const float* x, uint8_t* block) {
  const float d = signed_max(x) / -16;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(block, d);
  uint8_t q[32];
  for (int j = 0; j < 32; ++j) q[j] = uint8_t(std::min<int>(31, to_int8_like_x86(x[j] * id + 16.5f)));
  put_fifth_bits(block + 2, q);
  for (int j = 0; j < 16; ++j) block[6 + j] = uint8_t((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
}

// Q5_1: as Q4_1 with 32 levels, d = (max - min) / 31; llama.cpp casts x + 1/2 to uint8_t without a clamp (its
// largest level is 31 + 1/2 up to rounding, so 31), which on x86 is the low byte of the int32 truncation.
void quantize_q5_1_block(const float* x, uint8_t* block) {
  float min = 0;
  const float id = put_scale_and_min(x, 31, block, &min);
  uint8_t q[32];
  for (int j = 0; j < 32; ++j) q[j] = uint8_t(to_int8_like_x86((x[j] - min) * id + 0.5f));
  put_fifth_bits(block + 4, q);
  for (int j = 0; j < 16; ++j) block[8 + j] = uint8_t((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
}

// ---- Q4_K and Q5_K: 8 sub-blocks of 32 with a scale and a min each ---------------------------------------------

// The scale and min of one sub-block, x ~ scale L - min with L in [0, nmax] (make_qkx2_quants): start from the
// range's grid, then try nstep + 1 stretched grids (nmax + rmin + rdelta is steps across the range), each with the
// weighted least-squares scale and min of its levels (min held at <= 0), and keep the one of least weighted squared
// error. Writes the levels to L (scratch: `trial`); returns the scale and sets *neg_min to -min (>= 0).
float fit_scale_min(const float* x, const float* w, int nmax, float rmin, float rdelta, int nstep, uint8_t* L,
                    uint8_t* trial, float* neg_min) {
  constexpr int n = 32;
  float min = x[0], max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *neg_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::max(0, std::min(nmax, l)));
    const float diff = scale * L[i] + min - x[i];
    best_error += w[i] * (diff * diff);
  }
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * step + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      trial[i] = uint8_t(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (!(D > 0)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * trial[i] + this_min - x[i];
      error += w[i] * (diff * diff);
    }
    if (error < best_error) {
      std::memcpy(L, trial, n);
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  *neg_min = -min;
  return scale;
}

// Q4_K (nmax 15) and Q5_K (nmax 31): each sub-block's scale and min fitted, both sets quantized to 6 bits against
// the largest of each (stored as f16 d = max / 63 and dmin), then every value re-quantized against the stored,
// rounded scales; `levels` gets the 256 quants.
void quantize_k_scales_and_levels(const float* x, int nmax, float rmin, float rdelta, int nstep, uint8_t* block,
                                  uint8_t* levels) {
  uint8_t* packed = block + 4;
  float scales[8], mins[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    float weights[32];
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    uint8_t trial[32];
    scales[j] = fit_scale_min(xs, weights, nmax, rmin, rdelta, nstep, levels + 32 * j, trial, &mins[j]);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t sc6[8], m6[8];
  for (int j = 0; j < 8; ++j) {
    // (uint8_t first, as llama.cpp stores them: a negative level wraps before the clamp to 63)
    sc6[j] = std::min<uint8_t>(63, uint8_t(nearest_int(inv_scale * scales[j])));
    m6[j] = std::min<uint8_t>(63, uint8_t(nearest_int(inv_min * mins[j])));
  }
  // The 6-bit packing ggml_quants.h describes: sub-blocks 0-3 whole in bytes 0-7, 4-7's low nibbles in bytes 8-11
  // and their top two bits above those of 0-3.
  for (int j = 0; j < 4; ++j) {
    packed[j] = uint8_t(sc6[j] | ((sc6[j + 4] >> 4) << 6));
    packed[j + 4] = uint8_t(m6[j] | ((m6[j + 4] >> 4) << 6));
    packed[j + 8] = uint8_t((sc6[j + 4] & 15) | ((m6[j + 4] & 15) << 4));
  }
  put_half(block, max_scale / 63.f);
  put_half(block + 2, max_min / 63.f);
  const float d_all = get_half(block), dmin_all = get_half(block + 2);
  for (int j = 0; j < 8; ++j) {
    const float d = d_all * sc6[j];
    if (d == 0) continue;  // the levels of the fit stay
    const float dm = dmin_all * m6[j];
    for (int l = 0; l < 32; ++l)
      levels[32 * j + l] = uint8_t(std::max(0, std::min(nmax, nearest_int((x[32 * j + l] + dm) / d))));
  }
}

void quantize_q4_k_block(const float* x, uint8_t* block) {
  uint8_t levels[kSuperBlock];
  quantize_k_scales_and_levels(x, 15, -1.f, 0.1f, 20, block, levels);
  // Sub-blocks 2c and 2c + 1 share qs[32c .. 32c + 31]: low and high nibbles.
  uint8_t* qs = block + 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) qs[32 * c + l] = uint8_t(levels[64 * c + l] | (levels[64 * c + 32 + l] << 4));
}

void quantize_q5_k_block(const float* x, uint8_t* block) {
  uint8_t levels[kSuperBlock];
  quantize_k_scales_and_levels(x, 31, -0.5f, 0.1f, 15, block, levels);
  // As Q4_K's nibbles, the fifth bit of sub-block j's value l in bit j of qh[l].
  uint8_t* qh = block + 16;
  uint8_t* qs = block + 48;
  std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = levels[64 * c + l], hi = levels[64 * c + 32 + l];
      qh[l] = uint8_t(qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      qs[32 * c + l] = uint8_t((lo & 15) | ((hi & 15) << 4));
    }
  }
}

// ---- Q6_K: 16 sub-blocks of 16 with an int8 scale each ----------------------------------------------------------

// A symmetric scale for 16 values, x ~ scale (L - nmax) with L - nmax in [-nmax, nmax - 1] (make_qx_quants with
// weights x^2): the grid through the value of largest magnitude, then 18 grids stretched by -0.9 .. 0.9 levels, each
// with its weighted least-squares scale, keeping the one that explains the most (largest sumlx^2 / suml2).
float fit_symmetric_scale(const float* x, int nmax, int8_t* L) {
  constexpr int n = 16;
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  // The weighted sums of one grid: sum w x l and sum w l^2 with w = x^2.
  const auto sums = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  const auto set_levels = [&](float iscale) {
    for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))));
  };
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  sums(iscale, &sumlx, &suml2);
  set_levels(iscale);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(nmax + 0.1f * step) / max;
    sums(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      set_levels(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void quantize_q6_k_block(const float* x, uint8_t* block) {
  uint8_t* ql = block;
  uint8_t* qh = block + 128;
  auto* scales_out = reinterpret_cast<int8_t*>(block + 192);
  int8_t levels[kSuperBlock];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int s = 0; s < 16; ++s) {
    scales[s] = fit_symmetric_scale(x + 16 * s, 32, levels + 16 * s);
    if (std::fabs(scales[s]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[s]);
      max_scale = scales[s];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {  // all zero: every byte 0 (d = +0)
    std::memset(block, 0, 210);
    return;
  }
  // The largest scale maps to -128; d is its f16 step.
  const float iscale = -128.f / max_scale;
  put_half(block + 208, 1 / iscale);
  for (int s = 0; s < 16; ++s) scales_out[s] = int8_t(std::min(127, nearest_int(iscale * scales[s])));
  const float d_all = get_half(block + 208);
  for (int s = 0; s < 16; ++s) {
    const float d = d_all * scales_out[s];
    if (d == 0) continue;  // the levels of the fit stay
    for (int i = 0; i < 16; ++i)
      levels[16 * s + i] = int8_t(std::max(-32, std::min(31, nearest_int(x[16 * s + i] / d))) + 32);
  }
  // Value 128 h + 32 g + l: its low nibble in ql[64 h + 32 (g & 1) + l] (the low one for g < 2, else the high one),
  // its top two bits at bit 2g of qh[32 h + l].
  for (int h = 0; h < 2; ++h) {
    const int8_t* L = levels + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[64 * h + l] = uint8_t((L[l] & 15) | ((L[l + 64] & 15) << 4));
      ql[64 * h + 32 + l] = uint8_t((L[l + 32] & 15) | ((L[l + 96] & 15) << 4));
      qh[32 * h + l] =
          uint8_t((L[l] >> 4) | ((L[l + 32] >> 4) << 2) | ((L[l + 64] >> 4) << 4) | ((L[l + 96] >> 4) << 6));
    }
  }
}

}  // namespace

const char* ggml_quants_types() { return "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16"; }

int64_t ggml_row_bytes(GgmlType type, int64_t n) {
  const GgmlTypeInfo* info = ggml_type_info(uint32_t(type));
  if (!info) fail("type", ggml_type_name(type), ggml_supported_types());
  if (n < 0 || n % info->block_size != 0)
    fail("n", to_text(n), "a multiple of " + std::string(info->name) + "'s block size " + to_text(info->block_size));
  return n / info->block_size * info->type_size;
}

void ggml_quantize(GgmlType type, const float* x, int64_t n, void* blocks) {
  struct BlockQuantizer {
    GgmlType type;
    void (*quantize)(const float* x, uint8_t* block);  // null: a plain type, converted value by value
  };
  static constexpr BlockQuantizer kQuantizers[] = {
      {GgmlType::Q8_0, quantize_q8_0_block}, {GgmlType::Q4_0, quantize_q4_0_block},
      {GgmlType::Q4_1, quantize_q4_1_block}, {GgmlType::Q5_0, quantize_q5_0_block},
      {GgmlType::Q5_1, quantize_q5_1_block},
      {GgmlType::Q4_K, quantize_q4_k_block}, {GgmlType::Q5_K, quantize_q5_k_block},
      {GgmlType::Q6_K, quantize_q6_k_block}, {GgmlType::F32, nullptr}, {GgmlType::F16, nullptr},
      {GgmlType::BF16, nullptr}};
  const BlockQuantizer* quantizer = nullptr;
  for (const BlockQuantizer& q : kQuantizers)
    if (q.type == type) quantizer = &q;
  if (!quantizer) fail("type", ggml_type_name(type), ggml_quants_types());
  if (ggml_row_bytes(type, n) == 0) return;  // n = 0: nothing to read or write (the pointers may be null)
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      fail("x[" + std::to_string(i) + "]", to_text(x[i]),
           "finite values (quantizing " + std::to_string(n) + " values to " + ggml_type_name(type) + ")");
  auto* out = static_cast<uint8_t*>(blocks);
  switch (type) {
    case GgmlType::F32: std::memcpy(out, x, size_t(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) put_half(out + 2 * i, x[i]);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = float_to_bf16(x[i]);
        out[2 * i] = uint8_t(h & 0xff);
        out[2 * i + 1] = uint8_t(h >> 8);
      }
      return;
    default: break;
  }
  const GgmlTypeInfo& info = *ggml_type_info(uint32_t(type));
  for (int64_t b = 0; b < n / info.block_size; ++b)
    quantizer->quantize(x + b * info.block_size, out + b * info.type_size);
}

GgmlType ggml_type_of(WeightFormat format) {
  switch (format) {
    case WeightFormat::Q8_0: return GgmlType::Q8_0;
    case WeightFormat::Q4_0: return GgmlType::Q4_0;
    case WeightFormat::Q4_1: return GgmlType::Q4_1;
    case WeightFormat::Q5_0: return GgmlType::Q5_0;
    case WeightFormat::Q5_1: return GgmlType::Q5_1;
    case WeightFormat::Q4_K: return GgmlType::Q4_K;
    case WeightFormat::Q5_K: return GgmlType::Q5_K;
    case WeightFormat::Q6_K: return GgmlType::Q6_K;
    default: break;
  }
  fail("format", weight_format_name(format), "a block format: q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k");
}

}  // namespace rotary
