// core/src/memory_pages_reference.cpp: the float64 oracle of MemoryPages::search (rotary/memory_pages.h), written
// apart from the fast path: the pages (the tree's leaves, in node order) taken from the index, but their bounds
// scanned here from the memory's keys, every bound and score in double, the pages ranked by a full sort (no tree,
// no boxes), one thread.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "rotary/error.h"
#include "rotary/memory_pages.h"

namespace rotary {

void memory_pages_search_reference(const KvMemory& memory, const MemoryPages& pages, int64_t kv_head, int64_t n,
                                   const float* queries, int k, int64_t* rows, double* scores) {
  const int64_t N = memory.size(), D = memory.head_dim();
  check(pages.size() == N, "memory_pages_reference rows grouped", pages.size(), "the memory's size (sync first)");
  check(k >= 1 && k <= N, "memory_pages_reference k", k, "1..the memory size " + std::to_string(N));
  const PageTree tree = pages.tree(kv_head);
  std::vector<std::vector<int64_t>> page_rows;
  for (int64_t i = 0; i < tree.node_count; ++i)
    if (tree.nodes[i].left < 0)
      page_rows.emplace_back(tree.rows + tree.nodes[i].first, tree.rows + tree.nodes[i].first + tree.nodes[i].count);
  auto key = [&](int64_t j, int64_t d) {  // in double, whatever the storage
    return load_as_double(memory.key_data(kv_head), memory.storage(), j * D + d);
  };
  const int64_t pages_read = pages.config().pages_read;
  for (int64_t i = 0; i < n; ++i) {
    const float* q = queries + i * D;
    auto score = [&](int64_t j) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += double(q[d]) * key(j, d);
      return s;
    };
    // bound(page) = sum_d max over the page's rows of q_d k_jd, computed as that maximum directly.
    std::vector<double> bound;
    for (const std::vector<int64_t>& page : page_rows) {
      double b = 0;
      for (int64_t d = 0; d < D; ++d) {
        double best = -INFINITY;
        for (int64_t j : page) best = std::max(best, double(q[d]) * key(j, d));
        b += best;
      }
      bound.push_back(b);
    }
    std::vector<size_t> order(page_rows.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bound[a] > bound[b]; });
    std::vector<std::pair<double, int64_t>> found;  // (score, row)
    auto kth_best = [&] {
      std::vector<double> s;
      for (const auto& f : found) s.push_back(f.first);
      std::sort(s.begin(), s.end(), std::greater<>());
      return s[size_t(k - 1)];
    };
    for (size_t r = 0; r < order.size(); ++r) {
      const bool enough_rows = int64_t(found.size()) >= k;
      if (pages_read > 0 && int64_t(r) >= pages_read && enough_rows) break;
      // Certified: in exact arithmetic a page bounded below the k-th best holds nothing better.
      if (pages_read == 0 && enough_rows && kth_best() > bound[order[r]]) break;
      for (int64_t j : page_rows[order[r]]) found.push_back({score(j), j});
    }
    std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int j = 0; j < k; ++j) rows[i * k + j] = found[size_t(j)].second, scores[i * k + j] = found[size_t(j)].first;
  }
}

}  // namespace rotary
