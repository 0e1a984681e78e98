// The graphs whose files seed the memory_graph fuzz target (fuzz/corpus/memory_graph/), shared by the target and
// tests/core/test_memory_graph.cpp (which checks that the checked-in seeds are what MemoryGraph::save writes for
// these, and rewrites them with ROTARY_WRITE_FUZZ_SEEDS=1). The memory (40 rows of 2 kv heads of 4) is built by the
// target itself: a graph only opens over the rows it was saved for. Its keys and the training queries are
// multiples of 1/8, so every score is exact in fp32 whatever the build (FMA or not, AVX2 or the baseline path) and
// the graph - which follows the scores' order, near ties included - is the same bytes in every build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory_pages_seeds.h"
#include "rotary/kv_memory.h"
#include "rotary/memory_graph.h"

namespace rotary::fuzz {

inline constexpr int64_t kGraphSeedRows = 40;      // appended as 24 then 16 (a graph, then a tail)
inline constexpr int64_t kGraphSeedFirstRows = 24;

// The page seeds' rows with keys drifting by 1/8 every 9 rows: every key a multiple of 1/8.
inline void append_graph_seed_rows(KvMemory& m, int64_t from, int64_t to) { append_pages_seed_rows(m, from, to, 0.125f); }

// The whole memory, as a graph of a seed is opened over.
inline KvMemory graph_seed_memory() {
  KvMemory m(pages_seed_memory_config());
  append_graph_seed_rows(m, 0, kGraphSeedRows);
  return m;
}

// Small enough that the seeds are a few KB: a row keeps 4 neighbours, 16 training queries per head.
inline MemoryGraphConfig graph_seed_config(int64_t min_graph_rows) {
  MemoryGraphConfig c;
  c.degree = 4, c.query_neighbors = 4, c.training_queries = 16, c.search_width = 8, c.entry_points = 4;
  c.min_graph_rows = min_graph_rows, c.routing_queries = 4, c.routes = 2;
  return c;
}

struct MemoryGraphSeed {
  std::string file;  // under fuzz/corpus/memory_graph/
  MemoryGraphConfig config;
};

inline std::vector<MemoryGraphSeed> memory_graph_seeds() {
  return {{"graph_tail.graph", graph_seed_config(16)}, {"tail_only.graph", graph_seed_config(64)}};
}

// Seed `s`'s graph written to `path`: head 0 given 20 training queries (16 kept), head 1 none; synced over the
// first 24 rows (a graph when min_graph_rows allows), then over all 40 (a tail of 16).
inline void write_graph_seed(const MemoryGraphSeed& s, const std::string& path) {
  KvMemory m(pages_seed_memory_config());
  append_graph_seed_rows(m, 0, kGraphSeedFirstRows);
  MemoryGraph graph(m, s.config);
  std::vector<float> q(20 * 4);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.125f * float(int(i % 13) - 6);
  graph.add_queries(0, 20, q.data());
  graph.sync();
  append_graph_seed_rows(m, kGraphSeedFirstRows, kGraphSeedRows);
  graph.sync();
  graph.save(path);
}

}  // namespace rotary::fuzz
