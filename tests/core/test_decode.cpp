// rotary/kv_cache.h: a decode step over a KvCache equals the last row of the prefill, for every position mode
// (None, Rope, Rerope, LeakyRerope; log-n; RoPER; attention factor; partial rotation; both layouts), every storage
// dtype and every compiled SIMD target; consecutive steps; GQA/MQA; a batch of caches; split-K across threads;
// the re-rotating baseline; capacity and bad input; guard zones.
//
// The oracle (decode_oracle) is written here from the definitions with ABSOLUTE rotations, as the seed computes
// them: near score (a R(pos_i) q) . (a R(pos_j) k), far score ReRoPE (a^2 R(w) q) . k, Leaky
// (a R((pos_i - w)/k + w) q) . (a R(pos_j/k) k), RoPER value R(-delta_ij) v_j. It reads the raw inputs, never
// the cache, so the cache's storage (rotated keys, permuted layout, near table, far copies) is under test too.
// The library's own float64 references (attention_decode_reference, attention_forward_reference) are checked
// against it as well.
//
// Tolerances, as root-mean-square error relative to the oracle's rms (sqrt(nmse)), in units of the storage
// type's unit roundoff u = dtype_eps:
//  - f16/bf16: the output is rounded once to the storage type (rms ~u/sqrt(3)); keys stored rotated are rounded
//    once more (a score of O(1) moves by ~u/3 rms, softmax passes that on); fp32 arithmetic is far below u.
//    Allowed 4 u (measured 0.4-0.7 u).
//  - f32: the same roundings plus fp32 cos/sin (a few ulps) and fp32 sums over n keys (~sqrt(n) ulps typical).
//    Allowed 64 u (measured 3-7 u, n up to 5000).
//  - f64: float64 sums (tiny) plus the angle itself: pos * inv_freq rounds to ~u * pos radians, and the kernels
//    form angles of distances while the oracle forms angles of absolute positions. Allowed 32 u + u * max
//    position (measured 4-9 u at positions ~200).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "harness.h"
#include "rotary/attention.h"
#include "rotary/error.h"
#include "rotary/kv_cache.h"
#include "rotary/rope_spec.h"
#include "simd_targets.h"

namespace rotary {
namespace {

using test::dtype_eps;
using test::GuardedBuffer;
using test::nmse;

struct Case {
  PositionMode mode = PositionMode::Rope;
  DType dtype = DType::F32;
  RopeLayout layout = RopeLayout::HalfSplit;
  int D = 32, rotary_dim = 32;
  int64_t Hq = 4, Hkv = 2, n = 97;
  int64_t window = 16;
  double leaky_k = 4;
  int64_t logn = 0;
  bool roper = false;
  double attention_factor = 1.0;
  int64_t q_gap = 0;  // q position = last cached position + q_gap
  uint64_t seed = 1;
};

std::string describe(const Case& c) {
  const char* modes[] = {"none", "rope", "rerope", "leaky"};
  return std::string(modes[int(c.mode)]) + " " + dtype_name(c.dtype) +
         (c.layout == RopeLayout::Interleaved ? " interleaved" : " half") + " D=" + std::to_string(c.D) +
         " r=" + std::to_string(c.rotary_dim) + " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
         " n=" + std::to_string(c.n) + (c.roper ? " roper" : "") + (c.logn ? " logn" : "") +
         " a=" + std::to_string(c.attention_factor);
}

RopeFreqs make_freqs(const Case& c) {
  RopeSpec spec;
  spec.head_dim = c.D;
  spec.rotary_dim = c.rotary_dim;
  spec.base = 10000.0;
  spec.layout = c.layout;
  RopeFreqs f = spec.freqs();
  f.attention_factor = c.attention_factor;
  return f;
}

PositionParams make_pos(const Case& c, const RopeFreqs* f) {
  PositionParams pp;
  pp.mode = c.mode;
  pp.freqs = c.mode == PositionMode::None ? nullptr : f;
  pp.roper = c.roper;
  pp.window = c.window;
  pp.leaky_k = c.leaky_k;
  pp.logn_train_len = c.logn;
  return pp;
}

// Strictly increasing positions with gaps of 1..3, starting at 2.
std::vector<int64_t> make_positions(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  int64_t p = 2;
  for (auto& x : pos) x = (p += 1 + int64_t(rng() % 3));
  return pos;
}

// y = factor R(angle) x on the rotary pairs, the rest unchanged.
std::vector<double> turn(const RopeFreqs& f, const std::vector<double>& x, double angle, double factor) {
  std::vector<double> y(x);
  const int r = f.rotary_dim;
  for (int i = 0; i < r / 2; ++i) {
    const int a = f.layout == RopeLayout::Interleaved ? 2 * i : i;
    const int b = f.layout == RopeLayout::Interleaved ? 2 * i + 1 : i + r / 2;
    const double c = std::cos(angle * f.inv_freq[size_t(i)]) * factor,
                 s = std::sin(angle * f.inv_freq[size_t(i)]) * factor;
    y[size_t(a)] = x[size_t(a)] * c - x[size_t(b)] * s;
    y[size_t(b)] = x[size_t(a)] * s + x[size_t(b)] * c;
  }
  return y;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

struct Rows {  // contiguous q [Hq, D], k, v [n, Hkv, D] in the storage dtype
  GuardedBuffer q, k, v;
  Rows(DType t, int64_t Hq, int64_t Hkv, int64_t n, int D) : q(t, Hq * D), k(t, n * Hkv * D), v(t, n * Hkv * D) {}
  std::vector<double> row(const GuardedBuffer& b, int64_t index, int D) const {
    std::vector<double> x(static_cast<size_t>(D));
    for (int d = 0; d < D; ++d) x[size_t(d)] = b.get(index * D + d);
    return x;
  }
};

// The decode step as the seed defines it: query at q_pos against keys [0, n) of the raw rows.
void decode_oracle(const PositionParams& pp, int D, int64_t Hq, int64_t Hkv, const Rows& rows, const int64_t* pos,
                   int64_t n, int64_t q_pos, double scale, std::vector<double>& o, std::vector<double>& lse) {
  o.assign(size_t(Hq * D), 0.0);
  lse.assign(size_t(Hq), 0.0);
  const RopeFreqs* f = pp.freqs;
  const double a = f ? f->attention_factor : 1.0, w = double(pp.window), kk = pp.leaky_k;
  const bool clipped = pp.mode == PositionMode::Rerope || pp.mode == PositionMode::LeakyRerope;
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t g = h / (Hq / Hkv);
    std::vector<double> q = rows.row(rows.q, h, D);
    double lam = scale;
    if (pp.logn_train_len > 1) lam *= std::max(1.0, std::log(double(q_pos) + 1) / std::log(double(pp.logn_train_len)));
    for (double& x : q) x *= lam;
    std::vector<double> s(static_cast<size_t>(n)), delta(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      const std::vector<double> k = rows.row(rows.k, j * Hkv + g, D);
      const double d = double(q_pos - pos[j]);
      delta[size_t(j)] = d;
      if (pp.mode == PositionMode::None) {
        s[size_t(j)] = dot(q, k);
      } else if (!clipped || d < w) {
        s[size_t(j)] = dot(turn(*f, q, double(q_pos), a), turn(*f, k, double(pos[j]), a));
      } else if (pp.mode == PositionMode::Rerope) {
        s[size_t(j)] = dot(turn(*f, q, w, a * a), k);
        delta[size_t(j)] = w;
      } else {
        s[size_t(j)] = dot(turn(*f, q, (double(q_pos) - w) / kk + w, a), turn(*f, k, double(pos[j]) / kk, a));
        delta[size_t(j)] = w + (d - w) / kk;
      }
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double x : s) sum += std::exp(x - mx);
    for (int64_t j = 0; j < n; ++j) {
      std::vector<double> v = rows.row(rows.v, j * Hkv + g, D);
      if (pp.roper) v = turn(*f, v, -delta[size_t(j)], 1.0);
      const double p = std::exp(s[size_t(j)] - mx) / sum;
      for (int d = 0; d < D; ++d) o[size_t(h * D + d)] += p * v[size_t(d)];
    }
    lse[size_t(h)] = mx + std::log(sum);
  }
}

double tolerance(DType t, int64_t max_pos) {
  const double u = dtype_eps(t);
  switch (t) {
    case DType::F64: return 32 * u + u * double(max_pos);
    case DType::F32: return 64 * u;
    default: return 4 * u;
  }
}

HeadsView view(GuardedBuffer& b, int64_t heads, int D) { return {b.data(), heads, heads * D, D}; }

// Fills a cache with c.n random tokens (all appended at once, or in pieces of `piece`), decodes the last one with
// the fast kernel and the float64 reference, and checks both and lse against the oracle.
void check_case(const Case& c, int64_t piece = 0, int threads = 0, int64_t split = 0) {
  SCOPED_TRACE(describe(c));
  const RopeFreqs f = make_freqs(c);
  const PositionParams pp = make_pos(c, &f);
  Rows rows(c.dtype, c.Hq, c.Hkv, c.n, c.D);
  test::fill_uniform(rows.q, c.seed * 3 + 0);
  test::fill_uniform(rows.k, c.seed * 3 + 1);
  test::fill_uniform(rows.v, c.seed * 3 + 2);
  const std::vector<int64_t> pos = make_positions(c.n, c.seed);
  KvCache cache({c.n, c.Hkv, c.D, c.dtype, pp});
  const int64_t step = piece > 0 ? piece : c.n;
  for (int64_t t = 0; t < c.n; t += step) {
    const int64_t m = std::min(step, c.n - t);
    const int64_t off = t * c.Hkv * c.D * int64_t(dtype_size(c.dtype));
    HeadsView kv{static_cast<uint8_t*>(rows.k.data()) + off, c.Hkv, c.Hkv * c.D, c.D};
    HeadsView vv{static_cast<uint8_t*>(rows.v.data()) + off, c.Hkv, c.Hkv * c.D, c.D};
    cache.append(m, kv, vv, pos.data() + t);
  }
  const int64_t q_pos = pos.back() + c.q_gap;
  const double scale = 1.0 / std::sqrt(double(c.D)) * 1.1;
  std::vector<double> o_ref, lse_ref;
  decode_oracle(pp, c.D, c.Hq, c.Hkv, rows, pos.data(), c.n, q_pos, scale, o_ref, lse_ref);

  const DType lse_t = c.dtype == DType::F64 ? DType::F64 : DType::F32;
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "attention_decode" : "attention_decode_reference");
    GuardedBuffer o(c.dtype, c.Hq * c.D), lse(lse_t, c.Hq);
    DecodeParams p;
    p.q = view(rows.q, c.Hq, c.D);
    p.o = view(o, c.Hq, c.D);
    p.lse = lse.data();
    p.q_positions = &q_pos;
    p.softmax_scale = scale;
    p.threads = threads;
    p.split_keys = split;
    if (which == 0)
      attention_decode(cache, p);
    else
      attention_decode_reference(cache, p);
    const double err = std::sqrt(nmse(o.to_double(), o_ref));
    EXPECT_LE(err, tolerance(c.dtype, q_pos)) << "rms error / u = " << err / dtype_eps(c.dtype);
    // lse is stored in fp32 (f64 for F64): its own rounding plus the score error above, absolute.
    for (int64_t h = 0; h < c.Hq; ++h)
      EXPECT_NEAR(lse.get(h), lse_ref[size_t(h)], 4 * tolerance(c.dtype, q_pos) * (1 + std::fabs(lse_ref[size_t(h)])));
    EXPECT_TRUE(o.guards_intact());
    EXPECT_TRUE(lse.guards_intact());
  }
}

std::vector<Case> mode_cases() {
  std::vector<Case> cases;
  for (PositionMode mode : {PositionMode::None, PositionMode::Rope, PositionMode::Rerope, PositionMode::LeakyRerope})
    for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
      Case c;
      c.mode = mode;
      c.dtype = t;
      c.seed = 10 + cases.size();
      cases.push_back(c);
      if (mode == PositionMode::None) continue;
      c.layout = RopeLayout::Interleaved;  // partial rotation, log-n, attention factor, RoPER, MQA, a q gap
      c.D = 48;
      c.rotary_dim = 20;
      c.logn = 16;
      c.attention_factor = 1.25;
      c.roper = true;
      c.Hq = 3;
      c.Hkv = 1;
      c.q_gap = 3;
      c.seed = 100 + cases.size();
      cases.push_back(c);
    }
  return cases;
}

TEST(Decode, StepEqualsLastRowOfPrefillEveryModeDtypeTarget) {
  for (int64_t target : detail::simd_targets()) {
    SCOPED_TRACE(detail::simd_target_name(target));
    detail::force_simd_target(target);
    for (const Case& c : mode_cases()) check_case(c);
  }
  detail::force_simd_target(0);
}

TEST(Decode, MhaGqaMqaAndOddHeadDims) {
  for (auto [Hq, Hkv, D, r] : std::vector<std::tuple<int64_t, int64_t, int, int>>{
           {4, 4, 16, 16}, {8, 2, 40, 40}, {6, 1, 70, 64}, {2, 2, 130, 128}, {5, 5, 18, 2}}) {
    for (PositionMode mode : {PositionMode::Rope, PositionMode::Rerope, PositionMode::LeakyRerope}) {
      Case c;
      c.mode = mode;
      c.Hq = Hq, c.Hkv = Hkv, c.D = D, c.rotary_dim = r, c.n = 75, c.window = 9;
      c.seed = uint64_t(Hq * 100 + D);
      check_case(c);
    }
  }
}

// Tokens appended one at a time, a decode after each: every step equals the oracle over the prefix, while the
// near/far boundary moves through the cache (w = 6) and RoPER's far sum is turned each step.
TEST(Decode, ConsecutiveSteps) {
  for (PositionMode mode : {PositionMode::Rope, PositionMode::Rerope, PositionMode::LeakyRerope})
    for (bool roper : {false, true}) {
      Case c;
      c.mode = mode;
      c.roper = roper;
      c.window = 6;
      c.leaky_k = 3;
      c.logn = 8;
      const RopeFreqs f = make_freqs(c);
      const PositionParams pp = make_pos(c, &f);
      const int64_t steps = 40;
      Rows rows(c.dtype, c.Hq, c.Hkv, steps, c.D);
      test::fill_uniform(rows.k, 7), test::fill_uniform(rows.v, 8);
      const std::vector<int64_t> pos = make_positions(steps, 9);
      KvCache cache({steps, c.Hkv, c.D, c.dtype, pp});
      GuardedBuffer q_all(c.dtype, steps * c.Hq * c.D);
      test::fill_uniform(q_all, 10);
      for (int64_t t = 0; t < steps; ++t) {
        SCOPED_TRACE(describe(c) + " step " + std::to_string(t));
        const int64_t off = t * c.Hkv * c.D;
        cache.append(1, {static_cast<float*>(rows.k.data()) + off, c.Hkv, c.Hkv * c.D, c.D},
                     {static_cast<float*>(rows.v.data()) + off, c.Hkv, c.Hkv * c.D, c.D}, &pos[size_t(t)]);
        for (int64_t i = 0; i < c.Hq * c.D; ++i) rows.q.set(i, q_all.get(t * c.Hq * c.D + i));
        GuardedBuffer o(c.dtype, c.Hq * c.D);
        DecodeParams p;
        p.q = view(rows.q, c.Hq, c.D);
        p.o = view(o, c.Hq, c.D);  // q_positions null: the last cached position
        attention_decode(cache, p);
        std::vector<double> o_ref, lse_ref;
        decode_oracle(pp, c.D, c.Hq, c.Hkv, rows, pos.data(), t + 1, pos[size_t(t)], 1 / std::sqrt(double(c.D)), o_ref,
                      lse_ref);
        EXPECT_LE(std::sqrt(nmse(o.to_double(), o_ref)), tolerance(c.dtype, pos.back()));
      }
    }
}

TEST(Decode, AppendInPiecesEqualsAppendAtOnce) {
  Case c;
  c.mode = PositionMode::LeakyRerope;
  c.roper = true;
  c.dtype = DType::BF16;
  check_case(c, 7);
}

// attention_forward_reference (engineer "attention") on the whole sequence: its last query row is the step.
TEST(Decode, MatchesAttentionForwardReferenceLastRow) {
  for (PositionMode mode : {PositionMode::Rope, PositionMode::Rerope, PositionMode::LeakyRerope})
    for (bool roper : {false, true}) {
      Case c;
      c.mode = mode, c.roper = roper, c.dtype = DType::F64, c.logn = 20, c.attention_factor = 1.1, c.n = 60;
      c.rotary_dim = 16, c.layout = RopeLayout::Interleaved;
      SCOPED_TRACE(describe(c));
      const RopeFreqs f = make_freqs(c);
      const PositionParams pp = make_pos(c, &f);
      const int64_t n = c.n;
      // Prefill layout [n, H, D]; the decode's q is the last token's query.
      GuardedBuffer q(c.dtype, n * c.Hq * c.D), k(c.dtype, n * c.Hkv * c.D), v(c.dtype, n * c.Hkv * c.D),
          o(c.dtype, n * c.Hq * c.D), o_dec(c.dtype, c.Hq * c.D);
      test::fill_uniform(q, 21), test::fill_uniform(k, 22), test::fill_uniform(v, 23);
      const std::vector<int64_t> pos = make_positions(n, 24);
      AttentionParams ap;
      ap.tokens = n, ap.head_dim = c.D, ap.dtype = c.dtype;
      ap.q = view(q, c.Hq, c.D), ap.k = view(k, c.Hkv, c.D), ap.v = view(v, c.Hkv, c.D), ap.o = view(o, c.Hq, c.D);
      ap.positions = pos.data(), ap.causal = true, ap.pos = pp;
      attention_forward_reference(ap);

      KvCache cache({n, c.Hkv, c.D, c.dtype, pp});
      cache.append(n, view(k, c.Hkv, c.D), view(v, c.Hkv, c.D), pos.data());
      DecodeParams p;
      p.q = {static_cast<double*>(q.data()) + (n - 1) * c.Hq * c.D, c.Hq, c.Hq * c.D, c.D};
      p.o = view(o_dec, c.Hq, c.D);
      attention_decode(cache, p);
      const std::vector<double> all = o.to_double();
      const std::vector<double> last(all.end() - c.Hq * c.D, all.end());
      EXPECT_LE(std::sqrt(nmse(o_dec.to_double(), last)), tolerance(c.dtype, pos.back()));
    }
}

// Split-K across threads: fixed chunks give the same bits on 1 and 2 threads; chunked equals unchunked within
// rounding; a window past the near table (distances > 8192 computed per key) still equals the oracle.
TEST(Decode, LongCacheSplitAcrossThreads) {
  Case c;
  c.mode = PositionMode::Rerope;
  c.Hq = 4, c.Hkv = 1, c.D = 64, c.rotary_dim = 64, c.n = 5000, c.window = 20000;
  check_case(c, 0, 2, 300);  // positions step 1..3: all keys near, distances past 8192 computed per key
  c.mode = PositionMode::LeakyRerope, c.window = 700, c.roper = true;
  check_case(c, 0, 2, 512);

  const RopeFreqs f = make_freqs(c);
  const PositionParams pp = make_pos(c, &f);
  Rows rows(c.dtype, c.Hq, c.Hkv, c.n, c.D);
  test::fill_uniform(rows.q, 31), test::fill_uniform(rows.k, 32), test::fill_uniform(rows.v, 33);
  const std::vector<int64_t> pos = make_positions(c.n, 34);
  KvCache cache({c.n, c.Hkv, c.D, c.dtype, pp});
  cache.append(c.n, view(rows.k, c.Hkv, c.D), view(rows.v, c.Hkv, c.D), pos.data());
  auto run = [&](int threads, int64_t split) {
    GuardedBuffer o(c.dtype, c.Hq * c.D);
    DecodeParams p;
    p.q = view(rows.q, c.Hq, c.D), p.o = view(o, c.Hq, c.D), p.threads = threads, p.split_keys = split;
    attention_decode(cache, p);
    return o.to_double();
  };
  EXPECT_EQ(run(1, 256), run(2, 256));
  EXPECT_LE(std::sqrt(nmse(run(2, 256), run(1, c.n))), tolerance(c.dtype, 0));
  EXPECT_EQ(run(2, 0), run(2, 0));  // automatic split is deterministic for a thread count
}

TEST(Decode, BatchOfCachesWithOwnLengthsAndModes) {
  std::vector<Case> cases(3);
  cases[0].mode = PositionMode::Rope, cases[0].n = 30;
  cases[1].mode = PositionMode::Rerope, cases[1].n = 81, cases[1].window = 10;
  cases[2].mode = PositionMode::LeakyRerope, cases[2].n = 5, cases[2].window = 3, cases[2].roper = true;
  const int D = 32;
  const int64_t Hq = 4, Hkv = 2, B = 3;
  std::vector<RopeFreqs> freqs;
  for (const Case& c : cases) freqs.push_back(make_freqs(c));
  std::vector<KvCache> caches;
  std::vector<Rows> rows;
  std::vector<std::vector<int64_t>> pos;
  GuardedBuffer q(DType::F32, B * Hq * D), o(DType::F32, B * Hq * D);
  test::fill_uniform(q, 41);
  for (int64_t b = 0; b < B; ++b) {
    const Case& c = cases[size_t(b)];
    rows.emplace_back(DType::F32, Hq, Hkv, c.n, D);
    test::fill_uniform(rows[size_t(b)].k, 42 + b), test::fill_uniform(rows[size_t(b)].v, 52 + b);
    for (int64_t i = 0; i < Hq * D; ++i) rows[size_t(b)].q.set(i, q.get(b * Hq * D + i));
    pos.push_back(make_positions(c.n, 60 + b));
    caches.emplace_back(KvCacheConfig{c.n + 5, Hkv, D, DType::F32, make_pos(c, &freqs[size_t(b)])});
    caches.back().append(c.n, view(rows[size_t(b)].k, Hkv, D), view(rows[size_t(b)].v, Hkv, D), pos.back().data());
  }
  std::vector<const KvCache*> ptrs{&caches[0], &caches[1], &caches[2]};
  DecodeParams p;
  p.q = view(q, Hq, D), p.o = view(o, Hq, D);
  attention_decode(ptrs, p);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> o_ref, lse_ref;
    decode_oracle(caches[size_t(b)].pos(), D, Hq, Hkv, rows[size_t(b)], pos[size_t(b)].data(), cases[size_t(b)].n,
                  pos[size_t(b)].back(), 1 / std::sqrt(double(D)), o_ref, lse_ref);
    const std::vector<double> all = o.to_double();
    const std::vector<double> got(all.begin() + b * Hq * D, all.begin() + (b + 1) * Hq * D);
    EXPECT_LE(std::sqrt(nmse(got, o_ref)), tolerance(DType::F32, 0)) << "sequence " << b;
  }
}

// RoPER must rotate each value once (R(pos_j - pos_i)); a published implementation rotated twice (R(2 pos_j -
// pos_i)). The step must match the definition and be far from the mistake.
TEST(Decode, RoperRotatesValuesOnce) {
  Case c;
  c.roper = true, c.n = 20;
  const RopeFreqs f = make_freqs(c);
  const PositionParams pp = make_pos(c, &f);
  Rows rows(c.dtype, c.Hq, c.Hkv, c.n, c.D);
  test::fill_uniform(rows.q, 71), test::fill_uniform(rows.k, 72), test::fill_uniform(rows.v, 73);
  const std::vector<int64_t> pos = make_positions(c.n, 74);
  KvCache cache({c.n, c.Hkv, c.D, c.dtype, pp});
  cache.append(c.n, view(rows.k, c.Hkv, c.D), view(rows.v, c.Hkv, c.D), pos.data());
  GuardedBuffer o(c.dtype, c.Hq * c.D);
  DecodeParams p;
  p.q = view(rows.q, c.Hq, c.D), p.o = view(o, c.Hq, c.D);
  attention_decode(cache, p);
  std::vector<double> good, twice, lse;
  decode_oracle(pp, c.D, c.Hq, c.Hkv, rows, pos.data(), c.n, pos.back(), 1 / std::sqrt(double(c.D)), good, lse);
  Rows wrong(c.dtype, c.Hq, c.Hkv, c.n, c.D);  // values pre-rotated by R(pos_j): the oracle then turns them again
  for (int64_t i = 0; i < c.Hq * c.D; ++i) wrong.q.set(i, rows.q.get(i));
  for (int64_t j = 0; j < c.n; ++j)
    for (int64_t g = 0; g < c.Hkv; ++g) {
      const std::vector<double> v = turn(f, rows.row(rows.v, j * c.Hkv + g, c.D), double(pos[size_t(j)]), 1.0);
      for (int d = 0; d < c.D; ++d) {
        wrong.v.set((j * c.Hkv + g) * c.D + d, v[size_t(d)]);
        wrong.k.set((j * c.Hkv + g) * c.D + d, rows.k.get((j * c.Hkv + g) * c.D + d));
      }
    }
  decode_oracle(pp, c.D, c.Hq, c.Hkv, wrong, pos.data(), c.n, pos.back(), 1 / std::sqrt(double(c.D)), twice, lse);
  EXPECT_LE(std::sqrt(nmse(o.to_double(), good)), tolerance(c.dtype, 0));
  EXPECT_GT(std::sqrt(nmse(o.to_double(), twice)), 0.1);
}

TEST(Decode, RerotateBaselineEqualsFastStep) {
  for (PositionMode mode : {PositionMode::Rerope, PositionMode::LeakyRerope}) {
    Case c;
    c.mode = mode, c.n = 300, c.window = 40, c.attention_factor = 1.2, c.logn = 64;
    const RopeFreqs f = make_freqs(c);
    const PositionParams pp = make_pos(c, &f);
    Rows rows(c.dtype, c.Hq, c.Hkv, c.n, c.D);
    test::fill_uniform(rows.q, 81), test::fill_uniform(rows.k, 82), test::fill_uniform(rows.v, 83);
    const std::vector<int64_t> pos = make_positions(c.n, 84);
    KvCache cache({c.n, c.Hkv, c.D, c.dtype, pp});
    cache.append(c.n, view(rows.k, c.Hkv, c.D), view(rows.v, c.Hkv, c.D), pos.data());
    GuardedBuffer o(c.dtype, c.Hq * c.D);
    DecodeParams p;
    p.q = view(rows.q, c.Hq, c.D), p.o = view(o, c.Hq, c.D);
    std::vector<float> scratch;
    attention_decode_rerotate_baseline(cache, p, scratch);
    std::vector<double> o_ref, lse;
    decode_oracle(pp, c.D, c.Hq, c.Hkv, rows, pos.data(), c.n, pos.back(), 1 / std::sqrt(double(c.D)), o_ref, lse);
    EXPECT_LE(std::sqrt(nmse(o.to_double(), o_ref)), tolerance(c.dtype, 0));
  }
}

// o written through a strided view (padding between heads and sequences): nothing outside the view changes.
TEST(Decode, StridedOutputTouchesOnlyItsView) {
  Case c;
  c.mode = PositionMode::Rerope, c.dtype = DType::BF16;
  const RopeFreqs f = make_freqs(c);
  Rows rows(c.dtype, c.Hq, c.Hkv, c.n, c.D);
  test::fill_uniform(rows.q, 91), test::fill_uniform(rows.k, 92), test::fill_uniform(rows.v, 93);
  const std::vector<int64_t> pos = make_positions(c.n, 94);
  KvCache cache({c.n, c.Hkv, c.D, c.dtype, make_pos(c, &f)});
  cache.append(c.n, view(rows.k, c.Hkv, c.D), view(rows.v, c.Hkv, c.D), pos.data());
  const int64_t hs = c.D + 5;
  GuardedBuffer o(c.dtype, c.Hq * hs + 3);
  for (int64_t i = 0; i < o.size(); ++i) o.set(i, 7.0);
  DecodeParams p;
  p.q = view(rows.q, c.Hq, c.D);
  p.o = {o.data(), c.Hq, c.Hq * hs + 3, hs};
  attention_decode(cache, p);
  for (int64_t i = 0; i < o.size(); ++i) {
    const bool inside = i < c.Hq * hs && i % hs < c.D;
    if (inside)
      EXPECT_LT(std::fabs(o.get(i)), 1.01) << i;  // a convex combination of values in [-1, 1]
    else
      EXPECT_EQ(o.get(i), 7.0) << i;
  }
  EXPECT_TRUE(o.guards_intact());
}

// A NaN in one cached key reaches exactly the query heads of its kv group (no silent drop by the exp), through
// every chunk of a split; a NaN in one query head reaches only that head.
TEST(Decode, NanReachesExactlyTheHeadsThatSeeIt) {
  for (PositionMode mode : {PositionMode::Rope, PositionMode::Rerope}) {
    Case c;
    c.mode = mode, c.n = 200, c.window = 20;
    const RopeFreqs f = make_freqs(c);
    Rows rows(c.dtype, c.Hq, c.Hkv, c.n, c.D);
    test::fill_uniform(rows.q, 1), test::fill_uniform(rows.k, 2), test::fill_uniform(rows.v, 3);
    for (int64_t j : {int64_t(5), c.n - 2}) {  // a far key and a near key of kv head 1
      SCOPED_TRACE("key " + std::to_string(j));
      Rows bad = rows;
      bad.k.set((j * c.Hkv + 1) * c.D + 3, std::nan(""));
      const std::vector<int64_t> pos = make_positions(c.n, 4);
      KvCache cache({c.n, c.Hkv, c.D, c.dtype, make_pos(c, &f)});
      cache.append(c.n, view(bad.k, c.Hkv, c.D), view(bad.v, c.Hkv, c.D), pos.data());
      for (int64_t split : {int64_t(0), int64_t(64)}) {
        GuardedBuffer o(c.dtype, c.Hq * c.D), lse(DType::F32, c.Hq);
        DecodeParams p;
        p.q = view(bad.q, c.Hq, c.D), p.o = view(o, c.Hq, c.D), p.lse = lse.data(), p.split_keys = split;
        attention_decode(cache, p);
        const int64_t G = c.Hq / c.Hkv;
        for (int64_t h = 0; h < c.Hq; ++h) {
          const bool sees = h / G == 1;
          for (int d = 0; d < c.D; ++d) EXPECT_EQ(std::isnan(o.get(h * c.D + d)), sees) << "head " << h;
          EXPECT_EQ(std::isnan(lse.get(h)), sees) << "head " << h;
        }
      }
    }
    Rows bad = rows;  // NaN in query head 2 only
    bad.q.set(2 * c.D + 7, std::nan(""));
    const std::vector<int64_t> pos = make_positions(c.n, 4);
    KvCache cache({c.n, c.Hkv, c.D, c.dtype, make_pos(c, &f)});
    cache.append(c.n, view(bad.k, c.Hkv, c.D), view(bad.v, c.Hkv, c.D), pos.data());
    GuardedBuffer o(c.dtype, c.Hq * c.D);
    DecodeParams p;
    p.q = view(bad.q, c.Hq, c.D), p.o = view(o, c.Hq, c.D);
    attention_decode(cache, p);
    for (int64_t h = 0; h < c.Hq; ++h) EXPECT_EQ(std::isnan(o.get(h * c.D)), h == 2) << "head " << h;
  }
}

template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no rotary::Error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Decode, CapacityIsEnforcedWithAClearError) {
  Case c;
  const RopeFreqs f = make_freqs(c);
  Rows rows(c.dtype, c.Hq, c.Hkv, 5, c.D);
  test::fill_uniform(rows.k, 1), test::fill_uniform(rows.v, 2);
  KvCache cache({4, c.Hkv, c.D, c.dtype, make_pos(c, &f)});
  const std::vector<int64_t> pos{0, 1, 2, 3, 4};
  cache.append(4, view(rows.k, c.Hkv, c.D), view(rows.v, c.Hkv, c.D), pos.data());
  expect_error([&] { cache.append(1, view(rows.k, c.Hkv, c.D), view(rows.v, c.Hkv, c.D), &pos[4]); },
               "kv_cache.append: size 4 + 1 exceeds capacity = 4");
  EXPECT_EQ(cache.size(), 4);
  cache.clear();
  EXPECT_EQ(cache.size(), 0);
  cache.append(2, view(rows.k, c.Hkv, c.D), view(rows.v, c.Hkv, c.D), pos.data());
  EXPECT_EQ(cache.size(), 2);
}

// Keys and values handed over head-major ([1, Hkv, n, D] transposed to [n, Hkv, D]: token_stride = D) fill the
// cache exactly as the same rows handed over token-major: the decode outputs are bitwise equal.
// KvCacheConfig::threads (the Params convention of rope.h): an append split over 2 threads stores bitwise what one
// thread stores, in every array the cache keeps (LeakyRerope with RoPER keeps all four).
TEST(Decode, AppendThreadsStoreTheSameBits) {
  Case c;
  c.mode = PositionMode::LeakyRerope;
  c.roper = true;
  const RopeFreqs f = make_freqs(c);
  const int64_t n = 64;  // n * kv_heads >= 64: append goes parallel
  Rows rows(c.dtype, c.Hq, c.Hkv, n, c.D);
  test::fill_uniform(rows.k, 2), test::fill_uniform(rows.v, 3);
  const std::vector<int64_t> pos = make_positions(n, 5);
  KvCacheConfig cfg{n, c.Hkv, c.D, c.dtype, make_pos(c, &f)};
  cfg.threads = 1;
  KvCache one(cfg);
  cfg.threads = 2;
  KvCache two(cfg);
  for (KvCache* cache : {&one, &two})
    cache->append(n, view(rows.k, c.Hkv, c.D), view(rows.v, c.Hkv, c.D), pos.data());
  const size_t bytes = size_t(c.Hkv * n * one.layout().row_stride) * dtype_size(c.dtype);
  for (auto get : {&KvCache::keys, &KvCache::keys_far, &KvCache::values, &KvCache::values_far}) {
    ASSERT_NE((one.*get)(), nullptr);
    EXPECT_EQ(std::memcmp((one.*get)(), (two.*get)(), bytes), 0);
  }
}

TEST(Decode, HeadMajorAppendEqualsTokenMajor) {
  for (PositionMode mode : {PositionMode::Rope, PositionMode::LeakyRerope}) {
    Case c;
    c.mode = mode;
    c.roper = true;
    const RopeFreqs f = make_freqs(c);
    const int64_t n = 21;
    Rows rows(c.dtype, c.Hq, c.Hkv, n, c.D);
    test::fill_uniform(rows.q, 1), test::fill_uniform(rows.k, 2), test::fill_uniform(rows.v, 3);
    GuardedBuffer kh(c.dtype, n * c.Hkv * c.D), vh(c.dtype, n * c.Hkv * c.D);  // [Hkv, n, D]
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < c.Hkv; ++h)
        for (int d = 0; d < c.D; ++d) {
          kh.set((h * n + t) * c.D + d, rows.k.get((t * c.Hkv + h) * c.D + d));
          vh.set((h * n + t) * c.D + d, rows.v.get((t * c.Hkv + h) * c.D + d));
        }
    const std::vector<int64_t> pos = make_positions(n, 7);
    KvCache token_major({n, c.Hkv, c.D, c.dtype, make_pos(c, &f)}), head_major({n, c.Hkv, c.D, c.dtype, make_pos(c, &f)});
    token_major.append(n, view(rows.k, c.Hkv, c.D), view(rows.v, c.Hkv, c.D), pos.data());
    head_major.append(n, {kh.data(), c.Hkv, c.D, n * c.D}, {vh.data(), c.Hkv, c.D, n * c.D}, pos.data());
    GuardedBuffer o1(c.dtype, c.Hq * c.D), o2(c.dtype, c.Hq * c.D);
    DecodeParams p;
    p.q = view(rows.q, c.Hq, c.D);
    p.o = view(o1, c.Hq, c.D);
    attention_decode(token_major, p);
    p.o = view(o2, c.Hq, c.D);
    attention_decode(head_major, p);
    EXPECT_EQ(o1.to_double(), o2.to_double()) << describe(c);
    double sum = 0;
    for (double x : o1.to_double()) sum += std::fabs(x);
    EXPECT_GT(sum, 0.0);  // the outputs are not trivially equal
  }
}

TEST(Decode, BadInputNamesTheField) {
  Case c;
  const RopeFreqs f = make_freqs(c);
  Rows rows(c.dtype, c.Hq, c.Hkv, 4, c.D);
  test::fill_uniform(rows.q, 1), test::fill_uniform(rows.k, 2), test::fill_uniform(rows.v, 3);
  auto config = [&](PositionMode mode) {
    Case m = c;
    m.mode = mode;
    return KvCacheConfig{8, c.Hkv, c.D, c.dtype, make_pos(m, &f)};
  };
  auto k = view(rows.k, c.Hkv, c.D), v = view(rows.v, c.Hkv, c.D);

  KvCacheConfig cfg = config(PositionMode::Rerope);
  cfg.pos.window = 0;
  expect_error([&] { KvCache x(cfg); }, "pos.window");
  cfg = config(PositionMode::LeakyRerope);
  cfg.pos.leaky_k = 0;
  expect_error([&] { KvCache x(cfg); }, "pos.leaky_k");
  cfg = config(PositionMode::Rope);
  cfg.pos.freqs = nullptr;
  expect_error([&] { KvCache x(cfg); }, "pos.freqs");
  cfg = config(PositionMode::Rope);
  cfg.head_dim = 16;
  expect_error([&] { KvCache x(cfg); }, "pos.freqs->head_dim");
  cfg = config(PositionMode::None);
  cfg.pos.roper = true;
  expect_error([&] { KvCache x(cfg); }, "pos.roper");
  cfg = config(PositionMode::Rope);
  cfg.pos.logn_train_len = 1;
  expect_error([&] { KvCache x(cfg); }, "pos.logn_train_len");
  cfg = config(PositionMode::Rope);
  cfg.capacity = 0;
  expect_error([&] { KvCache x(cfg); }, "capacity");
  cfg = config(PositionMode::Rope);
  cfg.threads = -1;
  expect_error([&] { KvCache x(cfg); }, "threads");

  KvCache cache(config(PositionMode::Rope));
  const std::vector<int64_t> bad{3, 3, 5, 6};
  expect_error([&] { cache.append(2, k, v, bad.data()); }, "positions[1]");
  EXPECT_EQ(cache.size(), 0);
  HeadsView wrong_heads = k;
  wrong_heads.heads = 1;
  expect_error([&] { cache.append(1, wrong_heads, v, bad.data()); }, "k.heads");
  HeadsView overlapping = v;
  overlapping.token_stride = c.D;
  expect_error([&] { cache.append(2, k, overlapping, &bad[1]); }, "v.token_stride");

  GuardedBuffer o(c.dtype, c.Hq * c.D);
  DecodeParams p;
  p.q = view(rows.q, c.Hq, c.D), p.o = view(o, c.Hq, c.D);
  expect_error([&] { attention_decode(cache, p); }, "size()");  // empty cache
  cache.append(2, k, v, &bad[1]);
  const int64_t early = 4;
  p.q_positions = &early;
  expect_error([&] { attention_decode(cache, p); }, "q_positions[0]");
  p.q_positions = nullptr;
  p.q.heads = 3;
  p.o.heads = 3;
  expect_error([&] { attention_decode(cache, p); }, "q.heads");
  p.q.heads = p.o.heads = c.Hq;
  p.o.data = nullptr;
  expect_error([&] { attention_decode(cache, p); }, "o.data");
  p.o = view(o, c.Hq, c.D);
  p.softmax_scale = -1;
  expect_error([&] { attention_decode(cache, p); }, "softmax_scale");
  p.softmax_scale = 0;

  KvCacheConfig other = config(PositionMode::Rope);
  other.dtype = DType::BF16;
  KvCache c2(other);
  GuardedBuffer kb(DType::BF16, c.Hkv * c.D);
  c2.append(1, view(kb, c.Hkv, c.D), view(kb, c.Hkv, c.D), bad.data());
  std::vector<const KvCache*> two{&cache, &c2};
  expect_error([&] { attention_decode(two, p); }, "caches[1].dtype()");
  std::vector<float> scratch;
  expect_error([&] { attention_decode_rerotate_baseline(cache, p, scratch); }, "cache.pos().mode");
}

}  // namespace
}  // namespace rotary
