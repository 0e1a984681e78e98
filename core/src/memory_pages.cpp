// core/src/memory_pages.cpp: page search over a KvMemory (rotary/memory_pages.h) - the trees of pages (grouping,
// boxes, segments), the fast fp32 best-bound-first search (top-P pages or certified), and memory_attention's
// candidates through it. Its float64 oracle, written apart: memory_pages_reference.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "memory_pages_impl.h"
#include "rotary/error.h"
#include "rotary/memory_pages.h"
#include "storage.h"
#include "validate.h"

namespace rotary {

const char* page_grouping_name(PageGrouping g) { return g == PageGrouping::Tokens ? "tokens" : "keys"; }

void MemoryPagesConfig::validate() const {
  check(page_size >= 1 && page_size <= 65536, "memory_pages.page_size", page_size, "1..65536");
  check(pages_read >= 0, "memory_pages.pages_read", pages_read,
        ">= 0 (pages scored per query; 0: certified, read until no unread page can hold a better row)");
  check(grouping == PageGrouping::Tokens || grouping == PageGrouping::Keys, "memory_pages.grouping", int(grouping),
        "tokens or keys");
}

double PageSearchStats::share_of_scan(int64_t memory_rows) const {
  if (queries == 0 || memory_rows == 0) return 0;
  return (2.0 * double(bounds) + double(rows_scored)) / (double(queries) * double(memory_rows));
}

void PageSearchStats::add(const PageSearchStats& o) {
  queries += o.queries, bounds += o.bounds, pages_read += o.pages_read, rows_scored += o.rows_scored;
}

namespace detail {

int64_t lay_out_tree(HeadTrees& t, const KeyRows* K, int64_t D, const MemoryPagesConfig& c, int64_t first,
                     int64_t count, std::vector<float>& buf) {
  const int64_t id = int64_t(t.nodes.size());
  t.nodes.push_back({first, count, -1, -1});
  float* hi = nullptr;
  float* lo = nullptr;
  if (K) {
    t.boxes.resize(size_t((id + 1) * 2 * D));
    hi = t.boxes.data() + id * 2 * D;
    lo = hi + D;
    std::fill(hi, hi + D, -std::numeric_limits<float>::infinity());
    std::fill(lo, lo + D, std::numeric_limits<float>::infinity());
    for (int64_t i = first; i < first + count; ++i) {
      const float* k = K->row(t.rows[size_t(i)], buf.data());
      for (int64_t d = 0; d < D; ++d) hi[d] = std::max(hi[d], k[d]), lo[d] = std::min(lo[d], k[d]);
    }
  }
  const int64_t B = c.page_size;
  if (count <= B) return id;
  // The left part a multiple of B, at least half: every page full but the last of the segment.
  const int64_t left = B * ((count + 2 * B - 1) / (2 * B));
  if (K && c.grouping == PageGrouping::Keys) {
    int64_t widest = 0;
    for (int64_t d = 1; d < D; ++d)
      if (hi[d] - lo[d] > hi[widest] - lo[widest]) widest = d;
    if (hi[widest] > lo[widest]) {  // (rows all alike: any cut; token order kept)
      const auto begin = t.rows.begin() + first;
      std::nth_element(begin, begin + left, begin + count, [&](int64_t a, int64_t b) {
        const float ka = K->at(a, widest), kb = K->at(b, widest);
        return ka < kb || (ka == kb && a < b);
      });
    }
  }
  const int64_t l = lay_out_tree(t, K, D, c, first, left, buf);
  const int64_t r = lay_out_tree(t, K, D, c, first + left, count - left, buf);
  t.nodes[size_t(id)].left = l, t.nodes[size_t(id)].right = r;
  return id;
}

}  // namespace detail

using detail::HeadTrees;
using detail::KeyRows;

MemoryPages::MemoryPages(const KvMemory& memory, const MemoryPagesConfig& config) : impl_(std::make_unique<Impl>()) {
  config.validate();
  impl_->memory = &memory;
  impl_->config = config;
  impl_->heads.resize(size_t(memory.kv_heads()));
  for (HeadTrees& t : impl_->heads) t.absmax.assign(size_t(memory.head_dim()), 0.0f), t.read_owned();
}

MemoryPages::~MemoryPages() = default;
MemoryPages::MemoryPages(MemoryPages&&) noexcept = default;
MemoryPages& MemoryPages::operator=(MemoryPages&&) noexcept = default;

void MemoryPages::sync() {
  Impl& m = *impl_;
  const int64_t n = m.memory->size();
  check(n >= m.covered, "memory_pages.sync memory size", n,
        ">= the rows already grouped (" + std::to_string(m.covered) + "; the memory was cleared: make a new index)");
  if (n == m.covered) return;
  check(!m.from_bytes, "memory_pages.sync memory size", n,
        std::to_string(m.covered) + " (the rows of an index opened from a file, which cannot grow: build an index "
        "in RAM over the memory, or open one saved with its rows)");
  // The new rows as a segment; then merge while the segment before the last is no larger than the last.
  m.segments.push_back({m.covered, n});
  size_t first_rebuilt = m.segments.size() - 1;
  while (m.segments.size() >= 2) {
    detail::PageSegment& prev = m.segments[m.segments.size() - 2];
    const detail::PageSegment last = m.segments.back();
    if (prev.end - prev.begin > last.end - last.begin) break;
    prev.end = last.end;
    m.segments.pop_back();
    first_rebuilt = std::min(first_rebuilt, m.segments.size() - 1);
  }
  const int64_t D = m.memory->head_dim(), heads = m.memory->kv_heads();
  // The kv heads' trees are independent: threads over them once the rows to group make it worth a team (a decode
  // step's sync usually groups one chunk; the first sync after a long prompt, or a large merge, groups millions).
  const int64_t regrouped = n - m.segments[first_rebuilt].begin;
  std::exception_ptr failed;  // an exception may not leave an OpenMP region: kept, rethrown after it
#pragma omp parallel for schedule(dynamic, 1) if (heads > 1 && regrouped * heads >= 65536)
  for (int64_t h = 0; h < heads; ++h) try {
    HeadTrees& t = m.heads[size_t(h)];
    const KeyRows K{m.memory->key_data(h), m.memory->storage(), D};
    std::vector<float> buf(static_cast<size_t>(D));
    // Drop the trees of the segments merged away (their nodes are the tail), re-group the merged one.
    if (first_rebuilt < t.roots.size()) {
      const int64_t first_node = t.roots[first_rebuilt];
      t.nodes.resize(size_t(first_node));
      t.boxes.resize(size_t(first_node * 2 * D));
      t.roots.resize(first_rebuilt);
    }
    t.rows.resize(size_t(n));
    for (size_t s = first_rebuilt; s < m.segments.size(); ++s) {
      const detail::PageSegment seg = m.segments[s];
      for (int64_t r = seg.begin; r < seg.end; ++r) t.rows[size_t(r)] = r;  // token order, then grouped
      t.roots.push_back(detail::lay_out_tree(t, &K, D, m.config, seg.begin, seg.end - seg.begin, buf));
    }
    for (int64_t j = m.covered; j < n; ++j) {
      const float* k = K.row(j, buf.data());
      for (int64_t d = 0; d < D; ++d) t.absmax[size_t(d)] = std::max(t.absmax[size_t(d)], std::abs(k[d]));
    }
    t.read_owned();
  } catch (...) {
#pragma omp critical(rotary_memory_pages_sync)
    if (!failed) failed = std::current_exception();
  }
  if (failed) {
    // A head could not be grouped (out of memory): every tree is forgotten, so that no search reads half-built ones
    // and the next sync groups the whole memory anew.
    m.segments.clear(), m.covered = 0;
    for (HeadTrees& t : m.heads) {
      t.rows.clear(), t.nodes.clear(), t.boxes.clear(), t.roots.clear();
      std::fill(t.absmax.begin(), t.absmax.end(), 0.0f);
      t.read_owned();
    }
    std::rethrow_exception(failed);
  }
  m.covered = n;
}

int64_t MemoryPages::size() const { return impl_->covered; }
int64_t MemoryPages::pages() const {
  if (impl_->heads.empty()) return 0;
  int64_t leaves = 0;
  for (const PageNode& node : impl_->heads[0].nodes) leaves += node.left < 0 ? 1 : 0;
  return leaves;
}
const MemoryPagesConfig& MemoryPages::config() const { return impl_->config; }

void MemoryPages::set_pages_read(int64_t pages_read) {
  MemoryPagesConfig next = impl_->config;
  next.pages_read = pages_read;
  next.validate();
  impl_->config = next;
}

PageTree MemoryPages::tree(int64_t kv_head) const {
  check(kv_head >= 0 && kv_head < impl_->memory->kv_heads(), "memory_pages.tree kv_head", kv_head,
        "0..kv_heads - 1 = " + std::to_string(impl_->memory->kv_heads() - 1));
  const HeadTrees& t = impl_->heads[size_t(kv_head)];
  return {t.rows_at, t.nodes.data(), int64_t(t.nodes.size()), t.boxes_at, t.roots.data(), int64_t(t.roots.size())};
}

namespace {

using detail::better_row;
using detail::ScoredRow;

struct Frontier {
  float bound;
  int64_t node;
};
// The priority queue's "less": a lower bound, or the later node on ties, waits.
bool waits(const Frontier& a, const Frontier& b) { return a.bound < b.bound || (a.bound == b.bound && a.node > b.node); }

// The per-thread buffers of one search.
struct Scratch {
  std::vector<float> qq;  // [2D]: q+, q-
  std::vector<float> row;  // [D]: a half-precision key widened
  std::vector<Frontier> frontier;
  std::vector<ScoredRow> best;
};

// One query of one kv head: fills rows / scores [k], best first.
void search_one(const HeadTrees& t, const KeyRows& K, int64_t D, int64_t pages_read, const float* q, int k,
                int64_t* rows, float* scores, PageSearchStats& stats, Scratch& s) {
  s.qq.resize(size_t(2 * D));
  s.row.resize(size_t(D));
  for (int64_t d = 0; d < D; ++d) s.qq[size_t(d)] = std::max(q[d], 0.0f), s.qq[size_t(D + d)] = std::min(q[d], 0.0f);
  auto bound = [&](int64_t node) {
    const float b = detail::search_dot(s.qq.data(), t.boxes_at + node * 2 * D, 2 * D);
    return std::isnan(b) ? -std::numeric_limits<float>::infinity() : b;  // a NaN key: its page last
  };
  // Certified stop: a row's fp32 score exceeds its exact value by at most gamma_D A and a node's fp32 bound falls
  // short of its exact value by at most gamma_2D A, A = sum_d |q_d| max_j |k_jd| (any summation order, FMA or
  // not), so a row below a node whose computed bound is b scores at most b + (3D + 2) u A computed (u = 2^-24;
  // 4D u taken as the slack). Stopping when the k-th best found >= b - slack leaves out no row above it by more
  // than 2 slack - and stops on exact ties (a repeated key), which a strict test could not.
  double a = 0;
  for (int64_t d = 0; d < D; ++d) a += std::abs(double(q[d])) * double(t.absmax_at[d]);
  const double slack = 4.0 * double(D) * std::ldexp(1.0, -24) * a;
  s.frontier.clear();
  s.best.clear();
  // A walk down the tree is a chain of dependent loads (a node's box, then its children's), each a likely cache
  // miss in a large memory: when a node enters the frontier its children's boxes are requested at once, so they
  // are in cache by the time it is expanded (about half the nodes pushed are; the others' prefetches are wasted).
  auto prefetch_box = [&](int64_t node) {
    const char* p = reinterpret_cast<const char*>(t.boxes_at + node * 2 * D);
    for (int64_t b = 0; b < 2 * D * int64_t(sizeof(float)); b += 64) __builtin_prefetch(p + b);
  };
  auto push = [&](int64_t node) {
    s.frontier.push_back({bound(node), node});
    std::push_heap(s.frontier.begin(), s.frontier.end(), waits);
    stats.bounds += 1;
    const PageNode& pushed = t.nodes[size_t(node)];
    if (pushed.left >= 0) prefetch_box(pushed.left), prefetch_box(pushed.right);
  };
  for (int64_t root : t.roots) push(root);
  // s.best is a heap whose front is the worst kept row (better_row() as the "less").
  int64_t read = 0;
  while (!s.frontier.empty()) {
    const Frontier top = s.frontier.front();
    const bool full = int64_t(s.best.size()) == k;
    if (pages_read == 0 && full && double(s.best.front().score) >= double(top.bound) - slack) break;
    if (pages_read > 0 && full && read >= pages_read) break;
    std::pop_heap(s.frontier.begin(), s.frontier.end(), waits);
    s.frontier.pop_back();
    const PageNode& node = t.nodes[size_t(top.node)];
    if (node.left >= 0) {
      push(node.left), push(node.right);
      continue;
    }
    // K holds the keys in page order (an opened index) or the memory's: key i of the page, or row i's.
    const bool paged = t.keys_at != nullptr;
    for (int64_t i = node.first; i < node.first + node.count; ++i) K.prefetch(paged ? i : t.rows_at[i]);
    for (int64_t i = node.first; i < node.first + node.count; ++i) {
      const int64_t row = t.rows_at[i];
      const ScoredRow c{detail::search_dot(q, K.row(paged ? i : row, s.row.data()), D), row};
      detail::keep_best(s.best, k, c);
    }
    read += 1;
    stats.pages_read += 1, stats.rows_scored += node.count;
  }
  stats.queries += 1;
  std::sort(s.best.begin(), s.best.end(), better_row);
  for (int i = 0; i < k; ++i) rows[i] = s.best[size_t(i)].row, scores[i] = s.best[size_t(i)].score;
}

}  // namespace

namespace {

// Searches `count` (kv head, query) pairs in parallel: head_of(i), query i at queries + i * D, outputs at i * k.
template <typename HeadOf>
void search_many(const KvMemory& memory, const std::vector<HeadTrees>& heads, int64_t pages_read, int64_t count,
                 HeadOf head_of, const float* queries, int k, int64_t* rows, float* scores, PageSearchStats* stats,
                 int threads) {
  const int64_t D = memory.head_dim();
  detail::search_in_parallel<Scratch>(count, threads, stats, [&](int64_t i, PageSearchStats& mine, Scratch& s) {
    const int64_t h = head_of(i);
    const HeadTrees& t = heads[size_t(h)];
    search_one(t, KeyRows{t.keys_at ? t.keys_at : memory.key_data(h), memory.storage(), D}, D, pages_read,
               queries + i * D, k, rows + i * k, scores + i * k, mine, s);
  });
}

}  // namespace

void MemoryPages::search(int64_t kv_head, int64_t n, const float* queries, int k, int64_t* rows, float* scores,
                         PageSearchStats* stats, int threads) const {
  const Impl& m = *impl_;
  detail::check_search_call(*m.memory, "memory_pages", "rows grouped", m.covered, kv_head, n, queries, k, rows,
                            scores, threads);
  if (n == 0) return;
  search_many(*m.memory, m.heads, m.config.pages_read, n, [kv_head](int64_t) { return kv_head; }, queries, k, rows,
              scores, stats, threads);
}

void MemoryPages::candidates(const MemoryAttentionParams& p, int64_t* out, PageSearchStats* stats) const {
  const Impl& m = *impl_;
  validate_memory_attention(*m.memory, p);
  detail::check_searchable(*m.memory, "memory_pages", "rows grouped", m.covered, p.top_k);
  check(out != nullptr || p.tokens == 0, "memory_pages.candidates out", "null", "[tokens, Hq, top_k] rows");
  // Every (token, query head) at once, threads over them all (a decode step: one query per head).
  const int64_t D = m.memory->head_dim(), Hq = p.q.heads, group = Hq / m.memory->kv_heads(), k = p.top_k;
  const int64_t count = p.tokens * Hq;
  std::vector<float> queries(size_t(count * D)), scores(size_t(count * k));
  detail::search_vectors(*m.memory, p, queries.data());
  search_many(*m.memory, m.heads, m.config.pages_read, count, [Hq, group](int64_t i) { return (i % Hq) / group; },
              queries.data(), p.top_k, out, scores.data(), stats, p.threads);
}

}  // namespace rotary
