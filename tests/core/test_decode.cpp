// rotary/kv_cache.h beyond one decode step against the oracle (those are the "decode" op cases, cases_decode.cpp,
// run on every SIMD target by core_test_ops): consecutive steps, the last row of attention_forward_reference,
// split-K determinism, a batch of caches, RoPER's single value rotation, append threads, head-major appends,
// capacity and bad input. The oracle and tolerances are the harness's (cases_decode.h, tolerance() in
// op_harness.cpp; docs/decode.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cases_decode.h"
#include "rotary/attention.h"
#include "expect.h"
#include "rotary/error.h"
#include "rotary/kv_cache.h"
#include "rotary/rope_spec.h"

namespace rotary {
namespace {

using test::expect_error;
using test::DecodeRows;
using test::DecodeSpec;
using test::GuardedBuffer;
using test::decode_oracle;
using test::make_freqs;
using test::make_pos;
using test::make_positions;
using test::rms_error;
using test::turn;

// The rms error relative to the oracle's rms that a decode step may have (the harness's DecodeOutput bound).
double tolerance(DType t, int64_t max_pos) {
  return std::sqrt(test::tolerance(test::Quantity::DecodeOutput, {.dtype = t, .max_position = max_pos}).bound);
}
HeadsView view(GuardedBuffer& b, int64_t heads, int D) { return test::token_view(b, heads, D); }

// Tokens appended one at a time, a decode after each: every step equals the oracle over the prefix, while the
// near/far boundary moves through the cache (w = 6) and RoPER's far sum is turned each step.
TEST(Decode, ConsecutiveSteps) {
  for (PositionMode mode : {PositionMode::Rope, PositionMode::Rerope, PositionMode::LeakyRerope})
    for (bool roper : {false, true}) {
      DecodeSpec c;
      c.mode = mode;
      c.roper = roper;
      c.window = 6;
      c.leaky_k = 3;
      c.logn = 8;
      const RopeFreqs f = make_freqs(c);
      const PositionParams pp = make_pos(c, &f);
      const int64_t steps = 40;
      DecodeRows rows(c.dtype, c.Hq, c.Hkv, steps, c.D);
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
        EXPECT_LE(rms_error(o.to_double(), o_ref), tolerance(c.dtype, pos.back()));
      }
    }
}

// attention_forward_reference (engineer "attention") on the whole sequence: its last query row is the step.
TEST(Decode, MatchesAttentionForwardReferenceLastRow) {
  for (PositionMode mode : {PositionMode::Rope, PositionMode::Rerope, PositionMode::LeakyRerope})
    for (bool roper : {false, true}) {
      DecodeSpec c;
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
      EXPECT_LE(rms_error(o_dec.to_double(), last), tolerance(c.dtype, pos.back()));
    }
}

// Split-K across threads: fixed chunks give the same bits on 1 and 2 threads; chunked equals unchunked within
// rounding. (A window past the near table still equals the oracle: the "long" decode op cases.)
TEST(Decode, LongCacheSplitAcrossThreads) {
  DecodeSpec c;
  c.mode = PositionMode::LeakyRerope, c.window = 700, c.roper = true;
  c.Hq = 4, c.Hkv = 1, c.D = 64, c.rotary_dim = 64, c.n = 5000;

  const RopeFreqs f = make_freqs(c);
  const PositionParams pp = make_pos(c, &f);
  DecodeRows rows(c.dtype, c.Hq, c.Hkv, c.n, c.D);
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
  EXPECT_LE(rms_error(run(2, 256), run(1, c.n)), tolerance(c.dtype, 0));
  EXPECT_EQ(run(2, 0), run(2, 0));  // automatic split is deterministic for a thread count
}

TEST(Decode, BatchOfCachesWithOwnLengthsAndModes) {
  std::vector<DecodeSpec> cases(3);
  cases[0].mode = PositionMode::Rope, cases[0].n = 30;
  cases[1].mode = PositionMode::Rerope, cases[1].n = 81, cases[1].window = 10;
  cases[2].mode = PositionMode::LeakyRerope, cases[2].n = 5, cases[2].window = 3, cases[2].roper = true;
  const int D = 32;
  const int64_t Hq = 4, Hkv = 2, B = 3;
  std::vector<RopeFreqs> freqs;
  for (const DecodeSpec& c : cases) freqs.push_back(make_freqs(c));
  std::vector<KvCache> caches;
  std::vector<DecodeRows> rows;
  std::vector<std::vector<int64_t>> pos;
  GuardedBuffer q(DType::F32, B * Hq * D), o(DType::F32, B * Hq * D);
  test::fill_uniform(q, 41);
  for (int64_t b = 0; b < B; ++b) {
    const DecodeSpec& c = cases[size_t(b)];
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
    EXPECT_LE(rms_error(got, o_ref), tolerance(DType::F32, 0)) << "sequence " << b;
  }
}

// RoPER must rotate each value once (R(pos_j - pos_i)); a published implementation rotated twice (R(2 pos_j -
// pos_i)). The step must match the definition and be far from the mistake.
TEST(Decode, RoperRotatesValuesOnce) {
  DecodeSpec c;
  c.roper = true, c.n = 20;
  const RopeFreqs f = make_freqs(c);
  const PositionParams pp = make_pos(c, &f);
  DecodeRows rows(c.dtype, c.Hq, c.Hkv, c.n, c.D);
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
  DecodeRows wrong(c.dtype, c.Hq, c.Hkv, c.n, c.D);  // values pre-rotated by R(pos_j): the oracle then turns them again
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
  EXPECT_LE(rms_error(o.to_double(), good), tolerance(c.dtype, 0));
  EXPECT_GT(rms_error(o.to_double(), twice), 0.1);
}

TEST(Decode, CapacityIsEnforcedWithAClearError) {
  DecodeSpec c;
  const RopeFreqs f = make_freqs(c);
  DecodeRows rows(c.dtype, c.Hq, c.Hkv, 5, c.D);
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
  DecodeSpec c;
  c.mode = PositionMode::LeakyRerope;
  c.roper = true;
  const RopeFreqs f = make_freqs(c);
  const int64_t n = 64;  // n * kv_heads >= 64: append goes parallel
  DecodeRows rows(c.dtype, c.Hq, c.Hkv, n, c.D);
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
    DecodeSpec c;
    c.mode = mode;
    c.roper = true;
    const RopeFreqs f = make_freqs(c);
    const int64_t n = 21;
    DecodeRows rows(c.dtype, c.Hq, c.Hkv, n, c.D);
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
  DecodeSpec c;
  const RopeFreqs f = make_freqs(c);
  DecodeRows rows(c.dtype, c.Hq, c.Hkv, 4, c.D);
  test::fill_uniform(rows.q, 1), test::fill_uniform(rows.k, 2), test::fill_uniform(rows.v, 3);
  auto config = [&](PositionMode mode) {
    DecodeSpec m = c;
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

  // Q8 storage: not with f64 (the reference precision), an unknown storage, and not mixed with dtype storage in a
  // batch; the re-rotating baseline reads f32 rows only.
  cfg = config(PositionMode::Rope);
  cfg.storage = KvStorage::Q8, cfg.dtype = DType::F64;
  expect_error([&] { KvCache x(cfg); }, {"dtype = f64", "f32, bf16 or f16 with storage q8"});
  cfg.dtype = DType::F32, cfg.storage = KvStorage(7);
  expect_error([&] { KvCache x(cfg); }, {"storage = 7", "dtype, q8"});
  KvCacheConfig quantized = config(PositionMode::Rope);
  quantized.storage = KvStorage::Q8;
  KvCache c3(quantized);
  c3.append(1, k, v, bad.data());
  two = {&cache, &c3};
  expect_error([&] { attention_decode(two, p); }, {"caches[1].storage() = q8", "the storage of caches[0] = dtype"});
  quantized = config(PositionMode::Rerope);
  quantized.storage = KvStorage::Q8;
  KvCache c4(quantized);
  c4.append(1, k, v, bad.data());
  expect_error([&] { attention_decode_rerotate_baseline(c4, p, scratch); }, "cache.storage() = q8");
}

// A Q8 cache stores what the same cache in f32 stores, each block of kQ8Block by the q8 rule: scale = max |x| /
// 127 of the f32 row's block and every element within half a scale of it (the kernel against the reference over
// these rows is the "q8" decode op cases). Every stored array - keys, Leaky's far keys, values, RoPER's far values
// - and rows padded to whole blocks (D = 70: 32 + 32 + 6 features -> 96), appended in two pieces; kv_cache_bytes
// counts the quants and a float a block.
TEST(Decode, Q8CacheStoresEachBlockByTheQ8Rule) {
  DecodeSpec c;
  c.mode = PositionMode::LeakyRerope, c.roper = true, c.D = 70, c.rotary_dim = 64, c.Hkv = 2, c.n = 21;
  const RopeFreqs f = make_freqs(c);
  const PositionParams pp = make_pos(c, &f);
  DecodeRows rows(c.dtype, c.Hq, c.Hkv, c.n, c.D);
  test::fill_uniform(rows.k, 41), test::fill_uniform(rows.v, 42);
  const std::vector<int64_t> pos = make_positions(c.n, 43);
  KvCacheConfig plain_config{c.n, c.Hkv, c.D, DType::F32, pp}, q8_config = plain_config;
  q8_config.storage = KvStorage::Q8;
  KvCache plain(plain_config), q8(q8_config);
  for (int64_t t0 : {int64_t(0), int64_t(12)}) {
    const int64_t m = t0 == 0 ? 12 : c.n - 12, off = t0 * c.Hkv * c.D;
    const HeadsView k{static_cast<float*>(rows.k.data()) + off, c.Hkv, c.Hkv * c.D, c.D};
    const HeadsView v{static_cast<float*>(rows.v.data()) + off, c.Hkv, c.Hkv * c.D, c.D};
    plain.append(m, k, v, pos.data() + t0), q8.append(m, k, v, pos.data() + t0);
  }
  ASSERT_EQ(q8.storage(), KvStorage::Q8);
  const int64_t rs = q8.layout().row_stride, blocks = rs / kQ8Block;
  ASSERT_EQ(rs, 96);
  ASSERT_EQ(plain.layout().row_stride, 80);
  EXPECT_EQ(kv_cache_bytes(q8_config), 4 * c.n * c.Hkv * (rs + blocks * 4));  // keys, values and the far copies
  EXPECT_EQ(kv_cache_bytes(plain_config), 4 * c.n * c.Hkv * 80 * 4);
  EXPECT_EQ(plain.key_scales(), nullptr);
  struct Array {
    const char* name;
    const void* f32;
    const void* quants;
    const float* scales;
  };
  int64_t nonzero = 0;
  for (const Array& a : {Array{"keys", plain.keys(), q8.keys(), q8.key_scales()},
                         Array{"keys_far", plain.keys_far(), q8.keys_far(), q8.key_far_scales()},
                         Array{"values", plain.values(), q8.values(), q8.value_scales()},
                         Array{"values_far", plain.values_far(), q8.values_far(), q8.value_far_scales()}}) {
    ASSERT_NE(a.scales, nullptr) << a.name;
    for (int64_t g = 0; g < c.Hkv; ++g)
      for (int64_t j = 0; j < c.n; ++j)
        for (int64_t b = 0; b < blocks; ++b) {
          SCOPED_TRACE(std::string(a.name) + " head " + std::to_string(g) + " row " + std::to_string(j) + " block " +
                       std::to_string(b));
          // The f32 row is 80 long: the q8 row's features past it are padding (zero).
          const int64_t row = g * c.n + j;
          float x[kQ8Block] = {};
          for (int64_t i = 0; i < kQ8Block && b * kQ8Block + i < 80; ++i)
            x[i] = static_cast<const float*>(a.f32)[row * 80 + b * kQ8Block + i];
          float amax = 0;
          for (float e : x) amax = std::max(amax, std::fabs(e));
          const float scale = a.scales[row * blocks + b];
          EXPECT_EQ(scale, amax / 127.0f);
          for (int64_t i = 0; i < kQ8Block; ++i) {
            const int8_t qi = static_cast<const int8_t*>(a.quants)[row * rs + b * kQ8Block + i];
            EXPECT_LE(std::fabs(double(qi) * scale - double(x[i])), 0.5 * double(scale) * (1 + 0x1p-20)) << i;
            nonzero += qi != 0;
          }
        }
  }
  EXPECT_GT(nonzero, 4 * c.n * c.Hkv * 60);
}

}  // namespace
}  // namespace rotary
