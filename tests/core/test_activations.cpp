// swiglu_forward (rotary/activations.h) against its float64 reference at every SIMD target: odd lengths (every tail),
// the whole range of gates (exponentials that would overflow, under- and overflow of the result), special values in
// both inputs, lengths past one OpenMP block, guard zones around the output, and the refusals.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "expect.h"
#include "expect_error.h"
#include "rotary/activations.h"
#include "rotary/error.h"
#include "simd_targets.h"

namespace rotary {
namespace {

constexpr float kGuard = 12345.0f;
constexpr int64_t kGuardLen = 16;

// The fast path within a few float ulps of the float64 formula: e^-|g| (~1 ulp), 1 + e and the division (1 each),
// two products (1 each) - 2^-20 of |want| covers them with room. The result's own floor: where e^-|g| leaves
// float's normal range (|g| > ~87) the kernel flushes it to 0 while the reference keeps a denormal-sized
// silu(g) ~ g e^g (< 1e-36 |g|): a quantity that is 0 to float precision gets |up| (1 + |g|) 1e-30.
void expect_close(const std::vector<float>& gate, const std::vector<float>& up0, const std::vector<float>& want,
                  const float* got, const std::string& where) {
  for (size_t i = 0; i < gate.size(); ++i) {
    const float w = want[i], g = got[i];
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << where << " i " << i << " gate " << gate[i] << " up " << up0[i] << ": " << g;
      continue;
    }
    // e^g below 2^-125 (g < -86.6) is 0 in the kernel (the softmax's exponential), so silu(g) is 0 there and an
    // infinite up gives NaN where the double formula's silu of ~1e-36 gives -inf: neither is a usable number.
    if (std::isinf(w) && std::isinf(up0[i]) && gate[i] < -86.0f) {
      EXPECT_TRUE(std::isnan(g) || g == w) << where << " i " << i << " gate " << gate[i] << ": " << g;
      continue;
    }
    if (std::isinf(w)) {
      EXPECT_EQ(g, w) << where << " i " << i << " gate " << gate[i] << " up " << up0[i];
      continue;
    }
    const double tol = std::ldexp(std::fabs(double(w)), -20) +
                       1e-30 * std::fabs(double(up0[i])) * (1.0 + std::fabs(double(gate[i])));
    EXPECT_NEAR(g, w, tol) << where << " i " << i << " gate " << gate[i] << " up " << up0[i];
  }
}

void check_case(const std::vector<float>& gate, const std::vector<float>& up0, int threads, const std::string& what) {
  std::vector<float> want = up0;
  swiglu_forward_reference(gate.data(), want.data(), int64_t(gate.size()));
  test::for_each_target([&] {
    std::vector<float> buf(up0.size() + 2 * kGuardLen, kGuard);
    std::copy(up0.begin(), up0.end(), buf.begin() + kGuardLen);
    swiglu_forward(gate.data(), buf.data() + kGuardLen, int64_t(gate.size()), threads);
    const std::string where = what + " at " + detail::activations_simd_target();
    expect_close(gate, up0, want, buf.data() + kGuardLen, where);
    for (int64_t i = 0; i < kGuardLen; ++i) {
      EXPECT_EQ(buf[size_t(i)], kGuard) << where << ": wrote before up";
      EXPECT_EQ(buf[buf.size() - 1 - size_t(i)], kGuard) << where << ": wrote past up";
    }
  });
}

TEST(swiglu_forward, EqualsTheFloat64FormulaAtEveryTargetAndLength) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t n : {1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 100, 257}) {
    std::vector<float> gate(static_cast<size_t>(n)), up(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) gate[size_t(i)] = normal(rng), up[size_t(i)] = normal(rng);
    check_case(gate, up, 1, "n " + std::to_string(n));
  }
}

// Gates across float's range (where e^-g overflows in the plain formula, and silu's result underflows), and NaN /
// inf in either input: the kernel gives what g / (1 + e^-g) gives.
TEST(swiglu_forward, ExtremeAndSpecialValuesFollowThePlainFormula) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> gate, up;
  for (float g : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f, 20.0f, -20.0f, 87.0f, -87.0f, 88.5f, -88.5f, 100.0f,
                  -100.0f, 1e4f, -1e4f, 3e38f, -3e38f, FLT_MIN, -FLT_MIN, 1e-42f, inf, -inf, nan}) {
    for (float u : {1.0f, -2.5f, 0.0f, 3e38f, inf, nan}) gate.push_back(g), up.push_back(u);
  }
  check_case(gate, up, 1, "special values");
  // The signs the plain formula gives: silu(+inf) = +inf, silu(-inf) = NaN, a NaN gate or up gives NaN.
  std::vector<float> g3 = {inf, -inf, nan, 1.0f}, u3 = {2.0f, 2.0f, 2.0f, nan};
  swiglu_forward(g3.data(), u3.data(), 4);
  EXPECT_EQ(u3[0], inf);
  EXPECT_TRUE(std::isnan(u3[1]) && std::isnan(u3[2]) && std::isnan(u3[3]));
}

// Past one OpenMP block (16,384 elements) the call splits over threads; every block's tail and the last short block
// are computed (and nothing else written), with one thread or several alike.
TEST(swiglu_forward, SplitsOverThreadsWithoutChangingABit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const int64_t n = 3 * 16384 + 77;
  std::vector<float> gate(static_cast<size_t>(n)), up(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) gate[size_t(i)] = normal(rng), up[size_t(i)] = normal(rng);
  check_case(gate, up, 3, "n " + std::to_string(n) + ", 3 threads");
  std::vector<float> one = up, many = up;
  swiglu_forward(gate.data(), one.data(), n, 1);
  swiglu_forward(gate.data(), many.data(), n, 4);
  EXPECT_EQ(one, many);
}

TEST(swiglu_forward, RefusesBadInputByNameBeforeWriting) {
  std::vector<float> a(8, 1.0f), b(8, 2.0f);
  test::expect_error([&] { swiglu_forward(a.data(), b.data(), -1); }, "swiglu n");
  test::expect_error([&] { swiglu_forward(a.data(), a.data() + 4, 8); }, "overlapping");
  test::expect_error([&] { swiglu_forward(nullptr, b.data(), 8); }, "swiglu gate / up");
  EXPECT_EQ(b, std::vector<float>(8, 2.0f));
  swiglu_forward(nullptr, nullptr, 0);  // nothing to do
}

}  // namespace
}  // namespace rotary
