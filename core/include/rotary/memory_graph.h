// rotary/memory_graph.h: a graph over a KvMemory's keys routed by the queries that search it - RetrievalAttention's
// attention-aware index (Liu et al. 2024), built as RoarGraph (Chen et al. 2024) projects a query-to-key graph
// onto the keys.
//
// An index built from the keys alone (HNSW, IVF: lab/memory) links keys that are near each other. A RoPE model's
// queries are not distributed like its keys, and a query's best keys need not be near each other, so such an
// index misses them (docs/memory.md: FAISS IVF finds a third of the top-k on a trained model's keys). This graph
// links keys that the same queries rank high. Training queries - the prefill's own queries through the memory's
// policy (add_queries) - are each scanned exactly for their top Kq keys, and the keys a query ranks together are
// linked to each other (the bipartite graph query -> keys, projected onto the keys). A row keeps its `degree` most co-ranked neighbours, and is linked to the rows before and after it in the
// memory (the text's order), so every row is reachable. A search is routed by the training queries: it ranks a
// sample of them (`routing_queries`, kept at unit length) by cosine with its own query and starts from the top
// rows of the `routes` most alike, and from fixed entry points (the best keys of training queries spread over the
// sample); then it walks the graph best first, keeping the best `search_width` rows found (a
// beam, as HNSW's bottom layer is searched), until no unexpanded row in the beam beats the worst kept; each
// neighbour is scored exactly. Approximate: no certificate (rotary/memory_pages.h's k-d page search has one); with
// search_width >= the rows, every row is scored and the top-k is the exact scan's.
//
// The memory only grows. Rows appended after the graph was built (the tail) are scanned exactly by every search,
// and sync() rebuilds the graph over every row once the tail reaches the rows in the graph (and min_graph_rows):
// O(log N) builds, each (training queries x N) dot products per kv head. Training queries: add_queries() keeps at
// most `training_queries` per kv head, a uniform sample of all it was given (reservoir sampling from a fixed seed:
// the same calls build the same graph). A head given none is built from a strided sample of its own keys as
// queries (a graph of the keys alone, with the recall problem above). Ties: rows by score descending, the earlier
// row first. A float64 oracle of the walk over the same graph, written apart: memory_graph_search_reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "rotary/kv_memory.h"

namespace rotary {

struct MemoryGraphConfig {
  int64_t degree = 64;              // M: a row's neighbours from the training queries, at most, 1..1024 (plus the
                                    // rows before and after it)
  int64_t query_neighbors = 32;     // Kq: each training query's exact top keys linked, 2..1024
  int64_t training_queries = 16384; // kept per kv head, 1..1048576
  int64_t search_width = 128;       // W: best rows kept while walking (k where k is larger), 1..1048576
  int64_t entry_points = 32;        // distinct rows a search starts from, 1..4096
  int64_t min_graph_rows = 4096;    // a memory of fewer rows is scanned exactly (no graph), >= 1
  int64_t routing_queries = 256;    // training queries kept for routing, 0..65536 (0: the entry points alone)
  int64_t routes = 4;               // routing queries a search starts from, 1..256
  void validate() const;            // rotary::Error naming the field ("memory_graph.degree = 0 ...; allowed: ...")
};

// The work of the searches of one call, summed over its queries.
struct GraphSearchStats {
  int64_t queries = 0;
  int64_t rows_scored = 0;  // rows scored exactly: entry points, neighbours reached, and the tail
  // Rows scored as a share of an exact scan's (queries x rows).
  double share_of_scan(int64_t memory_rows) const;
  void add(const GraphSearchStats& other);
};

// A read-only view of one kv head's graph (valid until the next sync that rebuilds it).
struct GraphView {
  int64_t rows = 0;                 // G: rows [0, G) are in the graph, [G, size) the tail
  const int64_t* offsets = nullptr; // [G + 1]: row r's neighbours are edges[offsets[r], offsets[r + 1])
  const uint32_t* edges = nullptr;  // in the order the walk visits them
  const int64_t* entries = nullptr; // [entry_count]
  int64_t entry_count = 0;
  const float* route_queries = nullptr;  // [route_count, D]: routing queries at unit length
  const int64_t* route_rows = nullptr;   // [route_count, route_width]: each one's top rows, best first
  int64_t route_count = 0, route_width = 0;
};

class MemoryGraph {
 public:
  // Links nothing yet: sync() takes in the memory's rows. The memory must outlive the graph and only grow.
  MemoryGraph(const KvMemory& memory, const MemoryGraphConfig& config);
  ~MemoryGraph();
  MemoryGraph(MemoryGraph&&) noexcept;
  MemoryGraph& operator=(MemoryGraph&&) noexcept;

  // Training queries of kv head h: search vectors fp32 [n, D] (KvMemory::search_query's), kept as a sample for
  // the next build. rotary::Error naming the field: kv_head, n < 0, null queries, a non-finite element.
  void add_queries(int64_t kv_head, int64_t n, const float* queries);
  // p's queries (p.q, p.q_positions, p.softmax_scale, p.query_origin; p.tokens of them) through the memory's
  // policy, each (token, query head) into its kv head's sample: what a prefill chunk's attention searches with.
  void add_queries(const MemoryAttentionParams& p);
  int64_t training_queries(int64_t kv_head) const;  // kept now

  // Takes in the rows appended since the last sync: they join the tail, and the graph is rebuilt over every row
  // when the tail reaches the rows in the graph and the memory has min_graph_rows. rotary::Error if the memory
  // shrank (cleared: make a new graph).
  void sync();
  int64_t size() const;        // rows taken in (graph and tail)
  int64_t graph_rows() const;  // rows in the graph
  int64_t builds() const;      // graphs built so far
  const MemoryGraphConfig& config() const;
  // Changes W for later searches (a sweep of recall against work builds one graph). rotary::Error naming
  // memory_graph.search_width outside its range.
  void set_search_width(int64_t search_width);
  GraphView graph(int64_t kv_head) const;

  // The k best rows of kv head h found for n search vectors (fp32 [n, D]), best first: rows, scores [n, k]
  // (fp32 logits; -1 and -inf past the rows found, which is k whenever the memory has k rows). Threads over the
  // queries (0: omp_get_max_threads()). rotary::Error naming the field: kv_head, k outside 1..size, rows
  // appended since the last sync, null pointers.
  void search(int64_t kv_head, int64_t n, const float* queries, int k, int64_t* rows, float* scores,
              GraphSearchStats* stats = nullptr, int threads = 0) const;
  // memory_attention's candidates for p's queries through the memory's policy, each in its kv head's graph.
  // out: [tokens, Hq, top_k].
  void candidates(const MemoryAttentionParams& p, int64_t* out, GraphSearchStats* stats = nullptr) const;

  // The graph file: save writes the graphs and the training samples (synced: rotary::Error naming memory_graph.save
  // rows taken in otherwise) atomically; open reads one written for `memory` into a graph that searches, grows and
  // rebuilds as the saved one would - a later run over a saved memory (KvMemory::save / open) does not build it
  // again. Refused, naming the file and the field: not a graph file, a damaged header or body (a field out of
  // range, either checksum, an offset, edge, entry or route row outside the rows the graph covers, a count other
  // than the header implies, a non-finite sample), truncated or trailing bytes, another memory (kv heads, head dim,
  // storage, size, the positions / sampled keys: "written for another memory"), other build settings ("written for
  // degree = 32, this run asks 64"; search_width and routes are the run's own). open_bytes: the same reader over
  // bytes in memory (what open runs on the file's mapping; fuzzed); the graph copies what it keeps.
  void save(const std::string& path) const;
  static MemoryGraph open(const std::string& path, const KvMemory& memory, const MemoryGraphConfig& config);
  static MemoryGraph open_bytes(const void* data, size_t bytes, const KvMemory& memory,
                                const MemoryGraphConfig& config, const std::string& source = "graph bytes");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// float64 oracle of MemoryGraph::search over the same graph (graph.graph(kv_head)), sharing no code with it:
// scores in double, the beam and the unexpanded rows kept as ordered sets, the tail scanned, one thread. With
// keys and queries whose scores are exact in fp32 (small integers) it returns the same rows.
void memory_graph_search_reference(const KvMemory& memory, const MemoryGraph& graph, int64_t kv_head, int64_t n,
                                   const float* queries, int k, int64_t* rows, double* scores);

}  // namespace rotary
