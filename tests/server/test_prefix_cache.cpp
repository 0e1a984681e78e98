// The prefix cache (rotary_server/prefix_cache.h) on the llama3 fixture: the longest prefix under equal settings
// wins, never past the limit; a kept session drops the entries it holds as a prefix; the least recently used goes
// first when the budget is full (find() counts as a use); take() moves an entry out with its bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "rotary_engine/hf_model.h"
#include "rotary_server/prefix_cache.h"

namespace rotary::server {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  engine::HfModel hf = engine::open_hf_model((fs::path(ROTARY_SOURCE_DIR) / "tests/data/hf_checkpoints/llama3").string());
  engine::Session session(const std::vector<int64_t>& tokens, DType kv = DType::F32) const {
    engine::SessionOptions o;
    o.capacity = 32, o.positions = hf.description.positions(), o.kv_dtype = kv;
    engine::Session s(hf.model, o);
    std::vector<int64_t> pos(tokens.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = int64_t(i);
    s.forward(tokens.data(), pos.data(), int64_t(tokens.size()), nullptr);
    return s;
  }
};

TEST(PrefixCache, TheLongestPrefixUnderEqualSettingsWins) {
  const Fixture f;
  PrefixCache cache(64 << 20);
  cache.keep(f.session({1, 2, 3, 4}));
  cache.keep(f.session({1, 2, 9}));
  const uint64_t f32 = f.session({1}).settings_fingerprint(), bf16 = f.session({1}, DType::BF16).settings_fingerprint();
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_EQ(cache.find({1, 2, 3, 4, 5}, f32, 10).tokens, 4);
  EXPECT_EQ(cache.find({1, 2, 3, 4, 5}, f32, 3).tokens, 3) << "never past the limit";
  EXPECT_EQ(cache.find({1, 2, 9, 9}, f32, 10).tokens, 3);
  EXPECT_EQ(cache.find({7, 2, 3}, f32, 10).tokens, 0);
  EXPECT_EQ(cache.find({1, 2, 3, 4, 5}, bf16, 10).tokens, 0) << "another cache dtype's rows";
  // A session holding an entry's tokens as its prefix replaces it.
  cache.keep(f.session({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(cache.entries(), 2);
  const PrefixCache::Match m = cache.find({1, 2, 3, 4, 5, 6, 7}, f32, 10);
  EXPECT_EQ(m.tokens, 6);
  const int64_t before = cache.bytes();
  engine::Session taken = cache.take(m);
  EXPECT_EQ(taken.tokens(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(cache.entries(), 1);
  EXPECT_EQ(cache.bytes(), before - taken.held_bytes());
}

TEST(PrefixCache, TheLeastRecentlyUsedGoesFirst) {
  const Fixture f;
  const int64_t one = f.session({1, 2, 3}).held_bytes();
  PrefixCache cache(3 * one);  // three sessions of three tokens
  cache.keep(f.session({1, 2, 3}));
  cache.keep(f.session({4, 5, 6}));
  cache.keep(f.session({7, 8, 9}));
  EXPECT_EQ(cache.bytes(), 3 * one);
  const uint64_t settings = f.session({1}).settings_fingerprint();
  EXPECT_EQ(cache.find({1, 2, 3, 0}, settings, 10).tokens, 3);  // {1,2,3} used: {4,5,6} is now the oldest
  cache.keep(f.session({10, 11, 12}));
  EXPECT_EQ(cache.entries(), 3);
  EXPECT_EQ(cache.find({4, 5, 6, 0}, settings, 10).tokens, 0) << "the least recently used should have gone";
  EXPECT_EQ(cache.find({1, 2, 3, 0}, settings, 10).tokens, 3);
  EXPECT_EQ(cache.find({7, 8, 9, 0}, settings, 10).tokens, 3);
  // A session larger than the whole budget is not kept, and evicts nothing.
  cache.keep(f.session({1, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(cache.entries(), 3);
  EXPECT_EQ(PrefixCache(0).budget(), 0);
}

}  // namespace
}  // namespace rotary::server
