// core/src/memory_graph_impl.h (internal): MemoryGraph's state, shared by memory_graph.cpp (sample, build,
// search) and memory_graph_file.cpp (save, open, open_bytes).
#pragma once

#include <cstdint>
#include <vector>

#include "rotary/memory_graph.h"

namespace rotary {
namespace detail {

// One kv head: its training query sample and its graph over rows [0, rows).
struct HeadGraph {
  std::vector<float> samples;  // [kept, D]
  int64_t seen = 0;            // training queries given so far
  int64_t rows = 0;
  std::vector<int64_t> offsets{0}, entries;
  std::vector<uint32_t> edges;  // 4 bytes a neighbour: the graph is several times the memory's own keys otherwise
  // Routing: a sample of the training queries, each scaled to unit length, and each one's top rows.
  int64_t route_width = 0;            // rows per routing query (Kq)
  std::vector<float> route_queries;   // [routing, D]
  std::vector<int64_t> route_rows;    // [routing, route_width]
};

}  // namespace detail

struct MemoryGraph::Impl {
  const KvMemory* memory = nullptr;
  MemoryGraphConfig config;
  int64_t covered = 0, graph_rows = 0, builds = 0;
  std::vector<detail::HeadGraph> heads;

  void keep_query(int64_t h, const float* q);
  void build(int64_t n);
};

}  // namespace rotary
