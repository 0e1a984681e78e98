// rope_apply (fast: Highway SIMD + OpenMP) against rope_apply_reference (float64 oracle) across layouts, rotary
// fractions, odd pair counts, storage dtypes, strides, positions, directions, GQA and in/out of place, on every
// SIMD target compiled in; then properties (relative positions, inverse, adjoint, layouts), large positions,
// every scaling type, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "rotary/error.h"
#include "rotary/rope.h"
#include "simd_targets.h"

namespace rotary {
namespace {

using test::dtype_eps;
using test::GuardedBuffer;

const double kSqrt2 = std::sqrt(2.0);
const double kU32 = dtype_eps(DType::F32);
const double kU64 = dtype_eps(DType::F64);

// Bound on |fast - reference| for one rotated element; inputs |x| <= X, scale s (a, or 1/a for Inverse):
//   fast arithmetic in the compute type (u_c = u32, or u64 for F64 storage): c and s are rounded to it (u_c
//   each, on top of <= 16 u64 from the float64 cos/sin, see test_angles.cpp), then two products and a sum with
//   two or three roundings (fused or not):  <= (|x1 c| + |x2 s|) 2 u_c + |y| u_c <= 3 sqrt2 s X u_c,
//   using |c| + |s| <= sqrt2 s and |y| <= sqrt2 s X;
//   both results are rounded once to the storage type:  + 2 eps_s |y| <= 2 sqrt2 s X eps_s.
// The 16 u64 cos/sin term enters twice (c and s): + 32 u64 s X.
double element_tol(DType dtype, double s, double X) {
  const double uc = dtype == DType::F64 ? kU64 : kU32;
  return s * X * (3 * kSqrt2 * uc + 2 * kSqrt2 * dtype_eps(dtype) + 32 * kU64);
}

std::vector<double> default_inv_freq(int pairs, double base = 10000.0) {
  std::vector<double> inv(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) inv[size_t(i)] = std::pow(base, -2.0 * i / (2.0 * pairs));
  return inv;
}

RopeFreqs make_freqs(int D, int r, RopeLayout layout, double attention_factor = 1.0) {
  RopeFreqs f;
  f.head_dim = D;
  f.rotary_dim = r;
  f.layout = layout;
  f.inv_freq = default_inv_freq(r / 2);
  f.attention_factor = attention_factor;
  return f;
}

// Where a [tokens, heads, D] view sits in its buffer.
struct Geometry {
  int64_t offset = 0, heads = 1, token_stride = 0, head_stride = 0;
};
enum class Strides { Packed, PaddedHeads, TokenGap, SbhdView, HeadMajor };
const char* strides_name(Strides s) {
  switch (s) {
    case Strides::Packed: return "packed";
    case Strides::PaddedHeads: return "padded_heads";
    case Strides::TokenGap: return "token_gap";
    case Strides::SbhdView: return "sbhd_view";
    case Strides::HeadMajor: return "head_major";
  }
  return "?";
}
Geometry make_geometry(Strides kind, int64_t heads, int D, int64_t tokens) {
  switch (kind) {
    case Strides::Packed: return {0, heads, heads * D, D};                  // [T, H, D]
    case Strides::PaddedHeads: return {0, heads, heads * (D + 5), D + 5};  // [T, H, D + 5][..., :D]
    case Strides::TokenGap: return {0, heads, heads * D + 13, D};          // [T, H*D + 13]
    case Strides::SbhdView: return {heads * D, heads, 3 * heads * D, D};   // [S, B=3, H, D][:, 1]
    case Strides::HeadMajor: return {0, heads, D, tokens * D};             // [1, H, S, D].transpose(1, 2)
  }
  return {};
}
int64_t buffer_elements(const Geometry& g, int64_t tokens, int D) {
  return g.offset + (tokens - 1) * g.token_stride + (g.heads - 1) * g.head_stride + D;
}
HeadsView view_of(GuardedBuffer& b, const Geometry& g) {
  HeadsView v;
  v.data = static_cast<char*>(b.data()) + g.offset * int64_t(dtype_size(b.dtype()));
  v.heads = g.heads;
  v.token_stride = g.token_stride;
  v.head_stride = g.head_stride;
  return v;
}
// 1 where an element is a rotated feature of some head, 0 elsewhere (pass-through features, padding).
std::vector<char> rotated_mask(const Geometry& g, int64_t tokens, int r, int64_t n) {
  std::vector<char> m(size_t(n), 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < g.heads; ++h)
      for (int d = 0; d < r; ++d) m[size_t(g.offset + t * g.token_stride + h * g.head_stride + d)] = 1;
  return m;
}
void copy_buffer(const GuardedBuffer& from, GuardedBuffer& to) {
  std::memcpy(to.data(), from.data(), size_t(from.size()) * dtype_size(from.dtype()));
}

struct Case {
  DType dtype = DType::F32;
  RopeLayout layout = RopeLayout::HalfSplit;
  int D = 64, r = 64;
  int64_t tokens = 5, q_heads = 4, k_heads = 2;  // k_heads 0: no k
  Strides strides = Strides::Packed;
  RopeDirection direction = RopeDirection::Forward;
  bool in_place = true;
  double attention_factor = 1.0;
  uint64_t seed = 1;
  const RopeFreqs* freqs = nullptr;  // when set, replaces D, r, layout and attention_factor (from a RopeSpec)
  const std::vector<int64_t>* positions = nullptr;  // when set, [tokens] positions (else random up to 1e6)

  std::string describe() const {
    static const char* dirs[] = {"forward", "inverse", "transpose"};
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s %s D=%d r=%d T=%lld hq=%lld hk=%lld %s %s %s a=%g", dtype_name(dtype),
                  layout == RopeLayout::Interleaved ? "interleaved" : "half_split", D, r, (long long)tokens,
                  (long long)q_heads, (long long)k_heads, strides_name(strides), dirs[int(direction)],
                  in_place ? "in_place" : "out_of_place", attention_factor);
    return buf;
  }
};

// Buffers of one view (q or k): the input, and what the fast and reference kernels write into.
struct ViewBuffers {
  Geometry in_g, out_g;
  std::optional<GuardedBuffer> in, fast, ref;
};

// Builds the buffers of one case; fast and ref start with the same contents.
ViewBuffers make_view_buffers(const Case& c, int64_t heads, uint64_t seed) {
  ViewBuffers v;
  v.in_g = make_geometry(c.strides, heads, c.D, c.tokens);
  // Out of place writes to a differently strided view (padded in -> packed out, packed in -> gapped out).
  v.out_g = c.in_place ? v.in_g
                       : make_geometry(c.strides == Strides::Packed ? Strides::TokenGap : Strides::Packed, heads, c.D, c.tokens);
  v.in.emplace(c.dtype, buffer_elements(v.in_g, c.tokens, c.D));
  test::fill_uniform(*v.in, seed);
  const int64_t n_out = buffer_elements(v.out_g, c.tokens, c.D);
  v.fast.emplace(c.dtype, n_out);
  v.ref.emplace(c.dtype, n_out);
  if (c.in_place) {
    copy_buffer(*v.in, *v.fast);
  } else {
    test::fill_uniform(*v.fast, seed + 1000);  // stale output contents: padding must stay as it was
  }
  copy_buffer(*v.fast, *v.ref);
  return v;
}

RopeParams make_params(const Case& c, const RopeFreqs& f, const std::vector<int64_t>& pos, ViewBuffers& q,
                       ViewBuffers* k, GuardedBuffer& q_out, GuardedBuffer* k_out) {
  RopeParams p;
  p.freqs = &f;
  p.tokens = c.tokens;
  p.positions = pos.data();
  p.dtype = c.dtype;
  p.direction = c.direction;
  p.q_out = view_of(q_out, q.out_g);
  p.q_in = c.in_place ? p.q_out : view_of(*q.in, q.in_g);
  if (k != nullptr) {
    p.k_out = view_of(*k_out, k->out_g);
    p.k_in = c.in_place ? p.k_out : view_of(*k->in, k->in_g);
  }
  return p;
}

// Compares fast against reference over a whole output buffer: rotated elements within tol, everything else
// (pass-through features, padding between heads and tokens, other batch rows) bit-identical. Returns max err.
double compare_view(const Case& c, const ViewBuffers& v, double tol) {
  EXPECT_TRUE(v.fast->guards_intact()) << "fast kernel wrote outside its buffer";
  EXPECT_TRUE(v.ref->guards_intact());
  const auto mask = rotated_mask(v.out_g, c.tokens, c.r, v.fast->size());
  double worst = 0;
  for (int64_t i = 0; i < v.fast->size(); ++i) {
    const double a = v.fast->get(i), b = v.ref->get(i);
    if (mask[size_t(i)]) {
      const double err = std::fabs(a - b);
      if (!(err <= tol)) {
        ADD_FAILURE() << "element " << i << ": fast " << a << " reference " << b << " tol " << tol;
        return err;
      }
      worst = std::max(worst, err);
    } else if (std::memcmp(static_cast<const char*>(v.fast->data()) + i * dtype_size(c.dtype),
                           static_cast<const char*>(v.ref->data()) + i * dtype_size(c.dtype), dtype_size(c.dtype))) {
      ADD_FAILURE() << "element " << i << " is not rotated but differs: fast " << a << " reference " << b;
      return INFINITY;
    }
  }
  return worst;
}

// Runs one case with the reference once and the fast kernel once per SIMD target. Returns max err / tol.
double run_case(const Case& c, const std::vector<int64_t>& targets) {
  SCOPED_TRACE(c.describe());
  std::mt19937_64 rng(c.seed);
  std::vector<int64_t> pos(size_t(c.tokens));
  std::uniform_int_distribution<int64_t> u(0, 1000000);
  for (auto& p : pos) p = u(rng);
  pos[0] = 0;
  if (c.positions) pos = *c.positions;

  const RopeFreqs f = c.freqs ? *c.freqs : make_freqs(c.D, c.r, c.layout, c.attention_factor);
  ViewBuffers q = make_view_buffers(c, c.q_heads, c.seed * 7 + 1);
  std::optional<ViewBuffers> k;
  if (c.k_heads > 0) k = make_view_buffers(c, c.k_heads, c.seed * 7 + 2);

  rope_apply_reference(make_params(c, f, pos, q, k ? &*k : nullptr, *q.ref, k ? &*k->ref : nullptr));
  const double s = c.direction == RopeDirection::Inverse ? 1.0 / f.attention_factor : f.attention_factor;
  const double tol = element_tol(c.dtype, s, 1.0);  // fill_uniform draws from [-1, 1)

  const std::vector<char> q_fast0(static_cast<char*>(q.fast->data()),
                                  static_cast<char*>(q.fast->data()) + q.fast->size() * dtype_size(c.dtype));
  const std::vector<char> k_fast0 =
      k ? std::vector<char>(static_cast<char*>(k->fast->data()),
                            static_cast<char*>(k->fast->data()) + k->fast->size() * dtype_size(c.dtype))
        : std::vector<char>();
  const std::vector<double> q_in0 = q.in->to_double(), k_in0 = k ? k->in->to_double() : std::vector<double>();
  double worst = 0;
  for (int64_t target : targets) {
    SCOPED_TRACE(detail::simd_target_name(target));
    detail::force_simd_target(target);
    std::memcpy(q.fast->data(), q_fast0.data(), q_fast0.size());  // in place: start from the input again
    if (k) std::memcpy(k->fast->data(), k_fast0.data(), k_fast0.size());
    rope_apply(make_params(c, f, pos, q, k ? &*k : nullptr, *q.fast, k ? &*k->fast : nullptr));
    worst = std::max(worst, compare_view(c, q, tol));
    if (k) worst = std::max(worst, compare_view(c, *k, tol));
    if (!c.in_place) {  // out of place, the input is read only
      EXPECT_TRUE(q.in->guards_intact());
      EXPECT_EQ(q.in->to_double(), q_in0);
      if (k) {
        EXPECT_TRUE(k->in->guards_intact());
        EXPECT_EQ(k->in->to_double(), k_in0);
      }
    }
  }
  detail::force_simd_target(0);
  return worst / tol;
}

struct Shape {
  int D, r;
  int64_t k_heads;
};
// Full rotation (64 pairs), half (16 pairs), 3 pairs (shorter than any vector), 35 pairs (vectors + a tail);
// k heads: MHA, GQA, MQA, none.
const Shape kShapes[] = {{128, 128, 4}, {64, 32, 2}, {20, 6, 1}, {96, 70, 0}};

void sweep(DType dtype, RopeLayout layout) {
  const auto targets = detail::simd_targets();
  double worst_ratio = 0;
  uint64_t seed = 1;
  for (const Shape& shape : kShapes)
    for (Strides strides :
         {Strides::Packed, Strides::PaddedHeads, Strides::TokenGap, Strides::SbhdView, Strides::HeadMajor})
      for (RopeDirection dir : {RopeDirection::Forward, RopeDirection::Inverse, RopeDirection::Transpose})
        for (bool in_place : {true, false})
          for (double a : {1.0, 1.17}) {
            Case c;
            c.dtype = dtype;
            c.layout = layout;
            c.D = shape.D;
            c.r = shape.r;
            c.k_heads = shape.k_heads;
            c.strides = strides;
            c.direction = dir;
            c.in_place = in_place;
            c.attention_factor = a;
            c.seed = seed++;
            worst_ratio = std::max(worst_ratio, run_case(c, targets));
            if (::testing::Test::HasFailure()) return;
          }
  // How much of the stated tolerance the worst element used (printed so the margin is visible in logs).
  std::printf("[ %s %s ] worst |fast - reference| = %.3f of tol over %zu targets\n", dtype_name(dtype),
              layout == RopeLayout::Interleaved ? "interleaved" : "half_split", worst_ratio, targets.size());
}

TEST(rope_kernels, F32HalfSplitMatchesReference) { sweep(DType::F32, RopeLayout::HalfSplit); }
TEST(rope_kernels, F32InterleavedMatchesReference) { sweep(DType::F32, RopeLayout::Interleaved); }
TEST(rope_kernels, Bf16HalfSplitMatchesReference) { sweep(DType::BF16, RopeLayout::HalfSplit); }
TEST(rope_kernels, Bf16InterleavedMatchesReference) { sweep(DType::BF16, RopeLayout::Interleaved); }
TEST(rope_kernels, F16HalfSplitMatchesReference) { sweep(DType::F16, RopeLayout::HalfSplit); }
TEST(rope_kernels, F16InterleavedMatchesReference) { sweep(DType::F16, RopeLayout::Interleaved); }
TEST(rope_kernels, F64HalfSplitMatchesReference) { sweep(DType::F64, RopeLayout::HalfSplit); }
TEST(rope_kernels, F64InterleavedMatchesReference) { sweep(DType::F64, RopeLayout::Interleaved); }

TEST(rope_kernels, ManyTokensUseThreadsAndStillMatch) {
  // Large enough to pass the OpenMP threshold (tokens * heads * D >= 2 * 32768 elements).
  Case c;
  c.D = 128;
  c.r = 128;
  c.tokens = 300;
  c.q_heads = 4;
  c.k_heads = 1;
  c.strides = Strides::PaddedHeads;
  c.in_place = false;
  EXPECT_LE(run_case(c, {detail::simd_targets().front()}), 1.0);
  c.dtype = DType::BF16;
  c.layout = RopeLayout::Interleaved;
  c.in_place = true;
  EXPECT_LE(run_case(c, {detail::simd_targets().front()}), 1.0);
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

// Every scaling type, through RopeSpec::freqs: the kernel only sees inv_freq and the attention factor, but the
// frequencies differ in range (long wavelengths, per-pair factors) and yarn/longrope bring attention factors != 1.
TEST(rope_kernels, EveryScalingTypeMatchesReference) {
  const RopeScaling all[] = {RopeScaling::None,    RopeScaling::Linear, RopeScaling::NtkFixed,
                             RopeScaling::NtkMixed, RopeScaling::Dynamic, RopeScaling::Yarn,
                             RopeScaling::Llama3,  RopeScaling::LongRope, RopeScaling::Explicit};
  uint64_t seed = 100;
  for (RopeScaling scaling : all) {
    RopeSpec spec;
    spec.head_dim = 96;
    spec.rotary_dim = 64;
    spec.layout = seed % 2 ? RopeLayout::Interleaved : RopeLayout::HalfSplit;
    spec.scaling = scaling;
    spec.factor = 8.0;
    spec.max_position_embeddings = 32768;
    spec.original_max_position_embeddings = 4096;
    for (int j = 0; j < 32; ++j) {
      spec.short_factor.push_back(1.0 + 0.05 * j);
      spec.long_factor.push_back(1.0 + 0.5 * j);
      spec.freq_factors.push_back(j < 16 ? 1.0 : 4.0);
    }
    const int64_t seq_len = 65536;  // beyond max_position_embeddings: dynamic and longrope take their long forms
    const RopeFreqs f = spec.freqs(seq_len);
    SCOPED_TRACE(spec.describe());
    for (DType dtype : {DType::F32, DType::BF16}) {
      for (RopeDirection dir : {RopeDirection::Forward, RopeDirection::Inverse}) {
        Case c;
        c.freqs = &f;
        c.D = f.head_dim;
        c.r = f.rotary_dim;
        c.layout = f.layout;
        c.dtype = dtype;
        c.direction = dir;
        c.strides = Strides::PaddedHeads;
        c.in_place = dir == RopeDirection::Forward;
        c.seed = seed++;
        EXPECT_LE(run_case(c, {detail::simd_targets().front()}), 1.0);
      }
    }
  }
}

// A NaN input never comes out as a number (bf16 rounding has no NaN branch; see RoundToBf16Bits).
TEST(rope_kernels, NanInputsStayNan) {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
      const RopeFreqs f = make_freqs(96, 70, layout);
      GuardedBuffer b(dtype, 2 * 96);
      test::fill_uniform(b, 11);
      const std::vector<int64_t> nan_at = {0, 3, 34, 35, 69, 70, 95, 96 + 17, 96 + 60};  // rotated and pass-through
      for (int64_t i : nan_at) b.set(i, std::nan(""));
      const std::vector<int64_t> pos = {12345, 1 << 24};
      RopeParams p;
      p.tokens = 2;
      p.positions = pos.data();
      p.dtype = dtype;
      p.q_in = {b.data(), 1, 96, 96};
      p.q_out = p.q_in;
      rope_apply(f, p);
      for (int64_t i : nan_at) EXPECT_TRUE(std::isnan(b.get(i))) << dtype_name(dtype) << " element " << i;
      EXPECT_TRUE(b.guards_intact());
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

TEST(rope_kernels, PositionsUpTo2Pow24AndBeyond) {
  // Around 2^24; 2e8 and 3e8 sit either side of the end of the fast angle reduction (|angle| <= 2e8 with
  // inv_freq[0] = 1); beyond it positions up to the int64 limits take the exact libm path.
  const int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  const std::vector<int64_t> pos = {(1 << 24) - 1, 1 << 24,           (1 << 24) + 1,     199999999, 200000001,
                                    300000000,     600000001, 700000000, 700000001, int64_t(1) << 31, int64_t(1) << 40, int64_t(1) << 53,
                                    kMax,          kMin,              -5};
  for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
    const RopeFreqs f = make_freqs(64, 64, layout);
    EXPECT_LE(fast_vs_reference_f32(f, pos, 8), element_tol(DType::F32, 1.0, 1.0));
    // F64 storage resolves errors ~1e-16, so an inexact reduction that fp32 would hide shows up here; every
    // target, since with FMA the reduction stays exact further out than without (SSE4 and below).
    Case c;
    c.dtype = DType::F64;
    c.layout = layout;
    c.tokens = int64_t(pos.size());
    c.k_heads = 0;
    c.positions = &pos;
    EXPECT_LE(run_case(c, detail::simd_targets()), 1.0);
  }
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
  try {
    rope_apply(f, p);
    ADD_FAILURE() << "no rotary::Error for " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field + " = "), std::string::npos) << e.what();
  }
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
