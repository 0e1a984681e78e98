// rotary/memory_graph.h: the query-routed graph over a KvMemory. The oracles: the exact scan (memory_attention
// without candidates) for a beam as wide as the memory; the float64 walk over the same graph
// (memory_graph_search_reference) on keys and queries of small integers, whose scores fp32 computes exactly; brute
// force for recall; and the graph's shape checked edge by edge (in range, no loops or repeats, the degree, the
// text's order, every row reachable from the entry points).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <random>
#include <vector>

#include "expect_error.h"
#include "rotary/kv_memory.h"
#include "rotary/memory_graph.h"
#include "rotary/rope_spec.h"

namespace rotary {
namespace {

RopeFreqs graph_freqs(int D) {
  RopeSpec s;
  s.head_dim = D;
  s.base = 10000;
  return s.freqs();
}

// A memory of Hkv kv heads: gaussian keys (or small integers in [-3, 3]).
struct GraphFixture {
  int D;
  int64_t Hkv;
  RopeFreqs freqs;
  KvMemory memory;
  bool integers;
  GraphFixture(int head_dim, int64_t kv_heads, bool small_integers = false, MemoryPolicy policy = MemoryPolicy::Rerope,
               DType storage = DType::F32)
      : D(head_dim), Hkv(kv_heads), freqs(graph_freqs(head_dim)),
        memory(KvMemoryConfig{kv_heads, head_dim, policy, &freqs, policy == MemoryPolicy::Rerope ? 16 : 0, 0, storage}),
        integers(small_integers) {}
  void append(int64_t count, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0, 1);
    std::uniform_int_distribution<int> u(-3, 3);
    std::vector<float> k(size_t(count * Hkv * D)), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = integers ? float(u(rng)) : g(rng), v[i] = g(rng);
    std::vector<int64_t> pos(static_cast<size_t>(count));
    for (int64_t t = 0; t < count; ++t) pos[size_t(t)] = memory.size() + t;
    memory.append(count, {k.data(), Hkv, Hkv * D, D}, {v.data(), Hkv, Hkv * D, D}, pos.data());
  }
  // Search vectors: gaussian around `mean` (a shift from the keys' distribution), or small integers.
  std::vector<float> queries(int64_t count, uint32_t seed, float mean = 0) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0, 1);
    std::uniform_int_distribution<int> u(-3, 3);
    std::vector<float> q(size_t(count * D));
    for (size_t i = 0; i < q.size(); ++i) q[i] = integers ? float(u(rng)) : (i % size_t(D) < 4 ? mean : 0.0f) + g(rng);
    return q;
  }
};

// Brute force in double: the k best rows of kv head h (row order on ties).
std::vector<std::pair<double, int64_t>> exact_top(const KvMemory& m, int64_t h, const float* q, int k) {
  std::vector<float> key(static_cast<size_t>(m.head_dim()));
  std::vector<std::pair<double, int64_t>> all;
  for (int64_t j = 0; j < m.size(); ++j) {
    m.key_rows(h, j, 1, key.data());
    double s = 0;
    for (int d = 0; d < m.head_dim(); ++d) s += double(q[d]) * double(key[size_t(d)]);
    all.push_back({s, j});
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  all.resize(size_t(k));
  return all;
}

MemoryGraphConfig small_config() {
  MemoryGraphConfig c;
  c.degree = 8;
  c.query_neighbors = 8;
  c.training_queries = 400;
  c.search_width = 16;
  c.entry_points = 8;
  c.min_graph_rows = 100;
  return c;
}

TEST(MemoryGraph, TheGraphIsWellFormedAndEveryRowReachable) {
  GraphFixture f(16, 2);
  f.append(3000, 1);
  MemoryGraphConfig c = small_config();
  MemoryGraph graph(f.memory, c);
  const std::vector<float> train = f.queries(400, 7, 1.0f);
  graph.add_queries(0, 400, train.data());  // head 1 gets none: built from its own keys
  graph.sync();
  ASSERT_EQ(graph.builds(), 1);
  ASSERT_EQ(graph.graph_rows(), 3000);
  EXPECT_EQ(graph.training_queries(0), 400);
  EXPECT_EQ(graph.training_queries(1), 0);
  for (int64_t h = 0; h < 2; ++h) {
    const GraphView g = graph.graph(h);
    ASSERT_EQ(g.rows, 3000);
    ASSERT_EQ(g.offsets[0], 0);
    int64_t linked = 0;  // rows with a neighbour beyond the text's order
    for (int64_t r = 0; r < g.rows; ++r) {
      const uint32_t* first = g.edges + g.offsets[r];
      const uint32_t* last = g.edges + g.offsets[r + 1];
      ASSERT_LE(g.offsets[r], g.offsets[r + 1]);
      ASSERT_LE(last - first, c.degree + 2) << "row " << r;
      std::vector<int64_t> nb(first, last);
      std::sort(nb.begin(), nb.end());
      ASSERT_TRUE(std::adjacent_find(nb.begin(), nb.end()) == nb.end()) << "a repeated edge at row " << r;
      for (int64_t e : nb) ASSERT_TRUE(e >= 0 && e < g.rows && e != r) << "row " << r << " edge " << e;
      if (r > 0) {
        ASSERT_TRUE(std::binary_search(nb.begin(), nb.end(), r - 1)) << "row " << r;
      }
      if (r + 1 < g.rows) {
        ASSERT_TRUE(std::binary_search(nb.begin(), nb.end(), r + 1)) << "row " << r;
      }
      linked += int64_t(nb.size()) > (r > 0) + (r + 1 < g.rows) ? 1 : 0;
    }
    EXPECT_GT(linked, 100) << "head " << h << ": the training queries' rankings linked almost nothing";
    ASSERT_EQ(g.entry_count, c.entry_points);
    std::vector<int64_t> entries(g.entries, g.entries + g.entry_count);
    std::sort(entries.begin(), entries.end());
    ASSERT_TRUE(std::adjacent_find(entries.begin(), entries.end()) == entries.end());
    std::vector<bool> reached(size_t(g.rows), false);
    std::queue<int64_t> todo;
    for (int64_t e : entries) reached[size_t(e)] = true, todo.push(e);
    while (!todo.empty()) {
      const int64_t r = todo.front();
      todo.pop();
      for (int64_t i = g.offsets[r]; i < g.offsets[r + 1]; ++i)
        if (!reached[size_t(g.edges[i])]) reached[size_t(g.edges[i])] = true, todo.push(g.edges[i]);
    }
    EXPECT_TRUE(std::all_of(reached.begin(), reached.end(), [](bool b) { return b; })) << "head " << h;
  }
}

// A beam as wide as the memory scores every row: the exact scan's rows and scores, through each policy.
TEST(MemoryGraph, ABeamAsWideAsTheMemoryIsTheExactScan) {
  for (MemoryPolicy policy : {MemoryPolicy::Exact, MemoryPolicy::Rerope}) {
    GraphFixture f(32, 2, false, policy);
    f.append(1500, 2);
    MemoryGraphConfig c = small_config();
    c.search_width = 1500;
    c.routing_queries = 0;  // so that the rows scored are the memory's, once each
    MemoryGraph graph(f.memory, c);
    const int64_t tokens = 3, Hq = 4;
    std::vector<float> q(size_t(tokens * Hq * f.D));
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0, 1);
    for (float& x : q) x = g(rng);
    std::vector<int64_t> pos{1500, 1501, 1502};
    MemoryAttentionParams p;
    p.tokens = tokens;
    p.q = {q.data(), Hq, Hq * f.D, f.D};
    p.q_positions = pos.data();
    p.top_k = 20;
    graph.add_queries(p);
    EXPECT_EQ(graph.training_queries(0), tokens * Hq / 2);
    graph.sync();
    ASSERT_EQ(graph.graph_rows(), 1500);
    std::vector<int64_t> got(size_t(tokens * Hq * p.top_k)), want(got.size());
    std::vector<float> want_scores(got.size()), o(q.size(), 0.0f), lse(size_t(tokens * Hq), -INFINITY);
    p.o = {o.data(), Hq, Hq * f.D, f.D};
    p.lse = lse.data();
    GraphSearchStats stats;
    graph.candidates(p, got.data(), &stats);
    EXPECT_EQ(stats.queries, tokens * Hq);
    EXPECT_EQ(stats.rows_scored, tokens * Hq * 1500);
    p.retrieved = want.data();
    p.retrieved_scores = want_scores.data();
    memory_attention(f.memory, p);
    EXPECT_EQ(got, want) << memory_policy_name(policy);
  }
}

// The fast walk and the float64 one visit the same rows in the same order when fp32 scores are exact, with a
// tail beside the graph, in f32 and bf16 storage.
TEST(MemoryGraph, TheWalkIsItsFloat64Oracles) {
  for (const auto& [storage, D] : {std::pair{DType::F32, 8}, std::pair{DType::BF16, 8}, std::pair{DType::F32, 6}}) {
    GraphFixture f(D, 2, /*small_integers*/ true, MemoryPolicy::Rerope, storage);
    f.append(2000, 3);
    MemoryGraph graph(f.memory, small_config());
    const std::vector<float> train = f.queries(300, 4);
    graph.add_queries(0, 300, train.data());
    graph.add_queries(1, 300, train.data());
    graph.sync();
    f.append(300, 5);  // a tail: fewer rows than the graph's, so no rebuild
    graph.sync();
    ASSERT_EQ(graph.graph_rows(), 2000);
    ASSERT_EQ(graph.size(), 2300);
    const int k = 10;
    const std::vector<float> q = f.queries(50, 6);
    for (int64_t h = 0; h < 2; ++h) {
      std::vector<int64_t> rows(size_t(50 * k)), want(rows.size());
      std::vector<float> scores(rows.size());
      std::vector<double> want_scores(rows.size());
      graph.search(h, 50, q.data(), k, rows.data(), scores.data());
      memory_graph_search_reference(f.memory, graph, h, 50, q.data(), k, want.data(), want_scores.data());
      EXPECT_EQ(rows, want) << dtype_name(storage) << " D " << D << " head " << h;
      for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(double(scores[i]), want_scores[i]) << i;
    }
  }
}

TEST(MemoryGraph, TheTailIsScannedAndTheGraphRebuiltWhenTheTailReachesIt) {
  GraphFixture f(16, 1);
  MemoryGraphConfig c = small_config();
  c.min_graph_rows = 500;
  MemoryGraph graph(f.memory, c);
  f.append(300, 1);
  graph.sync();
  EXPECT_EQ(graph.builds(), 0);  // below min_graph_rows: scanned exactly
  f.append(300, 2);
  graph.sync();
  EXPECT_EQ(graph.builds(), 1);
  EXPECT_EQ(graph.graph_rows(), 600);
  f.append(200, 3);
  graph.sync();
  EXPECT_EQ(graph.builds(), 1);
  EXPECT_EQ(graph.graph_rows(), 600);
  // A query that is a tail row's key, scaled up: that row is the best, found by the scan of the tail.
  std::vector<float> q(16);
  f.memory.key_rows(0, 700, 1, q.data());
  for (float& x : q) x *= 100.0f;
  int64_t row = -1;
  float score = 0;
  GraphSearchStats stats;
  graph.search(0, 1, q.data(), 1, &row, &score, &stats);
  EXPECT_EQ(row, exact_top(f.memory, 0, q.data(), 1)[0].second);
  EXPECT_GE(stats.rows_scored, 200);  // at least the tail
  f.append(400, 4);  // tail 600 = the graph's rows
  graph.sync();
  EXPECT_EQ(graph.builds(), 2);
  EXPECT_EQ(graph.graph_rows(), 1200);
}

// The case the graph is for: RoPE keys stored rotated by their positions (policy exact). Each token's key is one of
// 24 character vectors plus noise, turned by its position - so alike keys point every way and a box over them (the
// k-d page search) bounds little - and a query is a character vector at its own position. Routed by 4,000 queries
// at positions inside the memory, the graph is asked by 64 queries past its end: recall of the exact top-8 (by
// score; measured 0.910) and the rows scored (0.047 of a scan), the search deterministic.
TEST(MemoryGraph, OnRotatedRopeKeysItRecallsTheTopKScoringAFewRows) {
  const int D = 16;
  const int64_t N = 30000, Hq = 2;
  GraphFixture f(D, 1, false, MemoryPolicy::Exact);
  std::mt19937 rng(21);
  std::normal_distribution<float> g(0, 1);
  std::uniform_int_distribution<int> pick(0, 23);
  std::vector<float> chars(size_t(24 * D));
  for (float& x : chars) x = g(rng);
  std::vector<float> k(size_t(N * D)), v(k.size());
  for (int64_t t = 0; t < N; ++t) {
    const int c = pick(rng);
    for (int d = 0; d < D; ++d) k[size_t(t * D + d)] = chars[size_t(c * D + d)] + 0.1f * g(rng), v[size_t(t * D + d)] = g(rng);
  }
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) pos[size_t(t)] = t;
  f.memory.append(N, {k.data(), 1, D, D}, {v.data(), 1, D, D}, pos.data());
  // Queries: a character vector plus noise for each of Hq heads, at the given positions.
  auto queries = [&](int64_t n, int64_t first, int64_t step, std::vector<float>& q, std::vector<int64_t>& at) {
    q.resize(size_t(n * Hq * D));
    at.resize(size_t(n));
    for (int64_t t = 0; t < n; ++t) {
      at[size_t(t)] = first + t * step;
      for (int64_t h = 0; h < Hq; ++h) {
        const int c = pick(rng);
        for (int d = 0; d < D; ++d) q[size_t((t * Hq + h) * D + d)] = 3.0f * chars[size_t(c * D + d)] + 0.3f * g(rng);
      }
    }
  };
  std::vector<float> train_q, test_q;
  std::vector<int64_t> train_pos, test_pos;
  queries(2000, 0, N / 2000, train_q, train_pos);
  queries(32, N, 1, test_q, test_pos);
  MemoryGraphConfig c;
  c.degree = 32, c.search_width = 64;  // lighter than the defaults (64, 128), which score 0.107 of this memory
  MemoryGraph graph(f.memory, c);
  MemoryAttentionParams p;
  p.tokens = 2000;
  p.q = {train_q.data(), Hq, Hq * D, D};
  p.q_positions = train_pos.data();
  graph.add_queries(p);
  EXPECT_EQ(graph.training_queries(0), 4000);
  graph.sync();
  ASSERT_EQ(graph.graph_rows(), N);
  const int K = 8;
  std::vector<float> o(test_q.size(), 0.0f), lse(size_t(32 * Hq), -INFINITY);
  MemoryAttentionParams t;
  t.tokens = 32;
  t.q = {test_q.data(), Hq, Hq * D, D};
  t.q_positions = test_pos.data();
  t.top_k = K;
  t.o = {o.data(), Hq, Hq * D, D};
  t.lse = lse.data();
  std::vector<int64_t> got(size_t(32 * Hq * K));
  GraphSearchStats stats;
  graph.candidates(t, got.data(), &stats);
  double recall = 0;
  std::vector<float> sv(static_cast<size_t>(D)), key(static_cast<size_t>(D));
  for (int64_t i = 0; i < 32 * Hq; ++i) {
    f.memory.search_query(test_q.data() + i * D, test_pos[size_t(i / Hq)], 0, sv.data());
    const auto want = exact_top(f.memory, 0, sv.data(), K);
    for (int j = 0; j < K; ++j) {
      const int64_t row = got[size_t(i * K + j)];
      ASSERT_GE(row, 0);
      f.memory.key_rows(0, row, 1, key.data());
      double s = 0;
      for (int d = 0; d < D; ++d) s += double(sv[size_t(d)]) * double(key[size_t(d)]);
      recall += s >= want.back().first - 1e-4 * std::max(1.0, std::abs(want.back().first)) ? 1 : 0;
    }
  }
  recall /= double(32 * Hq * K);
  const double share = stats.share_of_scan(N);
  std::printf("rotated keys, routed graph: recall@8 %.3f, rows scored %.4f of a scan\n", recall, share);
  EXPECT_GE(recall, 0.85);
  EXPECT_LE(share, 0.08);
}

TEST(MemoryGraph, TheSampleOfTrainingQueriesIsCappedAndRepeatable) {
  GraphFixture f(16, 1);
  f.append(1000, 1);
  MemoryGraphConfig c = small_config();
  c.training_queries = 100;
  const std::vector<float> train = f.queries(5000, 2);
  auto build = [&] {
    auto g = std::make_unique<MemoryGraph>(f.memory, c);
    for (int64_t i = 0; i < 5000; i += 250) g->add_queries(0, 250, train.data() + i * 16);
    g->sync();
    return g;
  };
  const auto a = build(), b = build();
  EXPECT_EQ(a->training_queries(0), 100);
  const GraphView ga = a->graph(0), gb = b->graph(0);
  ASSERT_EQ(ga.offsets[ga.rows], gb.offsets[gb.rows]);
  EXPECT_TRUE(std::equal(ga.edges, ga.edges + ga.offsets[ga.rows], gb.edges));
  // Not simply the first 100 given: the sample reaches past them.
  const auto first_only = std::make_unique<MemoryGraph>(f.memory, c);
  first_only->add_queries(0, 100, train.data());
  first_only->sync();
  const GraphView g1 = first_only->graph(0);
  EXPECT_FALSE(g1.offsets[g1.rows] == ga.offsets[ga.rows] && std::equal(ga.edges, ga.edges + ga.offsets[ga.rows], g1.edges));
}

TEST(MemoryGraph, BadSettingsAndCallsNameTheField) {
  GraphFixture f(16, 2);
  f.append(200, 1);
  auto with = [&](auto change) {
    MemoryGraphConfig c;
    change(c);
    return c;
  };
  using test::expect_error;
  expect_error([&] { MemoryGraph(f.memory, with([](auto& c) { c.degree = 0; })); }, {"memory_graph.degree = 0", "1..1024"});
  expect_error([&] { MemoryGraph(f.memory, with([](auto& c) { c.query_neighbors = 1; })); }, {"memory_graph.query_neighbors = 1", "2..1024"});
  expect_error([&] { MemoryGraph(f.memory, with([](auto& c) { c.training_queries = 0; })); }, {"memory_graph.training_queries = 0"});
  expect_error([&] { MemoryGraph(f.memory, with([](auto& c) { c.search_width = 0; })); }, {"memory_graph.search_width = 0"});
  expect_error([&] { MemoryGraph(f.memory, with([](auto& c) { c.entry_points = 5000; })); }, {"memory_graph.entry_points = 5000", "1..4096"});
  expect_error([&] { MemoryGraph(f.memory, with([](auto& c) { c.min_graph_rows = 0; })); }, {"memory_graph.min_graph_rows = 0"});
  expect_error([&] { MemoryGraph(f.memory, with([](auto& c) { c.routing_queries = -1; })); }, {"memory_graph.routing_queries = -1", "0..65536"});
  expect_error([&] { MemoryGraph(f.memory, with([](auto& c) { c.routes = 0; })); }, {"memory_graph.routes = 0", "1..256"});
  MemoryGraph graph(f.memory, small_config());
  std::vector<float> q(16, 0.5f);
  int64_t row = 0;
  float score = 0;
  expect_error([&] { graph.search(0, 1, q.data(), 1, &row, &score); }, {"memory_graph rows taken in = 0", "sync"});
  expect_error([&] { graph.add_queries(2, 1, q.data()); }, {"memory_graph.add_queries kv_head = 2", "0..kv_heads - 1 = 1"});
  expect_error([&] { graph.add_queries(0, -1, q.data()); }, {"memory_graph.add_queries n = -1"});
  q[3] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { graph.add_queries(0, 1, q.data()); }, {"memory_graph.add_queries queries[3]", "finite"});
  q[3] = 0;
  graph.sync();
  expect_error([&] { graph.search(0, 1, q.data(), 0, &row, &score); }, {"memory_graph.search k = 0", "1..the rows taken in 200"});
  expect_error([&] { graph.search(5, 1, q.data(), 1, &row, &score); }, {"memory_graph.search kv_head = 5"});
  expect_error([&] { graph.search(0, 1, nullptr, 1, &row, &score); }, {"memory_graph.search queries"});
  expect_error([&] { graph.set_search_width(-3); }, {"memory_graph.search_width = -3"});
  f.append(10, 2);
  expect_error([&] { graph.search(0, 1, q.data(), 1, &row, &score); }, {"memory_graph rows taken in = 200", "sync after appending"});
  f.memory.clear();
  expect_error([&] { graph.sync(); }, {"memory_graph.sync memory size = 0", "make a new graph"});
}

}  // namespace
}  // namespace rotary
