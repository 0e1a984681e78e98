// rotary/ggml_quants.h: llama.cpp's block formats. Blocks built here byte by byte from the layouts (chosen scales
// and quants, so the expected values are d x q worked out in the test, not by the library), quantize -> dequantize
// round trips within each format's derived bound, the k-quant quantizers' defining properties (every quant the
// nearest level of its sub-block's stored grid, the largest 6-bit scale 63, Q6_K's largest scale -128, a constant
// positive sub-block's min 0), block independence, odd lengths and the refusals.
// (tests/gguf_oracle/test_ggml_quants_oracle.py compares the same code with gguf-py and llama.cpp's C, byte for byte.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "expect.h"
#include "rotary/ggml_quants.h"

namespace rotary {
namespace {

using test::expect_error;

constexpr double kF16Unit = 0x1p-11;  // f16's unit roundoff (11 significant bits)
constexpr double kBF16Unit = 0x1p-8;
constexpr double kF32Unit = 0x1p-24;

// f16 bit patterns and the values IEEE 754 gives them.
struct Half {
  uint16_t bits;
  double value;
};
constexpr Half kHalf_0_5{0x3800, 0.5}, kHalf_0_25{0x3400, 0.25}, kHalf_m0_25{0xB400, -0.25},
    kHalf_0_125{0x3000, 0.125}, kHalf_1_5{0x3E00, 1.5}, kHalf_min_sub{0x0001, 0x1p-24}, kHalf_max{0x7BFF, 65504.0};

void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = uint8_t(v & 0xff);
  b[at + 1] = uint8_t(v >> 8);
}
uint16_t get16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
// An f16 field read back (to check stored scales): normal and subnormal halves, from the definition.
double half_of(const uint8_t* p) {
  const uint16_t h = get16(p);
  const int e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0 ? std::ldexp(m, -24) : e == 31 ? INFINITY : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

// Every block type the quantizers write.
constexpr GgmlType kQuantTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                                    GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

std::vector<double> decode(GgmlType type, const std::vector<uint8_t>& blocks, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n), -999.0);
  ggml_dequantize_reference(type, blocks.data(), n, out.data());
  return out;
}
std::vector<uint8_t> encode(GgmlType type, const std::vector<float>& x) {
  const auto n = int64_t(x.size());
  std::vector<uint8_t> blocks(static_cast<size_t>(ggml_row_bytes(type, n)), 0xA5);
  ggml_quantize(type, x.data(), n, blocks.data());
  return blocks;
}

// The 12 bytes of a Q4_K / Q5_K block's 6-bit scales and mins, packed as ggml-common.h lays them out: bytes 0-3 the
// scales of sub-blocks 0-3 with bits 4-5 of sub-block 4-7's scales on top, bytes 4-7 the same for the mins, bytes
// 8-11 the low nibbles of sub-blocks 4-7's scale (low) and min (high).
void pack_scales_mins(std::vector<uint8_t>& b, size_t at, const int sc[8], const int m[8]) {
  for (int k = 0; k < 4; ++k) {
    b[at + k] = uint8_t(sc[k] | ((sc[k + 4] >> 4) << 6));
    b[at + 4 + k] = uint8_t(m[k] | ((m[k + 4] >> 4) << 6));
    b[at + 8 + k] = uint8_t((sc[k + 4] & 15) | ((m[k + 4] & 15) << 4));
  }
}
// And read back bit by bit: sub-block j's scale and min.
int scale6(const uint8_t* packed, int j) {
  return j < 4 ? packed[j] & 63 : (packed[j + 4] & 15) + 16 * (packed[j - 4] >> 6);
}
int min6(const uint8_t* packed, int j) {
  return j < 4 ? packed[j + 4] & 63 : (packed[j + 4] >> 4) + 16 * (packed[j] >> 6);
}

// ---- Hand-built blocks ---------------------------------------------------------------------------------------

TEST(ggml_quants, DequantizeQ8_0ValuesAreScaleTimesSignedQuants) {
  std::vector<uint8_t> b(2 * 34);
  put16(b, 0, kHalf_0_5.bits);
  put16(b, 34, kHalf_min_sub.bits);  // a subnormal scale
  for (int j = 0; j < 32; ++j) {
    b[2 + j] = uint8_t(int8_t(j * 8 - 128));  // -128, -120, ..., 120
    b[36 + j] = uint8_t(int8_t(127 - j));
  }
  const std::vector<double> got = decode(GgmlType::Q8_0, b, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(got[j], kHalf_0_5.value * (j * 8 - 128)) << j;
    EXPECT_EQ(got[32 + j], kHalf_min_sub.value * (127 - j)) << j;
  }
}

TEST(ggml_quants, DequantizeQ4_0LowNibblesFirstThenHighOnes) {
  std::vector<uint8_t> b(18);
  put16(b, 0, kHalf_m0_25.bits);
  int lo[16], hi[16];
  for (int j = 0; j < 16; ++j) {
    lo[j] = j;
    hi[j] = (5 * j + 3) % 16;
    b[2 + j] = uint8_t(lo[j] | (hi[j] << 4));
  }
  const std::vector<double> got = decode(GgmlType::Q4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(got[j], kHalf_m0_25.value * (lo[j] - 8)) << j;
    EXPECT_EQ(got[16 + j], kHalf_m0_25.value * (hi[j] - 8)) << j;
  }
}

TEST(ggml_quants, DequantizeQ4_1UnsignedNibblesPlusTheMin) {
  std::vector<uint8_t> b(2 * 20);
  put16(b, 0, kHalf_0_5.bits);
  put16(b, 2, kHalf_m0_25.bits);  // m = -0.25
  put16(b, 20, kHalf_min_sub.bits);
  put16(b, 22, kHalf_1_5.bits);
  int lo[16], hi[16];
  for (int j = 0; j < 16; ++j) {
    lo[j] = (3 * j + 1) % 16;
    hi[j] = 15 - j;
    b[4 + j] = uint8_t(lo[j] | (hi[j] << 4));
    b[24 + j] = uint8_t(hi[j] | (lo[j] << 4));
  }
  const std::vector<double> got = decode(GgmlType::Q4_1, b, 64);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(got[j], kHalf_0_5.value * lo[j] + kHalf_m0_25.value) << j;
    EXPECT_EQ(got[16 + j], kHalf_0_5.value * hi[j] + kHalf_m0_25.value) << j;
    EXPECT_EQ(got[32 + j], kHalf_min_sub.value * hi[j] + kHalf_1_5.value) << j;
    EXPECT_EQ(got[48 + j], kHalf_min_sub.value * lo[j] + kHalf_1_5.value) << j;
  }
}

// Q5_0 / Q5_1's fifth bits: qh's 4 bytes as one little-endian uint32, bit e for value e - every byte of qh carries
// a different pattern (a lone low bit, a lone high bit, alternating, mixed), so a byte or bit order mistake shows.
constexpr uint8_t kQh[4] = {0x01, 0x80, 0x5A, 0xC3};
int fifth_bit(int e) { return (kQh[e / 8] >> (e % 8)) & 1; }

// A Q5_0 (no min) or Q5_1 block with scale d (and min m) built byte by byte - qh = kQh at `qh_at`, the nibbles of
// qs[16] after it - and decoded: value e must be d (q - offset) + m with q = nibble + 16 x bit e of qh.
void expect_q5_block(GgmlType type, Half d, const Half* m, int offset) {
  const int qh_at = m ? 4 : 2;
  std::vector<uint8_t> b(size_t(qh_at + 4 + 16));
  put16(b, 0, d.bits);
  if (m) put16(b, 2, m->bits);
  std::copy(std::begin(kQh), std::end(kQh), b.begin() + qh_at);
  int nib[32];
  for (int j = 0; j < 16; ++j) {
    nib[j] = (5 * j + 2 + qh_at) % 16;
    nib[16 + j] = (7 * j + 9) % 16;
    b[size_t(qh_at + 4 + j)] = uint8_t(nib[j] | (nib[16 + j] << 4));
  }
  const std::vector<double> got = decode(type, b, 32);
  for (int e = 0; e < 32; ++e)
    EXPECT_EQ(got[e], d.value * (nib[e] + 16 * fifth_bit(e) - offset) + (m ? m->value : 0.0))
        << ggml_type_name(type) << " " << e;
}

TEST(ggml_quants, DequantizeQ5_0FifthBitsFromALittleEndianWordMinus16) {
  expect_q5_block(GgmlType::Q5_0, kHalf_m0_25, nullptr, 16);
}

// (the largest half as the min: d q + m still exact in float64)
TEST(ggml_quants, DequantizeQ5_1FifthBitsPlusTheMin) { expect_q5_block(GgmlType::Q5_1, kHalf_0_125, &kHalf_max, 0); }

// Scales and mins whose top two bits differ across all eight sub-blocks (0..3 each), so every field of the 6-bit
// packing carries something.
constexpr int kScales[8] = {63, 1, 32, 17, 48, 5, 60, 33};
constexpr int kMins[8] = {0, 62, 16, 47, 33, 63, 9, 40};

TEST(ggml_quants, DequantizeQ4_KSixBitScalesAndMinsOfAllEightSubBlocks) {
  std::vector<uint8_t> b(144);
  put16(b, 0, kHalf_0_5.bits);
  put16(b, 2, kHalf_0_25.bits);
  pack_scales_mins(b, 4, kScales, kMins);
  std::vector<int> q(256);
  for (int e = 0; e < 256; ++e) {
    q[e] = (7 * e + 3) % 16;
    const int j = e / 32, l = e % 32;  // sub-blocks 2c, 2c + 1: low, high nibbles of qs[32c + l]
    b[16 + 32 * (j / 2) + l] |= uint8_t(j % 2 == 0 ? q[e] : q[e] << 4);
  }
  const std::vector<double> got = decode(GgmlType::Q4_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32;
    EXPECT_EQ(got[e], kHalf_0_5.value * kScales[j] * q[e] - kHalf_0_25.value * kMins[j]) << e;
  }
  // The unpacking the property tests below use agrees with the packing.
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(scale6(b.data() + 4, j), kScales[j]) << j;
    EXPECT_EQ(min6(b.data() + 4, j), kMins[j]) << j;
  }
}

TEST(ggml_quants, DequantizeQ5_KFifthBitFromQh) {
  std::vector<uint8_t> b(176);
  put16(b, 0, kHalf_1_5.bits);
  put16(b, 2, kHalf_0_125.bits);
  pack_scales_mins(b, 4, kMins, kScales);  // swapped: other values in the same fields
  std::vector<int> q(256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32;
    q[e] = (11 * e + 1) % 32;
    b[48 + 32 * (j / 2) + l] |= uint8_t(j % 2 == 0 ? (q[e] & 15) : (q[e] & 15) << 4);
    if (q[e] >= 16) b[16 + l] |= uint8_t(1 << j);  // bit j of qh[l]
  }
  const std::vector<double> got = decode(GgmlType::Q5_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32;
    EXPECT_EQ(got[e], kHalf_1_5.value * kMins[j] * q[e] - kHalf_0_125.value * kScales[j]) << e;
  }
}

TEST(ggml_quants, DequantizeQ6_KSixteenInt8ScalesAndSplitQuants) {
  std::vector<uint8_t> b(210);
  put16(b, 208, kHalf_0_125.bits);
  const int scales[16] = {-128, 127, -1, 1, 0, 64, -64, 3, -7, 100, -100, 42, -42, 2, -2, 9};
  for (int s = 0; s < 16; ++s) b[192 + s] = uint8_t(int8_t(scales[s]));
  std::vector<int> q(256);
  for (int e = 0; e < 256; ++e) {
    q[e] = (13 * e + 5) % 64;
    const int h = e / 128, g = (e % 128) / 32, l = e % 32;
    b[64 * h + 32 * (g & 1) + l] |= uint8_t(g < 2 ? (q[e] & 15) : (q[e] & 15) << 4);
    b[128 + 32 * h + l] |= uint8_t((q[e] >> 4) << (2 * g));
  }
  const std::vector<double> got = decode(GgmlType::Q6_K, b, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(got[e], kHalf_0_125.value * scales[e / 16] * (q[e] - 32)) << e;
}

TEST(ggml_quants, DequantizePlainTypes) {
  const Half halves[] = {kHalf_0_5, kHalf_m0_25, kHalf_min_sub, kHalf_max, {0x0200, 0x1p-15}, {0x8000, -0.0}};
  std::vector<uint8_t> f16(2 * std::size(halves));
  for (size_t i = 0; i < std::size(halves); ++i) put16(f16, 2 * i, halves[i].bits);
  const std::vector<double> got16 = decode(GgmlType::F16, f16, int64_t(std::size(halves)));
  for (size_t i = 0; i < std::size(halves); ++i) {
    EXPECT_EQ(got16[i], halves[i].value) << i;
    EXPECT_EQ(std::signbit(got16[i]), std::signbit(halves[i].value)) << i;
  }
  // bf16: the top half of a float32 (1.0f = 0x3F800000, -3.0f = 0xC0400000).
  std::vector<uint8_t> bf16(4);
  put16(bf16, 0, 0x3F80);
  put16(bf16, 2, 0xC040);
  EXPECT_EQ(decode(GgmlType::BF16, bf16, 2), (std::vector<double>{1.0, -3.0}));
  const std::vector<float> f32 = {0.1f, -7.5e-39f, 3e38f};
  std::vector<uint8_t> raw(12);
  std::memcpy(raw.data(), f32.data(), 12);
  const std::vector<double> got32 = decode(GgmlType::F32, raw, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got32[i], double(f32[i])) << i;
}

TEST(ggml_quants, DequantizeNonFiniteScalesFollowIeeeArithmetic) {
  std::vector<uint8_t> b(34);
  put16(b, 0, 0x7C00);  // +inf
  b[2] = 0;
  b[3] = 1;
  b[4] = uint8_t(int8_t(-2));
  const std::vector<double> got = decode(GgmlType::Q8_0, b, 32);
  EXPECT_TRUE(std::isnan(got[0]));  // inf x 0
  EXPECT_EQ(got[1], INFINITY);
  EXPECT_EQ(got[2], -INFINITY);
  put16(b, 0, 0x7E00);  // NaN
  EXPECT_TRUE(std::isnan(decode(GgmlType::Q8_0, b, 32)[1]));
}

// ---- Quantize -> dequantize ----------------------------------------------------------------------------------

// Rows of several kinds (seeded): normal, outliers, all-zero blocks, around f16's subnormal range, one sign only,
// mixed magnitudes per 32 values.
std::vector<std::vector<float>> sample_rows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(-4, 4);
  std::vector<std::vector<float>> rows;
  const auto row = [&](auto value) {
    std::vector<float> r(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) r[size_t(i)] = value(i);
    rows.push_back(r);
  };
  row([&](int64_t) { return normal(rng); });
  row([&](int64_t i) { return normal(rng) * (i % 97 == 5 ? 100.f : 1.f); });
  row([&](int64_t i) { return (i / 32) % 3 == 1 ? 0.f : normal(rng); });
  row([&](int64_t) { return normal(rng) * 3e-7f; });  // scales below f16's smallest normal
  row([&](int64_t) { return std::fabs(normal(rng)) + 0.25f; });
  row([&](int64_t) { return -std::fabs(normal(rng)) - 0.25f; });
  std::vector<float> block_scale(static_cast<size_t>(n / 32 + 1));
  for (float& s : block_scale) s = std::pow(10.f, uniform(rng));
  row([&](int64_t i) { return normal(rng) * block_scale[size_t(i / 32)]; });
  return rows;
}

// Q8_0: d = amax / 127 in float32, q = round(x / d) in [-127, 127] (|x| <= amax), stored d_h = f16(d). Then
// |x - d_h q| <= |x - d q| + |q| |d - d_h| <= d / 2 + 127 |d - d_h| (+ the float32 rounding of x / d: two
// roundings of a number below 128, 256 u32 d at most),
// with |d - d_h| <= u_h d for a normal half and <= 2^-25 for a subnormal one: the bound below.
TEST(ggml_quants, QuantizeQ8_0RoundTripWithinHalfAStepPlusScaleRounding) {
  for (const std::vector<float>& x : sample_rows(32 * 40, 1)) {
    const std::vector<double> y = decode(GgmlType::Q8_0, encode(GgmlType::Q8_0, x), int64_t(x.size()));
    for (size_t b = 0; b < x.size() / 32; ++b) {
      double amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(double(x[32 * b + j])));
      const double d = amax / 127;
      const double bound = d * (0.5 + 256 * kF32Unit) + 127 * std::max(kF16Unit * d, 0x1p-25);
      for (int j = 0; j < 32; ++j)
        ASSERT_LE(std::fabs(double(x[32 * b + j]) - y[32 * b + j]), bound) << "block " << b << " value " << j;
    }
  }
}

// Q4_0 (h = 8) and Q5_0 (h = 16): d = max / -h (max: the value of largest magnitude), q = trunc(x / d + h + 0.5)
// clamped to 2h - 1, x_hat = d_h (q - h). t = x / d lies in [-h, h]; rounding half up gives |x - d (q - h)| <= |d| / 2,
// except for t > h - 0.5 (the opposite sign of max near full magnitude), clamped from 2h to 2h - 1: up to |d|. With
// the f16 scale: |x - x_hat| <= that + h |d - d_h| (+ the float32 rounding of t + h + 0.5, below 4h u32 |d|).
void expect_signed_round_trip(GgmlType type, int h, uint32_t seed) {
  for (const std::vector<float>& x : sample_rows(32 * 40, seed)) {
    const std::vector<double> y = decode(type, encode(type, x), int64_t(x.size()));
    for (size_t b = 0; b < x.size() / 32; ++b) {
      double max = 0;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(double(x[32 * b + j])) > std::fabs(max)) max = x[32 * b + j];
      const double d = std::fabs(max) / h;
      for (int j = 0; j < 32; ++j) {
        const double t = max != 0 ? double(x[32 * b + j]) / (max / -h) : 0;
        const double step = t > h - 0.5 - 1e-5 ? 1 : 0.5;  // the clamped end: up to a whole step
        const double bound = d * (step + 4 * h * kF32Unit) + h * std::max(kF16Unit * d, 0x1p-25);
        ASSERT_LE(std::fabs(double(x[32 * b + j]) - y[32 * b + j]), bound)
            << ggml_type_name(type) << " block " << b << " value " << j;
      }
    }
  }
}
TEST(ggml_quants, QuantizeQ4_0RoundTripWithinHalfAStepOrOneAtTheClampedEnd) {
  expect_signed_round_trip(GgmlType::Q4_0, 8, 2);
}
TEST(ggml_quants, QuantizeQ5_0RoundTripWithinHalfAStepOrOneAtTheClampedEnd) {
  expect_signed_round_trip(GgmlType::Q5_0, 16, 12);
}

// Q4_1 (levels = 15) and Q5_1 (31): d = (max - min) / levels, the min stored as m_h = f16(min), q = trunc((x - min) /
// d + 0.5) - t = (x - min) / d lies in [0, levels], so |t - q| <= 1/2 and no clamp bites - and x_hat = d_h q + m_h.
// So |x - x_hat| <= d / 2 + levels |d - d_h| + |min - m_h| (+ the float32 roundings of x - min, the reciprocal, the
// product and the + 0.5: below 4 (levels + 1) u32 d).
TEST(ggml_quants, QuantizeQ4_1AndQ5_1RoundTripWithinHalfAStepPlusScaleAndMinRounding) {
  for (const auto& [type, levels] : {std::pair{GgmlType::Q4_1, 15}, std::pair{GgmlType::Q5_1, 31}}) {
    for (const std::vector<float>& x : sample_rows(32 * 40, 13)) {
      const std::vector<uint8_t> blocks = encode(type, x);
      const std::vector<double> y = decode(type, blocks, int64_t(x.size()));
      const int64_t bytes = ggml_row_bytes(type, 32);
      for (size_t b = 0; b < x.size() / 32; ++b) {
        const auto [lo, hi] = std::minmax_element(x.begin() + int64_t(32 * b), x.begin() + int64_t(32 * b + 32));
        const double min = *lo, d = (double(*hi) - min) / levels;
        EXPECT_EQ(half_of(&blocks[size_t(int64_t(b) * bytes + 2)]), double(f16_to_float(float_to_f16(float(min)))))
            << ggml_type_name(type) << " block " << b << ": m is the block's min";
        const double bound = d * (0.5 + 4 * (levels + 1) * kF32Unit) + levels * std::max(kF16Unit * d, 0x1p-25) +
                             std::max(kF16Unit * std::fabs(min), 0x1p-25);
        for (int j = 0; j < 32; ++j)
          ASSERT_LE(std::fabs(double(x[32 * b + j]) - y[32 * b + j]), bound)
              << ggml_type_name(type) << " block " << b << " value " << j;
      }
    }
  }
}

// Values on the grid come back exactly: integers in [-127, 127] with 127 present (d = 1), in [-8, 7] with -8 the
// value of largest magnitude (d = 1), in [-16, 15] with -16 so (Q5_0, d = 1), and for the formats with a min, the
// integers min .. min + levels with both ends in every block (Q4_1: -3 .. 12, Q5_1: -10 .. 21; d = 1, m = min).
TEST(ggml_quants, QuantizeGridValuesRoundTripExactly) {
  std::vector<float> q8(64), q4(64), q5(64), q41(64), q51(64);
  for (int i = 0; i < 64; ++i) {
    q8[i] = float(i % 32 == 7 ? 127 : (37 * i) % 255 - 127);
    q4[i] = float(i % 32 == 0 ? -8 : (5 * i) % 16 - 8);
    q5[i] = float(i % 32 == 0 ? -16 : (7 * i) % 32 - 16);
    q41[i] = float(i % 32 == 3 ? -3 : i % 32 == 20 ? 12 : (5 * i) % 16 - 3);
    q51[i] = float(i % 32 == 30 ? -10 : i % 32 == 1 ? 21 : (7 * i) % 32 - 10);
  }
  for (const auto& [type, x] : {std::pair{GgmlType::Q8_0, &q8}, std::pair{GgmlType::Q4_0, &q4},
                                std::pair{GgmlType::Q5_0, &q5}, std::pair{GgmlType::Q4_1, &q41},
                                std::pair{GgmlType::Q5_1, &q51}}) {
    const std::vector<double> y = decode(type, encode(type, *x), 64);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(y[i], (*x)[i]) << ggml_type_name(type) << " " << i;
  }
}

// The k-quants' last step, their defining property: with the stored f16 d (and dmin) and 6- or 8-bit sub-block
// scales, every value's quant is the level of its sub-block's grid nearest to it - q = clamp(round(t), 0, nmax) with
// t = (x + dmin m) / (d sc) (Q4_K / Q5_K) or t = x / (d sc) + 32 (Q6_K) - up to the float32 rounding of t (|t| u32
// twice, for the sum and the quotient). So |x - x_hat| <= (1/2 + 2 |t| u32) |d sc| for x inside the grid's span,
// and the distance to the span's nearer end outside it. A sub-block whose stored step d sc is 0 keeps the levels of
// the fit (llama.cpp skips it) and decodes to -dmin m whatever they are: not checked.
struct KGrid {
  double step, offset;  // x ~ step q - offset
  int levels;           // q in [0, levels)
};
void expect_nearest_levels(const std::vector<float>& x, const std::vector<double>& y, size_t values_per_grid,
                           const std::vector<KGrid>& grids, const std::string& what) {
  for (size_t g = 0; g < grids.size(); ++g) {
    const KGrid& grid = grids[g];
    if (grid.step == 0) continue;
    for (size_t i = g * values_per_grid; i < (g + 1) * values_per_grid; ++i) {
      const double t = (double(x[i]) + grid.offset) / grid.step;
      const double q = std::round((y[i] + grid.offset) / grid.step);  // the quant the block holds (exact)
      const double nearest = std::clamp(t, 0.0, double(grid.levels - 1));
      ASSERT_LE(std::fabs(nearest - q), 0.5 + 4 * std::fabs(t) * kF32Unit + 1e-12)
          << what << ": value " << i << " = " << x[i] << ", t = " << t << ", quant " << q;
    }
  }
}

std::vector<KGrid> q45_k_grids(const std::vector<uint8_t>& blocks, size_t block_bytes, int levels) {
  std::vector<KGrid> grids;
  for (size_t at = 0; at < blocks.size(); at += block_bytes) {
    const double d = half_of(&blocks[at]), dmin = half_of(&blocks[at + 2]);
    for (int j = 0; j < 8; ++j)
      grids.push_back({d * scale6(&blocks[at + 4], j), dmin * min6(&blocks[at + 4], j), levels});
  }
  return grids;
}

TEST(ggml_quants, QuantizeQ4_KAndQ5_KQuantsAreTheNearestLevelsOfTheStoredGrids) {
  for (const auto& [type, bytes, levels] : {std::tuple{GgmlType::Q4_K, size_t(144), 16},
                                            std::tuple{GgmlType::Q5_K, size_t(176), 32}}) {
    int row_index = 0;
    for (const std::vector<float>& x : sample_rows(256 * 6, 3)) {
      const std::vector<uint8_t> blocks = encode(type, x);
      const std::vector<double> y = decode(type, blocks, int64_t(x.size()));
      const std::string what = ggml_type_name(type) + " row " + std::to_string(row_index++);
      expect_nearest_levels(x, y, 32, q45_k_grids(blocks, bytes, levels), what);
      for (size_t at = 0; at < blocks.size(); at += bytes) {
        // 6-bit scales relative to the largest: that one is 63 (every row here has a sub-block with a range).
        int top_scale = 0, top_min = 0;
        for (int j = 0; j < 8; ++j) {
          top_scale = std::max(top_scale, scale6(&blocks[at + 4], j));
          top_min = std::max(top_min, min6(&blocks[at + 4], j));
        }
        EXPECT_EQ(top_scale, 63) << what;
        EXPECT_TRUE(top_min == 63 || (top_min == 0 && half_of(&blocks[at + 2]) == 0)) << what << " top min " << top_min;
      }
    }
  }
}

TEST(ggml_quants, QuantizeKQuantConstantPositiveSubBlocksHaveMinZeroAndSitOnTheTopLevel) {
  // A sub-block of one value c > 0: its min is held at 0 (min <= 0 by the format's design), every candidate grid puts
  // all values on one level (no least-squares refit: D = 0), so scale = c / nmax, the top level: dmin and every m
  // are 0, every quant is nmax, and the value comes back as d sc nmax (within the 6-bit scale's rounding).
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f + 0.25f * float((i / 32) % 5);
  for (const auto& [type, bytes, nmax] : {std::tuple{GgmlType::Q4_K, size_t(144), 15},
                                          std::tuple{GgmlType::Q5_K, size_t(176), 31}}) {
    const std::vector<uint8_t> blocks = encode(type, x);
    const std::vector<double> y = decode(type, blocks, 512);
    for (size_t at = 0; at < blocks.size(); at += bytes) {
      EXPECT_EQ(get16(&blocks[at + 2]), 0) << ggml_type_name(type);
      const double d = half_of(&blocks[at]);
      for (int j = 0; j < 8; ++j) {
        EXPECT_EQ(min6(&blocks[at + 4], j), 0) << ggml_type_name(type) << " sub-block " << j;
        const size_t first = at / bytes * 256 + 32 * size_t(j);
        EXPECT_EQ(y[first], d * scale6(&blocks[at + 4], j) * nmax) << ggml_type_name(type) << " sub-block " << j;
        // 6-bit scale against the largest (63): at most half a step of the largest off, plus f16 rounding of d.
        EXPECT_LE(std::fabs(y[first] - x[first]), (0.5 + 63 * kF16Unit) * d * nmax * 1.0001) << first;
      }
    }
  }
}

TEST(ggml_quants, QuantizeQ6_KQuantsAreTheNearestLevelsAndTheLargestScaleIsMinus128) {
  int row_index = 0;
  for (const std::vector<float>& x : sample_rows(256 * 6, 4)) {
    const std::vector<uint8_t> blocks = encode(GgmlType::Q6_K, x);
    const std::vector<double> y = decode(GgmlType::Q6_K, blocks, int64_t(x.size()));
    std::vector<KGrid> grids;
    for (size_t at = 0; at < blocks.size(); at += 210) {
      const double d = half_of(&blocks[at + 208]);
      int smallest = 0;
      for (int s = 0; s < 16; ++s) {
        const int scale = int8_t(blocks[at + 192 + s]);
        smallest = std::min(smallest, scale);
        grids.push_back({d * scale, 32 * d * scale, 64});  // x ~ d sc (q - 32)
      }
      // The sub-block of largest |scale| maps to -128 (d = its scale / -128): the one int8 end used in full.
      EXPECT_EQ(smallest, -128) << "row " << row_index << " block " << at / 210;
    }
    expect_nearest_levels(x, y, 16, grids, "Q6_K row " + std::to_string(row_index++));
  }
}

// Values the k-quant formulas hold exactly: Q6_K with integers in [-32, 31] and -32 in every 16 (the first grid,
// scale 1, explains them perfectly; d = -1/128, scale -128).
TEST(ggml_quants, QuantizeQ6_KIntegersRoundTripExactly) {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = float(i % 16 == 3 ? -32 : (7 * i) % 64 - 32);
  const std::vector<double> y = decode(GgmlType::Q6_K, encode(GgmlType::Q6_K, x), 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

TEST(ggml_quants, QuantizeZerosDecodeToZerosAndAllZeroQ6_KBlocksAreZeroBytes) {
  const std::vector<float> zeros(512, 0.f);
  for (GgmlType type : kQuantTypes) {
    const std::vector<double> y = decode(type, encode(type, zeros), 512);
    for (double v : y) ASSERT_EQ(v, 0.0) << ggml_type_name(type);
  }
  for (uint8_t byte : encode(GgmlType::Q6_K, zeros)) ASSERT_EQ(byte, 0);
}

// Plain types: round to nearest, so |x - x_hat| <= u |x| (f16 normal range: u = 2^-11, subnormal: 2^-25 absolute;
// bf16: 2^-8), and float32 exactly.
TEST(ggml_quants, QuantizePlainTypesRoundToNearest) {
  for (const std::vector<float>& x : sample_rows(256, 6)) {
    const auto n = int64_t(x.size());
    const std::vector<double> h = decode(GgmlType::F16, encode(GgmlType::F16, x), n);
    const std::vector<double> b = decode(GgmlType::BF16, encode(GgmlType::BF16, x), n);
    const std::vector<double> f = decode(GgmlType::F32, encode(GgmlType::F32, x), n);
    for (int64_t i = 0; i < n; ++i) {
      const double v = x[size_t(i)];
      if (std::fabs(v) < 65504) {
        ASSERT_LE(std::fabs(v - h[i]), std::max(kF16Unit * std::fabs(v), 0x1p-25)) << i;
      }
      ASSERT_LE(std::fabs(v - b[i]), kBF16Unit * std::fabs(v)) << i;
      ASSERT_EQ(f[i], v) << i;
    }
  }
  // Past f16's largest half: infinity, as the hardware conversion (and llama.cpp) give.
  EXPECT_EQ(decode(GgmlType::F16, encode(GgmlType::F16, {70000.f}), 1)[0], INFINITY);
}

// Large finite values are taken, as llama.cpp takes them: a scale past f16's largest half (65504) is stored as
// infinity (Q8_0: d = amax / 127 with amax = 1e7), and the k-quant searches, whose sums overflow float32 at 1e30, still
// write whole blocks (what those hold is llama.cpp's business: tests/gguf_oracle compares them byte for byte).
TEST(ggml_quants, QuantizeLargeFiniteValuesAreTaken) {
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -1e7f : 1e7f) * float(1 + i % 5);
  const std::vector<uint8_t> q8 = encode(GgmlType::Q8_0, x);
  for (size_t at = 0; at < q8.size(); at += 34) EXPECT_EQ(get16(&q8[at]), 0x7C00) << at;
  for (float& v : x) v *= 1e23f;
  for (GgmlType type : kQuantTypes) {
    std::vector<uint8_t> blocks(static_cast<size_t>(ggml_row_bytes(type, 512)), 0xA5);
    EXPECT_NO_THROW(ggml_quantize(type, x.data(), 512, blocks.data())) << ggml_type_name(type);
  }
}

// ---- Blocks, lengths, refusals -------------------------------------------------------------------------------

TEST(ggml_quants, QuantizeBlocksDependOnlyOnTheirOwnValues) {
  const std::vector<float> x = sample_rows(256 * 3, 7)[1];
  for (GgmlType type : kQuantTypes) {
    const GgmlTypeInfo& info = *ggml_type_info(uint32_t(type));
    const std::vector<uint8_t> whole = encode(type, x);
    for (size_t b = 0; b < x.size() / size_t(info.block_size); ++b) {
      const std::vector<float> one(x.begin() + int64_t(b) * info.block_size,
                                   x.begin() + int64_t(b + 1) * info.block_size);
      const std::vector<uint8_t> alone = encode(type, one);
      ASSERT_TRUE(std::equal(alone.begin(), alone.end(), whole.begin() + int64_t(b) * info.type_size))
          << ggml_type_name(type) << " block " << b;
    }
  }
}

TEST(ggml_quants, RowBytesFromTheLayouts) {
  // Field by field (ggml-common.h): d [+ dmin] + scales + quants.
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q8_0, 96), 3 * (2 + 32));
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_0, 64), 2 * (2 + 32 / 2));
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_1, 64), 2 * (2 + 2 + 32 / 2));
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q5_0, 96), 3 * (2 + 4 + 32 / 2));
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q5_1, 32), 2 + 2 + 4 + 32 / 2);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_K, 512), 2 * (2 + 2 + 12 + 256 / 2));
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q5_K, 256), 2 + 2 + 12 + 256 / 8 + 256 / 2);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q6_K, 768), 3 * (256 / 2 + 256 / 4 + 256 / 16 + 2));
  EXPECT_EQ(ggml_row_bytes(GgmlType::BF16, 3), 6);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_K, 0), 0);
}

TEST(ggml_quants, LengthsNotWholeBlocksAreRefusedNamingNAndTheBlockSize) {
  std::vector<float> x(600, 1.f);
  std::vector<uint8_t> out(1024);
  std::vector<double> values(600);
  for (const auto& [type, n, block] : {std::tuple{GgmlType::Q4_0, 33, "32"}, std::tuple{GgmlType::Q8_0, 31, "32"},
                                       std::tuple{GgmlType::Q4_1, 48, "32"}, std::tuple{GgmlType::Q5_0, 1, "32"},
                                       std::tuple{GgmlType::Q5_1, 65, "32"},
                                       std::tuple{GgmlType::Q4_K, 255, "256"}, std::tuple{GgmlType::Q5_K, 257, "256"},
                                       std::tuple{GgmlType::Q6_K, 100, "256"}, std::tuple{GgmlType::F16, -1, "1"}}) {
    const std::string name = ggml_type_name(type);
    const std::string field = "n = " + std::to_string(n);
    expect_error([&] { ggml_quantize(type, x.data(), n, out.data()); }, {field, name + "'s block size " + block});
    expect_error([&] { ggml_dequantize_reference(type, out.data(), n, values.data()); }, {field, block});
    expect_error([&] { ggml_row_bytes(type, n); }, {field, block});
  }
}

TEST(ggml_quants, OtherTypesAreRefusedNamingTheTypeAndTheList) {
  std::vector<float> x(256, 1.f);
  std::vector<uint8_t> out(1024);
  std::vector<double> values(256);
  for (GgmlType type : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q8_K, GgmlType::I8, GgmlType::I32,
                        GgmlType(16) /* IQ2_XXS */}) {
    const std::string field = "type = " + ggml_type_name(type);
    expect_error([&] { ggml_quantize(type, x.data(), 256, out.data()); }, {field, ggml_quants_types()});
    expect_error([&] { ggml_dequantize_reference(type, out.data(), 0, values.data()); }, {field, ggml_quants_types()});
  }
  expect_error([&] { ggml_row_bytes(GgmlType(16), 256); }, {"type = type 16", "Q4_K (12)"});
}

TEST(ggml_quants, QuantizeNonFiniteInputIsRefusedNamingTheElementAndNothingIsWritten) {
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                        GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
    for (const auto& [at, bad, text] : {std::tuple{17, std::numeric_limits<float>::quiet_NaN(), "nan"},
                                        std::tuple{300, -INFINITY, "-inf"}, std::tuple{511, INFINITY, "inf"}}) {
      std::vector<float> x(512, 0.5f);
      x[at] = bad;
      std::vector<uint8_t> out(static_cast<size_t>(ggml_row_bytes(type, 512)), 0x5A);
      expect_error([&] { ggml_quantize(type, x.data(), 512, out.data()); },
                   {"x[" + std::to_string(at) + "] = " + text, "finite", ggml_type_name(type)});
      EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0x5A; })) << ggml_type_name(type);
    }
  }
}

TEST(ggml_quants, ZeroLengthReadsAndWritesNothing) {
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16}) {
    ggml_quantize(type, nullptr, 0, nullptr);
    ggml_dequantize_reference(type, nullptr, 0, nullptr);
    EXPECT_EQ(ggml_row_bytes(type, 0), 0) << ggml_type_name(type);
  }
}

}  // namespace
}  // namespace rotary
