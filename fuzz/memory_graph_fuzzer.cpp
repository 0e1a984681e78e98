// Fuzz target: MemoryGraph::open_bytes (rotary/memory_graph.h), the one reader of a graph file (open() runs it on
// its mapping; a file a user points us at, possibly truncated or crafted), over the memory its seeds were saved
// for (fuzz/memory_graph_seeds.h). A graph that loads is used: every offset, edge, entry and route row of every
// head read, searches run at two widths, and the graph grown by more rows and rebuilt, so ASan sees any row index
// past the memory or the graph's arrays. Each input is read twice, with the build settings its header names (so
// mutated ones are checked past the settings' comparison):
//   1. as it is: the magic, ranges and both checksums;
//   2. with both checksums (FNV-1a, docs/memory.md) made right: the counts, offsets, edges, entries, route rows
//      and samples against the rows the graph covers, truncated and trailing bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "memory_graph_seeds.h"
#include "rotary/error.h"
#include "rotary/memory_graph.h"

namespace {

constexpr size_t kFields = 8;                 // after the magic: int64 x 12, uint64 memory_check
constexpr size_t kHeaderHash = 8 + 13 * 8;    // FNV-1a of the fields
constexpr size_t kBody = kHeaderHash + 8;     // the body's first byte

uint64_t fnv(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

int64_t field(const std::vector<uint8_t>& b, int i, int64_t fallback, int64_t lo, int64_t hi) {
  if (b.size() < kFields + 8 * size_t(i + 1)) return fallback;
  int64_t v = 0;
  std::memcpy(&v, b.data() + kFields + 8 * size_t(i), 8);
  return v >= lo && v <= hi ? v : fallback;
}

volatile uint64_t sink;

void use(rotary::MemoryGraph& graph, const rotary::KvMemory& seed_memory) {
  uint64_t sum = 0;
  for (int64_t h = 0; h < seed_memory.kv_heads(); ++h) {
    const rotary::GraphView g = graph.graph(h);
    for (int64_t r = 0; r <= g.rows; ++r) sum += uint64_t(g.offsets[r]);
    for (int64_t i = 0; i < g.offsets[g.rows]; ++i) sum += g.edges[i];
    for (int64_t i = 0; i < g.entry_count; ++i) sum += uint64_t(g.entries[i]);
    for (int64_t i = 0; i < g.route_count * g.route_width; ++i) sum += uint64_t(g.route_rows[i]);
  }
  const int k = int(std::min<int64_t>(3, graph.size()));
  const float queries[2 * 4] = {1.0f, -0.5f, 0.25f, 2.0f, -1.0f, 0.0f, 0.5f, -0.125f};
  std::vector<int64_t> rows(size_t(2 * k));
  std::vector<float> scores(rows.size());
  for (int64_t width : {1, 64}) {
    graph.set_search_width(width);
    for (int64_t h = 0; h < seed_memory.kv_heads(); ++h) {
      graph.search(h, 2, queries, k, rows.data(), scores.data(), nullptr, 1);
      for (int64_t r : rows) sum += uint64_t(r);
    }
  }
  sink = sum;
}

void try_open(const std::vector<uint8_t>& bytes) {
  // A memory of its own per input: a graph that loads is grown by rows and rebuilt over them.
  rotary::KvMemory memory = rotary::fuzz::graph_seed_memory();
  rotary::MemoryGraphConfig c = rotary::fuzz::graph_seed_config(16);
  c.degree = field(bytes, 6, c.degree, 1, 1024);
  c.query_neighbors = field(bytes, 7, c.query_neighbors, 2, 1024);
  c.training_queries = field(bytes, 8, c.training_queries, 1, 64);
  c.entry_points = field(bytes, 9, c.entry_points, 1, 4096);
  c.min_graph_rows = field(bytes, 10, c.min_graph_rows, 1, 1 << 20);
  c.routing_queries = field(bytes, 11, c.routing_queries, 0, 64);
  std::vector<uint8_t> copy(bytes);
  try {
    rotary::MemoryGraph graph =
        rotary::MemoryGraph::open_bytes(copy.data(), copy.size(), memory, c, "fuzz input");
    use(graph, memory);
    rotary::fuzz::append_graph_seed_rows(memory, rotary::fuzz::kGraphSeedRows, 2 * rotary::fuzz::kGraphSeedRows);
    graph.sync();
    use(graph, memory);
  } catch (const rotary::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  try_open(bytes);
  if (bytes.size() >= kBody + 8) {
    const uint64_t header = fnv(bytes.data() + 8, kHeaderHash - 8);
    std::memcpy(bytes.data() + kHeaderHash, &header, 8);
    const uint64_t body = fnv(bytes.data() + kBody, bytes.size() - 8 - kBody);
    std::memcpy(bytes.data() + bytes.size() - 8, &body, 8);
    try_open(bytes);
  }
  return 0;
}
