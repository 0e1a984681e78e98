// A session's prefix reused (Session::copy_prefix_from, rotary_engine/model.h; `rotary serve`'s prefix cache): a
// session continued from another's first n tokens gives bitwise the hidden rows of a session that read those n
// tokens itself and went on the same way - with the checkpoint's RoPE, ReRoPE on a bf16 cache, Leaky ReRoPE on a q8
// cache, on every fixture family - while the source keeps all of its tokens; tokens(), held_bytes() and a saved
// context's token ids; and what a copy refuses, by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "expect_error.h"
#include "hf_fixtures.h"
#include "rotary_engine/hf_model.h"

namespace rotary::test {
namespace {

namespace fs = std::filesystem;

// Hidden rows of tokens[from, to) read one token at a time by `s` (positions = indices).
std::vector<float> decode(engine::Session& s, const std::vector<int64_t>& tokens, int64_t from, int64_t to, int64_t d) {
  std::vector<float> hidden(size_t((to - from) * d));
  for (int64_t t = from; t < to; ++t) s.forward(&tokens[size_t(t)], &t, 1, hidden.data() + (t - from) * d);
  return hidden;
}

TEST_P(HfEngineFixture, ACopiedPrefixGoesOnAsTheSessionThatReadIt) {
  const fs::path dir = kFixtures / GetParam();
  const Expected e = read_expected(dir);
  const int64_t S = int64_t(e.tokens.size()), L = S / 2;
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const int64_t width = c.model->arch().d_model;
  const engine::PositionMethod native = c.description.positions();
  const auto [rerope, leaky] = rerope_variants(native);
  struct Case {
    const char* name;
    engine::PositionMethod positions;
    DType kv;
    KvStorage storage;
  };
  for (const Case& k : {Case{"rope f32", native, DType::F32, KvStorage::Dtype},
                        Case{"rerope bf16", rerope, DType::BF16, KvStorage::Dtype},
                        Case{"leaky q8", leaky, DType::F32, KvStorage::Q8}}) {
    SCOPED_TRACE(std::string(GetParam()) + ", " + k.name);
    engine::SessionOptions o;
    o.capacity = S, o.positions = k.positions, o.kv_dtype = k.kv, o.kv_storage = k.storage, o.prefill_chunk = 3;
    const std::vector<int64_t> pos = positions_from_zero(S);
    // The source read the first L tokens as a prompt, then other tokens than the ones that follow here.
    engine::Session source(c.model, o);
    source.forward(e.tokens.data(), pos.data(), L, nullptr);
    std::vector<int64_t> other(e.tokens.rbegin(), e.tokens.rend());
    for (int64_t t = L; t < S; ++t) source.forward(&other[size_t(t)], &pos[size_t(t)], 1, nullptr);
    const int64_t source_bytes = source.held_bytes();
    // The reference read the same L tokens itself and goes on with the fixture's.
    engine::Session reference(c.model, o);
    reference.forward(e.tokens.data(), pos.data(), L, nullptr);
    const int64_t prefix_bytes = reference.held_bytes();
    const std::vector<float> want = decode(reference, e.tokens, L, S, width);
    engine::Session copy(c.model, o);
    EXPECT_EQ(copy.held_bytes(), 0);
    copy.copy_prefix_from(source, L);
    EXPECT_EQ(copy.size(), L);
    EXPECT_EQ(copy.next_position(), L);
    EXPECT_EQ(copy.held_bytes(), prefix_bytes);
    EXPECT_EQ(copy.tokens(), std::vector<int64_t>(e.tokens.begin(), e.tokens.begin() + L));
    const std::vector<float> got = decode(copy, e.tokens, L, S, width);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "the copy's rows differ from the reader's";
    EXPECT_EQ(copy.tokens(), e.tokens);
    // The source still holds all of its tokens.
    EXPECT_EQ(source.size(), S);
    EXPECT_EQ(source.held_bytes(), source_bytes);
    EXPECT_GT(source_bytes, prefix_bytes);
    EXPECT_EQ(source.tokens()[size_t(L)], other[size_t(L)]);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfEngineFixture, ::testing::ValuesIn(kFamilies));

TEST(SessionPrefix, RefusesWhatCannotBeCopiedByName) {
  const engine::HfModel c = engine::open_hf_model((kFixtures / "llama3").string());
  const engine::HfModel other = engine::open_hf_model((kFixtures / "llama3").string());
  engine::SessionOptions o;
  o.capacity = 8, o.positions = c.description.positions();
  const int64_t tokens[] = {1, 2, 3, 4}, pos[] = {0, 1, 2, 3};
  engine::Session source(c.model, o);
  source.forward(tokens, pos, 4, nullptr);
  engine::Session foreign(other.model, o);
  expect_error([&] { foreign.copy_prefix_from(source, 2); }, {"copy_prefix_from source", "another model"});
  engine::SessionOptions bf16 = o;
  bf16.kv_dtype = DType::BF16;
  engine::Session other_cache(c.model, bf16);
  expect_error([&] { other_cache.copy_prefix_from(source, 2); }, {"copy_prefix_from source", "kv cache f32", "bf16"});
  engine::Session target(c.model, o);
  expect_error([&] { target.copy_prefix_from(source, 0); }, {"copy_prefix_from n = 0", "[1, source.size() = 4]"});
  expect_error([&] { target.copy_prefix_from(source, 5); }, {"copy_prefix_from n = 5"});
  engine::SessionOptions small = o;
  small.capacity = 2;
  engine::Session tight(c.model, small);
  expect_error([&] { tight.copy_prefix_from(source, 3); }, {"copy_prefix_from n = 3", "capacity = 2"});
  target.copy_prefix_from(source, 2);
  expect_error([&] { target.copy_prefix_from(source, 2); }, {"copy_prefix_from", "holding 2 tokens", "an empty session"});
  engine::SessionOptions memory = o;
  engine::MemoryOptions m;
  m.window = 2, m.top_k = 1;
  memory.memory = m;
  engine::Session with_memory(c.model, memory);
  with_memory.forward(tokens, pos, 4, nullptr);
  engine::Session memory_target(c.model, memory);
  expect_error([&] { memory_target.copy_prefix_from(with_memory, 2); }, {"copy_prefix_from source", "a memory"});
  EXPECT_GT(with_memory.held_bytes(), 0);
}

// A saved context keeps the tokens' ids: the opened session's tokens() are the saved one's.
TEST(SessionPrefix, ASavedContextKeepsItsTokenIds) {
  const engine::HfModel c = engine::open_hf_model((kFixtures / "qwen2").string());
  engine::SessionOptions o;
  o.capacity = 8, o.positions = c.description.positions();
  const int64_t tokens[] = {5, 7, 11, 13, 17}, pos[] = {0, 1, 2, 3, 4};
  engine::Session saved(c.model, o);
  saved.forward(tokens, pos, 3, nullptr);
  saved.forward(tokens + 3, pos + 3, 1, nullptr);
  const fs::path dir = fs::path(::testing::TempDir()) / ("rotary_prefix_ctx_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  saved.save_context(dir.string());
  EXPECT_TRUE(fs::exists(dir / "tokens.ids"));
  engine::Session opened(c.model, o);
  opened.open_context(dir.string());
  EXPECT_EQ(opened.tokens(), std::vector<int64_t>(tokens, tokens + 4));
  EXPECT_EQ(opened.held_bytes(), saved.held_bytes());
  // A token-id file of the wrong length is refused by name (the manifest's hash names it first).
  { std::ofstream(dir / "tokens.ids", std::ios::binary | std::ios::trunc) << "12345678"; }
  engine::Session damaged(c.model, o);
  expect_error([&] { damaged.open_context(dir.string()); }, {"tokens.ids"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rotary::test
