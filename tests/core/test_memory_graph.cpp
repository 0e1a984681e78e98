// rotary/memory_graph.h: the query-routed graph over a KvMemory. The oracles: the exact scan (memory_attention
// without candidates) for a beam as wide as the memory; the float64 walk over the same graph
// (memory_graph_search_reference) on keys and queries of small integers, whose scores fp32 computes exactly; brute
// force for recall; and the graph's shape checked edge by edge (in range, no loops or repeats, the degree, the
// text's order, every row reachable from the entry points).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <queue>
#include <random>
#include <vector>

#include "../../fuzz/memory_graph_seeds.h"
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

// The graph file: a saved graph opens over its memory as it was - the same graph, sample and counters, so the same
// searches bitwise, and after more rows and queries the same rebuild as the graph never saved; a graph not synced
// is not saved; foreign, damaged, truncated or padded files and other build settings are refused by name.
uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

TEST(MemoryGraph, ASavedGraphOpensAsItWasAndDamagedOrForeignFilesAreRefused) {
  GraphFixture f(16, 2);
  f.append(3000, 1);
  const MemoryGraphConfig c = small_config();
  MemoryGraph graph(f.memory, c);
  const std::vector<float> train = f.queries(500, 7, 1.0f);  // head 0: 500 given, 400 kept; head 1: none
  graph.add_queries(0, 500, train.data());
  graph.sync();
  f.append(200, 2);  // a tail, not in the graph
  graph.sync();
  ASSERT_EQ(graph.builds(), 1);
  const std::string path = ::testing::TempDir() + "/rotary_graph_test.graph";
  graph.save(path);
  MemoryGraph opened = MemoryGraph::open(path, f.memory, c);
  EXPECT_EQ(opened.size(), 3200);
  EXPECT_EQ(opened.graph_rows(), 3000);
  EXPECT_EQ(opened.builds(), 1);
  EXPECT_EQ(opened.training_queries(0), 400);
  EXPECT_EQ(opened.training_queries(1), 0);
  auto same_graph = [](const MemoryGraph& a, const MemoryGraph& b, int64_t h, int64_t D) {
    const GraphView x = a.graph(h), y = b.graph(h);
    ASSERT_EQ(x.rows, y.rows);
    ASSERT_TRUE(std::equal(x.offsets, x.offsets + x.rows + 1, y.offsets));
    ASSERT_TRUE(std::equal(x.edges, x.edges + x.offsets[x.rows], y.edges));
    ASSERT_EQ(x.entry_count, y.entry_count);
    ASSERT_TRUE(std::equal(x.entries, x.entries + x.entry_count, y.entries));
    ASSERT_EQ(x.route_count, y.route_count);
    ASSERT_EQ(x.route_width, y.route_width);
    ASSERT_TRUE(std::equal(x.route_queries, x.route_queries + x.route_count * D, y.route_queries));
    ASSERT_TRUE(std::equal(x.route_rows, x.route_rows + x.route_count * x.route_width, y.route_rows));
  };
  auto same_search = [&](const MemoryGraph& a, const MemoryGraph& b) {
    const std::vector<float> q = f.queries(20, 9, 1.0f);
    for (int64_t h = 0; h < 2; ++h) {
      std::vector<int64_t> ra(20 * 8), rb(ra.size());
      std::vector<float> sa(ra.size()), sb(ra.size());
      GraphSearchStats wa, wb;
      a.search(h, 20, q.data(), 8, ra.data(), sa.data(), &wa);
      b.search(h, 20, q.data(), 8, rb.data(), sb.data(), &wb);
      EXPECT_EQ(ra, rb) << "head " << h;
      EXPECT_EQ(0, std::memcmp(sa.data(), sb.data(), sa.size() * 4)) << "head " << h;
      EXPECT_EQ(wa.rows_scored, wb.rows_scored) << "head " << h;
    }
  };
  for (int64_t h = 0; h < 2; ++h) same_graph(graph, opened, h, 16);
  same_search(graph, opened);
  // Both grow alike: the reservoir goes on from the saved count, the rebuild links the same rows.
  const std::vector<float> more = f.queries(300, 11, 1.0f);
  for (MemoryGraph* g : {&graph, &opened}) g->add_queries(0, 300, more.data()), g->add_queries(1, 50, more.data());
  f.append(3000, 3);
  graph.sync(), opened.sync();
  ASSERT_EQ(opened.builds(), 2);
  for (int64_t h = 0; h < 2; ++h) same_graph(graph, opened, h, 16);
  same_search(graph, opened);

  using test::expect_error;
  MemoryGraph unsynced(f.memory, c);
  expect_error([&] { unsynced.save(path + ".x"); }, {"memory_graph.save rows taken in = 0", "sync"});
  // Written before the growth above, so over the first 3,200 rows: this memory (6,200 rows) is another.
  expect_error([&] { MemoryGraph::open(path, f.memory, c); }, {"written for size = 3200 rows", "this memory has 6200"});
  GraphFixture same(16, 2), other(16, 2);
  same.append(3000, 1), same.append(200, 2);
  other.append(3000, 5), other.append(200, 2);  // the same shape, other keys
  EXPECT_EQ(MemoryGraph::open(path, same.memory, c).graph_rows(), 3000);
  expect_error([&] { MemoryGraph::open(path, other.memory, c); }, {"written for another memory", "memory_check"});
  MemoryGraphConfig wider = c;
  wider.degree = 9;
  expect_error([&] { MemoryGraph::open(path, same.memory, wider); }, {"written for degree = 8", "this run asks 9"});
  MemoryGraphConfig searched = c;  // the search's own settings are the run's
  searched.search_width = 64, searched.routes = 2;
  EXPECT_EQ(MemoryGraph::open(path, same.memory, searched).config().search_width, 64);
  expect_error([&] { MemoryGraph::open(path + ".missing", same.memory, c); }, {"memory_graph.open path"});

  std::vector<uint8_t> file;
  {
    std::ifstream in(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t header = 8, fields = 104, body = header + fields + 8;  // the header's hash at 112, body at 120
  auto open_bytes = [&](const std::vector<uint8_t>& b) { MemoryGraph::open_bytes(b.data(), b.size(), same.memory, c); };
  auto rehash = [&](std::vector<uint8_t> b) {  // both checksums made right, to reach the checks past them
    const uint64_t hh = fnv1a(b.data() + header, fields);
    std::memcpy(b.data() + header + fields, &hh, 8);
    const uint64_t bh = fnv1a(b.data() + body, b.size() - 8 - body);
    std::memcpy(b.data() + b.size() - 8, &bh, 8);
    return b;
  };
  ASSERT_NO_THROW(open_bytes(rehash(file)));
  expect_error([&] { open_bytes({'h', 'e', 'l', 'l', 'o'}); }, {"memory_graph.open", "not a rotary graph file"});
  std::vector<uint8_t> b = file;
  b[header + 3 * 8] ^= 1;  // size
  expect_error([&] { open_bytes(b); }, {"a damaged header (checksum)"});
  b = file;
  b[body + 56 + 5] ^= 0x40;  // a byte of kv head 0's first sample
  expect_error([&] { open_bytes(b); }, {"a damaged body (checksum)"});
  // Past the checksums: kv head 0's first edge outside the graph's 3,000 rows.
  const size_t edges0 = body + 56 + 400 * 16 * 4 + 3001 * 8;
  b = file;
  const uint32_t outside = 3000;
  std::memcpy(b.data() + edges0, &outside, 4);
  expect_error([&] { open_bytes(rehash(b)); }, {"kv head 0 edges[0] = 3000 is invalid", "0..2999"});
  int64_t bad_offset = 5000;  // row 0's neighbours past the degree
  b = file;
  std::memcpy(b.data() + body + 56 + 400 * 16 * 4 + 8, &bad_offset, 8);
  expect_error([&] { open_bytes(rehash(b)); }, {"kv head 0 offsets[1] = 5000 is invalid"});
  b = file;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(b.data() + body + 56, &nan, 4);
  expect_error([&] { open_bytes(rehash(b)); }, {"kv head 0 samples[0] is not finite"});
  b = file;
  int64_t kept = 399;
  std::memcpy(b.data() + body + 8, &kept, 8);
  expect_error([&] { open_bytes(rehash(b)); }, {"kv head 0 kept = 399 is invalid", "400..400"});
  b = file;
  b.erase(b.end() - 8 - 64, b.end() - 8);  // cut inside the last block (the hash kept at the end)
  expect_error([&] { open_bytes(rehash(b)); }, {"truncated inside kv head 1 route rows"});
  b = file;
  b.insert(b.end() - 8, 16, uint8_t(0));
  expect_error([&] { open_bytes(rehash(b)); }, {"16 bytes after the last kv head's graph (trailing bytes)"});
  std::remove(path.c_str());
}

// The fuzz target's seeds (fuzz/corpus/memory_graph/) are what save() writes for fuzz/memory_graph_seeds.h's
// graphs, and open over its memory; ROTARY_WRITE_FUZZ_SEEDS=1 rewrites them after a change of the format.
TEST(MemoryGraph, FuzzSeedsAreWhatSaveWrites) {
  const bool rewrite = std::getenv("ROTARY_WRITE_FUZZ_SEEDS") != nullptr;
  const KvMemory memory = fuzz::graph_seed_memory();
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  for (const fuzz::MemoryGraphSeed& seed : fuzz::memory_graph_seeds()) {
    SCOPED_TRACE(seed.file);
    const std::string tmp = ::testing::TempDir() + "/rotary_seed_" + std::to_string(::getpid()) + ".graph";
    fuzz::write_graph_seed(seed, tmp);
    const std::string saved = bytes(tmp);
    std::remove(tmp.c_str());
    const std::string checked_in = std::string(ROTARY_SOURCE_DIR) + "/fuzz/corpus/memory_graph/" + seed.file;
    if (rewrite) std::ofstream(checked_in, std::ios::binary) << saved;
    EXPECT_EQ(bytes(checked_in), saved) << checked_in << " is not what save() writes";
    const MemoryGraph opened = MemoryGraph::open(checked_in, memory, seed.config);
    EXPECT_EQ(opened.size(), 40);
    EXPECT_EQ(opened.graph_rows(), seed.config.min_graph_rows <= 24 ? 24 : 0);
    EXPECT_EQ(opened.training_queries(0), 16);
  }
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
