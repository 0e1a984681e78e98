// rotary/memory_pages.h: query-aware page search over a KvMemory - Quest's page bounds (Tang et al. 2024) in a
// tree, over pages of consecutive tokens or of alike keys.
//
// One kv head's stored keys are cut into pages of at most B rows. Each page keeps the elementwise maximum and
// minimum of its keys, hi and lo [D]. For a search vector q (KvMemory::search_query: its inner product with a
// stored key IS the scaled logit under every policy) no key of the page can score more than
//   bound(q, page) = sum_d max(q_d hi_d, q_d lo_d) = q+ . hi + q- . lo       (q+ = max(q, 0), q- = min(q, 0))
// Unlike a k-means list or a graph built from the keys alone, the bound is computed with the query itself, so it
// stays an upper bound whatever the queries' distribution (RetrievalAttention's problem: RoPE queries and keys are
// distributed differently). Pages are the leaves of a binary tree whose every node keeps the box (hi, lo) of the
// rows below it, so a search need not bound every page: it walks the tree best bound first (branch and bound, as
// a k-d tree answers maximum-inner-product search), scoring the rows of each page it reaches.
//
// How rows are grouped into pages (MemoryPagesConfig::grouping):
//   Tokens  consecutive tokens (Quest, InfLLM's blocks): tight boxes where a model's keys change slowly along the
//           text; nothing gained where they do not (a trained model's keys repeat with the text, docs/memory.md)
//   Keys    a k-d split of the keys' values (each node cut at the median of its widest coordinate): alike keys
//           share a page wherever they sit in the text, so repeated and clustered keys give tight boxes
//
//   pages_read = P > 0   the P pages of the best bounds, and more in that order until k rows are scored (recall
//                        set by P)
//   pages_read = 0       certified: the walk stops once no unread page's bound exceeds the k-th best score found,
//                        up to the fp32 rounding of both (slack below), so every row left out scores at most the
//                        k-th retrieved plus twice the slack - the exact scan's top-k, up to rows that tie with its
//                        k-th within fp32 rounding; the work adapts to how peaked the scores are
//
// The memory only grows. sync() puts the rows appended since the last sync in a segment of their own, and merges
// segments as a binary counter does (a segment no larger than the one after it is merged into it, and the union
// re-grouped), so there are O(log N) segments and a row is re-grouped O(log N) times. Ties: pages by bound, the
// earlier node first; rows by score descending, the earlier row first (memory_attention's order). A float64
// oracle, written apart, is memory_pages_search_reference.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rotary/kv_memory.h"

namespace rotary {

enum class PageGrouping : uint8_t { Tokens, Keys };
const char* page_grouping_name(PageGrouping g);  // "tokens", "keys"

struct MemoryPagesConfig {
  int64_t page_size = 32;   // B: rows per page at most, 1..65536
  int64_t pages_read = 0;   // P: pages scored per query, >= 0; 0: certified (above)
  PageGrouping grouping = PageGrouping::Keys;
  void validate() const;    // rotary::Error naming the field ("memory_pages.page_size = 0 ...; allowed: 1..65536")
};

// The work of the searches of one call, summed over its queries.
struct PageSearchStats {
  int64_t queries = 0;
  int64_t bounds = 0;       // node bounds computed (each a dot product of length 2D: two keys' worth)
  int64_t pages_read = 0;   // pages whose rows were scored
  int64_t rows_scored = 0;  // rows scored exactly
  // Vectors of length D scored, as a share of an exact scan's (queries x rows): (2 bounds + rows) / (queries x N).
  double share_of_scan(int64_t memory_rows) const;
  void add(const PageSearchStats& other);
};

// One node of a kv head's tree: the rows rows[first, first + count) of PageTree::rows, its children (-1: a page).
struct PageNode {
  int64_t first = 0, count = 0;
  int64_t left = -1, right = -1;
};

// A read-only view of one kv head's trees (valid until the next sync).
struct PageTree {
  const int64_t* rows = nullptr;   // [N]: memory rows grouped, each node's rows contiguous
  const PageNode* nodes = nullptr;
  int64_t node_count = 0;
  const float* boxes = nullptr;    // [node_count, 2, D]: each node's hi then lo over its rows
  const int64_t* roots = nullptr;  // one per segment
  int64_t root_count = 0;
};

class MemoryPages {
 public:
  // Groups nothing yet: sync() covers the memory's rows. The memory must outlive the index and only grow.
  MemoryPages(const KvMemory& memory, const MemoryPagesConfig& config);
  ~MemoryPages();
  MemoryPages(MemoryPages&&) noexcept;
  MemoryPages& operator=(MemoryPages&&) noexcept;

  // Groups the rows appended since the last sync (segments above). rotary::Error if the memory shrank (cleared:
  // make a new index), or for an index opened from a file when the memory has rows past the file's.
  void sync();

  // Writes the index to `path` atomically (KvMemory::save's way: complete or absent): its segments, and per kv
  // head the rows in page order, every node's box and the certificate's per-coordinate max |key| (with checksums
  // and a fingerprint of the memory's rows), then each head's keys in page order - the block layout: a page's keys
  // are one block of this file, where a k-d page's rows lie scattered over the memory's. Beside the memory's own
  // file it makes a memory larger than RAM searchable without reading every key at open: open() maps the index,
  // a search reads the boxes it bounds and the blocks of the pages it scores, and memory_attention then reads the
  // top-k rows from the memory. Layout: docs/memory.md. rotary::Error naming memory_pages.save if rows were
  // appended since the last sync.
  void save(const std::string& path) const;
  // Maps a file written by save() over `memory`, which must hold the rows it was saved with (kv heads, head dim,
  // storage and size equal; its positions and a sample of its keys hashed as when saved). config.page_size and
  // config.grouping must be the file's; pages_read is the caller's choice. rotary::Error naming the file and the
  // field: not a page index, a damaged header or body (a field out of range, a checksum, segments that do not
  // cover the rows, rows that are not a permutation of their segment's, a size other than the header implies),
  // another memory or another page size / grouping. The index cannot grow (sync() with new rows is an error).
  static MemoryPages open(const std::string& path, const KvMemory& memory, const MemoryPagesConfig& config);
  // The reader open() runs on its mapping, for bytes already in memory (tests, fuzzing): the same checks, every
  // count and offset in overflow-checked arithmetic, errors naming `source`. The bytes are BORROWED (kept alive
  // and unchanged by the caller while the index is used) and must be aligned to 8 bytes.
  static MemoryPages open_bytes(const void* data, size_t size, const KvMemory& memory,
                                const MemoryPagesConfig& config, const std::string& source = "page index bytes");
  int64_t size() const;   // rows covered
  int64_t pages() const;  // pages (leaves) per kv head
  const MemoryPagesConfig& config() const;
  // Changes P for later searches (a sweep of recall against work groups the rows once). rotary::Error naming
  // memory_pages.pages_read for a negative value.
  void set_pages_read(int64_t pages_read);
  PageTree tree(int64_t kv_head) const;

  // The k best rows of kv head h for n search vectors (fp32 [n, D], as KvMemory::search_query makes them), best
  // first: rows, scores [n, k] (fp32 logits of the rows). Threads over the queries (0: omp_get_max_threads()).
  // rotary::Error naming the field: kv_head, k outside 1..size, rows appended since the last sync, null pointers.
  void search(int64_t kv_head, int64_t n, const float* queries, int k, int64_t* rows, float* scores,
              PageSearchStats* stats = nullptr, int threads = 0) const;

  // memory_attention's candidates for p's queries (p.q, p.q_positions, p.top_k, p.softmax_scale, p.query_origin):
  // the search vector of each (token, query head) through the memory's policy, searched in its kv head's tree.
  // out: [tokens, Hq, top_k].
  void candidates(const MemoryAttentionParams& p, int64_t* out, PageSearchStats* stats = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// float64 oracle of MemoryPages::search over the same pages (the leaves of pages.tree(kv_head), in node order),
// sharing no arithmetic with it: each page's min / max scanned from the memory's keys, bounds and scores in
// double, every page ranked by a full sort (no tree); certified mode reads pages until the k-th best score
// exceeds the next bound (in exact arithmetic: exactly the top-k of every row). One thread; scores in double.
void memory_pages_search_reference(const KvMemory& memory, const MemoryPages& pages, int64_t kv_head, int64_t n,
                                   const float* queries, int k, int64_t* rows, double* scores);

}  // namespace rotary
