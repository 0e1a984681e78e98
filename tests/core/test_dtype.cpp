// rotary/dtype.h's scalar conversions, over every 16-bit pattern: f16 -> f32 against the format's definition
// written out in double (sign, exponent 0 subnormal, 31 infinity / NaN), and f16 -> f32 -> f16 returning the same
// bits; bf16 -> f32 -> bf16 the same. (Rounding of f32 -> f16 / bf16 is tested through every kernel's storage.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "rotary/dtype.h"

namespace rotary {
namespace {

TEST(DType, F16ToFloatIsTheFormatsValueForEveryPattern) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t h = uint16_t(bits);
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    const int exp = (h >> 10) & 0x1f;
    const int mant = h & 0x3ff;
    const float got = f16_to_float(h);
    if (exp == 31) {
      if (mant == 0) {
        EXPECT_TRUE(std::isinf(got) && std::signbit(got) == (sign < 0)) << std::hex << bits;
      } else {
        EXPECT_TRUE(std::isnan(got)) << std::hex << bits;
      }
      continue;
    }
    const double want = sign * (exp == 0 ? std::ldexp(double(mant), -24) : std::ldexp(1.0 + mant / 1024.0, exp - 15));
    ASSERT_EQ(double(got), want) << std::hex << bits;
    ASSERT_EQ(std::signbit(got), sign < 0) << std::hex << bits;  // -0 stays -0
    ASSERT_EQ(float_to_f16(got), h) << std::hex << bits;
  }
}

TEST(DType, Bf16RoundTripsEveryNonNanPattern) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float f = bf16_to_float(uint16_t(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), uint16_t(bits)) << std::hex << bits;
  }
}

}  // namespace
}  // namespace rotary
