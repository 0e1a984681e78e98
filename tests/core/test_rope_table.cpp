// rope_table_apply (rotary/rope_table.h) against its float64 reference: every storage type, both layouts, both
// table widths, forward and transpose, in and out of place, partial rotation, odd pair counts, padded strides and
// rows picked in any order; guard zones catch stray writes. Then: tables that hold a rotation's cos / sin give
// rope_apply's result, transpose is the adjoint, and bad input names the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "harness.h"
#include "expect_error.h"
#include "rotary/rope.h"
#include "rotary/rope_table.h"

namespace rotary {
namespace {

using test::dtype_eps;
using test::GuardedBuffer;

struct Shape {
  int D, r;
  int64_t tokens, heads, head_pad, table_rows;
};

// |fast - reference| of one output element, inputs |x| <= 1 and table entries |c|, |s| <= 1: both read the same
// table values; the fast path's two products and sum in the compute type (u_c = u32, u64 for f64 storage) round at
// most three times over |x_a c| + |x_b s| <= 2 (<= 2 * 2 u_c, fused or not, plus |y| u_c <= 2 u_c), and both round
// the result once to storage (eps_s each, |y| <= 2).
double element_tol(DType dtype) {
  const double uc = dtype == DType::F64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  return 2 * (3 * uc) + 2 * 2 * dtype_eps(dtype);
}

struct Table {
  std::vector<float> cos32, sin32;
  std::vector<double> cos64, sin64;
  const void* cos(DType dt) const { return dt == DType::F64 ? (const void*)cos64.data() : cos32.data(); }
  const void* sin(DType dt) const { return dt == DType::F64 ? (const void*)sin64.data() : sin32.data(); }
};

// Random entries in [-1, 1] (not a rotation: halves differ, as a per-feature table may), rounded to float32 so the
// float32 and float64 tables hold the same values.
Table random_table(int64_t rows, int64_t stride, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Table t;
  for (int64_t i = 0; i < rows * stride; ++i) {
    t.cos32.push_back(float(u(g)));
    t.sin32.push_back(float(u(g)));
  }
  t.cos64.assign(t.cos32.begin(), t.cos32.end());
  t.sin64.assign(t.sin32.begin(), t.sin32.end());
  return t;
}

TEST(rope_table, FastEqualsReferenceAcrossDtypesLayoutsWidthsStridesAndRows) {
  const std::vector<Shape> shapes = {
      {64, 64, 37, 3, 0, 50},  {10, 6, 5, 2, 3, 7},    // partial rotation, 3 pairs (an odd count), padded heads
      {128, 96, 19, 4, 8, 19}, {2, 2, 1, 1, 0, 1},     // the smallest head
      {34, 34, 300, 2, 0, 64},                         // 17 pairs; enough tokens for two threads
  };
  int cases = 0;
  for (const Shape& s : shapes)
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16})
      for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved})
        for (TableWidth width : {TableWidth::Pairs, TableWidth::Features})
          for (bool transpose : {false, true})
            for (bool in_place : {false, true}) {
              SCOPED_TRACE(::testing::Message() << "D=" << s.D << " r=" << s.r << " T=" << s.tokens << " dtype="
                                                << dtype_name(dtype) << " layout=" << layout_name(layout)
                                                << " width=" << int(width) << " transpose=" << transpose
                                                << " in_place=" << in_place);
              const int64_t head_stride = s.D + s.head_pad, token_stride = s.heads * head_stride + 5;
              const int64_t n = s.tokens * token_stride;
              RopeTableParams p;
              p.head_dim = s.D;
              p.rotary_dim = s.r;
              p.layout = layout;
              p.width = width;
              p.row_stride = p.table_width() + 3;
              p.table_rows = s.table_rows;
              const Table table = random_table(s.table_rows, p.row_stride, 11 + cases);
              p.cos = table.cos(dtype);
              p.sin = table.sin(dtype);
              std::vector<int64_t> rows(static_cast<size_t>(s.tokens));
              for (int64_t t = 0; t < s.tokens; ++t) rows[size_t(t)] = (t * 7 + 3) % s.table_rows;  // any order
              p.tokens = s.tokens;
              p.rows = rows.data();
              p.dtype = dtype;
              p.transpose = transpose;
              GuardedBuffer x(dtype, n), fast(dtype, n), ref(dtype, n);
              test::fill_uniform(x, 5 + cases);
              if (in_place) {
                fast = x;
                ref = x;
              }
              p.x_in = {in_place ? fast.data() : x.data(), s.heads, token_stride, head_stride};
              p.x_out = {fast.data(), s.heads, token_stride, head_stride};
              rope_table_apply(p);
              p.x_in.data = in_place ? ref.data() : x.data();
              p.x_out.data = ref.data();
              rope_table_apply_reference(p);
              ASSERT_TRUE(fast.guards_intact());
              ASSERT_TRUE(ref.guards_intact());
              const std::vector<double> a = fast.to_double(), b = ref.to_double();
              double worst = 0;
              for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(a[size_t(i)] - b[size_t(i)]));
              EXPECT_LE(worst, element_tol(dtype)) << "target " << rope_simd_target();
              // Padding between heads and tokens is never written: it keeps the fresh buffer's fill (or x's, in place).
              const std::vector<double> before = (in_place ? x : GuardedBuffer(dtype, n)).to_double();
              for (int64_t t = 0; t < s.tokens; ++t)
                for (int64_t e = s.heads * head_stride - s.head_pad; e < token_stride; ++e) {
                  const size_t i = size_t(t * token_stride + e);
                  EXPECT_TRUE(a[i] == before[i] || (std::isnan(a[i]) && std::isnan(before[i])))
                      << "padding element " << i << " written";
                }
              ++cases;
            }
  EXPECT_EQ(cases, 5 * 4 * 2 * 2 * 2 * 2);
}

// Tables that hold a rotation's cos and sin (per pair, and transformers' cat(freqs, freqs) per feature) rotate as
// rope_apply does for the same positions; the transpose undoes it (the rotation by the negated angle).
TEST(rope_table, TablesOfARotationGiveRopeApplysResult) {
  const int D = 64, H = 3;
  const int64_t T = 40;
  for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved})
    for (TableWidth width : {TableWidth::Pairs, TableWidth::Features}) {
      RopeFreqs f;
      f.head_dim = D;
      f.rotary_dim = D;
      f.layout = layout;
      for (int i = 0; i < D / 2; ++i) f.inv_freq.push_back(std::pow(10000.0, -2.0 * i / D));
      const int64_t width_n = width == TableWidth::Pairs ? D / 2 : D;
      std::vector<float> c(size_t(T * width_n)), s(size_t(T * width_n));
      for (int64_t t = 0; t < T; ++t)
        for (int i = 0; i < D / 2; ++i) {
          const double angle = double(t) * f.inv_freq[size_t(i)];
          const auto [a, b] = rope_pair(layout, D, i);
          for (int e : width == TableWidth::Pairs ? std::vector<int>{i} : std::vector<int>{a, b}) {
            c[size_t(t * width_n + e)] = float(std::cos(angle));
            s[size_t(t * width_n + e)] = float(std::sin(angle));
          }
        }
      std::vector<int64_t> pos(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = t;
      GuardedBuffer x(DType::F32, T * H * D), by_table(DType::F32, T * H * D), by_freqs(DType::F32, T * H * D),
          back(DType::F32, T * H * D);
      test::fill_uniform(x, 9);
      RopeParams rp;
      rp.freqs = &f;
      rp.tokens = T;
      rp.positions = pos.data();
      rp.q_in = {x.data(), H, H * D, D};
      rp.q_out = {by_freqs.data(), H, H * D, D};
      rope_apply(rp);
      RopeTableParams p;
      p.head_dim = D;
      p.rotary_dim = D;
      p.layout = layout;
      p.width = width;
      p.cos = c.data();
      p.sin = s.data();
      p.table_rows = T;
      p.row_stride = width_n;
      p.tokens = T;
      p.rows = pos.data();
      p.x_in = {x.data(), H, H * D, D};
      p.x_out = {by_table.data(), H, H * D, D};
      rope_table_apply(p);
      p.transpose = true;
      p.x_in.data = by_table.data();
      p.x_out.data = back.data();
      rope_table_apply(p);
      const std::vector<double> a = by_table.to_double(), b = by_freqs.to_double(), x0 = x.to_double(),
                                x1 = back.to_double();
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_NEAR(a[i], b[i], 2e-6) << i;  // two float32 cos/sin roundings of the same angle
        ASSERT_NEAR(x1[i], x0[i], 4e-6) << i;
      }
    }
}

// <y, M x> = <M^T y, x>: the transpose is the adjoint of the forward map, also for tables that are no rotation.
TEST(rope_table, TransposeIsTheAdjoint) {
  const int D = 24, H = 2;
  const int64_t T = 9;
  for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved})
    for (TableWidth width : {TableWidth::Pairs, TableWidth::Features}) {
      RopeTableParams p;
      p.head_dim = D;
      p.rotary_dim = 16;
      p.layout = layout;
      p.width = width;
      p.row_stride = p.table_width();
      p.table_rows = 4;
      const Table table = random_table(p.table_rows, p.row_stride, 3);
      p.cos = table.cos64.data();
      p.sin = table.sin64.data();
      p.dtype = DType::F64;
      std::vector<int64_t> rows = {3, 0, 1, 1, 2, 3, 0, 2, 1};
      p.tokens = T;
      p.rows = rows.data();
      GuardedBuffer x(DType::F64, T * H * D), y(DType::F64, T * H * D), mx(DType::F64, T * H * D),
          mty(DType::F64, T * H * D);
      test::fill_uniform(x, 1);
      test::fill_uniform(y, 2);
      p.x_in = {x.data(), H, H * D, D};
      p.x_out = {mx.data(), H, H * D, D};
      rope_table_apply(p);
      p.transpose = true;
      p.x_in.data = y.data();
      p.x_out.data = mty.data();
      rope_table_apply(p);
      double lhs = 0, rhs = 0;
      for (int64_t i = 0; i < T * H * D; ++i) lhs += y.get(i) * mx.get(i), rhs += mty.get(i) * x.get(i);
      EXPECT_NEAR(lhs, rhs, 1e-12);
    }
}

TEST(rope_table, BadInputThrowsNamingTheField) {
  const int D = 8;
  std::vector<float> c(4 * 4, 1.0f), s(4 * 4, 0.0f), x(2 * D), y(2 * D);
  std::vector<int64_t> rows = {0, 3};
  RopeTableParams good;
  good.head_dim = D;
  good.rotary_dim = D;
  good.cos = c.data();
  good.sin = s.data();
  good.table_rows = 4;
  good.row_stride = 4;
  good.tokens = 2;
  good.rows = rows.data();
  good.x_in = {x.data(), 1, D, D};
  good.x_out = {y.data(), 1, D, D};
  rope_table_apply(good);
  auto expect = [&](auto edit, const std::string& field) {
    RopeTableParams p = good;
    edit(p);
    test::expect_error_naming([&] { rope_table_apply(p); }, field);
    test::expect_error_naming([&] { rope_table_apply_reference(p); }, field);
  };
  std::vector<int64_t> bad_rows = {0, 4};
  expect([&](RopeTableParams& p) { p.rows = bad_rows.data(); }, "rows[1]");
  expect([](RopeTableParams& p) { p.rotary_dim = 7; }, "rotary_dim");
  expect([](RopeTableParams& p) { p.width = TableWidth::Features; }, "row_stride");  // 4 < rotary_dim 8
  expect([](RopeTableParams& p) { p.sin = nullptr; }, "sin");
  expect([](RopeTableParams& p) { p.table_rows = 0; }, "table_rows");
  expect([](RopeTableParams& p) { p.x_out.token_stride = 3; }, "x_out.token_stride");
}

}  // namespace
}  // namespace rotary
