// core/src/key_rows.h (internal): what the memory's searches (memory_pages.cpp, memory_graph.cpp) share - a kv
// head's stored keys read as fp32, the fp32 score of a row, and the order of scored rows.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "mapped_file.h"
#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/kv_memory.h"
#include "storage.h"
#include "validate.h"

namespace rotary::detail {

// A kv head's stored keys as fp32: f32 rows in place, half-precision ones widened.
struct KeyRows {
  const void* base;
  DType storage;
  int64_t D;
  const float* row(int64_t j, float* buf) const { return f32_row(base, storage, j * D, D, buf); }
  float at(int64_t j, int64_t d) const {
    float v = 0;
    return *f32_row(base, storage, j * D + d, 1, &v);
  }
  // Asks the cache for row j ahead of its use: the rows a search scores sit anywhere in the memory (a k-d page or
  // a graph's neighbours gather alike keys from the whole text), so scoring them one by one would wait on one
  // cache miss per row in turn.
  void prefetch(int64_t j) const {
    const int64_t bytes = D * int64_t(dtype_size(storage));
    const char* p = static_cast<const char*>(base) + j * bytes;
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
  }
};

// The fp32 score of a search: q . k.
inline float search_dot(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

struct ScoredRow {
  float score;
  int64_t row;
};
// Score descending, the earlier row first on ties (memory_attention's order).
inline bool better_row(const ScoredRow& a, const ScoredRow& b) {
  return a.score > b.score || (a.score == b.score && a.row < b.row);
}

// Offers c to `best`, a heap of at most `cap` rows whose front is the worst kept (better_row as the "less"): kept
// while there is room or when better than the worst, which it then replaces. Returns whether it was kept.
inline bool keep_best(std::vector<ScoredRow>& best, int64_t cap, const ScoredRow& c) {
  if (int64_t(best.size()) < cap) {
    best.push_back(c);
    std::push_heap(best.begin(), best.end(), better_row);
    return true;
  }
  if (!better_row(c, best.front())) return false;
  std::pop_heap(best.begin(), best.end(), better_row);
  best.back() = c;
  std::push_heap(best.begin(), best.end(), better_row);
  return true;
}

// The search vectors of p's queries through the memory's policy (KvMemory::search_query): out [tokens, Hq, D].
inline void search_vectors(const KvMemory& memory, const MemoryAttentionParams& p, float* out) {
  const int64_t D = memory.head_dim(), Hq = p.q.heads;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t h = 0; h < Hq; ++h)
      memory.search_query(static_cast<const float*>(p.q.data) + t * p.q.token_stride + h * p.q.head_stride,
                          p.q_positions[t], p.softmax_scale, out + (t * Hq + h) * D, p.query_origin);
}

// Runs one(i, stats, scratch) for every i in [0, count) on `threads` threads (0: omp_get_max_threads()), each
// thread with its own Stats and a Scratch kept between calls (a decode step's search allocates nothing once warm),
// then sums the threads' Stats into *stats (when given).
template <typename Scratch, typename Stats, typename One>
void search_in_parallel(int64_t count, int threads, Stats* stats, One one) {
  const int team = std::max(1, threads > 0 ? threads : omp_get_max_threads());
  std::vector<Stats> per_thread(static_cast<size_t>(team));
#pragma omp parallel num_threads(team) if (count > 1)
  {
    thread_local Scratch s;
    Stats& mine = per_thread[size_t(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) one(i, mine, s);
  }
  if (stats)
    for (const Stats& x : per_thread) stats->add(x);
}

// What a search over `covered` rows of memory needs before it runs (the errors name `index`, "memory_pages" or
// "memory_graph", and what its rows are called): synced, not empty, k in 1..covered.
inline void check_searchable(const KvMemory& memory, const std::string& index, const std::string& covered_as,
                             int64_t covered, int k) {
  check(covered == memory.size(), index + " " + covered_as, covered,
        "the memory's size " + std::to_string(memory.size()) + " (sync after appending)");
  check(covered > 0, index + ".search " + covered_as, covered, "> 0 (append and sync before searching)");
  check(k >= 1 && k <= covered, index + ".search k", k, "1..the " + covered_as + " " + std::to_string(covered));
}

// A search(kv_head, n, queries, k, rows, scores, threads) call's arguments, as above, and the pointers and threads.
inline void check_search_call(const KvMemory& memory, const std::string& index, const std::string& covered_as,
                              int64_t covered, int64_t kv_head, int64_t n, const float* queries, int k,
                              const int64_t* rows, const float* scores, int threads) {
  check(kv_head >= 0 && kv_head < memory.kv_heads(), index + ".search kv_head", kv_head,
        "0..kv_heads - 1 = " + std::to_string(memory.kv_heads() - 1));
  check_searchable(memory, index, covered_as, covered, k);
  check(n >= 0, index + ".search n", n, ">= 0");
  if (n == 0) return;
  check(queries != nullptr, index + ".search queries", "null", "[n, D] search vectors");
  check(rows != nullptr && scores != nullptr, index + ".search rows / scores", "null", "[n, k] outputs");
  check_threads(threads);
}

// FNV-1a of the memory's positions and of up to 64 of each head's key rows spread over it: what a search index's
// file (the page index's, the graph's) records of the memory it was built over, a cheap test at open that it is
// opened over the same rows (not a proof: the keys are not read in full).
inline uint64_t memory_check(const KvMemory& m) {
  const int64_t n = m.size(), D = m.head_dim();
  const int64_t row_bytes = D * int64_t(dtype_size(m.storage()));
  uint64_t h = fnv1a64(m.positions(), size_t(n) * sizeof(int64_t));
  const int64_t samples = std::min<int64_t>(n, 64);
  for (int64_t kv = 0; kv < m.kv_heads(); ++kv)
    for (int64_t i = 0; i < samples; ++i) {
      const int64_t row = samples == 1 ? 0 : i * (n - 1) / (samples - 1);
      h = fnv1a64(static_cast<const char*>(m.key_data(kv)) + row * row_bytes, size_t(row_bytes), h);
    }
  return h;
}

// The checks an index file (the page index's, the graph's) makes of the memory it is opened over, from its header:
// kv heads, head dim, storage and size in range ("a damaged header"), then equal to the memory's ("written for
// kv_heads = 2, this memory has 4"), then its fingerprint (memory_check: "written for another memory").
inline void check_index_file_memory(const ReaderErrors& e, int64_t kv_heads, int64_t head_dim, int64_t storage,
                                    int64_t size, uint64_t fingerprint, const KvMemory& memory) {
  if (kv_heads < 1 || kv_heads > 4096) throw e.damaged("kv_heads", kv_heads, "1..4096");
  if (head_dim < 2 || head_dim > 4096) throw e.damaged("head_dim", head_dim, "2..4096");
  if (storage != int64_t(DType::F32) && storage != int64_t(DType::F16) && storage != int64_t(DType::BF16))
    throw e.damaged("storage", storage, "0 (f32), 1 (f16) or 2 (bf16)");
  if (size < 0 || size > (int64_t(1) << 40)) throw e.damaged("size", size, "0..2^40 rows");
  auto differs = [&](const std::string& field, const std::string& file, const std::string& has) {
    return e.bad("written for " + field + " = " + file + ", this memory has " + has);
  };
  if (kv_heads != memory.kv_heads()) throw differs("kv_heads", std::to_string(kv_heads), std::to_string(memory.kv_heads()));
  if (head_dim != memory.head_dim()) throw differs("head_dim", std::to_string(head_dim), std::to_string(memory.head_dim()));
  if (storage != int64_t(memory.storage())) throw differs("storage", dtype_name(DType(storage)), dtype_name(memory.storage()));
  if (size != memory.size()) throw differs("size", std::to_string(size) + " rows", std::to_string(memory.size()));
  if (fingerprint != memory_check(memory))
    throw e.bad("written for another memory: the positions or keys of this one differ (memory_check)");
}

}  // namespace rotary::detail
