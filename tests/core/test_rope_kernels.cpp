// rope_apply beyond the kernel-vs-reference sweep (that is the "rope" op's case list, cases_rope.cpp, run on
// every SIMD target by core_test_ops): the threads field, exact storage rounding on every target, properties
// (relative positions, inverse, adjoint, layouts), the accuracy the naive fp32-angle kernel lacks, the Params
// convention and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cases_rope.h"
#include "expect.h"
#include "rotary/error.h"
#include "rotary/rope.h"
#include "simd_targets.h"

namespace rotary {
namespace {

using test::dtype_eps;
using test::GuardedBuffer;

const double kSqrt2 = std::sqrt(2.0);

// The RopeElement bound of the harness (tolerance(), op_harness.cpp): |fast - exact| of one rotated element of
// storage `dtype`, scale s (attention factor) and inputs |x| <= X.
double element_tol(DType dtype, double s, double X) {
  return test::tolerance(test::Quantity::RopeElement, {.dtype = dtype, .scale = s * X}).bound;
}

RopeFreqs make_freqs(int D, int r, RopeLayout layout, double attention_factor = 1.0) {
  return test::rope_test_freqs(D, r, layout, attention_factor);
}

// RopeParams::threads caps the OpenMP threads: one thread gives bitwise the result of two; a count outside
// 0..kMaxThreads is refused naming the field.
void expect_error_naming(const RopeFreqs& f, const RopeParams& p, const std::string& field);  // below
TEST(rope_kernels, ThreadsFieldIsHonouredAndChecked) {
  const int D = 128, H = 4;
  const int64_t T = 300;
  const RopeFreqs f = make_freqs(D, D, RopeLayout::HalfSplit);
  GuardedBuffer x(DType::F32, T * H * D), y1(DType::F32, T * H * D), y2(DType::F32, T * H * D);
  test::fill_uniform(x, 3);
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = 7 * t;
  RopeParams p;
  p.tokens = T;
  p.positions = pos.data();
  p.q_in = {x.data(), H, H * D, D};
  for (auto [threads, out] : {std::pair{1, &y1}, std::pair{2, &y2}}) {
    p.threads = threads;
    p.q_out = {out->data(), H, H * D, D};
    rope_apply(f, p);
  }
  EXPECT_EQ(y1.to_double(), y2.to_double());
  p.threads = -2;
  expect_error_naming(f, p, "threads");
}

// The tolerance above allows any rounding to storage (truncation stays within one ulp), so the rounding mode is
// checked exactly: at position 0 the rotation is y = fl32(x * a), and with a = 1 + 2^-8 (bf16) or 1 + 2^-11 (f16)
// the fp32 product is exact and often lands on or near a halfway point of the storage type (exact ties at powers
// of two). Every finite 16-bit pattern is an input; the output must equal rotary's round-to-nearest-even.
TEST(rope_kernels, StorageRoundingIsNearestEvenOnEveryTarget) {
  for (DType dtype : {DType::BF16, DType::F16}) {
    const double a = dtype == DType::BF16 ? 1.0 + std::ldexp(1.0, -8) : 1.0 + std::ldexp(1.0, -11);
    for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
      const RopeFreqs f = make_freqs(128, 128, layout, a);
      std::vector<uint16_t> x(65536);
      std::vector<float> expected(65536);
      for (uint32_t b = 0; b < 65536; ++b) {
        const float v = dtype == DType::BF16 ? bf16_to_float(uint16_t(b)) : f16_to_float(uint16_t(b));
        x[b] = std::isfinite(v) ? uint16_t(b) : 0;
        const float y = (std::isfinite(v) ? v : 0.0f) * float(a);  // exact in fp32
        expected[b] = dtype == DType::BF16 ? bf16_to_float(float_to_bf16(y)) : f16_to_float(float_to_f16(y));
      }
      for (int64_t target : detail::simd_targets()) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " " << detail::simd_target_name(target));
        detail::force_simd_target(target);
        std::vector<uint16_t> y = x;
        const int64_t pos = 0;
        RopeParams p;
        p.tokens = 1;
        p.positions = &pos;
        p.dtype = dtype;
        p.q_in = {y.data(), 512, 512 * 128, 128};
        p.q_out = p.q_in;
        rope_apply(f, p);
        for (size_t i = 0; i < y.size(); ++i) {
          const float got = dtype == DType::BF16 ? bf16_to_float(y[i]) : f16_to_float(y[i]);
          ASSERT_EQ(got, expected[i]) << "input bits 0x" << std::hex << x[i];  // == : -0 and +0 both fine
        }
      }
      detail::force_simd_target(0);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Properties of the fast kernel (f32 storage, best target).

// Rotates a [tokens, heads, D] packed f32 array in place with the fast kernel.
void rotate_f32(const RopeFreqs& f, std::vector<float>& x, int64_t heads, const std::vector<int64_t>& pos,
                RopeDirection dir = RopeDirection::Forward) {
  RopeParams p;
  p.tokens = int64_t(pos.size());
  p.positions = pos.data();
  p.dtype = DType::F32;
  p.direction = dir;
  p.q_in = {x.data(), heads, heads * f.head_dim, f.head_dim};
  p.q_out = p.q_in;
  rope_apply(f, p);
}

std::vector<float> random_f32(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

double dot(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// The naive kernel: fp32 angle = float(pos) * float(inv_freq), fp32 cos/sin, half-split, one head.
void rotate_naive_fp32(const RopeFreqs& f, float* x, int64_t pos) {
  const int h = f.rotary_dim / 2;
  for (int i = 0; i < h; ++i) {
    const float angle = float(pos) * float(f.inv_freq[size_t(i)]);
    const float c = std::cos(angle), s = std::sin(angle), x1 = x[i], x2 = x[i + h];
    x[i] = x1 * c - x2 * s;
    x[i + h] = x1 * s + x2 * c;
  }
}

TEST(rope_kernels, ScoreDependsOnlyOnRelativePosition) {
  // <R(m) q, R(n) k> = <q, R(n - m) k>: shifting both positions by 999000 leaves the score unchanged.
  const int D = 128;
  const RopeFreqs f = make_freqs(D, D, RopeLayout::HalfSplit);
  const auto q = random_f32(D, 1), k = random_f32(D, 2);
  // Each rotated element is within e = element_tol (|x| <= 1) of exact and is <= sqrt2 in size, so one score is
  // within 2 D sqrt2 e of exact and two scores differ by at most 4 D sqrt2 e.
  const double tol = 4 * D * kSqrt2 * element_tol(DType::F32, 1.0, 1.0);
  double naive_worst = 0;
  for (int64_t m : {0, 17, 4000}) {
    for (int64_t n : {0, 5, 3000}) {
      auto score = [&](int64_t shift, bool naive) {
        std::vector<float> qr = q, kr = k;
        if (naive) {
          rotate_naive_fp32(f, qr.data(), m + shift);
          rotate_naive_fp32(f, kr.data(), n + shift);
        } else {
          rotate_f32(f, qr, 1, {m + shift});
          rotate_f32(f, kr, 1, {n + shift});
        }
        return dot(qr.data(), kr.data(), D);
      };
      EXPECT_NEAR(score(999000, false), score(0, false), tol) << "m=" << m << " n=" << n;
      naive_worst = std::max(naive_worst, std::fabs(score(999000, true) - score(0, true)));
    }
  }
  // The same check on a kernel that forms the angle in fp32 fails: the bound can tell.
  EXPECT_GT(naive_worst, tol);
}

TEST(rope_kernels, InverseUndoesForward) {
  const int D = 96;
  for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
    for (double a : {1.0, 1.3}) {
      const RopeFreqs f = make_freqs(D, 70, layout, a);
      const std::vector<int64_t> pos = {0, 1, 123456, 999999, int64_t(1) << 24};
      const auto x = random_f32(pos.size() * 3 * D, 3);
      auto y = x;
      rotate_f32(f, y, 3, pos, RopeDirection::Forward);
      rotate_f32(f, y, 3, pos, RopeDirection::Inverse);
      // Forward: y = a R x + d1 with |d1| <= e1 = element_tol(a, 1) = a element_tol(1, 1). Inverse maps d1 to
      // R^-1 d1 / a, each element <= sqrt2 e1 / a, and adds its own error <= element_tol(1/a, |y| <= sqrt2 a)
      // = sqrt2 element_tol(1, 1) (element_tol is linear in s X). In total <= 2 sqrt2 element_tol(1, 1).
      const double tol = 2 * kSqrt2 * element_tol(DType::F32, 1.0, 1.0);
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::fabs(y[i] - x[i])));
      EXPECT_LE(worst, tol) << "a=" << a;
      EXPECT_GT(worst, 0.0);  // a real round trip through fp32, not a no-op
    }
  }
}

TEST(rope_kernels, TransposeIsTheAdjoint) {
  // <a R x, y> = <x, (a R)^T y> for any x, y; with a != 1, Transpose = a^2 Inverse.
  const int D = 64;
  const double a = 1.25;
  for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
    const RopeFreqs f = make_freqs(D, 48, layout, a);
    const std::vector<int64_t> pos = {3, 500000};
    const auto x = random_f32(pos.size() * D, 4), y = random_f32(pos.size() * D, 5);
    auto rx = x, rty = y, inv_y = y;
    rotate_f32(f, rx, 1, pos, RopeDirection::Forward);
    rotate_f32(f, rty, 1, pos, RopeDirection::Transpose);
    rotate_f32(f, inv_y, 1, pos, RopeDirection::Inverse);
    const double tol_elem = element_tol(DType::F32, a, 1.0);
    for (size_t t = 0; t < pos.size(); ++t) {
      const double lhs = dot(rx.data() + t * D, y.data() + t * D, D);
      const double rhs = dot(x.data() + t * D, rty.data() + t * D, D);
      // Each side: D products of an element within tol_elem times |y| <= 1.
      EXPECT_NEAR(lhs, rhs, 2 * D * tol_elem);
    }
    for (size_t i = 0; i < y.size(); ++i) {
      if (int(i % D) < f.rotary_dim) {  // pass-through features are not scaled by a
        ASSERT_NEAR(rty[i], a * a * inv_y[i], 2 * a * a * element_tol(DType::F32, 1.0 / a, 1.0) + tol_elem);
      }
    }
  }
}

TEST(rope_kernels, LayoutsAgreeUpToThePairPermutation) {
  // Interleaved pair i is features (2i, 2i+1); half-split pair i is (i, i + r/2). Permuting the features of the
  // input one way and the output back must give the same result.
  const int D = 96, r = 70, h = r / 2;
  const std::vector<int64_t> pos = {0, 7, 654321};
  const auto x_il = random_f32(pos.size() * 2 * D, 6);
  std::vector<float> x_hs = x_il;
  for (size_t row = 0; row < pos.size() * 2; ++row)
    for (int i = 0; i < h; ++i) {
      x_hs[row * D + i] = x_il[row * D + 2 * i];
      x_hs[row * D + h + i] = x_il[row * D + 2 * i + 1];
    }
  auto y_il = x_il, y_hs = x_hs;
  rotate_f32(make_freqs(D, r, RopeLayout::Interleaved), y_il, 2, pos);
  rotate_f32(make_freqs(D, r, RopeLayout::HalfSplit), y_hs, 2, pos);
  const double tol = 2 * element_tol(DType::F32, 1.0, 1.0);  // each within element_tol of the same exact value
  for (size_t row = 0; row < pos.size() * 2; ++row) {
    for (int i = 0; i < h; ++i) {
      ASSERT_NEAR(y_il[row * D + 2 * i], y_hs[row * D + i], tol);
      ASSERT_NEAR(y_il[row * D + 2 * i + 1], y_hs[row * D + h + i], tol);
    }
    for (int d = r; d < D; ++d) ASSERT_EQ(y_il[row * D + d], x_il[row * D + d]);
  }
}

// One head rotated by the fast kernel and by the reference at the given positions; returns max |diff|.
double fast_vs_reference_f32(const RopeFreqs& f, const std::vector<int64_t>& pos, uint64_t seed) {
  const int D = f.head_dim;
  const auto x = random_f32(pos.size() * D, seed);
  auto fast = x, ref = x;
  rotate_f32(f, fast, 1, pos);
  RopeParams p;
  p.tokens = int64_t(pos.size());
  p.positions = pos.data();
  p.q_in = {ref.data(), 1, D, D};
  p.q_out = p.q_in;
  rope_apply_reference(f, p);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::fabs(fast[i] - ref[i])));
  return worst;
}

TEST(rope_kernels, PositionOneMillionIsAccurate) {
  const RopeFreqs f = make_freqs(128, 128, RopeLayout::HalfSplit);
  const double tol = element_tol(DType::F32, 1.0, 1.0);
  EXPECT_LE(fast_vs_reference_f32(f, {1000000}, 7), tol);

  // The naive fp32-angle kernel misses the same bound at this position (the test can fail).
  const auto x = random_f32(128, 7);
  auto naive = x, ref = x;
  rotate_naive_fp32(f, naive.data(), 1000000);
  const int64_t pos = 1000000;
  RopeParams p;
  p.tokens = 1;
  p.positions = &pos;
  p.q_in = {ref.data(), 1, 128, 128};
  p.q_out = p.q_in;
  rope_apply_reference(f, p);
  double naive_err = 0;
  for (size_t i = 0; i < x.size(); ++i) naive_err = std::max(naive_err, double(std::fabs(naive[i] - ref[i])));
  EXPECT_GT(naive_err, 100 * tol);
}

// The Params convention (rope.h): the frequencies travel in RopeParams::freqs, required even for zero tokens; the
// earlier rope_apply(freqs, params) form gives bitwise the same result, its argument taking the place of p.freqs.
TEST(rope_kernels, FreqsInParamsAndTheEarlierFormAgree) {
  const int D = 64, H = 2;
  const int64_t T = 5;
  const RopeFreqs f = make_freqs(D, 48, RopeLayout::Interleaved, 1.25);
  const RopeFreqs other = make_freqs(D, D, RopeLayout::HalfSplit);
  GuardedBuffer x(DType::F32, T * H * D), y_new(DType::F32, T * H * D), y_old(DType::F32, T * H * D),
      y_ref_new(DType::F32, T * H * D), y_ref_old(DType::F32, T * H * D);
  test::fill_uniform(x, 11);
  const std::vector<int64_t> pos = {0, 3, 70, 1000, 123456};
  RopeParams p;
  p.tokens = T;
  p.positions = pos.data();
  p.q_in = {x.data(), H, H * D, D};
  auto out = [&](GuardedBuffer& b) {
    RopeParams q = p;
    q.q_out = {b.data(), H, H * D, D};
    return q;
  };
  RopeParams with = out(y_new);
  with.freqs = &f;
  rope_apply(with);
  rope_apply(f, out(y_old));  // p.freqs null here
  EXPECT_EQ(y_new.to_double(), y_old.to_double());
  RopeParams ref = out(y_ref_new);
  ref.freqs = &f;
  rope_apply_reference(ref);
  RopeParams ref_old = out(y_ref_old);
  ref_old.freqs = &other;  // replaced by the argument
  rope_apply_reference(f, ref_old);
  EXPECT_EQ(y_ref_new.to_double(), y_ref_old.to_double());
  EXPECT_NE(y_new.to_double(), x.to_double());  // it did rotate
  EXPECT_NO_THROW(validate_rope_params(with));
  EXPECT_NO_THROW(validate_rope_params(f, out(y_old)));

  RopeParams none;  // tokens = 0, freqs null
  for (const RopeParams& bad : {none, out(y_new)}) {
    for (int reference = 0; reference < 2; ++reference) {
      try {
        reference ? rope_apply_reference(bad) : rope_apply(bad);
        ADD_FAILURE() << "no rotary::Error for a null freqs";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("freqs = null"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(rope_kernels, ZeroTokensIsANoOp) {
  const RopeFreqs f = make_freqs(64, 64, RopeLayout::HalfSplit);
  RopeParams p;  // tokens = 0, every pointer null
  EXPECT_NO_THROW(rope_apply(f, p));
  GuardedBuffer b(DType::F32, 64);
  test::fill_uniform(b, 9);
  const auto before = b.to_double();
  p.q_in = {b.data(), 1, 64, 64};
  p.q_out = p.q_in;
  EXPECT_NO_THROW(rope_apply(f, p));
  EXPECT_EQ(b.to_double(), before);
  EXPECT_TRUE(b.guards_intact());
}

void expect_error_naming(const RopeFreqs& f, const RopeParams& p, const std::string& field) {
  test::expect_error_naming([&] { rope_apply(f, p); }, field);
}

TEST(rope_kernels, BadInputThrowsNamingTheField) {
  const RopeFreqs f = make_freqs(64, 64, RopeLayout::HalfSplit);
  std::vector<float> q(4 * 2 * 64), k(4 * 4 * 64);
  const std::vector<int64_t> pos = {0, 1, 2, 3};
  RopeParams good;
  good.tokens = 4;
  good.positions = pos.data();
  good.q_in = {q.data(), 2, 2 * 64, 64};
  good.q_out = good.q_in;
  good.k_in = {k.data(), 2, 2 * 64, 64};
  good.k_out = good.k_in;
  EXPECT_NO_THROW(rope_apply(f, good));

  auto with = [&](const std::function<void(RopeParams&)>& change) {
    RopeParams p = good;
    change(p);
    return p;
  };
  expect_error_naming(f, with([](RopeParams& p) { p.q_in.data = nullptr; }), "q_in.data");
  expect_error_naming(f, with([](RopeParams& p) { p.q_out.data = nullptr; }), "q_out.data");
  expect_error_naming(f, with([](RopeParams& p) { p.q_in.heads = p.q_out.heads = 0; }), "q_in.heads");
  expect_error_naming(f, with([](RopeParams& p) { p.q_in.head_stride = 32; }), "q_in.head_stride");
  expect_error_naming(f, with([](RopeParams& p) { p.q_out.token_stride = 100; }), "q_out.token_stride");
  expect_error_naming(f, with([](RopeParams& p) {
                        p.k_in.heads = p.k_out.heads = 3;
                        p.k_in.token_stride = p.k_out.token_stride = 3 * 64;
                      }), "k_in.heads");
  expect_error_naming(f, with([](RopeParams& p) { p.k_out.heads = 1; }), "k_out.heads");
  expect_error_naming(f, with([](RopeParams& p) { p.positions = nullptr; }), "positions");
  expect_error_naming(f, with([](RopeParams& p) { p.tokens = -1; }), "tokens");
  RopeFreqs odd = f;
  odd.rotary_dim = 63;
  expect_error_naming(odd, good, "freqs.rotary_dim");
  RopeFreqs nan_factor = f;
  nan_factor.attention_factor = std::nan("");
  expect_error_naming(nan_factor, good, "freqs.attention_factor");
}

}  // namespace
}  // namespace rotary
