// The engine's retrieval memory (SessionOptions::memory, docs/memory.md) on every fixture family
// (tests/data/hf_checkpoints), opened by engine::open_hf_model: with every row retrieved it is the full forward
// (the float64 transcription of transformers); the page search and a caller's search propose the rows it attends;
// what it refuses, by name.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "expect_error.h"
#include "hf_fixtures.h"
#include "rotary_engine/generate.h"
#include "rotary_engine/hf_model.h"

namespace rotary::test {
namespace {

namespace fs = std::filesystem;


// A retrieval memory behind the caches (SessionOptions::memory): with every memory row retrieved, window + memory
// is attention over all the tokens, so the logits equal the transcription's - policy exact under the checkpoint's
// RoPE, policy rerope under ReRoPE (every memory key past the window sits at distance w, as ReRoPE puts it) - through
// chunked prompts (chunks of 3 and 5, the window 4..8 tokens) and one token at a time. The merge adds one fp32
// log-sum-exp per query, so the float32 bound stands. The window alone (top_k 0) and retrieved keys left unrotated
// (policy none) must differ, or the check would not see the memory.
TEST_P(HfEngineFixture, AMemoryWithEveryRowRetrievedEqualsTheFullForward) {
  const fs::path dir = kFixtures / GetParam();
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const engine::PositionMethod native = c.description.positions();
  const int64_t S = int64_t(e.tokens.size());
  const std::vector<double>& want = e.logits.at("logits");
  auto memory = [](MemoryPolicy policy, int64_t window, int top_k, int64_t chunk) {
    engine::MemoryOptions m;
    m.policy = policy, m.window = window, m.top_k = top_k, m.chunk = chunk;
    return m;
  };
  for (int64_t chunk : {3, 5})
    for (int64_t prompt : {S, S / 2, int64_t(1)}) {
      const engine::MemoryOptions all = memory(MemoryPolicy::Exact, 4, 1 << 20, chunk);
      EXPECT_LT(relative_error(engine_logits(c.model, native, e.tokens, prompt, DType::F32, all), want), kTolF32)
          << "exact, chunk " << chunk << ", prompt " << prompt;
    }
  // Memory stats: every token past the first window's worth retrieved, all of the memory's mass counted.
  engine::SessionOptions o;
  o.capacity = S, o.positions = native, o.memory = memory(MemoryPolicy::Exact, 4, 1 << 20, 3);
  engine::Session s(c.model, o);
  const std::vector<int64_t> pos = positions_from_zero(S);
  s.forward(e.tokens.data(), pos.data(), S, nullptr);
  const engine::MemoryStats stats = s.memory_stats();
  EXPECT_EQ(s.size(), S);
  EXPECT_GE(stats.memory_tokens, S - 8);  // the window keeps 4..8 tokens
  EXPECT_GT(stats.retrieving_queries, 0);
  EXPECT_GT(stats.memory_mass, 0.0);
  EXPECT_LE(stats.memory_mass, 1.0);

  const double window_only = relative_error(engine_logits(c.model, native, e.tokens, S, DType::F32,
                                                          memory(MemoryPolicy::Exact, 4, 0, 3)), want);
  EXPECT_GT(window_only, 1e-3) << "the window alone must differ from full attention";
  const double unrotated = relative_error(engine_logits(c.model, native, e.tokens, S, DType::F32,
                                                        memory(MemoryPolicy::NoRotation, 4, 1 << 20, 3)), want);
  EXPECT_GT(unrotated, 1e-3) << "retrieved keys left unrotated must differ from full attention";
  if (e.logits.count("logits_rerope_w8")) {
    const engine::PositionMethod rerope = rerope_at(native, 8);
    for (int64_t prompt : {S, int64_t(2)})
      EXPECT_LT(relative_error(engine_logits(c.model, rerope, e.tokens, prompt, DType::F32,
                                             memory(MemoryPolicy::Rerope, 8, 1 << 20, 5)),
                               e.logits.at("logits_rerope_w8")),
                kTolF32)
          << "rerope, prompt " << prompt;
  }
  // Greedy generation through the memory equals generation without one.
  const std::vector<int64_t> prompt(e.tokens.begin(), e.tokens.begin() + 11);
  engine::SessionOptions plain;
  plain.capacity = 11 + 12, plain.positions = native;
  engine::SessionOptions with_memory = plain;
  with_memory.memory = memory(MemoryPolicy::Exact, 4, 1 << 20, 0);
  engine::Session a(c.model, plain), b(c.model, with_memory);
  int64_t prompt_calls = 0;
  EXPECT_EQ(engine::generate(b, prompt, {.max_new = 12, .on_prompt = [&](int64_t, int64_t) { ++prompt_calls; }}),
            engine::generate(a, prompt, {.max_new = 12}));
  EXPECT_EQ(prompt_calls, 3);  // 11 prompt tokens, a window's worth (4) per call
}

// The memory's top-k through the page search (MemoryOptions::search, rotary/memory_pages.h): certified, by tokens
// and by keys, it retrieves the exact scan's rows, so the logits are the exact scan's (the same rows scored by the
// same kernel: within float32 reordering, 1e-6), at top-3 of a memory of up to 20 rows per layer and head; with
// every row, the transcription's. The stats count the search's work against the scan's (the scan: exactly 1).
TEST_P(HfEngineFixture, PageSearchRetrievesTheExactScansRows) {
  const fs::path dir = kFixtures / GetParam();
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const engine::PositionMethod native = c.description.positions();
  const int64_t S = int64_t(e.tokens.size());
  auto memory = [](int top_k, std::optional<MemoryPagesConfig> search) {
    engine::MemoryOptions m;
    m.window = 4, m.top_k = top_k, m.chunk = 3, m.search = search;
    return m;
  };
  const std::vector<double> scan = engine_logits(c.model, native, e.tokens, S / 2, DType::F32, memory(3, std::nullopt));
  EXPECT_GT(relative_error(scan, e.logits.at("logits")), 1e-4) << "top-3 of the memory must differ from all of it";
  for (PageGrouping g : {PageGrouping::Tokens, PageGrouping::Keys})
    for (int64_t page_size : {1, 2, 5}) {
      const MemoryPagesConfig certified{.page_size = page_size, .pages_read = 0, .grouping = g};
      EXPECT_LT(relative_error(engine_logits(c.model, native, e.tokens, S / 2, DType::F32, memory(3, certified)), scan),
                1e-6)
          << page_grouping_name(g) << ", pages of " << page_size;
      EXPECT_LT(relative_error(engine_logits(c.model, native, e.tokens, S / 2, DType::F32, memory(1 << 20, certified)),
                               e.logits.at("logits")),
                kTolF32)
          << page_grouping_name(g) << ", every row";
    }
  engine::SessionOptions o;
  o.capacity = S, o.positions = native;
  const std::vector<int64_t> pos = positions_from_zero(S);
  for (bool paged : {false, true}) {
    o.memory = memory(3, paged ? std::optional<MemoryPagesConfig>(MemoryPagesConfig{.page_size = 2, .pages_read = 1})
                               : std::nullopt);
    engine::Session s(c.model, o);
    s.forward(e.tokens.data(), pos.data(), S, nullptr);
    const double share = s.memory_stats().scored_share;
    if (paged) {
      EXPECT_GT(share, 0.0);
    } else {
      EXPECT_EQ(share, 1.0);
    }
  }
  engine::SessionOptions bad = o;
  bad.memory->search = MemoryPagesConfig{.page_size = 0};
  expect_error([&] { engine::Session(c.model, bad); }, "memory_pages.page_size = 0");
}

// A search the caller supplies (MemoryOptions::search_factory: the lab's FAISS indexes) proposes the rows that
// memory_attention then scores: one that proposes every row gives the full forward's logits, one that finds none
// gives the window alone's; each layer's search is synced before it is asked, and its work reaches scored_share.
TEST_P(HfEngineFixture, ACallersSearchProposesTheRowsTheMemoryAttends) {
  const fs::path dir = kFixtures / GetParam();
  const engine::HfModel c = engine::open_hf_model(dir.string());
  const Expected e = read_expected(dir);
  const engine::PositionMethod native = c.description.positions();
  const int64_t S = int64_t(e.tokens.size());
  struct Proposing final : engine::MemorySearch {
    const KvMemory& memory;
    bool all;
    int64_t* syncs;
    int64_t synced = 0;
    Proposing(const KvMemory& m, bool every_row, int64_t* count) : memory(m), all(every_row), syncs(count) {}
    void sync() override { ++*syncs, synced = memory.size(); }
    double candidates(const MemoryAttentionParams& p, int64_t* out) override {
      EXPECT_EQ(synced, memory.size()) << "asked before sync()";
      const int64_t per_query = p.top_k, queries = p.tokens * p.q.heads;
      for (int64_t i = 0; i < queries * per_query; ++i) out[i] = all && i % per_query < memory.size() ? i % per_query : -1;
      return 7.0 * double(queries);
    }
  };
  int64_t syncs = 0;
  auto memory = [&](int top_k, bool every_row) {
    engine::MemoryOptions m;
    m.window = 4, m.top_k = top_k, m.chunk = 3;
    m.search_factory = [&syncs, every_row](const KvMemory& mem) {
      return std::make_unique<Proposing>(mem, every_row, &syncs);
    };
    return m;
  };
  EXPECT_LT(relative_error(engine_logits(c.model, native, e.tokens, S / 2, DType::F32, memory(1 << 20, true)),
                           e.logits.at("logits")),
            kTolF32);
  EXPECT_GT(syncs, 0);
  engine::MemoryOptions window_alone;
  window_alone.window = 4, window_alone.top_k = 0, window_alone.chunk = 3;
  const std::vector<double> alone = engine_logits(c.model, native, e.tokens, S / 2, DType::F32, window_alone);
  EXPECT_GT(relative_error(alone, e.logits.at("logits")), 1e-4) << "the window alone must differ from all of it";
  EXPECT_LT(relative_error(engine_logits(c.model, native, e.tokens, S / 2, DType::F32, memory(3, false)), alone), 1e-6);

  engine::SessionOptions o;
  o.capacity = S, o.positions = native, o.memory = memory(3, true);
  {
    engine::Session s(c.model, o);
    const std::vector<int64_t> pos = positions_from_zero(S);
    s.forward(e.tokens.data(), pos.data(), S, nullptr);
    const double share = s.memory_stats().scored_share;  // 7 vectors per (token, head) against a scan of every row
    EXPECT_GT(share, 0.0);
    EXPECT_LT(share, 1.0);
  }
  engine::SessionOptions bad = o;
  bad.memory->search = MemoryPagesConfig{.page_size = 2};
  expect_error([&] { engine::Session(c.model, bad); }, {"memory.search_factory", "one search per memory"});
  bad = o, bad.memory->search_factory = [](const KvMemory&) { return std::unique_ptr<engine::MemorySearch>(); };
  const std::vector<int64_t> pos = positions_from_zero(S);
  expect_error([&] { engine::Session(c.model, bad).forward(e.tokens.data(), pos.data(), S, nullptr); },
               {"memory.search_factory", "a MemorySearch"});
}

INSTANTIATE_TEST_SUITE_P(Families, HfEngineFixture, ::testing::ValuesIn(kFamilies));

// A memory's settings that cannot run are refused by name when the session is made.
TEST(HfEngine, RefusesMemorySettingsByName) {
  const fs::path dir = kFixtures / "llama2";
  const engine::HfModel c = engine::open_hf_model(dir.string());
  engine::SessionOptions o;
  o.capacity = 32, o.positions = c.description.positions();
  o.memory = engine::MemoryOptions{.window = 4};
  engine::Session ok(c.model, o);
  engine::SessionOptions bad = o;
  bad.kv_dtype = DType::BF16;
  expect_error([&] { engine::Session(c.model, bad); }, {"kv_dtype = bf16", "f32 with a memory"});
  bad.kv_dtype = DType::F32, bad.kv_storage = KvStorage::Q8;
  expect_error([&] { engine::Session(c.model, bad); }, {"kv_storage = q8", "dtype with a memory"});
  bad = o, bad.memory->top_k = -1;
  expect_error([&] { engine::Session(c.model, bad); }, "memory.top_k = -1");
  bad = o, bad.memory->chunk = -2;
  expect_error([&] { engine::Session(c.model, bad); }, "memory.chunk = -2");
  bad = o, bad.memory->window = 0;
  expect_error([&] { engine::Session(c.model, bad); }, "window = 0");
  bad = o, bad.memory->storage = DType::F64;
  expect_error([&] { engine::Session(c.model, bad); }, "f64");
  bad = o, bad.positions.rope.scaling = RopeScaling::Dynamic, bad.positions.rope.factor = 2;
  bad.positions.rope.max_position_embeddings = 16;
  expect_error([&] { engine::Session(c.model, bad); }, {"positions.rope.scaling = dynamic", "do not change"});
  bad = o, bad.positions.mode = PositionMode::Rerope, bad.positions.window = 8, bad.memory->policy = MemoryPolicy::Rerope;
  expect_error([&] { engine::Session(c.model, bad); }, "window");  // the ReRoPE window 8 > the memory's window 4
}

}  // namespace
}  // namespace rotary::test
