// linear_forward beyond its op cases (cases_linear.cpp): q8 quantization's error bound, results independent of the
// thread count and of how tokens are batched (decode and prefill give the same bits), bf16 activations (rounded once
// per x in a group, on the bf16 dot products where the CPU has them), and bad input refused by name.
#include <gtest/gtest.h>

#include <cpuid.h>

#include <cctype>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "expect.h"
#include "expect_error.h"
#include "harness.h"
#include "rotary/ggml_quants.h"
#include "rotary/linear.h"
#include "simd_targets.h"

namespace rotary {
namespace {

using test::expect_error;
using test::expect_error_naming;

std::vector<float> uniform(int64_t n, uint64_t seed, double lo = -1, double hi = 1) {
  test::GuardedBuffer b(DType::F32, n);
  test::fill_uniform(b, seed, lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  std::memcpy(v.data(), b.data(), size_t(n) * 4);
  return v;
}

// The stored scale is max |w| / 127 rounded to f16, and the quants are made against it: every weight within half of
// it (rows 0-4, normal scales), the block's largest |w| at +-127; a block of small weights (row 5) has a subnormal
// scale, still within half of it or 127 x 2^-25 at the clamp; a block of tinier ones (row 6) a zero scale and zero
// quants, within 127 x 2^-25 of them.
TEST(quantize_q8, EveryWeightWithinHalfItsF16ScaleAndTheBlockMaximumAt127) {
  const int64_t rows = 7, cols = 75;  // two whole blocks and one of 11
  std::vector<float> w = uniform(rows * cols, 3, -2, 2);
  w[7] = 0;                                     // zero stays zero
  for (int64_t c = 64; c < 75; ++c) w[size_t(2 * cols + c)] = 0;  // an all-zero block: scale 0, quants 0
  for (int64_t c = 0; c < cols; ++c) w[size_t(5 * cols + c)] *= 1e-3f, w[size_t(6 * cols + c)] *= 1e-9f;
  std::vector<int8_t> q(size_t(rows * cols));
  std::vector<uint16_t> s(size_t(rows * q8_blocks(cols)));
  quantize_q8(w.data(), DType::F32, rows, cols, cols, q.data(), s.data());
  ASSERT_EQ(q8_blocks(cols), 3);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < 3; ++b) {
      const float scale = f16_to_float(s[size_t(r * 3 + b)]);
      float amax = 0;
      for (int64_t c = b * 32; c < std::min<int64_t>(cols, b * 32 + 32); ++c) amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
      EXPECT_EQ(s[size_t(r * 3 + b)], float_to_f16(amax / 127.0f)) << "row " << r << " block " << b;
      if (r < 5 && amax > 0) {
        EXPECT_GE(scale, 0x1p-14f) << "row " << r << " block " << b << ": a normal half";
      }
      if (r == 5) {
        EXPECT_LT(scale, 0x1p-14f) << "block " << b << ": a subnormal half";
      }
      if (r == 6) {
        EXPECT_EQ(scale, 0.0f) << "block " << b;
      }
      for (int64_t c = b * 32; c < std::min<int64_t>(cols, b * 32 + 32); ++c) {
        const double wq = double(q[size_t(r * cols + c)]) * scale, wv = w[size_t(r * cols + c)];
        // Half a step, plus the one rounding of w / scale (|w / scale| <= ~127, u = 2^-24); 127 x 2^-25 where the
        // scale is subnormal or zero.
        const double bound = std::max(scale * (0.5 + 128 * 0x1p-24), r < 5 ? 0.0 : 127 * 0x1p-25);
        EXPECT_LE(std::fabs(wq - wv), bound) << "row " << r << " col " << c;
        if (std::fabs(wv) == amax && amax > 0 && r < 5) {
          EXPECT_EQ(std::abs(q[size_t(r * cols + c)]), 127);
        }
        if (r == 6) {
          EXPECT_EQ(q[size_t(r * cols + c)], 0);
        }
      }
    }
  EXPECT_EQ(q[7], 0);
  EXPECT_EQ(s[size_t(2 * 3 + 2)], 0);
}

// f16 holds scales up to 65504: a weight past 127 x 65504 is refused by position before anything is written, and
// one at the bound is kept at +-127 x 65504.
TEST(quantize_q8, RefusesAWeightWhoseBlockScaleOverflowsF16) {
  std::vector<float> w = uniform(2 * 40, 6);
  w[size_t(40 + 3)] = float(kQ8MaxWeight);
  std::vector<int8_t> q(w.size(), 42);
  std::vector<uint16_t> s(4, 42);
  quantize_q8(w.data(), DType::F32, 2, 40, 40, q.data(), s.data());
  EXPECT_EQ(q[size_t(40 + 3)], 127);
  EXPECT_EQ(double(q[size_t(40 + 3)]) * f16_to_float(s[2]), kQ8MaxWeight);
  w[size_t(40 + 5)] = -2 * float(kQ8MaxWeight);
  std::fill(q.begin(), q.end(), 42), std::fill(s.begin(), s.end(), 42);
  expect_error([&] { quantize_q8(w.data(), DType::F32, 2, 40, 40, q.data(), s.data()); },
               {"weight[1][5] = -16638016", "127 x 65504", "f16"});
  for (int8_t v : q) EXPECT_EQ(v, 42);
  for (uint16_t v : s) EXPECT_EQ(v, 42);
}

TEST(quantize_q8, ReadsEveryStorageDtypeAndStride) {
  const int64_t rows = 3, cols = 40, stride = 45;
  test::GuardedBuffer bf(DType::BF16, rows * stride), f32(DType::F32, rows * cols);
  test::fill_uniform(bf, 9);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) f32.set(r * cols + c, bf.get(r * stride + c));
  std::vector<int8_t> qa(size_t(rows * cols)), qb(qa.size());
  std::vector<uint16_t> sa(size_t(rows * 2)), sb(sa.size());
  quantize_q8(bf.data(), DType::BF16, rows, cols, stride, qa.data(), sa.data());
  quantize_q8(f32.data(), DType::F32, rows, cols, cols, qb.data(), sb.data());
  EXPECT_EQ(qa, qb);
  EXPECT_EQ(sa, sb);
}

TEST(quantize_q8, RefusesNonFiniteWeightsByPositionBeforeWriting) {
  std::vector<float> w = uniform(4 * 40, 5);
  w[size_t(2 * 40 + 33)] = std::numeric_limits<float>::quiet_NaN();
  w[size_t(3 * 40 + 1)] = std::numeric_limits<float>::infinity();
  std::vector<int8_t> q(w.size(), 42);
  std::vector<uint16_t> s(8, 42);
  expect_error([&] { quantize_q8(w.data(), DType::F32, 4, 40, 40, q.data(), s.data()); }, {"weight[2][33] = nan", "finite"});
  for (int8_t v : q) EXPECT_EQ(v, 42);
  for (uint16_t v : s) EXPECT_EQ(v, 42);
  expect_error_naming([&] { quantize_q8(w.data(), DType::F32, 0, 40, 40, q.data(), s.data()); }, "rows");
  expect_error_naming([&] { quantize_q8(w.data(), DType::F32, 4, 40, 39, q.data(), s.data()); }, "src_row_stride");
}

// A weight matrix of every format over the same values, with its own storage.
struct Weights {
  std::vector<uint8_t> data;
  std::vector<uint16_t> scales;
  WeightMatrix m;
  Weights(WeightFormat f, int64_t rows, int64_t cols, uint64_t seed) {
    const std::vector<float> w = uniform(rows * cols, seed);
    m.format = f, m.rows = rows, m.cols = cols, m.row_stride = cols;
    data.resize(size_t(weight_matrix_bytes(f, rows, cols)));
    if (is_block_format(f)) {
      const GgmlType t = ggml_type_of(f);
      for (int64_t r = 0; r < rows; ++r)
        ggml_quantize(t, w.data() + r * cols, cols, data.data() + r * weight_row_bytes(f, cols));
    } else if (f == WeightFormat::Q8) {
      scales.resize(size_t(rows * q8_blocks(cols)));
      quantize_q8(w.data(), DType::F32, rows, cols, cols, reinterpret_cast<int8_t*>(data.data()), scales.data());
      m.scales = scales.data(), m.scale_stride = q8_blocks(cols);
    } else {
      const DType t = f == WeightFormat::F32 ? DType::F32 : f == WeightFormat::F16 ? DType::F16 : DType::BF16;
      for (size_t i = 0; i < w.size(); ++i) store_from_double(data.data(), t, int64_t(i), w[i]);
    }
    m.data = data.data();
  }
};

constexpr WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8};
// llama.cpp's block formats, every one the linear layers take.
constexpr WeightFormat kBlockFormats[] = {WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q4_1,
                                          WeightFormat::Q5_0, WeightFormat::Q5_1, WeightFormat::Q4_K,
                                          WeightFormat::Q5_K, WeightFormat::Q6_K};

// Runs p (weights, bias, strides, activations set) on T tokens of x one at a time on one thread, then all at once at
// each thread count, and fails at the first output whose bits differ, naming `what`, the threads, token and row.
void expect_batching_changes_no_bit(LinearParams p, const std::vector<float>& x, int64_t T, int64_t K, int64_t N,
                                    std::initializer_list<int> thread_counts, const std::string& what) {
  std::vector<float> one(size_t(T * N)), batch(one.size());
  for (int64_t t = 0; t < T; ++t) {
    p.tokens = 1, p.x = x.data() + t * K, p.y = one.data() + t * N, p.threads = 1;
    linear_forward(p);
  }
  for (int threads : thread_counts) {
    std::fill(batch.begin(), batch.end(), -1.0f);
    p.tokens = T, p.x = x.data(), p.y = batch.data(), p.threads = threads;
    linear_forward(p);
    for (size_t i = 0; i < one.size(); ++i)
      if (std::memcmp(&one[i], &batch[i], 4) != 0) {
        ADD_FAILURE() << what << " threads " << threads << ": token " << i / N << " row " << i % N
                      << ": one at a time " << one[i] << ", batched " << batch[i];
        break;
      }
  }
}

std::string describe(int64_t K, WeightFormat f, ActivationFormat a) {
  return "K " + std::to_string(K) + ": " + weight_format_name(f) + " activations " + activation_format_name(a);
}

// Every output is one thread's dot product in a fixed order, so neither the thread count nor the batching of tokens
// (decode one at a time, prefill tiles of three, chunks, column slices) changes a bit: the engine's prefill and
// decode agree exactly. K = 4100: token chunks of 15 (kChunkBytes), a tail mid-vector and mid-block; f32 rows past
// kLongRowBytes (decode 4 rows at a time), the others' rows under it (one at a time). K = 16421: every format's rows
// past it. T = 70 and 71 leave 1 and 2 tokens past the last whole tile; N = 37 rows leave one past the last group.
// K = 1500: chunks of 42 tokens run the float tiles in column slices (1024 + 476, the last with a 4-column tail).
// T = 7 and 8: small batches (q8 weights on AVX2's byte products: tiles of 4 + 2 + 1 tokens a row; float weights
// with two chains: 6 + 1 and 6 + 2). The float rows' two chains at targets of up to 8 lanes (runs of 8 vectors,
// linear_hwy.cpp): K = 107 ends with vectors short of two runs reaching into chain 1 and the tail in chain 1 (AVX2: 13
// vectors, SSE4: 26); K = 1500's second chunk (28 tokens) runs on activations copied in chain order again.
TEST(linear_forward, SameBitsForAnyThreadCountAndTokenBatching) {
  const int64_t N = 37;
  for (const auto& [T, K] : {std::pair<int64_t, int64_t>{70, 4100}, {71, 4100}, {70, 16421}, {70, 1500}, {7, 4100},
                            {70, 107}, {7, 107}, {8, 1500}}) {
    const std::vector<float> x = uniform(T * K, 11), bias = uniform(N, 12);
    // Each format; then bf16 weights with bf16 activations, q8 weights with q8 activations.
    for (int config = 0; config < 6; ++config) {
      const WeightFormat f = config < 4 ? kFormats[config] : config == 4 ? WeightFormat::BF16 : WeightFormat::Q8;
      Weights w(f, N, K, 13);
      LinearParams p;
      p.w = w.m, p.bias = bias.data(), p.x_stride = K, p.y_stride = N;
      p.activations = config < 4 ? ActivationFormat::F32 : config == 4 ? ActivationFormat::BF16 : ActivationFormat::Q8;
      expect_batching_changes_no_bit(p, x, T, K, N, {1, 2, 3, 8}, describe(K, f, p.activations));
    }
  }
}

// The float tiles' copies of the activations in chain order (linear_hwy.cpp) are kept for the rest of a call's token
// chunk, never past the call: the same x buffer (and bf16 activations' conversion buffer, the same each call) with
// new values gives the new values' outputs, bit for bit those of a buffer never seen before.
TEST(linear_forward, ActivationCopiesDoNotOutliveTheirCall) {
  const int64_t T = 30, K = 1500, N = 37;  // one token chunk (42 at K = 1500), so the next call's chunk is the same
  const std::vector<float> x1 = uniform(T * K, 31), x2 = uniform(T * K, 32);
  for (ActivationFormat a : {ActivationFormat::F32, ActivationFormat::BF16})
    for (int threads : {1, 2}) {
      Weights w(WeightFormat::BF16, N, K, 33);
      LinearParams p;
      p.w = w.m, p.tokens = T, p.x_stride = K, p.y_stride = N, p.activations = a, p.threads = threads;
      std::vector<float> x = x1, first(size_t(T * N)), second(first.size()), fresh(first.size());
      p.x = x.data(), p.y = first.data();
      linear_forward(p);
      x = x2;  // same buffer, new values
      p.y = second.data();
      linear_forward(p);
      const std::vector<float> other = x2;  // a buffer no call has read
      p.x = other.data(), p.y = fresh.data();
      linear_forward(p);
      const std::string what = std::string(activation_format_name(a)) + " threads " + std::to_string(threads);
      EXPECT_EQ(std::memcmp(second.data(), fresh.data(), second.size() * 4), 0) << what;
      EXPECT_NE(std::memcmp(second.data(), first.data(), second.size() * 4), 0) << what;
    }
}

// The block formats likewise, with q8 activations (AVX2's byte products from AVX2 up) and f32 ones (the float path):
// T = 71 runs the panels, N = 37 leaving 5 rows past them; T = 7, 4 and 3 the small batches' row-by-row tiles
// (4 + 2 + 1, 4, and 2 + 1 tokens: byte_products_avx2.h RowByRow); K = 1280 is 40 units, two panel slices (32 + 8).
TEST(linear_forward, BlockFormatsSameBitsForAnyThreadCountAndTokenBatching) {
  const int64_t N = 37;
  for (const auto& [T, K] : {std::pair<int64_t, int64_t>{71, 512}, {71, 1280}, {7, 1280}, {4, 512}, {3, 1280}}) {
    const std::vector<float> x = uniform(T * K, 21), bias = uniform(N, 22);
    for (WeightFormat f : kBlockFormats)
      for (ActivationFormat a : {ActivationFormat::Q8, ActivationFormat::F32}) {
        Weights w(f, N, K, 23);
        LinearParams p;
        p.w = w.m, p.bias = bias.data(), p.x_stride = K, p.y_stride = N, p.activations = a;
        expect_batching_changes_no_bit(p, x, T, K, N, {1, 2, 3}, describe(K, f, a));
      }
  }
}

// The byte products give the same bits on every kernel that runs them: AVX2's vpmaddubsw / vpmaddwd, and vpdpbusd -
// AVX512-VNNI's at AVX-512 targets, AVX-VNNI's at AVX2 targets of a CPU with it (Q4_0's, Q5_0's and Q8_0's quants
// unsigned, the offset started from x's corrections: linear_blocks-inl.h Offset) - sum each lane to the same integer,
// so a model gives the same tokens on either kind of CPU. Decode (one token at a time, row by row) and prefill (71
// tokens: the panels), K = 1280 (two panel slices), N = 37 (a part panel), 9 tokens of a 200 x 4096 matrix, and small
// batches of 7 and 3 (row-by-row tiles of 4 + 2 + 1, and 2 + 1 tokens); Q8_0 with a quant of -128 in every 7th block
// (a GGUF file may hold it). Every (target, AVX-VNNI allowed) pair that runs byte products is compared with the first;
// needs a kernel with vpdpbusd and one without (a CPU with AVX512-VNNI or AVX-VNNI).
TEST(linear_forward, BlockFormatsSameBitsWithAndWithoutVnni) {
  struct Variant {
    int64_t target;
    bool avx_vnni;  // detail::allow_avx_vnni
    std::string products;
  };
  std::vector<Variant> variants;  // those that run byte products, best first
  bool dpbusd = false, bytes = false;
  for (int64_t target : detail::simd_targets())
    for (bool avx_vnni : {true, false}) {
      detail::force_simd_target(target);
      detail::allow_avx_vnni(avx_vnni);
      const std::string products = linear_q8_products();
      detail::allow_avx_vnni(true);
      if (products == "float32 lanes") continue;
      if (!variants.empty() && variants.back().target == target && variants.back().products == products) continue;
      variants.push_back({target, avx_vnni, products});
      (products.rfind("int8 dot products", 0) == 0 ? dpbusd : bytes) = true;
    }
  detail::force_simd_target(0);
  if (!dpbusd || !bytes) GTEST_SKIP() << "needs a CPU with AVX512-VNNI or AVX-VNNI (byte products with vpdpbusd and without)";
  const auto use = [](const Variant& v) {
    detail::force_simd_target(v.target);
    detail::allow_avx_vnni(v.avx_vnni);
  };
  for (const auto& [T, K, N] : {std::tuple<int64_t, int64_t, int64_t>{71, 1280, 37}, {9, 4096, 200}, {7, 1280, 37}, {3, 1280, 37}}) {
    const std::vector<float> x = uniform(T * K, 31, -3, 3), bias = uniform(N, 32);
    for (WeightFormat f : kBlockFormats) {
      Weights w(f, N, K, 33);
      if (f == WeightFormat::Q8_0)
        for (size_t b = 0; b < w.data.size() / 34; b += 7) w.data[b * 34 + 2 + b % 32] = 0x80;
      LinearParams p;
      p.w = w.m, p.bias = bias.data(), p.x_stride = K, p.y_stride = N, p.activations = ActivationFormat::Q8;
      p.threads = 2;
      std::vector<std::vector<float>> decode, prefill;
      for (const Variant& v : variants) {
        use(v);
        auto& one = decode.emplace_back(size_t(T * N), -1.0f);
        for (int64_t t = 0; t < T; ++t) {
          p.tokens = 1, p.x = x.data() + t * K, p.y = one.data() + t * N;
          linear_forward(p);
        }
        auto& all = prefill.emplace_back(size_t(T * N), -1.0f);
        p.tokens = T, p.x = x.data(), p.y = all.data();
        linear_forward(p);
      }
      detail::force_simd_target(0);
      detail::allow_avx_vnni(true);
      for (size_t i = 1; i < variants.size(); ++i) {
        const std::string what = describe(K, f, ActivationFormat::Q8) + " at " +
                                 detail::simd_target_name(variants[i].target) + " (" + variants[i].products +
                                 ") against " + detail::simd_target_name(variants[0].target) + " (" +
                                 variants[0].products + ")";
        EXPECT_EQ(std::memcmp(decode[i].data(), decode[0].data(), decode[0].size() * 4), 0) << what << ", decode";
        EXPECT_EQ(std::memcmp(prefill[i].data(), prefill[0].data(), prefill[0].size() * 4), 0) << what << ", prefill";
      }
      EXPECT_EQ(std::memcmp(decode[0].data(), prefill[0].data(), decode[0].size() * 4), 0) << weight_format_name(f);
    }
  }
}

// weight_row (an embedding row) reads every format as the reference does: each row times a one-hot x.
TEST(weight_row, EqualsTheMatrixTimesAOneHotVector) {
  for (WeightFormat f : kFormats) {
    Weights w(f, 5, 37, 41);
    std::vector<float> row(37), want(5 * 37), onehot(37 * 37, 0.0f);
    for (int c = 0; c < 37; ++c) onehot[size_t(c * 37 + c)] = 1;
    LinearParams p;  // y[c][r] = W[r][c]
    p.w = w.m, p.tokens = 37, p.x = onehot.data(), p.x_stride = 37, p.y = want.data(), p.y_stride = 5;
    linear_forward_reference(p);
    for (int64_t r = 0; r < 5; ++r) {
      weight_row(w.m, r, row.data());
      for (int64_t c = 0; c < 37; ++c) EXPECT_EQ(row[size_t(c)], want[size_t(c * 5 + r)]) << weight_format_name(f);
    }
    expect_error_naming([&] { weight_row(w.m, 5, row.data()); }, "row");
  }
  // The block formats (whole blocks: 256 columns), their rows decoded as the float64 reference decodes them.
  const int64_t K = 256;
  std::vector<float> row(K), want(3 * K), onehot(K * K, 0.0f);
  for (int64_t c = 0; c < K; ++c) onehot[size_t(c * K + c)] = 1;
  for (WeightFormat f : kBlockFormats) {
    Weights w(f, 3, K, 42);
    LinearParams p;
    p.w = w.m, p.tokens = K, p.x = onehot.data(), p.x_stride = K, p.y = want.data(), p.y_stride = 3;
    linear_forward_reference(p);
    for (int64_t r = 0; r < 3; ++r) {
      weight_row(w.m, r, row.data());
      for (int64_t c = 0; c < K; ++c) EXPECT_EQ(row[size_t(c)], want[size_t(c * 3 + r)]) << weight_format_name(f) << " " << c;
    }
  }
}

TEST(linear_forward, AccumulateAddsToTheOutput) {
  Weights w(WeightFormat::BF16, 6, 50, 21);
  const std::vector<float> x = uniform(3 * 50, 22);
  std::vector<float> y(18), base(18, 0.0f), residual = uniform(18, 23);
  LinearParams p;
  p.w = w.m, p.tokens = 3, p.x = x.data(), p.x_stride = 50, p.y = base.data(), p.y_stride = 6;
  linear_forward(p);
  y = residual;
  p.y = y.data(), p.accumulate = true;
  linear_forward(p);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], residual[i] + base[i]) << i;
}

TEST(linear_forward, RefusesBadParamsByName) {
  Weights w(WeightFormat::Q8, 4, 64, 31);
  std::vector<float> x(2 * 64), y(2 * 4);
  auto good = [&] {
    LinearParams p;
    p.w = w.m, p.tokens = 2, p.x = x.data(), p.x_stride = 64, p.y = y.data(), p.y_stride = 4;
    return p;
  };
  linear_forward(good());
  auto refused = [&](auto edit, const std::string& field) {
    LinearParams p = good();
    edit(p);
    expect_error_naming([&] { linear_forward(p); }, field);
    expect_error_naming([&] { linear_forward_reference(p); }, field);
  };
  refused([](LinearParams& p) { p.w.rows = 0; }, "w.rows");
  refused([](LinearParams& p) { p.w.cols = -3; }, "w.cols");
  refused([](LinearParams& p) { p.w.row_stride = 63; }, "w.row_stride");
  refused([](LinearParams& p) { p.w.row_stride = int64_t(1) << 62; }, "w.row_stride");
  refused([](LinearParams& p) { p.w.data = nullptr; }, "w.data");
  refused([](LinearParams& p) { p.w.scales = nullptr; }, "w.scales");
  refused([](LinearParams& p) { p.w.scale_stride = 1; }, "w.scale_stride");
  refused([](LinearParams& p) { p.w.format = WeightFormat(int(kLastWeightFormat) + 1); }, "w.format");
  refused([](LinearParams& p) { p.tokens = -1; }, "tokens");
  refused([](LinearParams& p) { p.x = nullptr; }, "x");
  refused([](LinearParams& p) { p.x_stride = 10; }, "x_stride");
  refused([](LinearParams& p) { p.y_stride = 3; }, "y_stride");
  refused([&](LinearParams& p) { p.y = x.data() + 60; }, "y");  // overlaps x
  refused([](LinearParams& p) { p.threads = -2; }, "threads");
  refused([](LinearParams& p) { p.activations = ActivationFormat::BF16; }, "activations");  // q8 weights
  refused([](LinearParams& p) { p.w.format = WeightFormat::F16, p.activations = ActivationFormat::Q8; }, "activations");
  refused([](LinearParams& p) { p.activations = ActivationFormat(7); }, "activations");
  // Block formats: rows are whole blocks, and y must not overlap the blocks (their bytes, not cols x 1).
  Weights blocks(WeightFormat::Q4_K, 4, 512, 32);
  std::vector<float> xb(2 * 512), yb(2 * 4);
  auto block_call = [&](auto edit) {
    LinearParams p;
    p.w = blocks.m, p.tokens = 2, p.x = xb.data(), p.x_stride = 512, p.y = yb.data(), p.y_stride = 4;
    p.activations = ActivationFormat::Q8;
    edit(p);
    linear_forward(p);
  };
  block_call([](LinearParams&) {});
  expect_error_naming([&] { block_call([](LinearParams& p) { p.w.cols = 500, p.x_stride = 500; }); }, "w.cols");
  expect_error_naming([&] { block_call([](LinearParams& p) { p.w.row_stride = 600; }); }, "w.row_stride");
  expect_error_naming([&] {
    block_call([&](LinearParams& p) { p.y = reinterpret_cast<float*>(blocks.data.data() + 3 * 288 + 100); });
  }, "y");
  // The 32-weight formats likewise: Q5_0 rows of 48 weights are a block and a half.
  for (WeightFormat f : {WeightFormat::Q4_1, WeightFormat::Q5_0, WeightFormat::Q5_1}) {
    Weights small(f, 4, 64, 33);
    LinearParams p;
    p.w = small.m, p.tokens = 2, p.x = xb.data(), p.x_stride = 64, p.y = yb.data(), p.y_stride = 4;
    linear_forward(p);
    p.w.cols = 48, p.x_stride = 48;
    expect_error([&] { linear_forward(p); }, {"w.cols = 48", "a multiple of 32", weight_format_name(f)});
    p.w.cols = 64, p.x_stride = 64, p.w.row_stride = 80;
    expect_error([&] { linear_forward(p); }, {"w.row_stride = 80", "a multiple of 32"});
  }
  // An element format has no GGUF block type.
  expect_error_naming([] { ggml_type_of(WeightFormat::BF16); }, "format");
  EXPECT_EQ(ggml_type_of(WeightFormat::Q4_K), GgmlType::Q4_K);
  // Nothing written by a refused call.
  std::vector<float> before = y;
  LinearParams p = good();
  p.x_stride = 1;
  expect_error_naming([&] { linear_forward(p); }, "x_stride");
  EXPECT_EQ(y, before);
}

// A group shares one team of threads among its products' rows; each product keeps the bits it has alone, whatever
// its neighbours (formats, shapes, token counts, an empty one) and the thread count.
TEST(linear_forward_group, EachProductHasItsBitsAlone) {
  struct Case {
    WeightFormat f;
    int64_t rows, cols, tokens;
  };
  const Case cases[] = {{WeightFormat::BF16, 37, 130, 5}, {WeightFormat::Q8, 8, 70, 5}, {WeightFormat::F32, 3, 9, 1},
                        {WeightFormat::F16, 21, 130, 0}, {WeightFormat::BF16, 64, 33, 13}};
  constexpr int n = 5;
  std::vector<std::unique_ptr<Weights>> w;
  std::vector<std::vector<float>> x, bias, alone(n), grouped(n);
  for (int i = 0; i < n; ++i) {
    const Case& c = cases[i];
    w.push_back(std::make_unique<Weights>(c.f, c.rows, c.cols, 50 + uint64_t(i)));
    x.push_back(uniform(std::max<int64_t>(c.tokens, 1) * c.cols, 60 + uint64_t(i)));
    bias.push_back(uniform(c.rows, 70 + uint64_t(i)));
  }
  for (int threads : {1, 2, 3, 7}) {
    std::vector<LinearParams> ps(n);
    for (int i = 0; i < n; ++i) {
      const Case& c = cases[i];
      alone[size_t(i)].assign(size_t(std::max<int64_t>(c.tokens, 1) * c.rows), 0.5f);
      grouped[size_t(i)] = alone[size_t(i)];
      LinearParams& p = ps[size_t(i)];
      p.w = w[size_t(i)]->m, p.bias = i % 2 ? nullptr : bias[size_t(i)].data(), p.tokens = c.tokens;
      p.x = x[size_t(i)].data(), p.x_stride = c.cols, p.y_stride = c.rows, p.accumulate = i == 4;
      p.threads = threads;
      p.y = alone[size_t(i)].data();
      linear_forward(p);
      p.y = grouped[size_t(i)].data();
    }
    linear_forward_group(ps.data(), n);
    for (int i = 0; i < n; ++i)
      EXPECT_EQ(std::memcmp(alone[size_t(i)].data(), grouped[size_t(i)].data(), alone[size_t(i)].size() * 4), 0)
          << "product " << i << " threads " << threads;
  }
}

// Runs the four products of `ms` (tokens[i] tokens each; product 2 with f32 activations, the others with `act`) alone
// and as one group over one x, at 1, 2 and 3 threads, and expects each product's bits to be the same both ways.
void expect_group_keeps_bits(const std::vector<float>& x, int64_t K, const WeightMatrix* const (&ms)[4],
                             const int64_t (&tokens)[4], ActivationFormat act) {
  const int64_t T = tokens[0];
  for (int threads : {1, 2, 3}) {
    std::vector<LinearParams> ps(4);
    std::vector<std::vector<float>> alone(4), grouped(4);
    for (int i = 0; i < 4; ++i) {
      LinearParams& p = ps[size_t(i)];
      p.w = *ms[i], p.tokens = tokens[i], p.x = x.data(), p.x_stride = K, p.y_stride = p.w.rows, p.threads = threads;
      p.activations = i == 2 ? ActivationFormat::F32 : act;
      alone[size_t(i)].assign(size_t(T * p.w.rows), 0.25f), grouped[size_t(i)] = alone[size_t(i)];
      p.y = alone[size_t(i)].data();
      linear_forward(p);
      p.y = grouped[size_t(i)].data();
    }
    linear_forward_group(ps.data(), 4);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(std::memcmp(alone[size_t(i)].data(), grouped[size_t(i)].data(), alone[size_t(i)].size() * 4), 0)
          << activation_format_name(act) << " product " << i << " threads " << threads;
  }
}

// bf16 activations: products of a group that read one x (decode's q, k, v) share its rounding; each has the bits
// it has alone, also beside a product reading the same x with f32 activations and one reading fewer of its tokens.
TEST(linear_forward_group, Bf16ActivationsSharedAmongProductsKeepTheirBits) {
  const int64_t K = 75, T = 6;
  const std::vector<float> x = uniform(T * K, 90);
  Weights wq(WeightFormat::BF16, 40, K, 91), wk(WeightFormat::BF16, 9, K, 92), wv(WeightFormat::BF16, 9, K, 93);
  Weights wf(WeightFormat::F32, 5, K, 94);
  const WeightMatrix* ms[] = {&wq.m, &wk.m, &wf.m, &wv.m};
  const int64_t tokens[] = {T, T, T, 4};
  expect_group_keeps_bits(x, K, ms, tokens, ActivationFormat::BF16);
  // Rounding is what changes the result: the same product with f32 activations differs.
  std::vector<float> f32(size_t(T * 40)), b16(f32.size());
  LinearParams p;
  p.w = wq.m, p.tokens = T, p.x = x.data(), p.x_stride = K, p.y = f32.data(), p.y_stride = 40;
  linear_forward(p);
  p.y = b16.data(), p.activations = ActivationFormat::BF16;
  linear_forward(p);
  EXPECT_NE(f32, b16);
}

// q8 activations: products of a group that read one x share its quantization; each has the bits it has alone,
// also beside a product reading the same x with f32 activations and one reading fewer of its tokens. Quantizing is
// what changes the result (the same product with f32 activations differs), and by no more than the activations'
// quantization allows: per block |x - q scale| <= scale / 2 (plus one rounding), so |dy| <= sum |w| scale / 2.
TEST(linear_forward_group, Q8ActivationsSharedAmongProductsKeepTheirBits) {
  const int64_t K = 75, T = 6;
  const std::vector<float> x = uniform(T * K, 190);
  Weights wq(WeightFormat::Q8, 40, K, 191), wk(WeightFormat::Q8, 9, K, 192), wv(WeightFormat::Q8, 9, K, 193);
  const WeightMatrix* ms[] = {&wq.m, &wk.m, &wq.m, &wv.m};
  const int64_t tokens[] = {T, T, T, 4};
  expect_group_keeps_bits(x, K, ms, tokens, ActivationFormat::Q8);
  std::vector<float> f32(size_t(T * 40)), q8(f32.size()), w(static_cast<size_t>(K));
  LinearParams p;
  p.w = wq.m, p.tokens = T, p.x = x.data(), p.x_stride = K, p.y = f32.data(), p.y_stride = 40;
  linear_forward(p);
  p.y = q8.data(), p.activations = ActivationFormat::Q8;
  linear_forward(p);
  EXPECT_NE(f32, q8);
  for (int64_t r = 0; r < 40; ++r) {
    weight_row(wq.m, r, w.data());
    for (int64_t t = 0; t < T; ++t) {
      double bound = 0;
      for (int64_t b = 0; b < q8_blocks(K); ++b) {
        float amax = 0, wsum = 0;
        for (int64_t c = b * kQ8Block; c < std::min(K, (b + 1) * kQ8Block); ++c)
          amax = std::max(amax, std::fabs(x[size_t(t * K + c)])), wsum += std::fabs(w[size_t(c)]);
        bound += double(wsum) * amax / 127 * (0.5 + 1e-6);
      }
      EXPECT_LE(std::fabs(double(q8[size_t(t * 40 + r)]) - f32[size_t(t * 40 + r)]), bound + 1e-5) << t << " " << r;
    }
  }
}

// q8_quantize_block (q8 activations, the q8 KV cache): scale = max |v| / 127 kept in float, quant = round(v / scale)
// ties away from zero, written out here again; non-finite values kept non-finite through the scale.
TEST(q8_quantize_block, ScaleIsTheBlockMaximumOver127AndNonFiniteValuesPoisonTheBlock) {
  std::vector<float> v = uniform(45, 7);
  v[3] = 0.5f * v[0];  // whatever the values, each quant is its own rounding
  std::vector<int8_t> q(45);
  for (int64_t at : {0, 32}) {
    const int64_t n = at == 0 ? 32 : 13;
    float amax = 0;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[size_t(at + i)]));
    const float scale = q8_quantize_block(v.data() + at, n, q.data() + at);
    EXPECT_EQ(scale, amax / 127.0f);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(q[size_t(at + i)], int8_t(std::round(v[size_t(at + i)] / scale))) << at + i;
  }
  const float zeros[3] = {0, -0.0f, 0};
  EXPECT_EQ(q8_quantize_block(zeros, 3, q.data()), 0.0f);
  EXPECT_EQ(q[0] | q[1] | q[2], 0);
  float bad[4] = {1, 2, std::numeric_limits<float>::quiet_NaN(), 3};
  EXPECT_TRUE(std::isnan(q8_quantize_block(bad, 4, q.data())));
  bad[2] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(q8_quantize_block(bad, 4, q.data())));
  EXPECT_EQ(q[2], -127);
  EXPECT_EQ(q[0] | q[1] | q[3], 0);
  expect_error_naming([&] { q8_quantize_block(bad, 0, q.data()); }, "n");
  expect_error_naming([&] { q8_quantize_block(bad, kQ8Block + 1, q.data()); }, "n");
  expect_error_naming([&] { q8_quantize_block(nullptr, 4, q.data()); }, "v");
  expect_error_naming([&] { q8_quantize_block(bad, 4, nullptr); }, "quants");
}

// q8 activations round halves away from zero, as quantize_q8 rounds weights (std::round), at every SIMD target:
// with max |x| = 127 a block's scale is 1, so x = k + 1/2 lands exactly on a tie; a quant off by one moves y by a
// whole weight, far past the reference's bound.
TEST(linear_forward, Q8ActivationsRoundHalvesAwayFromZeroAtEveryTarget) {
  const int64_t K = 64, N = 5;
  std::vector<float> x(static_cast<size_t>(K));
  for (int64_t c = 0; c < K; ++c) x[size_t(c)] = c % 32 == 0 ? 127.0f : float(c % 9) - 4.5f;  // ties, both signs
  Weights w(WeightFormat::Q8, N, K, 71);
  std::vector<float> want(static_cast<size_t>(N)), got(want.size()), row(static_cast<size_t>(K));
  LinearParams p;
  p.w = w.m, p.tokens = 1, p.x = x.data(), p.x_stride = K, p.y = want.data(), p.y_stride = N;
  p.activations = ActivationFormat::Q8;
  linear_forward_reference(p);
  test::for_each_target([&] {
    p.y = got.data();
    linear_forward(p);
    for (int64_t r = 0; r < N; ++r) {
      weight_row(w.m, r, row.data());
      double scale = 0;
      for (int64_t c = 0; c < K; ++c) scale += std::fabs(double(row[size_t(c)]) * x[size_t(c)]);
      EXPECT_NEAR(got[size_t(r)], want[size_t(r)], 1e-5 * scale) << detail::linear_simd_target() << " row " << r;
    }
  });
}

// A weight byte of -128 (a GGUF file's Q8_0 quant may hold it, though llama.cpp's quantizer writes +-127; split bit
// for bit into q8 weights it reaches the q8 kernels too) multiplies as -128 against negative and positive x alike, at
// every target: the byte products take |w| as their unsigned operand, never -w.
TEST(linear_forward, WeightBytesOfMinus128AreExactAtEveryTarget) {
  const int64_t K = 96, N = 6, T = 11;  // T > 8: the prefill tiles too
  std::vector<float> x(static_cast<size_t>(T * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -1.0f : 0.5f) * float(1 + i % 7);
  for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q8_0}) {
    Weights w(f, N, K, 73);
    // Every fifth weight's quant -128 (Q8_0: the quants follow each block's 2-byte scale).
    for (int64_t i = 0; i < N * K; i += 5) {
      const int64_t at = f == WeightFormat::Q8 ? i : (i / 32) * 34 + 2 + i % 32;
      w.data[size_t(at)] = 0x80;
    }
    std::vector<float> want(static_cast<size_t>(T * N)), got(want.size()), row(static_cast<size_t>(K));
    LinearParams p;
    p.w = w.m, p.tokens = T, p.x = x.data(), p.x_stride = K, p.y = want.data(), p.y_stride = N;
    p.activations = ActivationFormat::Q8;
    linear_forward_reference(p);
    test::for_each_target([&] {
      std::fill(got.begin(), got.end(), 0.0f);
      p.y = got.data();
      linear_forward(p);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < N; ++r) {
          weight_row(w.m, r, row.data());
          double scale = 0;
          for (int64_t c = 0; c < K; ++c) scale += std::fabs(double(row[size_t(c)]) * x[size_t(t * K + c)]);
          EXPECT_NEAR(got[size_t(t * N + r)], want[size_t(t * N + r)], 1e-5 * scale)
              << weight_format_name(f) << " at " << detail::linear_simd_target() << ", token " << t << " row " << r;
        }
    });
  }
}

// The bf16 dot-product instruction runs exactly where it should: at AVX-512 targets of a CPU that has AVX512-BF16,
// never at a lower target (ROTARY_SIMD_TARGET, or a smaller CPU).
TEST(linear_forward, Bf16DotProductsAtAvx512TargetsOfCpusThatHaveThem) {
  const bool cpu = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  test::for_each_target([&] {
    const std::string target = detail::linear_simd_target();
    EXPECT_EQ(linear_uses_bf16_dot(), cpu && target.rfind("AVX3", 0) == 0) << target;
  });
  std::printf("this CPU %s AVX512-BF16\n", cpu ? "has" : "lacks");
}

// The same for the int8 dot-product instruction of q8 activations and AVX512-VNNI.
TEST(linear_forward, Q8DotProductsAtAvx512TargetsOfCpusThatHaveThem) {
  const bool cpu = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl");
  test::for_each_target([&] {
    const std::string target = detail::linear_simd_target();
    EXPECT_EQ(linear_uses_q8_dot(), cpu && target.rfind("AVX3", 0) == 0) << target;
  });
  std::printf("this CPU %s AVX512-VNNI\n", cpu ? "has" : "lacks");
}

// Each target's path for q8 activations: AVX512-VNNI's int8 dot products where they run, AVX-VNNI's (the block
// formats) or else AVX2's byte products at the other x86 targets from AVX2 up, float32 lanes below (SSE4, scalar).
TEST(linear_forward, Q8ProductsAreTheBestEachTargetHas) {
  const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // AVX-VNNI: CPUID leaf 7, sub-leaf 1, EAX bit 4
  const bool avx_vnni = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 4 & 1) != 0;
  test::for_each_target([&] {
    const std::string target = detail::linear_simd_target();
    const bool avx512 = target.rfind("AVX3", 0) == 0, from_avx2 = avx512 || target == "AVX2";
    const std::string want =
        vnni && avx512                  ? "int8 dot products (AVX512-VNNI)"
        : avx2 && avx_vnni && from_avx2 ? "int8 dot products (AVX-VNNI) for the block formats, byte products (AVX2) for q8 weights"
        : avx2 && from_avx2             ? "byte products (AVX2)"
                                        : "float32 lanes";
    EXPECT_EQ(linear_q8_products(), want) << target;
    detail::allow_avx_vnni(false);  // a test's switch: AVX2's byte products there instead
    EXPECT_EQ(linear_q8_products(), std::string(vnni && avx512          ? "int8 dot products (AVX512-VNNI)"
                                                : avx2 && from_avx2 ? "byte products (AVX2)"
                                                                    : "float32 lanes"))
        << target << " without AVX-VNNI";
    detail::allow_avx_vnni(true);
  });
}

TEST(linear_forward_group, RefusesBadGroupsByNameBeforeWriting) {
  Weights w(WeightFormat::BF16, 4, 64, 81);
  std::vector<float> x(2 * 64), y0(2 * 4, 7.0f), y1(2 * 4, 7.0f);
  auto good = [&] {
    std::vector<LinearParams> ps(2);
    for (int i = 0; i < 2; ++i) {
      ps[size_t(i)].w = w.m, ps[size_t(i)].tokens = 2, ps[size_t(i)].x = x.data(), ps[size_t(i)].x_stride = 64;
      ps[size_t(i)].y = (i ? y1 : y0).data(), ps[size_t(i)].y_stride = 4;
    }
    return ps;
  };
  std::vector<LinearParams> ps = good();
  ps[1].w.rows = 0;
  expect_error([&] { linear_forward_group(ps.data(), 2); }, {"rotary: products[1].w.rows = 0"});
  ps = good();
  ps[1].threads = 3;
  expect_error([&] { linear_forward_group(ps.data(), 2); }, {"products[1].threads = 3", "products[0].threads = 0"});
  ps = good();
  ps[1].y = y0.data() + 2;  // writes where product 0 writes
  expect_error([&] { linear_forward_group(ps.data(), 2); }, {"products[0].y", "products[1]'s x, y, weights or bias"});
  std::vector<float> x1(2 * 64);
  ps = good();
  ps[1].x = x1.data(), ps[1].y = x.data();  // writes what product 0 reads
  expect_error([&] { linear_forward_group(ps.data(), 2); }, {"products[1].y", "products[0]'s x, y, weights or bias"});
  expect_error_naming([&] { linear_forward_group(ps.data(), 0); }, "count");
  expect_error_naming([&] { linear_forward_group(nullptr, 1); }, "products");
  for (float v : y0) EXPECT_EQ(v, 7.0f);
  for (float v : y1) EXPECT_EQ(v, 7.0f);
}

TEST(weight_format, NamesRoundTripAndUnknownNamesListTheChoices) {
  for (WeightFormat f : kFormats) EXPECT_EQ(parse_weight_format(weight_format_name(f)), f);
  for (WeightFormat f : kBlockFormats) {
    EXPECT_EQ(parse_weight_format(weight_format_name(f)), f);
    EXPECT_TRUE(is_block_format(f)) << weight_format_name(f);
    // The GGUF type of the same name, and its block as gguf.h's table of ggml types has it.
    const GgmlTypeInfo& info = *ggml_type_info(uint32_t(ggml_type_of(f)));
    std::string upper = weight_format_name(f);
    for (char& c : upper) c = c == 'k' ? 'K' : char(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(info.name, upper);
    EXPECT_EQ(weight_block_size(f), info.block_size) << upper;
    EXPECT_EQ(weight_block_bytes(f), info.type_size) << upper;
  }
  for (const auto& [name, f, bytes] : {std::tuple{"q4_1", WeightFormat::Q4_1, 20},
                                       std::tuple{"q5_0", WeightFormat::Q5_0, 22},
                                       std::tuple{"q5_1", WeightFormat::Q5_1, 24}}) {
    EXPECT_EQ(parse_weight_format(name), f);
    EXPECT_EQ(weight_block_size(f), 32) << name;
    EXPECT_EQ(weight_block_bytes(f), bytes) << name;
    EXPECT_EQ(weight_row_bytes(f, 96), 3 * bytes) << name;
  }
  expect_error([] { parse_weight_format("int4", "--weights"); },
               {"--weights = \"int4\"", "f32, f16, bf16, q8, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k"});
  EXPECT_EQ(weight_format_of(DType::BF16), WeightFormat::BF16);
  expect_error([] { weight_format_of(DType::F64); }, "weight dtype = f64");
  for (ActivationFormat f : {ActivationFormat::F32, ActivationFormat::BF16, ActivationFormat::Q8})
    EXPECT_EQ(parse_activation_format(activation_format_name(f)), f);
  expect_error([] { parse_activation_format("f16", "--activations"); }, {"--activations = \"f16\"", "f32, bf16, q8"});
}

}  // namespace
}  // namespace rotary
