// core/src/memory_graph_reference.cpp: float64 oracle of MemoryGraph::search (rotary/memory_graph.h), written
// apart from memory_graph.cpp: keys read through KvMemory::key_rows, scores in double, the beam and the
// unexpanded rows as ordered sets (no heaps), the tail scanned, one thread.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "rotary/error.h"
#include "rotary/memory_graph.h"

namespace rotary {

namespace {

struct Entry {
  double score;
  int64_t row;
};
// Best first: score descending, the earlier row on ties.
struct BestFirst {
  bool operator()(const Entry& a, const Entry& b) const {
    return a.score > b.score || (a.score == b.score && a.row < b.row);
  }
};

}  // namespace

void memory_graph_search_reference(const KvMemory& memory, const MemoryGraph& graph, int64_t kv_head, int64_t n,
                                   const float* queries, int k, int64_t* rows, double* scores) {
  const int64_t N = memory.size(), D = memory.head_dim();
  check(graph.size() == N, "memory_graph_search_reference rows taken in", graph.size(),
        "the memory's size " + std::to_string(N));
  check(k >= 1 && k <= N, "memory_graph_search_reference k", k, "1..the memory's size " + std::to_string(N));
  const GraphView g = graph.graph(kv_head);
  std::vector<double> key(static_cast<size_t>(D));
  std::vector<float> key32(static_cast<size_t>(D));
  auto score = [&](const float* q, int64_t r) {
    memory.key_rows(kv_head, r, 1, key32.data());
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(q[d]) * double(key32[size_t(d)]);
    return s;
  };
  const size_t width = size_t(std::max<int64_t>(graph.config().search_width, k));
  for (int64_t i = 0; i < n; ++i) {
    const float* q = queries + i * D;
    std::set<Entry, BestFirst> beam, unexpanded;
    std::vector<bool> seen(static_cast<size_t>(g.rows), false);
    auto offer = [&](int64_t r) {
      seen[size_t(r)] = true;
      const Entry e{score(q, r), r};
      if (beam.size() == width) {
        if (!BestFirst{}(e, *beam.rbegin())) return;
        beam.erase(std::prev(beam.end()));
      }
      beam.insert(e);
      unexpanded.insert(e);
    };
    // The routing queries most like q by cosine (their order: similarity descending, the earlier one on ties).
    std::vector<Entry> routed;
    for (int64_t r = 0; r < g.route_count; ++r) {
      double sim = 0;
      for (int64_t d = 0; d < D; ++d) sim += double(q[d]) * double(g.route_queries[r * D + d]);
      routed.push_back({sim, r});
    }
    std::sort(routed.begin(), routed.end(), BestFirst{});
    routed.resize(std::min<size_t>(routed.size(), size_t(graph.config().routes)));
    for (const Entry& r : routed)
      for (int64_t j = 0; j < g.route_width; ++j) {
        const int64_t row = g.route_rows[r.row * g.route_width + j];
        if (!seen[size_t(row)]) offer(row);
      }
    for (int64_t j = 0; j < g.entry_count; ++j)
      if (!seen[size_t(g.entries[j])]) offer(g.entries[j]);
    while (!unexpanded.empty()) {
      const Entry c = *unexpanded.begin();
      if (beam.size() == width && BestFirst{}(*beam.rbegin(), c)) break;
      unexpanded.erase(unexpanded.begin());
      for (int64_t e = g.offsets[c.row]; e < g.offsets[c.row + 1]; ++e)
        if (!seen[size_t(g.edges[e])]) offer(g.edges[e]);
    }
    std::vector<Entry> found(beam.begin(), beam.end());
    for (int64_t r = g.rows; r < N; ++r) found.push_back({score(q, r), r});
    std::sort(found.begin(), found.end(), BestFirst{});
    for (int j = 0; j < k; ++j) {
      const bool ok = j < int(found.size());
      rows[i * k + j] = ok ? found[size_t(j)].row : -1;
      scores[i * k + j] = ok ? found[size_t(j)].score : -std::numeric_limits<double>::infinity();
    }
  }
}

}  // namespace rotary
