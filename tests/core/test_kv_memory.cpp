// rotary/kv_memory.h: the retrieval memory. The oracle for the policies is full attention: with top_k = the memory
// size, the local window's decode step merged with memory attention must equal one decode step over every token
// (attention_decode_reference) - RoPE with true positions for `exact`, ReRoPE for `rerope` (memory keys all past
// the window). Then top-k selection against brute force, the fast path against the float64 oracle, `none`'s
// distance-0 placement, and bad input.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "../../fuzz/kv_memory_seeds.h"
#include "expect_error.h"
#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/kv_cache.h"
#include "rotary/kv_memory.h"
#include "rotary/rope_spec.h"

namespace rotary {
namespace {

struct Problem {
  int D = 32, Hq = 4, Hkv = 2;
  int64_t tokens = 50, window = 10;  // the last `window` tokens are local, the rest in memory
  std::vector<float> q, k, v;        // q [Hq, D] (one query); k, v [tokens, Hkv, D]
  std::vector<int64_t> pos;          // increasing, with gaps
  explicit Problem(int head_dim = 32, int q_heads = 4, int kv_heads = 2) : D(head_dim), Hq(q_heads), Hkv(kv_heads) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1, 1);
    q.resize(size_t(Hq * D));
    k.resize(size_t(tokens * Hkv * D));
    v.resize(k.size());
    for (float& x : q) x = 2 * u(rng);  // larger logits: a peaked softmax, so a wrong key shows
    for (float& x : k) x = u(rng);
    for (float& x : v) x = u(rng);
    int64_t p = 3;
    for (int64_t t = 0; t < tokens; ++t) pos.push_back(p += 1 + int64_t(rng() % 3));
  }
  HeadsView kv_view(std::vector<float>& x, int64_t first) const {
    return {x.data() + first * Hkv * D, Hkv, Hkv * D, D};
  }
  // A memory of every token under `policy`.
  KvMemory all_in_memory(const RopeFreqs& f, MemoryPolicy policy = MemoryPolicy::Exact) {
    KvMemory m({Hkv, D, policy, &f, 0, 0});
    m.append(tokens, kv_view(k, 0), kv_view(v, 0), pos.data());
    return m;
  }
};

RopeFreqs freqs_for(int D, RopeLayout layout = RopeLayout::HalfSplit, int rotary_dim = 0, double factor = 1.0) {
  RopeSpec s;
  s.head_dim = D;
  s.rotary_dim = rotary_dim;
  s.layout = layout;
  s.base = 100;  // fast turning pairs: distances matter within a few tokens
  RopeFreqs f = s.freqs();
  f.attention_factor = factor;
  return f;
}

// One decode step (the oracle) over tokens [first, first + n) of s at the query position: o [Hq, D], lse [Hq].
void decode_step(Problem& s, const PositionParams& pp, int64_t first, int64_t n, int64_t q_pos, std::vector<float>& o,
                 std::vector<float>& lse) {
  KvCache cache({n, s.Hkv, s.D, DType::F32, pp});
  cache.append(n, s.kv_view(s.k, first), s.kv_view(s.v, first), s.pos.data() + first);
  o.assign(size_t(s.Hq * s.D), 0.f);
  lse.assign(size_t(s.Hq), 0.f);
  DecodeParams p;
  p.q = {s.q.data(), s.Hq, s.Hq * s.D, s.D};
  p.o = {o.data(), s.Hq, s.Hq * s.D, s.D};
  p.lse = lse.data();
  p.q_positions = &q_pos;
  attention_decode_reference(cache, p);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

struct PolicyCase {
  const char* name;
  int D, Hq, Hkv;
  MemoryPolicy policy;
  PositionMode mode;
  RopeLayout layout;
  int rotary_dim;
  double factor;
  int64_t logn;
  int64_t w;
};

TEST(KvMemory, WindowPlusAllOfMemoryIsFullAttention) {
  const PolicyCase cases[] = {
      {"exact rope", 32, 4, 2, MemoryPolicy::Exact, PositionMode::Rope, RopeLayout::HalfSplit, 0, 1.0, 0, 0},
      {"exact rope interleaved partial factor logn", 32, 4, 2, MemoryPolicy::Exact, PositionMode::Rope,
       RopeLayout::Interleaved, 16, 1.1, 20, 0},
      {"exact rope odd: D 18, 10 rotated, MQA 3 heads", 18, 3, 1, MemoryPolicy::Exact, PositionMode::Rope,
       RopeLayout::HalfSplit, 10, 1.0, 0, 0},
      {"rerope w6", 32, 4, 2, MemoryPolicy::Rerope, PositionMode::Rerope, RopeLayout::HalfSplit, 0, 1.0, 0, 6},
      {"rerope w10 logn factor", 32, 4, 2, MemoryPolicy::Rerope, PositionMode::Rerope, RopeLayout::Interleaved, 0,
       1.2, 20, 10},
      {"rerope odd: D 24, 6 heads on 3", 24, 6, 3, MemoryPolicy::Rerope, PositionMode::Rerope,
       RopeLayout::Interleaved, 0, 1.0, 0, 7},
  };
  for (const PolicyCase& c : cases) {
    SCOPED_TRACE(c.name);
    Problem s(c.D, c.Hq, c.Hkv);
    const RopeFreqs f = freqs_for(s.D, c.layout, c.rotary_dim, c.factor);
    PositionParams pp;
    pp.mode = c.mode, pp.freqs = &f, pp.window = c.w, pp.logn_train_len = c.logn;
    const int64_t q_pos = s.pos.back() + 2;
    std::vector<float> o_full, lse_full;
    decode_step(s, pp, 0, s.tokens, q_pos, o_full, lse_full);

    // The window (every key nearer than w for ReRoPE: window >= w), then all of memory.
    const int64_t in_memory = s.tokens - s.window;
    ASSERT_GE(q_pos - s.pos[size_t(in_memory)], c.w) << "a local key must not be past the ReRoPE window";
    KvMemory memory({s.Hkv, s.D, c.policy, &f, c.w, c.logn});
    memory.append(in_memory, s.kv_view(s.k, 0), s.kv_view(s.v, 0), s.pos.data());
    ASSERT_EQ(memory.size(), in_memory);
    for (bool reference : {false, true}) {
      std::vector<float> o, lse;
      decode_step(s, pp, in_memory, s.window, q_pos, o, lse);
      std::vector<float> mass(size_t(s.Hq));
      MemoryAttentionParams p;
      p.tokens = 1;
      p.q = {s.q.data(), s.Hq, s.Hq * s.D, s.D};
      p.q_positions = &q_pos;
      p.top_k = int(in_memory);
      p.o = {o.data(), s.Hq, s.Hq * s.D, s.D};
      p.lse = lse.data();
      p.memory_mass = mass.data();
      (reference ? memory_attention_reference : memory_attention)(memory, p);
      // fp32 storage and sums over 50 keys: a few ulps of outputs of size ~1.
      EXPECT_LT(max_abs_diff(o, o_full), 2e-5) << (reference ? "reference" : "fast");
      EXPECT_LT(max_abs_diff(lse, lse_full), 2e-5) << (reference ? "reference" : "fast");
      for (float m : mass) EXPECT_TRUE(m > 0 && m < 1) << m;
    }
  }
}

// The point of the `exact` store (seed 001): the inner product of the search query with a stored key is the RoPE
// logit of the un-rotated q and k at their true distance, q . R(pos_j - pos_i) k * scale.
TEST(KvMemory, ExactSearchScoresAreTheTrueLogits) {
  Problem s;
  const RopeFreqs f = freqs_for(s.D);
  KvMemory memory = s.all_in_memory(f);
  const int64_t q_pos = s.pos.back() + 5;
  std::vector<float> sq(size_t(s.D));
  memory.search_query(s.q.data(), q_pos, 0, sq.data());
  const double scale = 1 / std::sqrt(double(s.D));
  for (int64_t j = 0; j < s.tokens; j += 7) {
    const float* kj = s.k.data() + j * s.Hkv * s.D;  // kv head 0 (q head 0's)
    double want = 0;
    const int half = s.D / 2;
    for (int i = 0; i < half; ++i) {  // q . R(pos_j - pos_i) k, half-split pairs (i, i + D/2)
      const double a = double(s.pos[size_t(j)] - q_pos) * f.inv_freq[size_t(i)];
      const double k0 = kj[i] * std::cos(a) - kj[i + half] * std::sin(a);
      const double k1 = kj[i] * std::sin(a) + kj[i + half] * std::cos(a);
      want += s.q[size_t(i)] * k0 + s.q[size_t(i + half)] * k1;
    }
    want *= scale;
    double got = 0;
    for (int d = 0; d < s.D; ++d) got += double(sq[size_t(d)]) * memory.keys(0)[j * s.D + d];
    EXPECT_NEAR(got, want, 1e-5 * (1 + std::abs(want))) << "row " << j;
  }
}

// top_k < size: the retrieved rows are the k best by score (brute force), best first; the fast path equals the
// float64 oracle; with no local keys (lse -inf) the output is the softmax over the retrieved keys alone.
TEST(KvMemory, TopKRetrievesTheBestRowsAndMatchesTheOracle) {
  Problem s;
  const RopeFreqs f = freqs_for(s.D);
  KvMemory memory = s.all_in_memory(f);
  const int64_t q_pos = s.pos.back() + 1;
  const int K = 5;
  std::vector<float> o_fast, o_ref;
  std::vector<int64_t> ids_fast, ids_ref;
  for (bool reference : {false, true}) {
    std::vector<float> o(size_t(s.Hq * s.D), 123.f), lse(size_t(s.Hq), -std::numeric_limits<float>::infinity());
    std::vector<int64_t> ids(size_t(s.Hq * K));
    std::vector<float> scores(size_t(s.Hq * K)), mass(size_t(s.Hq));
    MemoryAttentionParams p;
    p.tokens = 1;
    p.q = {s.q.data(), s.Hq, s.Hq * s.D, s.D};
    p.q_positions = &q_pos;
    p.top_k = K;
    p.o = {o.data(), s.Hq, s.Hq * s.D, s.D};
    p.lse = lse.data();
    p.retrieved = ids.data();
    p.retrieved_scores = scores.data();
    p.memory_mass = mass.data();
    (reference ? memory_attention_reference : memory_attention)(memory, p);
    for (float m : mass) EXPECT_FLOAT_EQ(m, 1.f) << "no local keys: all the mass is on memory";
    for (int h = 0; h < s.Hq; ++h) {
      // Brute force: every row's score through search_query, sorted.
      std::vector<float> sq(size_t(s.D));
      memory.search_query(s.q.data() + h * s.D, q_pos, 0, sq.data());
      const int kvh = h / (s.Hq / s.Hkv);
      std::vector<std::pair<double, int64_t>> all;
      for (int64_t j = 0; j < s.tokens; ++j) {
        double sc = 0;
        for (int d = 0; d < s.D; ++d) sc += double(sq[size_t(d)]) * memory.keys(kvh)[j * s.D + d];
        all.push_back({-sc, j});
      }
      std::sort(all.begin(), all.end());
      double sum = 0;
      std::vector<double> want(size_t(s.D), 0.0);
      for (int i = 0; i < K; ++i) {
        EXPECT_EQ(ids[size_t(h * K + i)], all[size_t(i)].second) << "head " << h << " rank " << i;
        EXPECT_NEAR(scores[size_t(h * K + i)], -all[size_t(i)].first, 1e-5);
        if (i > 0) {
          EXPECT_GE(scores[size_t(h * K + i - 1)], scores[size_t(h * K + i)]);
        }
        const double e = std::exp(-all[size_t(i)].first + all[0].first);
        sum += e;
        for (int d = 0; d < s.D; ++d) want[size_t(d)] += e * memory.values(kvh)[all[size_t(i)].second * s.D + d];
      }
      for (int d = 0; d < s.D; ++d) EXPECT_NEAR(o[size_t(h * s.D + d)], want[size_t(d)] / sum, 1e-5);
    }
    (reference ? o_ref : o_fast) = o;
    (reference ? ids_ref : ids_fast) = ids;
  }
  EXPECT_EQ(ids_fast, ids_ref);
  EXPECT_LT(max_abs_diff(o_fast, o_ref), 1e-5);
}

// Candidates from an index (lab/memory): the exact top-k given as candidates (shuffled, padded with -1) gives the
// exact search's output; rows an index got wrong are attended as given (scored exactly); a head the index found
// nothing for keeps the window's output and log-sum-exp (memory mass 0); bad rows are refused.
TEST(KvMemory, CandidatesFromAnIndexAreScoredExactly) {
  Problem s;
  const RopeFreqs f = freqs_for(s.D);
  KvMemory memory = s.all_in_memory(f);
  const int64_t q_pos = s.pos.back() + 1;
  const int K = 6;
  auto run = [&](const int64_t* candidates, int top_k, std::vector<float>& o, std::vector<int64_t>& ids) {
    o.assign(size_t(s.Hq * s.D), 0.f);
    std::vector<float> lse(size_t(s.Hq), -std::numeric_limits<float>::infinity());
    ids.assign(size_t(s.Hq * top_k), 99);
    MemoryAttentionParams p;
    p.tokens = 1;
    p.q = {s.q.data(), s.Hq, s.Hq * s.D, s.D};
    p.q_positions = &q_pos;
    p.top_k = top_k;
    p.o = {o.data(), s.Hq, s.Hq * s.D, s.D};
    p.lse = lse.data();
    p.candidates = candidates;
    p.retrieved = ids.data();
    memory_attention(memory, p);
  };
  std::vector<float> o_exact, o_cand;
  std::vector<int64_t> ids_exact, ids_cand;
  run(nullptr, 4, o_exact, ids_exact);
  // Per head: the exact 4 best, in reverse order, and two -1 fillers.
  std::vector<int64_t> cand(size_t(s.Hq * K), -1);
  for (int h = 0; h < s.Hq; ++h)
    for (int i = 0; i < 4; ++i) cand[size_t(h * K + i)] = ids_exact[size_t(h * 4 + 3 - i)];
  run(cand.data(), K, o_cand, ids_cand);
  EXPECT_LT(max_abs_diff(o_cand, o_exact), 1e-6);
  for (int h = 0; h < s.Hq; ++h) {
    for (int i = 0; i < 4; ++i) EXPECT_EQ(ids_cand[size_t(h * K + i)], ids_exact[size_t(h * 4 + i)]) << "best first";
    EXPECT_EQ(ids_cand[size_t(h * K + 4)], -1);
  }
  // Rows that are not the best are still what is attended to.
  for (int h = 0; h < s.Hq; ++h) cand[size_t(h * K)] = 7, cand[size_t(h * K + 1)] = 8;
  for (int h = 0; h < s.Hq; ++h)
    for (int i = 2; i < K; ++i) cand[size_t(h * K + i)] = -1;
  run(cand.data(), K, o_cand, ids_cand);
  for (int h = 0; h < s.Hq; ++h) EXPECT_TRUE(ids_cand[size_t(h * K)] == 7 || ids_cand[size_t(h * K)] == 8);
  cand[3] = s.tokens;  // past the memory
  test::expect_error([&] { run(cand.data(), K, o_cand, ids_cand); }, "candidates[3]");
  cand[3] = -1;
  std::fill(cand.begin(), cand.begin() + K, int64_t(-1));  // head 0 has nothing
  {
    std::vector<float> o(size_t(s.Hq * s.D)), lse(size_t(s.Hq)), mass(size_t(s.Hq), -1.f), scores(size_t(s.Hq * K));
    for (size_t i = 0; i < o.size(); ++i) o[i] = 0.25f * float(i % 7) - 0.5f;  // a window's output
    for (size_t i = 0; i < lse.size(); ++i) lse[i] = 1.5f + float(i);
    const std::vector<float> o_in = o, lse_in = lse;
    std::vector<int64_t> ids(size_t(s.Hq * K), 99);
    MemoryAttentionParams p;
    p.tokens = 1;
    p.q = {s.q.data(), s.Hq, s.Hq * s.D, s.D};
    p.q_positions = &q_pos;
    p.top_k = K;
    p.o = {o.data(), s.Hq, s.Hq * s.D, s.D};
    p.lse = lse.data();
    p.candidates = cand.data();
    p.retrieved = ids.data();
    p.retrieved_scores = scores.data();
    p.memory_mass = mass.data();
    memory_attention(memory, p);
    for (int d = 0; d < s.D; ++d) EXPECT_EQ(o[size_t(d)], o_in[size_t(d)]) << "head 0 keeps the window's output";
    EXPECT_EQ(lse[0], lse_in[0]);
    EXPECT_EQ(mass[0], 0.f);
    for (int i = 0; i < K; ++i) {
      EXPECT_EQ(ids[size_t(i)], -1);
      EXPECT_EQ(scores[size_t(i)], -std::numeric_limits<float>::infinity());
    }
    EXPECT_GT(mass[1], 0.f) << "the other heads attend to their candidates";
    EXPECT_NE(lse[1], lse_in[1]);
  }
}

// Unlimiformer's search (kv_memory.h): score = scale a^2 (R(m') q)^T (I + P) k_j with P the pair rotation
// (x_a, x_b) -> (-x_b, x_a) and m' = pos - query_origin, written out here from the un-rotated vectors, in both
// layouts and with a pass-through part.
TEST(KvMemory, UnlimiformerSearchIsTheCosEqualsSinScore) {
  Problem s(18, 3, 1);
  for (RopeLayout layout : {RopeLayout::HalfSplit, RopeLayout::Interleaved}) {
    const RopeFreqs f = freqs_for(s.D, layout, 10, 1.2);
    KvMemory memory = s.all_in_memory(f, MemoryPolicy::Unlimiformer);
    const int64_t pos = 500, origin = 470;
    std::vector<float> sq(size_t(s.D));
    memory.search_query(s.q.data(), pos, 0.5, sq.data(), origin);
    // y = a R(m') q on the pairs, q past them; then per pair (y_a + y_b, y_b - y_a); keys times a^... : the
    // policy puts a^2 on the query side (keys stored as given).
    std::vector<double> y(size_t(s.D));
    for (int i = 0; i < f.pairs(); ++i) {
      const int a = layout == RopeLayout::Interleaved ? 2 * i : i;
      const int b = layout == RopeLayout::Interleaved ? 2 * i + 1 : i + f.rotary_dim / 2;
      const double ang = double(pos - origin) * f.inv_freq[size_t(i)], c = std::cos(ang), sn = std::sin(ang);
      y[size_t(a)] = 1.2 * 1.2 * (s.q[size_t(a)] * c - s.q[size_t(b)] * sn);
      y[size_t(b)] = 1.2 * 1.2 * (s.q[size_t(a)] * sn + s.q[size_t(b)] * c);
    }
    for (int d = f.rotary_dim; d < s.D; ++d) y[size_t(d)] = s.q[size_t(d)];
    for (int64_t j = 0; j < s.tokens; j += 7) {
      const float* k = s.k.data() + j * s.Hkv * s.D;
      std::vector<double> kk(k, k + s.D);  // (I + P) k
      for (int i = 0; i < f.pairs(); ++i) {
        const int a = layout == RopeLayout::Interleaved ? 2 * i : i;
        const int b = layout == RopeLayout::Interleaved ? 2 * i + 1 : i + f.rotary_dim / 2;
        kk[size_t(a)] = k[a] - k[b];
        kk[size_t(b)] = k[b] + k[a];
      }
      double want = 0, got = 0;
      for (int d = 0; d < s.D; ++d) {
        want += y[size_t(d)] * kk[size_t(d)];
        got += double(sq[size_t(d)]) * memory.keys(0)[j * s.D + d];
      }
      EXPECT_NEAR(got, 0.5 * want, 1e-4 * (1 + std::abs(want))) << "row " << j;
    }
  }
}

// Unlimiformer's attention: with every row retrieved, it is attention with the keys re-rotated at pos_j - (the
// earliest retrieved position) and the query at pos - query_origin - i.e. the `exact` policy over those shifted
// positions (an independent path: keys rotated at write time). With fewer rows, the rows are the best by the
// approximate score and retrieved_scores are row_logit's re-rotated logits; fast path = float64 oracle.
TEST(KvMemory, UnlimiformerAttendsReRotatedKeys) {
  Problem s;
  const RopeFreqs f = freqs_for(s.D);
  KvMemory memory = s.all_in_memory(f, MemoryPolicy::Unlimiformer);
  const int64_t q_pos = s.pos.back() + 30, origin = s.pos.back() + 25;
  std::vector<int64_t> shifted(s.pos.size());
  for (size_t i = 0; i < s.pos.size(); ++i) shifted[i] = s.pos[i] - s.pos[0];
  KvMemory exact({s.Hkv, s.D, MemoryPolicy::Exact, &f, 0, 0});
  exact.append(s.tokens, s.kv_view(s.k, 0), s.kv_view(s.v, 0), shifted.data());
  auto attend = [&](const KvMemory& m, int64_t pos, int64_t org, int K, bool reference, std::vector<float>& o,
                    std::vector<int64_t>& ids, std::vector<float>& scores) {
    o.assign(size_t(s.Hq * s.D), 0.f);
    std::vector<float> lse(size_t(s.Hq), -std::numeric_limits<float>::infinity());
    ids.assign(size_t(s.Hq * K), 0);
    scores.assign(size_t(s.Hq * K), 0.f);
    MemoryAttentionParams p;
    p.tokens = 1;
    p.q = {s.q.data(), s.Hq, s.Hq * s.D, s.D};
    p.q_positions = &pos;
    p.query_origin = org;
    p.top_k = K;
    p.o = {o.data(), s.Hq, s.Hq * s.D, s.D};
    p.lse = lse.data();
    p.retrieved = ids.data();
    p.retrieved_scores = scores.data();
    (reference ? memory_attention_reference : memory_attention)(m, p);
  };
  std::vector<float> o_u, o_e, sc;
  std::vector<int64_t> ids;
  attend(exact, q_pos - origin, 0, int(s.tokens), true, o_e, ids, sc);
  for (bool reference : {false, true}) {
    attend(memory, q_pos, origin, int(s.tokens), reference, o_u, ids, sc);
    EXPECT_LT(max_abs_diff(o_u, o_e), 2e-5) << (reference ? "oracle" : "fast");
  }
  // Fewer rows: the best by the search score, attended with the re-rotated logits.
  const int K = 5;
  std::vector<float> o_fast, o_ref, sc_ref;
  std::vector<int64_t> ids_ref;
  attend(memory, q_pos, origin, K, false, o_fast, ids, sc);
  attend(memory, q_pos, origin, K, true, o_ref, ids_ref, sc_ref);
  EXPECT_EQ(ids, ids_ref);
  EXPECT_LT(max_abs_diff(o_fast, o_ref), 1e-5);
  for (int h = 0; h < s.Hq; ++h) {
    const int kvh = h / (s.Hq / s.Hkv);
    std::vector<float> sq(size_t(s.D));
    memory.search_query(s.q.data() + h * s.D, q_pos, 0, sq.data(), origin);
    std::vector<std::pair<double, int64_t>> all;
    for (int64_t j = 0; j < s.tokens; ++j) {
      double v = 0;
      for (int d = 0; d < s.D; ++d) v += double(sq[size_t(d)]) * memory.keys(kvh)[j * s.D + d];
      all.push_back({-v, j});
    }
    std::sort(all.begin(), all.end());
    int64_t earliest = std::numeric_limits<int64_t>::max();
    for (int i = 0; i < K; ++i) earliest = std::min(earliest, s.pos[size_t(all[size_t(i)].second)]);
    for (int i = 0; i < K; ++i) {
      EXPECT_EQ(ids[size_t(h * K + i)], all[size_t(i)].second) << "head " << h << " rank " << i;
      const double logit = memory.row_logit(s.q.data() + h * s.D, q_pos, kvh, ids[size_t(h * K + i)], 0, origin,
                                            earliest);
      EXPECT_NEAR(sc[size_t(h * K + i)], logit, 1e-5 * (1 + std::abs(logit)));
    }
  }
  // The origin may not lie after a query.
  test::expect_error([&] { attend(memory, q_pos, q_pos + 1, K, false, o_fast, ids, sc); },
                     {"memory_attention.query_origin", "<= every query position"});
}

// `none` places every retrieved key at distance 0: score = scale a^2 q . k_j, whatever the positions.
TEST(KvMemory, NoRotationScoresPlainDotProducts) {
  Problem s;
  const RopeFreqs f = freqs_for(s.D, RopeLayout::HalfSplit, 0, 1.3);
  KvMemory memory = s.all_in_memory(f, MemoryPolicy::NoRotation);
  std::vector<float> sq(size_t(s.D));
  memory.search_query(s.q.data(), 1000, 0.25, sq.data());
  for (int64_t j = 0; j < s.tokens; j += 9) {
    double want = 0, got = 0;
    for (int d = 0; d < s.D; ++d) {
      want += double(s.q[size_t(d)]) * s.k[size_t(j * s.Hkv * s.D + d)];
      got += double(sq[size_t(d)]) * memory.keys(0)[j * s.D + d];
    }
    EXPECT_NEAR(got, 0.25 * 1.3 * 1.3 * want, 1e-5);
  }
}

// save() then open(): the mapped memory answers exactly as the one in RAM; what does not fit is refused naming
// the file and the field; the file is written whole or not at all.
TEST(KvMemory, SavedMemoryMapsBackAndForeignOrDamagedFilesAreRefused) {
  Problem s;
  const RopeFreqs f = freqs_for(s.D, RopeLayout::Interleaved, 16, 1.1);
  const KvMemoryConfig cfg{s.Hkv, s.D, MemoryPolicy::Exact, &f, 0, 20};
  KvMemory memory(cfg);
  memory.append(s.tokens, s.kv_view(s.k, 0), s.kv_view(s.v, 0), s.pos.data());
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/rotary_kv_memory_" + std::to_string(::getpid()) + ".mem";
  memory.save(path, 42);
  KvMemory mapped = KvMemory::open(path, cfg, 42);
  EXPECT_TRUE(mapped.read_only());
  EXPECT_FALSE(memory.read_only());
  ASSERT_EQ(mapped.size(), memory.size());
  for (int64_t h = 0; h < s.Hkv; ++h) {
    EXPECT_EQ(0, std::memcmp(mapped.keys(h), memory.keys(h), size_t(s.tokens * s.D) * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(mapped.values(h), memory.values(h), size_t(s.tokens * s.D) * sizeof(float)));
  }
  EXPECT_EQ(0, std::memcmp(mapped.positions(), memory.positions(), size_t(s.tokens) * sizeof(int64_t)));
  test::expect_error([&] { mapped.append(1, s.kv_view(s.k, 0), s.kv_view(s.v, 0), s.pos.data()); }, "read-only");

  // Another model, another layout, another rotation.
  test::expect_error([&] { KvMemory::open(path, cfg, 43); }, {path, "fingerprint"});
  KvMemoryConfig other = cfg;
  other.policy = MemoryPolicy::NoRotation;
  test::expect_error([&] { KvMemory::open(path, other, 42); }, {"policy = exact", "none"});
  other = cfg, other.logn_train_len = 0;
  test::expect_error([&] { KvMemory::open(path, other, 42); }, "logn_train_len");
  const RopeFreqs g = freqs_for(s.D, RopeLayout::Interleaved, 16, 1.0);
  other = cfg, other.freqs = &g;
  test::expect_error([&] { KvMemory::open(path, other, 42); }, "another rotation");

  // Damaged files: truncated by one byte, trailing bytes, a flipped header byte, not a memory file at all.
  std::string bytes;
  {
    std::FILE* in = std::fopen(path.c_str(), "rb");
    ASSERT_NE(in, nullptr);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, in)) > 0;) bytes.append(buf, n);
    std::fclose(in);
  }
  auto write = [&](const std::string& b) {
    std::FILE* out = std::fopen(path.c_str(), "wb");
    std::fwrite(b.data(), 1, b.size(), out);
    std::fclose(out);
  };
  write(bytes.substr(0, bytes.size() - 1));
  test::expect_error([&] { KvMemory::open(path, cfg, 42); }, "truncated");
  write(bytes + "x");
  test::expect_error([&] { KvMemory::open(path, cfg, 42); }, "trailing bytes");
  std::string flipped = bytes;
  flipped[8 + 8] ^= 1;  // head_dim's low byte
  write(flipped);
  test::expect_error([&] { KvMemory::open(path, cfg, 42); }, "damaged header");
  write("hello");
  test::expect_error([&] { KvMemory::open(path, cfg, 42); }, "not a rotary memory file");
  // Positions no model uses (a header that checks out, rows past |2^53|): refused by the rule append() holds.
  const std::string stored_positions(reinterpret_cast<const char*>(memory.positions()),
                                     size_t(memory.size()) * sizeof(int64_t));
  const size_t positions_at = bytes.find(stored_positions);
  ASSERT_NE(positions_at, std::string::npos);
  for (const int64_t wild : {int64_t(1) << 62, -(int64_t(1) << 62)}) {
    std::string far = bytes;
    std::memcpy(far.data() + positions_at + sizeof(int64_t), &wild, sizeof wild);
    write(far);
    test::expect_error([&] { KvMemory::open(path, cfg, 42); }, {path, "positions[1] = " + std::to_string(wild), "2^53"});
  }
  std::remove(path.c_str());
  test::expect_error([&] { KvMemory::open(path, cfg, 42); }, {path, "No such file"});
  // A FIFO or a directory in the file's place is refused before any open() (which would wait for a writer).
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  test::expect_error([&] { KvMemory::open(path, cfg, 42); }, {path, "a FIFO"});
  std::remove(path.c_str());
  test::expect_error([&] { KvMemory::open(dir, cfg, 42); }, "a directory");

  // A save that cannot complete leaves no file (nor its temporary) behind.
  const std::string nowhere = dir + "/no_such_dir_" + std::to_string(::getpid()) + "/m.mem";
  test::expect_error([&] { memory.save(nowhere); }, "cannot create");
  // save() ends with an fsync of the directory (the rename's durability); that step names the directory when it
  // cannot be done.
  test::expect_error([&] { sync_directory_of(nowhere, "kv_memory.save"); },
                     {"kv_memory.save: fsync of directory " + dir + "/no_such_dir_", "No such file"});
  sync_directory_of(path, "kv_memory.save");
}

// ---- the reader on bytes (KvMemory::open_bytes, the one reader open() runs on its mapping) --------------------

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Header field i (docs/memory.md: kv_heads, head_dim, policy, window, logn_train_len, size, has_freqs, rotary_dim,
// layout, fingerprint, attention_factor, storage) set to `value`, and the FNV-1a checksum made right again: a crafted
// file, so the checks behind the checksum are reached.
void refresh_checksum(std::string& b) {
  int64_t has_freqs = 0, rotary_dim = 0;
  std::memcpy(&has_freqs, b.data() + 8 + 6 * 8, 8);
  std::memcpy(&rotary_dim, b.data() + 8 + 7 * 8, 8);
  const size_t end = 8 + 96 + (has_freqs == 1 ? size_t(rotary_dim / 2) * 8 : 0);
  if (end + 8 > b.size()) return;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 8; i < end; ++i) h = (h ^ uint8_t(b[i])) * 0x100000001b3ULL;
  std::memcpy(b.data() + end, &h, 8);
}
std::string with_field(std::string b, int field, int64_t value) {
  std::memcpy(b.data() + 8 + 8 * field, &value, 8);
  refresh_checksum(b);
  return b;
}
enum Field { kKvHeads, kHeadDim, kPolicy, kWindow, kLogn, kSize, kHasFreqs, kRotaryDim, kLayout, kStorage = 11 };

// open_bytes over an exact-size heap copy of `b` (so ASan sees a read past its end): a rotary::Error naming
// `source`, or a memory whose every view lies inside the bytes. Returns whether it loaded.
bool refused_or_inside(const std::string& b, const KvMemoryConfig& cfg, uint64_t fingerprint) {
  const std::unique_ptr<char[]> copy(new char[b.size()]);
  std::memcpy(copy.get(), b.data(), b.size());
  const char* lo = copy.get();
  const char* hi = lo + b.size();
  try {
    const KvMemory m = KvMemory::open_bytes(copy.get(), b.size(), cfg, fingerprint, "crafted.mem");
    EXPECT_TRUE(m.read_only());
    auto inside = [&](const void* p, int64_t bytes) {
      const char* c = static_cast<const char*>(p);
      return c >= lo && bytes >= 0 && bytes <= hi - c;
    };
    EXPECT_TRUE(inside(m.positions(), m.size() * 8));
    const int64_t element = int64_t(dtype_size(m.storage()));
    for (int64_t h = 0; h < m.kv_heads(); ++h) {
      EXPECT_TRUE(inside(m.key_data(h), m.size() * m.head_dim() * element));
      EXPECT_TRUE(inside(m.value_data(h), m.size() * m.head_dim() * element));
    }
    return true;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("crafted.mem"), std::string::npos) << e.what();
    return false;
  }
}

struct SeedFiles {
  RopeFreqs freqs = fuzz::kv_memory_seed_freqs();
  std::vector<fuzz::KvMemorySeed> seeds = fuzz::kv_memory_seeds(&freqs);
  std::string path(size_t i) const {
    return ::testing::TempDir() + "/rotary_kv_seed_" + std::to_string(::getpid()) + "_" + seeds[i].file;
  }
};

void expect_same_memory(const KvMemory& a, const KvMemory& b) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.kv_heads(), b.kv_heads());
  ASSERT_EQ(a.head_dim(), b.head_dim());
  ASSERT_EQ(a.storage(), b.storage());
  const size_t block = size_t(a.size() * a.head_dim()) * dtype_size(a.storage());
  EXPECT_EQ(0, std::memcmp(a.positions(), b.positions(), size_t(a.size()) * sizeof(int64_t)));
  for (int64_t h = 0; h < a.kv_heads(); ++h) {
    EXPECT_EQ(0, std::memcmp(a.key_data(h), b.key_data(h), block));
    EXPECT_EQ(0, std::memcmp(a.value_data(h), b.value_data(h), block));
  }
}

// The bytes of a saved file read as open(path) reads the file, with views into the caller's bytes.
TEST(KvMemory, OpenBytesReadsWhatOpenReads) {
  SeedFiles sf;
  for (size_t i = 0; i < sf.seeds.size(); ++i) {
    const fuzz::KvMemorySeed& seed = sf.seeds[i];
    SCOPED_TRACE(seed.file);
    const KvMemory memory = fuzz::kv_memory_seed_memory(seed);
    memory.save(sf.path(i), seed.fingerprint);
    const std::string bytes = file_bytes(sf.path(i));
    const KvMemory from_file = KvMemory::open(sf.path(i), seed.config, seed.fingerprint);
    std::remove(sf.path(i).c_str());  // the mapping stays valid
    const KvMemory from_bytes = KvMemory::open_bytes(bytes.data(), bytes.size(), seed.config, seed.fingerprint, "x");
    expect_same_memory(from_bytes, memory);
    expect_same_memory(from_bytes, from_file);
    EXPECT_TRUE(from_bytes.read_only());
    // Borrowed: the views point into the caller's bytes.
    EXPECT_GE(from_bytes.key_data(0), static_cast<const void*>(bytes.data()));
    EXPECT_LT(from_bytes.value_data(seed.config.kv_heads - 1),
              static_cast<const void*>(bytes.data() + bytes.size()));
    const std::vector<float> q(size_t(seed.config.head_dim), 0.5f);
    for (int64_t row = 0; row < memory.size(); ++row)
      EXPECT_EQ(from_bytes.row_logit(q.data(), 20, 0, row, 0), memory.row_logit(q.data(), 20, 0, row, 0));
  }
}

// Every prefix of a valid file, bytes past its end, a null or unaligned buffer, and headers that lie about a count
// with a correct checksum: each one a rotary::Error naming the source and the field, never a read past the bytes.
TEST(KvMemory, OpenBytesRefusesCutsAndLyingHeaders) {
  SeedFiles sf;
  const fuzz::KvMemorySeed& seed = sf.seeds[0];
  const KvMemoryConfig& cfg = seed.config;
  const uint64_t fp = seed.fingerprint;
  fuzz::kv_memory_seed_memory(seed).save(sf.path(0), fp);
  const std::string bytes = file_bytes(sf.path(0));
  std::remove(sf.path(0).c_str());
  ASSERT_EQ(bytes.size(), 704u);
  EXPECT_TRUE(refused_or_inside(bytes, cfg, fp));
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    SCOPED_TRACE(cut);
    EXPECT_FALSE(refused_or_inside(bytes.substr(0, cut), cfg, fp));
  }
  for (size_t extra = 1; extra <= 64; ++extra) EXPECT_FALSE(refused_or_inside(bytes + std::string(extra, '\0'), cfg, fp));
  auto refused = [&](const std::string& b, std::initializer_list<std::string> parts) {
    const std::unique_ptr<char[]> copy(new char[b.size()]);
    std::memcpy(copy.get(), b.data(), b.size());
    test::expect_error([&] { KvMemory::open_bytes(copy.get(), b.size(), cfg, fp, "crafted.mem"); }, parts);
  };
  refused(bytes.substr(0, 703), {"crafted.mem", "size 703 bytes where its header implies 704 (truncated)"});
  refused(bytes.substr(0, 110), {"crafted.mem", "truncated inside its header", "rotary_dim = 4 needs 128"});
  test::expect_error([&] { KvMemory::open_bytes(nullptr, 0, cfg, fp, "crafted.mem"); },
                     {"crafted.mem", "not a rotary memory file"});
  {
    const std::unique_ptr<char[]> shifted(new char[bytes.size() + 1]);
    std::memcpy(shifted.get() + 1, bytes.data(), bytes.size());
    test::expect_error([&] { KvMemory::open_bytes(shifted.get() + 1, bytes.size(), cfg, fp, "crafted.mem"); },
                       {"crafted.mem", "aligned to 8 bytes"});
  }
  // Counts out of range, named with their value and what is allowed.
  refused(with_field(bytes, kKvHeads, 0), {"crafted.mem", "damaged header", "kv_heads = 0 is invalid", "1..4096"});
  refused(with_field(bytes, kHeadDim, 5000), {"head_dim = 5000 is invalid", "2..4096"});
  refused(with_field(bytes, kSize, -1), {"size = -1 is invalid", "0..2^40"});
  refused(with_field(bytes, kSize, int64_t(1) << 41), {"size = 2199023255552 is invalid"});
  refused(with_field(bytes, kHasFreqs, 2), {"has_freqs = 2 is invalid"});
  refused(with_field(bytes, kRotaryDim, 3), {"rotary_dim = 3 is invalid"});
  refused(with_field(bytes, kRotaryDim, 4096), {"truncated inside its header", "rotary_dim = 4096 needs 16496"});
  refused(with_field(bytes, kStorage, 5), {"storage = 5 is invalid", "0 (f32), 1 (f16) or 2 (bf16)"});
  refused(with_field(bytes, kStorage, 3), {"storage = 3 is invalid"});  // f64: a dtype, not a memory's
  // Another storage of the same element size is still another memory: bf16 bits are not f16 values.
  refused(with_field(bytes, kStorage, 2), {"(trailing bytes)"});  // 2-byte rows: smaller blocks than the bytes
  // Counts in range that the bytes do not hold: the layout they imply against the size.
  refused(with_field(bytes, kSize, 5), {"size 704 bytes where its header implies 960 (truncated)", "size = 5 rows"});
  refused(with_field(bytes, kSize, 2), {"implies 448 (trailing bytes)"});
  refused(with_field(bytes, kSize, int64_t(1) << 40), {"(truncated)", "size = 1099511627776 rows"});
  refused(with_field(bytes, kKvHeads, 4096), {"(truncated)", "kv_heads = 4096"});
  // Counts whose blocks pass 2^63 bytes: refused by the checked arithmetic, not compared after wrapping.
  std::string huge = with_field(with_field(with_field(bytes, kSize, int64_t(1) << 40), kHeadDim, 4096), kKvHeads, 4096);
  refused(huge, {"crafted.mem", "2 x kv_heads x block bytes = 8192 x 18014398509481984 (past 2^63)"});
  // In range and the right size, but not this model's.
  refused(with_field(bytes, kPolicy, 7), {"written for policy = 7 (no policy), this model has rerope"});
  refused(with_field(bytes, kRotaryDim, 2), {"another rotation"});  // (a header of the same aligned size)
  refused(with_field(bytes, kLayout, 9), {"another rotation"});
  // A count the padding absorbs (4 rows of 8 floats fill the 128-byte blocks 3 rows were padded to) is a valid
  // file for that header: it loads, its fourth row the padding's zeros, every view inside the bytes.
  EXPECT_TRUE(refused_or_inside(with_field(bytes, kSize, 4), cfg, fp));
  // Every header byte set to each of a few values, the checksum made right: refused or inside the bytes.
  for (size_t at = 8; at < 8 + 96 + 16; ++at)
    for (const int value : {0x00, 0x01, 0x02, 0x7f, 0x80, 0xff}) {
      std::string b = bytes;
      b[at] = char(value);
      refresh_checksum(b);
      SCOPED_TRACE(std::to_string(at) + " = " + std::to_string(value));
      refused_or_inside(b, cfg, fp);
    }
}

// The fuzz target's seeds (fuzz/corpus/kv_memory/) are what save() writes for fuzz/kv_memory_seeds.h's memories;
// ROTARY_WRITE_FUZZ_SEEDS=1 rewrites them after a change of the format.
TEST(KvMemory, FuzzSeedsAreWhatSaveWrites) {
  SeedFiles sf;
  const bool rewrite = std::getenv("ROTARY_WRITE_FUZZ_SEEDS") != nullptr;
  for (size_t i = 0; i < sf.seeds.size(); ++i) {
    const fuzz::KvMemorySeed& seed = sf.seeds[i];
    SCOPED_TRACE(seed.file);
    fuzz::kv_memory_seed_memory(seed).save(sf.path(i), seed.fingerprint);
    const std::string saved = file_bytes(sf.path(i));
    std::remove(sf.path(i).c_str());
    const std::string checked_in = std::string(ROTARY_SOURCE_DIR) + "/fuzz/corpus/kv_memory/" + seed.file;
    if (rewrite) {
      std::ofstream(checked_in, std::ios::binary) << saved;
    }
    EXPECT_EQ(file_bytes(checked_in), saved) << checked_in << " is not what save() writes";
    EXPECT_NO_THROW(KvMemory::open(checked_in, seed.config, seed.fingerprint));
  }
}

// Keys and values stored in bf16 / f16: each element rounded once when appended (the stored bits are the f32
// memory's rounded to nearest even); the fast path equals the float64 oracle on the same stored rows; against the
// f32 memory of the same tokens the outputs move by no more than the rounding of keys and values allows (with every
// row retrieved, so the sets cannot differ): a logit moves by at most u sum_d |sq_d k_d| (u = 2^-8 bf16, 2^-11
// f16, relative to each stored element), so the softmax weights by a factor within e^(2 du) and the output by at
// most (e^(2 du) - 1) max|v| + u max|v|.
TEST(KvMemory, HalfPrecisionStorageRoundsOnceAndStaysWithinItsRounding) {
  for (const DType storage : {DType::BF16, DType::F16})
    for (const MemoryPolicy policy : {MemoryPolicy::Exact, MemoryPolicy::Rerope}) {
      SCOPED_TRACE(std::string(dtype_name(storage)) + " " + memory_policy_name(policy));
      Problem s;
      const RopeFreqs f = freqs_for(s.D);
      KvMemory wide({s.Hkv, s.D, policy, &f, policy == MemoryPolicy::Rerope ? 6 : 0, 0});
      KvMemory half({s.Hkv, s.D, policy, &f, policy == MemoryPolicy::Rerope ? 6 : 0, 0, storage});
      for (KvMemory* m : {&wide, &half}) m->append(s.tokens, s.kv_view(s.k, 0), s.kv_view(s.v, 0), s.pos.data());
      EXPECT_EQ(half.storage(), storage);
      for (int64_t h = 0; h < s.Hkv; ++h)
        for (int64_t i = 0; i < s.tokens * s.D; ++i) {
          const uint16_t k_bits = static_cast<const uint16_t*>(half.key_data(h))[i];
          const uint16_t v_bits = static_cast<const uint16_t*>(half.value_data(h))[i];
          const float k = wide.keys(h)[i], v = wide.values(h)[i];
          ASSERT_EQ(k_bits, storage == DType::BF16 ? float_to_bf16(k) : float_to_f16(k)) << i;
          ASSERT_EQ(v_bits, storage == DType::BF16 ? float_to_bf16(v) : float_to_f16(v)) << i;
        }
      test::expect_error([&] { half.keys(0); }, {"kv_memory.storage = " + std::string(dtype_name(storage)), "f32"});
      std::vector<float> rows(size_t(3 * s.D));
      half.key_rows(1, 4, 3, rows.data());
      for (int i = 0; i < 3 * s.D; ++i)
        EXPECT_EQ(rows[size_t(i)], load_as_double(half.key_data(1), storage, 4 * s.D + i));
      test::expect_error([&] { half.key_rows(1, s.tokens - 2, 3, rows.data()); }, "kv_memory.key_rows rows");

      const int64_t q_pos = s.pos.back() + 1;
      auto run = [&](const KvMemory& m, bool reference, std::vector<float>& o) {
        o.assign(size_t(s.Hq * s.D), 0.f);
        std::vector<float> lse(size_t(s.Hq), -std::numeric_limits<float>::infinity());
        MemoryAttentionParams p;
        p.tokens = 1;
        p.q = {s.q.data(), s.Hq, s.Hq * s.D, s.D};
        p.q_positions = &q_pos;
        p.top_k = int(s.tokens);
        p.o = {o.data(), s.Hq, s.Hq * s.D, s.D};
        p.lse = lse.data();
        (reference ? memory_attention_reference : memory_attention)(m, p);
      };
      std::vector<float> o_half, o_half_ref, o_wide;
      run(half, false, o_half);
      run(half, true, o_half_ref);
      run(wide, false, o_wide);
      EXPECT_LT(max_abs_diff(o_half, o_half_ref), 2e-5);
      const double u = storage == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      double dl = 0, vmax = 0;
      for (int h = 0; h < s.Hq; ++h) {
        std::vector<float> sq(size_t(s.D));
        wide.search_query(s.q.data() + h * s.D, q_pos, 0, sq.data());
        const int64_t kvh = h / (s.Hq / s.Hkv);
        for (int64_t j = 0; j < s.tokens; ++j) {
          double a = 0;
          for (int d = 0; d < s.D; ++d) a += std::abs(double(sq[size_t(d)]) * wide.keys(kvh)[j * s.D + d]);
          dl = std::max(dl, u * a);
        }
      }
      for (float v : s.v) vmax = std::max(vmax, double(std::abs(v)));
      const double bound = (std::exp(2 * dl) - 1) * vmax + u * vmax;
      const double diff = max_abs_diff(o_half, o_wide);
      EXPECT_LE(diff, bound);
      EXPECT_GT(diff, 0) << "the rounding changed nothing: is the memory stored in half precision?";
    }
}

// A memory saved in bf16 maps back as bf16 (the same bits); opened as another storage it is refused by name; a
// file of the first format (RTKVMEM1: no storage field, f32) still opens as f32.
TEST(KvMemory, StorageDtypeIsSavedCheckedAndTheFirstFormatStillReads) {
  Problem s;
  const RopeFreqs f = freqs_for(s.D);
  const std::string dir = ::testing::TempDir();
  const KvMemoryConfig half_cfg{s.Hkv, s.D, MemoryPolicy::Exact, &f, 0, 0, DType::BF16};
  KvMemory half(half_cfg);
  half.append(s.tokens, s.kv_view(s.k, 0), s.kv_view(s.v, 0), s.pos.data());
  const std::string path = dir + "/bf16.mem";
  half.save(path, 9);
  const KvMemory mapped = KvMemory::open(path, half_cfg, 9);
  EXPECT_EQ(mapped.storage(), DType::BF16);
  for (int64_t h = 0; h < s.Hkv; ++h)
    EXPECT_EQ(std::memcmp(mapped.key_data(h), half.key_data(h), size_t(s.tokens * s.D) * 2), 0);
  KvMemoryConfig f32_cfg = half_cfg;
  f32_cfg.storage = DType::F32;
  test::expect_error([&] { KvMemory::open(path, f32_cfg, 9); }, {path, "storage = bf16", "f32"});
  std::remove(path.c_str());

  // The first format: what save() writes for an f32 memory, less the storage field, magic 1, checksum redone.
  KvMemory wide(f32_cfg);
  wide.append(s.tokens, s.kv_view(s.k, 0), s.kv_view(s.v, 0), s.pos.data());
  wide.save(path, 9);
  std::string b = file_bytes(path);
  const size_t fields = 96, inv_freq = f.inv_freq.size() * 8;  // 9 int64, fingerprint, factor; storage at 88
  std::string v1 = "RTKVMEM1" + b.substr(8, 88) + b.substr(8 + 96, inv_freq);
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (size_t i = 8; i < v1.size(); ++i) hash = (hash ^ uint8_t(v1[i])) * 0x100000001b3ULL;
  v1.append(reinterpret_cast<const char*>(&hash), 8);
  const size_t v2_header_end = 8 + fields + inv_freq + 8;
  const size_t blocks_at = (v2_header_end + 63) / 64 * 64;  // the same 64-byte aligned blocks follow
  ASSERT_LE(v1.size(), blocks_at);
  v1.resize(blocks_at, '\0');
  v1 += b.substr(blocks_at);
  std::ofstream(path, std::ios::binary) << v1;
  const KvMemory old = KvMemory::open(path, f32_cfg, 9);
  EXPECT_EQ(old.storage(), DType::F32);
  EXPECT_EQ(old.size(), s.tokens);
  for (int64_t h = 0; h < s.Hkv; ++h)
    EXPECT_EQ(std::memcmp(old.keys(h), wide.keys(h), size_t(s.tokens * s.D) * 4), 0);
  test::expect_error([&] { KvMemory::open(path, half_cfg, 9); }, "storage = f32");
  std::remove(path.c_str());
  test::expect_error([&] { KvMemory({s.Hkv, s.D, MemoryPolicy::Exact, &f, 0, 0, DType::F64}); },
                     {"kv_memory.storage = f64", "f32, bf16 or f16"});
}

// MemoryKvCache, token by token across several moves to the memory (W = 6: the window holds 6..11 tokens): with
// top_k past the memory's size every step equals one decode step over all tokens so far (RoPE with `exact`,
// ReRoPE w = 4 with `rerope`); with top_k = 0 it equals the window alone; the rows retrieved are memory rows.
TEST(MemoryKvCache, StepByStepEqualsFullAttentionWithAllOfMemory) {
  for (const bool rerope : {false, true}) {
    SCOPED_TRACE(rerope ? "rerope" : "rope");
    Problem s;
    const RopeFreqs f = freqs_for(s.D);
    PositionParams pp;
    pp.mode = rerope ? PositionMode::Rerope : PositionMode::Rope;
    pp.freqs = &f;
    pp.window = rerope ? 4 : 0;
    MemoryKvCache cache({6, s.Hkv, s.D, pp, rerope ? MemoryPolicy::Rerope : MemoryPolicy::Exact});
    for (int64_t t = 0; t < s.tokens; ++t) {
      cache.append(1, s.kv_view(s.k, t), s.kv_view(s.v, t), &s.pos[size_t(t)]);
      ASSERT_EQ(cache.size(), t + 1);
      ASSERT_GE(cache.window_size(), std::min<int64_t>(t + 1, 6));
      ASSERT_LT(cache.window_size(), 12);
      const int64_t q_pos = s.pos[size_t(t)];
      std::vector<float> o(size_t(s.Hq * s.D)), mass(size_t(s.Hq));
      std::vector<int64_t> rows(size_t(s.Hq * 100));
      const HeadsView qv{s.q.data(), s.Hq, s.Hq * s.D, s.D}, ov{o.data(), s.Hq, s.Hq * s.D, s.D};
      cache.decode(
          {.q = qv, .q_position = q_pos, .o = ov, .top_k = 100, .memory_mass = mass.data(), .retrieved = rows.data()});
      std::vector<float> o_full, lse_full;
      decode_step(s, pp, 0, t + 1, q_pos, o_full, lse_full);
      ASSERT_LT(max_abs_diff(o, o_full), 2e-5) << "step " << t;
      const int64_t in_memory = cache.memory().size();
      for (int64_t h = 0; h < s.Hq; ++h)
        for (int64_t i = 0; i < 100; ++i) {
          const int64_t r = rows[size_t(h * 100 + i)];
          ASSERT_TRUE(i < in_memory ? r >= 0 && r < in_memory : r == -1) << "head " << h << " slot " << i;
        }
      if (in_memory == 0) {
        for (float m : mass) ASSERT_EQ(m, 0.f);
      }
      if (in_memory >= 3) {  // an index's candidates: the exact best 3 in reverse give the exact top-3's output
        std::vector<float> o_top(o.size()), o_cand(o.size());
        std::vector<int64_t> top(size_t(s.Hq * 3)), cand(size_t(s.Hq * 3)), got(size_t(s.Hq * 3));
        const HeadsView top_v{o_top.data(), s.Hq, s.Hq * s.D, s.D}, cand_v{o_cand.data(), s.Hq, s.Hq * s.D, s.D};
        cache.decode({.q = qv, .q_position = q_pos, .o = top_v, .top_k = 3, .retrieved = top.data()});
        for (int64_t h = 0; h < s.Hq; ++h)
          for (int i = 0; i < 3; ++i) cand[size_t(h * 3 + i)] = top[size_t(h * 3 + 2 - i)];
        cache.decode({.q = qv, .q_position = q_pos, .o = cand_v, .top_k = 3, .retrieved = got.data(),
                      .candidates = cand.data()});
        ASSERT_LT(max_abs_diff(o_cand, o_top), 1e-6) << "step " << t;
        ASSERT_EQ(got, top) << "step " << t;
      }
      // The window alone.
      cache.decode({.q = qv, .q_position = q_pos, .o = ov, .top_k = 0});
      std::vector<float> o_win, lse_win;
      decode_step(s, pp, t + 1 - cache.window_size(), cache.window_size(), q_pos, o_win, lse_win);
      ASSERT_LT(max_abs_diff(o, o_win), 2e-5) << "step " << t;
    }
    EXPECT_GT(cache.memory().size(), 30);
    // Out of order positions are refused and change nothing.
    const int64_t before = cache.size();
    int64_t early = 0;
    test::expect_error([&] { cache.append(1, s.kv_view(s.k, 0), s.kv_view(s.v, 0), &early); }, "positions");
    EXPECT_EQ(cache.size(), before);
  }
  const RopeFreqs f = freqs_for(32);
  PositionParams pp;
  pp.mode = PositionMode::Rerope, pp.freqs = &f, pp.window = 8;
  test::expect_error([&] { MemoryKvCache({4, 2, 32, pp, MemoryPolicy::Rerope}); }, "memory_kv_cache.window");
  test::expect_error([&] { MemoryKvCache({0, 2, 32, pp, MemoryPolicy::Exact}); }, "memory_kv_cache.window");
}

// A cache saved and opened again continues exactly as the one that went on: after every further append (rows moving
// to the memory included) the two decode to the same bits, for each policy that can be saved and each storage;
// KvMemory::read gives an owned memory with the mapped one's rows. What does not fit is refused, naming the file.
TEST(MemoryKvCache, SavedAndOpenedGoesOnAsTheOneThatStayed) {
  Problem s;
  const RopeFreqs f = freqs_for(s.D);
  const std::string dir = ::testing::TempDir() + "/rotary_mkv_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  const std::string mem = dir + "/layer0.memory", win = dir + "/layer0.window";
  struct Case {
    PositionMode mode;
    MemoryPolicy policy;
    DType storage;
  };
  for (const Case& c : {Case{PositionMode::Rope, MemoryPolicy::Exact, DType::F32},
                        Case{PositionMode::Rope, MemoryPolicy::Exact, DType::BF16},
                        Case{PositionMode::Rerope, MemoryPolicy::Rerope, DType::F16},
                        Case{PositionMode::Rope, MemoryPolicy::NoRotation, DType::F32}})
    for (int64_t first : {int64_t(3), int64_t(17)}) {  // the window alone, then a memory behind it
      SCOPED_TRACE(std::string(memory_policy_name(c.policy)) + " " + dtype_name(c.storage) + ", saved after " +
                   std::to_string(first));
      PositionParams pp;
      pp.mode = c.mode, pp.freqs = &f, pp.window = c.mode == PositionMode::Rerope ? 4 : 0;
      const MemoryKvCacheConfig config{6, s.Hkv, s.D, pp, c.policy, c.storage};
      MemoryKvCache stayed(config);
      stayed.append(first, s.kv_view(s.k, 0), s.kv_view(s.v, 0), s.pos.data());
      stayed.save(mem, win, 77);
      MemoryKvCache opened = MemoryKvCache::open(config, mem, win, 77);
      ASSERT_EQ(opened.size(), stayed.size());
      ASSERT_EQ(opened.window_size(), stayed.window_size());
      ASSERT_EQ(opened.memory().size(), stayed.memory().size());
      EXPECT_FALSE(opened.memory().read_only());
      const KvMemory read = KvMemory::read(mem, stayed.memory().config(), 77);
      ASSERT_EQ(read.size(), stayed.memory().size());
      for (int64_t h = 0; h < s.Hkv && read.size() > 0; ++h) {  // (an empty memory's blocks are null)
        const size_t bytes = size_t(read.size() * s.D) * dtype_size(c.storage);
        EXPECT_EQ(0, std::memcmp(read.key_data(h), stayed.memory().key_data(h), bytes));
        EXPECT_EQ(0, std::memcmp(read.value_data(h), stayed.memory().value_data(h), bytes));
      }
      for (int64_t t = first; t < s.tokens; ++t) {
        stayed.append(1, s.kv_view(s.k, t), s.kv_view(s.v, t), &s.pos[size_t(t)]);
        opened.append(1, s.kv_view(s.k, t), s.kv_view(s.v, t), &s.pos[size_t(t)]);
        std::vector<float> a(size_t(s.Hq * s.D)), b(a.size());
        const HeadsView qv{s.q.data(), s.Hq, s.Hq * s.D, s.D};
        stayed.decode({.q = qv, .q_position = s.pos[size_t(t)], .o = {a.data(), s.Hq, s.Hq * s.D, s.D}, .top_k = 5});
        opened.decode({.q = qv, .q_position = s.pos[size_t(t)], .o = {b.data(), s.Hq, s.Hq * s.D, s.D}, .top_k = 5});
        ASSERT_EQ(a, b) << "token " << t;
      }
      EXPECT_GT(opened.memory().size(), 30);
    }
  PositionParams pp;
  pp.mode = PositionMode::Rope, pp.freqs = &f;
  const MemoryKvCacheConfig config{6, s.Hkv, s.D, pp, MemoryPolicy::Exact};
  MemoryKvCache full(config);
  full.append(20, s.kv_view(s.k, 0), s.kv_view(s.v, 0), s.pos.data());  // memory 12 rows, window 8
  full.save(mem, win, 77);
  test::expect_error([&] { MemoryKvCache::open(config, mem, win, 78); }, {mem, "fingerprint"});
  test::expect_error([&] { MemoryKvCache::open(config, win, mem, 77); }, "policy");  // the two files swapped
  MemoryKvCacheConfig other = config;
  other.memory_storage = DType::BF16;
  test::expect_error([&] { MemoryKvCache::open(other, mem, win, 77); }, {mem, "storage"});
  test::expect_error([&] { full.save(mem, mem, 77); }, "memory_kv_cache.save window_path");
  MemoryKvCacheConfig unlimiformer = config;
  unlimiformer.policy = MemoryPolicy::Unlimiformer;
  test::expect_error([&] { MemoryKvCache(unlimiformer).save(mem + "u", win + "u"); },
                     {"memory_kv_cache.policy = unlimiformer", "query origin"});
  // Window files that no cache of this config writes (the documented layout: policy none, f32).
  auto window_file = [&](int64_t rows, int64_t from) {
    KvMemory w(KvMemoryConfig{s.Hkv, s.D, MemoryPolicy::NoRotation, nullptr, 0, 0, DType::F32});
    w.append(rows, s.kv_view(s.k, from), s.kv_view(s.v, from), s.pos.data() + from);
    w.save(win, 77);
  };
  window_file(12, 12);  // 2W rows
  test::expect_error([&] { MemoryKvCache::open(config, mem, win, 77); }, {win, "window rows = 12", "< 2 x window"});
  window_file(3, 12);  // fewer than W behind a memory of 12 rows
  test::expect_error([&] { MemoryKvCache::open(config, mem, win, 77); }, {win, "window rows = 3", ">= window = 6"});
  window_file(7, 5);  // positions inside the memory's
  test::expect_error([&] { MemoryKvCache::open(config, mem, win, 77); }, {win, "window position[0]"});
  std::remove(mem.c_str()), std::remove(win.c_str()), ::rmdir(dir.c_str());
}

TEST(KvMemory, BadInputNamesTheFieldAndChangesNothing) {
  Problem s;
  const RopeFreqs f = freqs_for(s.D);
  const RopeFreqs other = freqs_for(16);
  test::expect_error([&] { KvMemory({0, s.D, MemoryPolicy::Exact, &f, 0, 0}); }, "kv_heads");
  test::expect_error([&] { KvMemory({s.Hkv, s.D, MemoryPolicy::Exact, nullptr, 0, 0}); }, "freqs");
  test::expect_error([&] { KvMemory({s.Hkv, s.D, MemoryPolicy::Exact, &other, 0, 0}); }, "head_dim");
  test::expect_error([&] { KvMemory({s.Hkv, s.D, MemoryPolicy::Rerope, &f, 0, 0}); }, "window");
  test::expect_error([&] { KvMemory({s.Hkv, s.D, MemoryPolicy::Exact, &f, 0, 1}); }, "logn_train_len");
  test::expect_error([&] { parse_memory_policy("unlimited"); }, {"memory_policy", "unlimiformer"});
  EXPECT_EQ(parse_memory_policy("unlimiformer"), MemoryPolicy::Unlimiformer);
  EXPECT_EQ(parse_memory_policy("none"), MemoryPolicy::NoRotation);

  KvMemory memory({s.Hkv, s.D, MemoryPolicy::Exact, &f, 0, 0});
  std::vector<float> o(size_t(s.Hq * s.D)), lse(size_t(s.Hq));
  const int64_t q_pos = 100;
  MemoryAttentionParams p;
  p.tokens = 1;
  p.q = {s.q.data(), s.Hq, s.Hq * s.D, s.D};
  p.q_positions = &q_pos;
  p.o = {o.data(), s.Hq, s.Hq * s.D, s.D};
  p.lse = lse.data();
  p.top_k = 1;
  test::expect_error([&] { memory_attention(memory, p); }, "memory size");  // empty

  // A bad append adds nothing: a k view with the wrong head count, then a position past 2^53.
  test::expect_error([&] { memory.append(4, {s.k.data(), 3, 3 * s.D, s.D}, s.kv_view(s.v, 0), s.pos.data()); },
                     "kv_heads");
  std::vector<int64_t> bad = {1, 2, int64_t(1) << 60, 4};
  test::expect_error([&] { memory.append(4, s.kv_view(s.k, 0), s.kv_view(s.v, 0), bad.data()); }, "positions");
  EXPECT_EQ(memory.size(), 0);

  memory.append(8, s.kv_view(s.k, 0), s.kv_view(s.v, 0), s.pos.data());
  p.top_k = 0;
  test::expect_error([&] { memory_attention(memory, p); }, "top_k");
  p.top_k = 9;
  test::expect_error([&] { memory_attention(memory, p); }, "top_k");
  p.top_k = 2;
  p.q.heads = 3;
  test::expect_error([&] { memory_attention(memory, p); }, "q.heads");
  p.q.heads = s.Hq;
  p.lse = nullptr;
  test::expect_error([&] { memory_attention(memory, p); }, "lse");
}

}  // namespace
}  // namespace rotary
