// rotary/angles.h: fast fp32 cos/sin of rotation angles against the float64 libm values, on every compiled
// SIMD target; large positions; fractional positions; bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "expect.h"
#include "harness.h"
#include "rotary/angles.h"
#include "rotary/error.h"
#include "simd_targets.h"

namespace rotary {
namespace {

using test::dtype_eps;
using test::expect_error_naming;
using test::for_each_target;

// inv_freq[i] = base^(-2i/r), written out here rather than taken from RopeSpec (an independent computation).
std::vector<double> default_inv_freq(int pairs, double base = 10000.0) {
  std::vector<double> inv(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) inv[size_t(i)] = std::pow(base, -2.0 * i / (2.0 * pairs));
  return inv;
}

// Tolerance of an fp32 cos/sin against the float64 value, per unit of |scale|:
//   one rounding to fp32 (u32 = 2^-24) of a float64 value that is itself off by a few u64 (the reduced angle
//   rounded twice ~2 u64, the polynomial ~2 u64, the quadrant fix-up exact, the scale multiply 1 u64); we
//   allow 16 u64.
const double kU32 = dtype_eps(DType::F32);
const double kU64 = dtype_eps(DType::F64);
const double kTol = kU32 + 16 * kU64;

// Largest |fast - float64| / |scale| over the row.
double row_error(const std::vector<double>& inv, int64_t pos, double scale) {
  const int n = int(inv.size());
  std::vector<float> c(static_cast<size_t>(n)), s(static_cast<size_t>(n));
  std::vector<double> c64(static_cast<size_t>(n)), s64(static_cast<size_t>(n));
  rope_cos_sin(inv.data(), n, pos, scale, c.data(), s.data());
  rope_cos_sin_f64(inv.data(), n, pos, scale, c64.data(), s64.data());
  double err = 0;
  for (size_t i = 0; i < size_t(n); ++i) {
    err = std::max(err, std::fabs(double(c[i]) - c64[i]));
    err = std::max(err, std::fabs(double(s[i]) - s64[i]));
  }
  return err / std::fabs(scale);
}

std::vector<int64_t> test_positions() {
  const int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> pos = {0, 1, -1, 2, 7, 4095, 4096, 131071, 1000000, -1000000, (1 << 24) - 1, 1 << 24,
                              (1 << 24) + 1,
                              // around the end of the Cody-Waite range (|angle| = 2e8 with inv_freq[0] = 1)
                              199999999, 200000000, 200000001, -200000001, 400000001, int64_t(1) << 31, int64_t(1) << 40,
                              (int64_t(1) << 53) + 1, kMax, kMin};
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> u(0, int64_t(1) << 24);
  for (int i = 0; i < 64; ++i) pos.push_back(u(rng));
  return pos;
}

TEST(angles, Fp32MatchesFloat64OnEveryTargetAndPosition) {
  for_each_target([&] {
    // 1 and 3 pairs: tails only; 64: whole vectors; 67: vectors plus a tail.
    for (int pairs : {1, 3, 64, 67}) {
      const auto inv = default_inv_freq(pairs);
      for (double scale : {1.0, 0.6931, 1.2}) {
        double worst = 0;
        for (int64_t pos : test_positions()) {
          const double err = row_error(inv, pos, scale);
          ASSERT_LE(err, kTol) << "pairs=" << pairs << " pos=" << pos << " scale=" << scale;
          worst = std::max(worst, err);
        }
        // The rounding to fp32 alone reaches ~u32, so a much smaller maximum would mean the test is not seeing
        // fp32 output at all.
        EXPECT_GT(worst, 0.25 * kU32) << "pairs=" << pairs;
      }
    }
  });
}

TEST(angles, PositionOneMillionIsAccurateWhereFp32ProductIsNot) {
  const auto inv = default_inv_freq(64);
  const int64_t pos = 1000000;
  EXPECT_LE(row_error(inv, pos, 1.0), kTol);  // ~6e-8: "1e-6 relative" with margin

  // The naive kernel: fp32 angle = float(pos) * float(inv_freq). Its angle is off by up to ulp(1e6)/2 = 0.03 rad,
  // so the same bound fails - the check above can tell the two apart.
  std::vector<double> c64(64), s64(64);
  rope_cos_sin_f64(inv.data(), 64, pos, 1.0, c64.data(), s64.data());
  double naive_err = 0;
  for (size_t i = 0; i < 64; ++i) {
    const float angle = float(pos) * float(inv[i]);
    naive_err = std::max(naive_err, std::fabs(double(std::cos(angle)) - c64[i]));
    naive_err = std::max(naive_err, std::fabs(double(std::sin(angle)) - s64[i]));
  }
  EXPECT_GT(naive_err, 1000 * kTol);
}

TEST(angles, FractionalPositions) {
  const auto inv = default_inv_freq(67);
  for_each_target([&] {
    for (double pos : {0.0, 0.5, -3.25, 12345.678, 1048576.125, 1.9e8, 7.5e8, -2.0e12}) {
      std::vector<float> c(67), s(67);
      rope_cos_sin_at(inv.data(), 67, pos, 0.8, c.data(), s.data());
      for (size_t i = 0; i < 67; ++i) {
        const double a = pos * inv[i];
        ASSERT_LE(std::fabs(c[i] - 0.8 * std::cos(a)), 0.8 * kTol) << "pos=" << pos << " i=" << i;
        ASSERT_LE(std::fabs(s[i] - 0.8 * std::sin(a)), 0.8 * kTol) << "pos=" << pos << " i=" << i;
      }
    }
  });
  // An integer position given as a double takes the same path as rope_cos_sin: identical bits.
  std::vector<float> c1(67), s1(67), c2(67), s2(67);
  rope_cos_sin(inv.data(), 67, 777777, 1.0, c1.data(), s1.data());
  rope_cos_sin_at(inv.data(), 67, 777777.0, 1.0, c2.data(), s2.data());
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(s1, s2);
}

TEST(angles, ZeroCountWritesNothing) {
  EXPECT_NO_THROW(rope_cos_sin(nullptr, 0, 5, 1.0, nullptr, nullptr));
  EXPECT_NO_THROW(rope_cos_sin_at(nullptr, 0, 5.0, 1.0, nullptr, nullptr));
}

TEST(angles, BadInputThrowsNamingTheField) {
  const auto inv = default_inv_freq(4);
  float c[4], s[4];
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  expect_error_naming([&] { rope_cos_sin(inv.data(), -1, 0, 1.0, c, s); }, "n");
  expect_error_naming([&] { rope_cos_sin(nullptr, 4, 0, 1.0, c, s); }, "inv_freq");
  expect_error_naming([&] { rope_cos_sin(inv.data(), 4, 0, 1.0, nullptr, s); }, "cos");
  expect_error_naming([&] { rope_cos_sin(inv.data(), 4, 0, 1.0, c, nullptr); }, "sin");
  expect_error_naming([&] { rope_cos_sin(inv.data(), 4, 0, nan, c, s); }, "scale");
  expect_error_naming([&] { rope_cos_sin_at(inv.data(), 4, nan, 1.0, c, s); }, "pos");
  expect_error_naming([&] { rope_cos_sin_at(inv.data(), 4, inf, 1.0, c, s); }, "pos");
}

}  // namespace
}  // namespace rotary
