// lab/memory/memory_index.h: search indexes over a KvMemory's stored keys (rotary/kv_memory.h), one per kv head,
// for memories too large to scan: the index proposes top-k rows, memory_attention scores them exactly.
//
//   flat   faiss::IndexFlatIP: exact inner-product search (the same rows as the core's own scan)
//   hnsw   faiss::IndexHNSWFlat (inner product): a graph, ~log N per query; recall set by ef_search
//   ivf    faiss::IndexIVFFlat (inner product): k-means lists trained on the rows present at the first sync;
//          recall set by nprobe
//   pages  the core's query-aware page search (rotary/memory_pages.h, Quest): pages of B consecutive tokens,
//          searched best upper bound first, the bound computed with the query; recall set by pages_read (0:
//          certified exact)
//   kdtree the same search with the pages grouped by a k-d split of the keys' values (alike keys share a page)
//   graph  the core's query-routed graph (rotary/memory_graph.h, RetrievalAttention): keys linked when the same
//          training queries - the prefill's, given through add_queries - rank them high, walked best first;
//          recall set by the search width W
// Inner product is what the policies make the logit (kv_memory.h), so no normalisation: maximum inner product
// search, which HNSW and IVF support directly in FAISS.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "rotary/kv_memory.h"
#include "rotary/memory_graph.h"

namespace rotary::lab {

inline constexpr std::string_view kMemoryIndexKinds[] = {"flat", "hnsw", "ivf", "pages", "kdtree", "graph"};

struct MemoryIndexConfig {
  std::string kind = "flat";
  int hnsw_m = 32;                 // graph degree
  int hnsw_ef_construction = 64;
  int hnsw_ef_search = 128;        // candidates kept while searching (>= k is used)
  int ivf_lists = 0;               // 0: about 4 sqrt(N) at the first sync, at most N / 39 (FAISS's training floor)
  int ivf_nprobe = 16;             // lists scanned per query
  int pages_page_size = 32;        // pages, kdtree: rows per page (MemoryPagesConfig::page_size)
  int pages_read = 0;              // pages, kdtree: pages scored per query; 0: certified exact
  int graph_width = 128;           // graph: rows kept while walking (MemoryGraphConfig::search_width)
  int graph_degree = 64;           // graph: a row's neighbours from the training queries
  int graph_training_queries = 16384;  // graph: kept per kv head
  // rotary::Error naming the field ("memory_index.kind = annoy ...; allowed: flat, hnsw, ivf, pages, kdtree or
  // graph").
  void validate() const;
  MemoryGraphConfig graph_config() const;  // the graph's settings (the others at MemoryGraphConfig's defaults)
};

// An index as runs name it: flat, hnsw, ivf (their defaults), pages or kdtree (certified exact), pages<P> or
// kdtree<P> (P pages read per query: "pages16"), graph or graph<W> (search width W: "graph128"). rotary::Error
// naming `field` otherwise.
MemoryIndexConfig memory_index_from_name(const std::string& name, std::string_view field = "indexes");

// How hard a built index looks (MemoryIndex::set_search_effort); each kind reads its own field.
struct SearchEffort {
  int hnsw_ef_search = 128;
  int ivf_nprobe = 16;
  int pages_read = 0;
  int graph_width = 128;
};

// The searches' work since the last reset: vectors of length D scored (a FAISS distance, an IVF centroid, a key
// of a page, a page's bound counting two), against what exact scans of the same queries would score. NaN for
// hnsw: Debian's FAISS 1.7.3 does not count an HNSW search's distances (its hnsw_stats stay 0).
struct SearchWork {
  int64_t queries = 0;
  double vectors = 0;
  double scan_vectors = 0;  // queries x rows indexed
  double share_of_scan() const { return scan_vectors > 0 ? vectors / scan_vectors : 0; }
};

class MemoryIndex {
 public:
  // Indexes nothing yet: sync() adds the memory's rows. The memory must outlive the index.
  MemoryIndex(const KvMemory& memory, const MemoryIndexConfig& config);
  ~MemoryIndex();
  MemoryIndex(MemoryIndex&&) noexcept;
  MemoryIndex& operator=(MemoryIndex&&) noexcept;

  // Adds the rows appended to the memory since the last sync (ivf: trains its lists on the first sync's rows;
  // graph: rebuilds its graph when the rows not in it reach the rows in it, MemoryGraph::sync).
  void sync();
  // Kind graph: p's queries (the prefill's, through the memory's policy) join the training sample its next build
  // links keys by (MemoryGraph::add_queries). The other kinds are built from the keys alone and ignore them.
  void add_queries(const MemoryAttentionParams& p);
  // Kinds pages and kdtree: writes the page index (MemoryPages::save), or opens one written for `memory` mapped
  // from its file (MemoryPages::open; it cannot grow), so a memory larger than RAM is searched without grouping it
  // again. Kind graph: writes the graph and its training sample (MemoryGraph::save), or reads one written for
  // `memory` (MemoryGraph::open: it grows and rebuilds as the saved one would). rotary::Error naming
  // memory_index.kind for the FAISS kinds, and MemoryPages' / MemoryGraph's errors.
  void save(const std::string& path) const;
  static MemoryIndex open(const std::string& path, const KvMemory& memory, const MemoryIndexConfig& config);
  int64_t size() const;  // rows indexed
  const MemoryIndexConfig& config() const;
  // Changes how hard later searches look without rebuilding: hnsw's ef_search, ivf's nprobe (capped at its lists),
  // the pages read; flat ignores them. A sweep of recall against speed then builds one graph, one set of lists or
  // one set of page bounds. rotary::Error naming the field for a value outside MemoryIndexConfig's range.
  void set_search_effort(const SearchEffort& effort);
  // The work of the searches since construction or reset_work() (FAISS's distance counters for hnsw and ivf).
  const SearchWork& work() const;
  void reset_work();

  // The k best rows of kv head h for n search vectors (fp32 [n, D], as KvMemory::search_query makes them), best
  // first, padded with -1 (an approximate index may find fewer): rows, scores [n, k].
  void search(int64_t kv_head, int64_t n, const float* queries, int k, int64_t* rows, float* scores) const;

  // memory_attention's candidates for p's queries (p.q, p.q_positions, p.top_k, p.softmax_scale): the search
  // vector of each (token, head) through the memory's policy, searched in its kv head's index.
  // out: [tokens, Hq, top_k]. rotary::Error if rows were appended since the last sync.
  void candidates(const MemoryAttentionParams& p, int64_t* out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rotary::lab
