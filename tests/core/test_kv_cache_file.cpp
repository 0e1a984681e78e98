// A KvCache saved and opened again (KvCache::save / open / open_bytes, rotary/kv_cache.h; the file:
// core/src/kv_cache_file.h): the continued cache decodes and grows exactly as the one that never left memory, in
// every position mode and storage; a file for another cache, of another model or damaged is refused by name; the
// fuzz target's seeds (fuzz/corpus/kv_cache/) are what save writes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "cases_decode.h"
#include "expect.h"
#include "kv_cache_file.h"
#include "rotary/error.h"
#include "rotary/kv_cache.h"

namespace rotary {
namespace {

using test::DecodeRows;
using test::DecodeSpec;
using test::expect_error;
using test::GuardedBuffer;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/rotary_kvc_" + std::to_string(::getpid()) + "_" + name;
}
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Saved {
  DecodeSpec c;
  KvStorage storage = KvStorage::Dtype;
};

// One cache of each position mode, in f32, bf16 (log-n) and f16, one with q8 storage, one with a rotary_dim < D.
std::vector<Saved> every_mode_and_storage() {
  std::vector<Saved> cases(4);
  cases[0].c.mode = PositionMode::Rope;
  cases[1].c.mode = PositionMode::Rerope, cases[1].c.dtype = DType::BF16, cases[1].c.logn = 16, cases[1].c.window = 9;
  cases[2].c.mode = PositionMode::LeakyRerope, cases[2].c.roper = true, cases[2].c.D = 70, cases[2].c.rotary_dim = 64;
  cases[2].c.window = 7, cases[2].storage = KvStorage::Q8;
  cases[3].c.mode = PositionMode::None, cases[3].c.dtype = DType::F16, cases[3].c.Hq = 2, cases[3].c.Hkv = 2;
  return cases;
}

// A case's rotation and 40 tokens: their q / k / v rows (uniform, seeded) and positions.
struct CaseTokens {
  static constexpr int64_t kTokens = 40;
  explicit CaseTokens(const DecodeSpec& c)
      : f(test::make_freqs(c)), pp(test::make_pos(c, &f)), rows(c.dtype, c.Hq, c.Hkv, kTokens, c.D),
        pos(test::make_positions(kTokens, 4)) {
    test::fill_uniform(rows.q, 1), test::fill_uniform(rows.k, 2), test::fill_uniform(rows.v, 3);
  }
  CaseTokens(const CaseTokens&) = delete;  // (pp points at f)
  // The keys / values of the tokens from `t` on, as append() takes them.
  HeadsView keys_from(const DecodeSpec& c, int64_t t) { return view_from(rows.k, c, t); }
  HeadsView values_from(const DecodeSpec& c, int64_t t) { return view_from(rows.v, c, t); }
  static HeadsView view_from(GuardedBuffer& b, const DecodeSpec& c, int64_t t) {
    return {static_cast<uint8_t*>(b.data()) + t * c.Hkv * c.D * int64_t(dtype_size(c.dtype)), c.Hkv, c.Hkv * c.D, c.D};
  }
  RopeFreqs f;
  PositionParams pp;
  DecodeRows rows;
  std::vector<int64_t> pos;
};

// body(case, its tokens) for every case of every_mode_and_storage(), each traced by name.
void for_every_case(const std::function<void(const Saved&, CaseTokens&)>& body) {
  for (const Saved& s : every_mode_and_storage()) {
    SCOPED_TRACE(test::describe(s.c) + (s.storage == KvStorage::Q8 ? " q8" : ""));
    CaseTokens t(s.c);
    body(s, t);
  }
}

// The cache of spec c holding the first n tokens of `rows` at `pos`, in `storage`, of `capacity` tokens.
KvCache filled(const DecodeSpec& c, const PositionParams& pp, KvStorage storage, const DecodeRows& rows,
               const std::vector<int64_t>& pos, int64_t n, int64_t capacity) {
  KvCacheConfig config{capacity, c.Hkv, c.D, c.dtype, pp};
  config.storage = storage;
  KvCache cache(config);
  cache.append(n, {const_cast<void*>(rows.k.data()), c.Hkv, c.Hkv * c.D, c.D},
               {const_cast<void*>(rows.v.data()), c.Hkv, c.Hkv * c.D, c.D}, pos.data());
  return cache;
}

// One decode step of q at q_pos: o's bytes.
std::string step(const KvCache& cache, const DecodeSpec& c, GuardedBuffer& q, int64_t q_pos) {
  GuardedBuffer o(c.dtype, c.Hq * c.D);
  DecodeParams p;
  p.q = test::token_view(q, c.Hq, c.D), p.o = test::token_view(o, c.Hq, c.D), p.q_positions = &q_pos;
  p.threads = 1;
  attention_decode(cache, p);
  return std::string(static_cast<const char*>(o.data()), size_t(c.Hq * c.D) * dtype_size(c.dtype));
}

// Saved after 37 tokens and opened with room for 5 more: the same positions, the same decode step bit for bit,
// and after 3 more tokens appended to both, the same step again; the capacity is the saved tokens + the room.
TEST(KvCacheFile, ASavedCacheContinuesBitForBit) {
  for_every_case([](const Saved& s, CaseTokens& t) {
    const DecodeSpec& c = s.c;
    const int64_t n = CaseTokens::kTokens;
    const PositionParams& pp = t.pp;
    DecodeRows& rows = t.rows;
    const std::vector<int64_t>& pos = t.pos;
    KvCache original = filled(c, pp, s.storage, rows, pos, 37, n);
    const std::string path = temp_path("continue.kvc");
    original.save(path, 99);
    KvCacheConfig expected{5, c.Hkv, c.D, c.dtype, pp};
    expected.storage = s.storage;
    KvCache opened = KvCache::open(path, expected, 99);
    std::remove(path.c_str());
    EXPECT_EQ(opened.size(), 37);
    EXPECT_EQ(opened.capacity(), 42);
    EXPECT_EQ(opened.storage(), s.storage);
    EXPECT_EQ(0, std::memcmp(opened.positions(), original.positions(), 37 * sizeof(int64_t)));
    EXPECT_EQ(step(opened, c, rows.q, pos[36] + 2), step(original, c, rows.q, pos[36] + 2));
    const HeadsView k = t.keys_from(c, 37), v = t.values_from(c, 37);
    original.append(3, k, v, pos.data() + 37), opened.append(3, k, v, pos.data() + 37);
    EXPECT_EQ(step(opened, c, rows.q, pos[39]), step(original, c, rows.q, pos[39]));
    expect_error([&] { opened.append(3, k, v, pos.data() + 37); }, "exceeds capacity = 42");
  });
}

// A prefix copied out of a cache (KvCache::copy_prefix) is the cache that only ever held those tokens: the same
// positions and decode step bit for bit, and the same again after more tokens go into both; the original keeps all
// of its tokens; n past the size and a capacity below n are refused by name.
TEST(KvCachePrefix, ACopiedPrefixIsTheCacheOfThoseTokens) {
  for_every_case([](const Saved& s, CaseTokens& t) {
    const DecodeSpec& c = s.c;
    const int64_t n = CaseTokens::kTokens;
    const PositionParams& pp = t.pp;
    DecodeRows& rows = t.rows;
    const std::vector<int64_t>& pos = t.pos;
    const KvCache original = filled(c, pp, s.storage, rows, pos, 37, n);
    KvCache direct = filled(c, pp, s.storage, rows, pos, 25, 28);
    KvCache copy = original.copy_prefix(25, 28);
    EXPECT_EQ(original.size(), 37);
    EXPECT_EQ(copy.size(), 25);
    EXPECT_EQ(copy.capacity(), 28);
    EXPECT_EQ(copy.last_position(), pos[24]);
    EXPECT_EQ(0, std::memcmp(copy.positions(), direct.positions(), 25 * sizeof(int64_t)));
    EXPECT_EQ(step(copy, c, rows.q, pos[24] + 1), step(direct, c, rows.q, pos[24] + 1));
    const HeadsView k = t.keys_from(c, 25), v = t.values_from(c, 25);
    direct.append(3, k, v, pos.data() + 25), copy.append(3, k, v, pos.data() + 25);
    EXPECT_EQ(step(copy, c, rows.q, pos[27]), step(direct, c, rows.q, pos[27]));
    expect_error([&] { copy.append(1, k, v, pos.data() + 28); }, "exceeds capacity = 28");
    EXPECT_EQ(original.copy_prefix(0, 1).size(), 0);
    expect_error([&] { original.copy_prefix(38, 40); }, "kv_cache.copy_prefix: n = 38");
    expect_error([&] { original.copy_prefix(20, 19); }, "kv_cache.copy_prefix: capacity = 19");
  });
}

// Everything a file is checked for, by name: another cache's settings, another model's fingerprint, a file that is
// not one, truncated, padded, with a damaged header or positions; a missing path; a capacity past 2^34.
TEST(KvCacheFile, RefusesAnotherCacheAndDamageByName) {
  DecodeSpec c;
  c.mode = PositionMode::Rerope, c.window = 6;
  const RopeFreqs f = test::make_freqs(c);
  const PositionParams pp = test::make_pos(c, &f);
  DecodeRows rows(c.dtype, c.Hq, c.Hkv, 12, c.D);
  test::fill_uniform(rows.k, 5), test::fill_uniform(rows.v, 6);
  const std::vector<int64_t> pos = test::make_positions(12, 7);
  const std::string path = temp_path("refuse.kvc");
  filled(c, pp, KvStorage::Dtype, rows, pos, 12, 16).save(path, 5);
  const KvCacheConfig good{4, c.Hkv, c.D, c.dtype, pp};
  EXPECT_EQ(KvCache::open(path, good, 5).size(), 12);

  expect_error([&] { KvCache::open(path, good, 6); }, {path, "fingerprint = 5", "6 (another model)"});
  KvCacheConfig other = good;
  other.dtype = DType::BF16;
  expect_error([&] { KvCache::open(path, other, 5); }, {"dtype = f32", "this cache has bf16"});
  other = good, other.storage = KvStorage::Q8;
  expect_error([&] { KvCache::open(path, other, 5); }, {"storage = dtype", "this cache has q8"});
  other = good, other.kv_heads = 1;
  expect_error([&] { KvCache::open(path, other, 5); }, "kv_heads = 2");
  other = good, other.pos.window = 7;
  expect_error([&] { KvCache::open(path, other, 5); }, {"window = 6", "this cache has 7"});
  DecodeSpec rope = c;
  rope.mode = PositionMode::Rope;
  other = good, other.pos = test::make_pos(rope, &f);
  expect_error([&] { KvCache::open(path, other, 5); }, {"mode = 2", "this cache has 1"});
  RopeFreqs g = f;
  g.inv_freq[1] *= 1.5;
  other = good, other.pos.freqs = &g;
  expect_error([&] { KvCache::open(path, other, 5); }, "another rotation");
  other = good, other.capacity = int64_t(1) << 34;
  expect_error([&] { KvCache::open(path, other, 5); }, {"capacity", "the 12 tokens saved in"});
  expect_error([&] { KvCache::open(path + ".missing", good, 5); }, "kv_cache.open path");
  other = good, other.dtype = DType::F64, other.storage = KvStorage::Q8;  // the expected config first
  expect_error([&] { KvCache::open(path + ".missing", other, 5); }, "dtype = f64");

  const std::string bytes = file_bytes(path);
  std::remove(path.c_str());
  auto open = [&](std::string b) {
    std::vector<uint64_t> aligned((b.size() + 7) / 8);  // 8-byte aligned, as a mapping is
    std::memcpy(aligned.data(), b.data(), b.size());
    return KvCache::open_bytes(aligned.data(), b.size(), good, 5, "bytes");
  };
  EXPECT_EQ(open(bytes).size(), 12);
  expect_error([&] { open(bytes.substr(0, bytes.size() - 1)); }, {"bytes:", "(truncated)"});
  expect_error([&] { open(bytes + std::string(64, '\0')); }, "(trailing bytes)");
  expect_error([&] { open(bytes.substr(0, 20)); }, "no RTKVCAC1 magic");
  std::string b = bytes;
  b[8 + 24] ^= 1;  // window (no range to fail first)
  expect_error([&] { open(b); }, "checksum");
  b = bytes;
  b[8] = 0;  // kv_heads = 0 (high bytes already 0): out of range, named before the checksum
  expect_error([&] { open(b); }, {"a damaged header: kv_heads = 0", "1..65536"});
  // Positions are not in the header's checksum: a decreasing pair is refused by the positions' own check.
  b = bytes;
  const size_t positions = (8 + sizeof(detail::KvCacheFileHeader) + 8 * size_t(f.pairs()) + 8 + 63) / 64 * 64;
  const int64_t late = 1000;
  std::memcpy(&b[positions], &late, 8);
  expect_error([&] { open(b); }, {"positions[1]", "positions must increase"});
}

// The fuzz target's seeds (fuzz/corpus/kv_cache/) are what save() writes for these caches - mode none in f32 and
// ReRoPE (keys stored un-rotated: no sin / cos in the bytes) in q8, with inverse frequencies given exactly - so
// they follow the format; ROTARY_WRITE_FUZZ_SEEDS=1 rewrites them after a change of it.
TEST(KvCacheFile, FuzzSeedsAreWhatSaveWrites) {
  RopeFreqs f;
  f.head_dim = 32, f.rotary_dim = 32, f.layout = RopeLayout::HalfSplit;
  f.inv_freq.assign(16, 0.0);
  for (int i = 0; i < 16; ++i) f.inv_freq[size_t(i)] = 1.0 / double(1 << i);
  struct Seed {
    const char* file;
    PositionMode mode;
    KvStorage storage;
    int64_t kv_heads, tokens;
    int head_dim;
  };
  const bool rewrite = std::getenv("ROTARY_WRITE_FUZZ_SEEDS") != nullptr;
  for (const Seed& s : {Seed{"none_f32_2x8_3rows.kvc", PositionMode::None, KvStorage::Dtype, 2, 3, 8},
                        Seed{"rerope_q8_1x32_4rows.kvc", PositionMode::Rerope, KvStorage::Q8, 1, 4, 32}}) {
    SCOPED_TRACE(s.file);
    PositionParams pp;
    pp.mode = s.mode;
    if (s.mode != PositionMode::None) pp.freqs = &f, pp.window = 2;
    KvCacheConfig config{s.tokens, s.kv_heads, s.head_dim, DType::F32, pp};
    config.storage = s.storage;
    KvCache cache(config);
    const int64_t row = s.kv_heads * s.head_dim;
    std::vector<float> k(size_t(s.tokens * row)), v(k.size());
    std::vector<int64_t> pos(size_t(s.tokens));
    for (int64_t t = 0; t < s.tokens; ++t) {
      pos[size_t(t)] = 3 * t + 1;
      for (int64_t i = 0; i < row; ++i)
        k[size_t(t * row + i)] = 0.25f * float(t + 1) - float(i) / 16, v[size_t(t * row + i)] = -k[size_t(t * row + i)];
    }
    cache.append(s.tokens, {k.data(), s.kv_heads, row, s.head_dim}, {v.data(), s.kv_heads, row, s.head_dim},
                 pos.data());
    const std::string path = temp_path(s.file);
    cache.save(path, 11);
    const std::string saved = file_bytes(path);
    std::remove(path.c_str());
    const std::string checked_in = std::string(ROTARY_SOURCE_DIR) + "/fuzz/corpus/kv_cache/" + s.file;
    if (rewrite) std::ofstream(checked_in, std::ios::binary) << saved;
    EXPECT_EQ(file_bytes(checked_in), saved) << checked_in << " is not what save() writes";
    config.capacity = 1;
    EXPECT_EQ(KvCache::open(checked_in, config, 11).size(), s.tokens);
  }
}

}  // namespace
}  // namespace rotary
