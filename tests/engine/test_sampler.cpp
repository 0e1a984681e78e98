// engine::TokenSampler (rotary_engine/generate.h): the one sampling rule one choice at a time - the same tokens as
// sample_tokens on the same logits and seed; top_p keeps draws inside the nucleus (the most probable ids whose
// probabilities first reach top_p of the whole) and every id of it is drawn; greedy ignores top_p; bad settings and
// non-finite logits are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "expect_error.h"
#include "rotary_engine/generate.h"

namespace rotary::test {
namespace {

// Probabilities at temperature 1: e^0 = 1, e^-0.1 = 0.905, e^-2 = 0.135, then ~0: the sum is 2.04.
const std::vector<float> kLogits = {2.0f, 1.9f, 0.0f, -5.0f, -5.0f};

std::set<int64_t> drawn(double top_p, int draws) {
  std::set<int64_t> ids;
  for (int seed = 0; seed < draws; ++seed) {
    engine::GenerateOptions o;
    o.temperature = 1, o.top_p = top_p, o.seed = uint64_t(seed);
    engine::TokenSampler s(o, int64_t(kLogits.size()));
    ids.insert(s.choose(kLogits.data(), 1));
  }
  return ids;
}

TEST(TokenSampler, TopPDrawsOnlyFromTheNucleus) {
  // 0.4 of 2.04 is reached by id 0 alone; 0.5 (1.02) needs ids 0 and 1; 1 draws from all.
  EXPECT_EQ(drawn(0.4, 300), (std::set<int64_t>{0}));
  EXPECT_EQ(drawn(0.5, 300), (std::set<int64_t>{0, 1}));
  EXPECT_TRUE(drawn(1.0, 300).count(2)) << "without top_p the third id is drawn too";
}

TEST(TokenSampler, GivesSampleTokensChoicesAndGreedyIgnoresTopP) {
  engine::GenerateOptions o;
  o.temperature = 0.9, o.seed = 42, o.max_new = 20;
  // sample_tokens feeding the same logits back each step against the sampler's choices.
  const std::vector<int64_t> looped = engine::sample_tokens(o, int64_t(kLogits.size()), kLogits.data(), 1,
                                                            [&](int64_t, int64_t) { return kLogits.data(); });
  engine::TokenSampler s(o, int64_t(kLogits.size()));
  std::vector<int64_t> stepped;
  for (int i = 0; i < 20; ++i) stepped.push_back(s.choose(kLogits.data(), 1 + i));
  EXPECT_EQ(looped, stepped);
  o.temperature = 0, o.top_p = 0.01;
  engine::TokenSampler greedy(o, int64_t(kLogits.size()));
  EXPECT_EQ(greedy.choose(kLogits.data(), 1), 0);
  o.stop_ids = {3};
  EXPECT_TRUE(engine::TokenSampler(o, 5).is_stop(3));
  EXPECT_FALSE(engine::TokenSampler(o, 5).is_stop(0));
}

TEST(TokenSampler, RefusesBadSettingsAndNonFiniteLogitsByName) {
  for (double top_p : {0.0, -0.5, 1.5, std::nan("")}) {
    engine::GenerateOptions o;
    o.top_p = top_p;
    expect_error([&] { engine::TokenSampler(o, 5); }, {"top_p", "(0, 1]"});
  }
  engine::GenerateOptions o;
  engine::TokenSampler s(o, 5);
  std::vector<float> bad = kLogits;
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { s.choose(bad.data(), 7); }, {"logits[3] at position 6", "finite"});
}

}  // namespace
}  // namespace rotary::test
