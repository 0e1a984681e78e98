// core/src/memory_graph.cpp: the query-routed graph over a KvMemory (rotary/memory_graph.h) - training query
// samples, the build (each training query's exact top keys, projected into edges), the fp32 beam search with the
// tail scanned, and memory_attention's candidates through it. Its file: memory_graph_file.cpp. Its float64
// oracle, written apart: memory_graph_reference.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "key_rows.h"
#include "memory_graph_impl.h"
#include "rotary/error.h"
#include "rotary/memory_graph.h"
#include "validate.h"

namespace rotary {

using detail::better_row;
using detail::HeadGraph;
using detail::keep_best;
using detail::KeyRows;
using detail::ScoredRow;
using detail::search_dot;

void MemoryGraphConfig::validate() const {
  check(degree >= 1 && degree <= 1024, "memory_graph.degree", degree, "1..1024");
  check(query_neighbors >= 2 && query_neighbors <= 1024, "memory_graph.query_neighbors", query_neighbors,
        "2..1024");
  check(training_queries >= 1 && training_queries <= (int64_t(1) << 20), "memory_graph.training_queries",
        training_queries, "1..1048576");
  check(search_width >= 1 && search_width <= (int64_t(1) << 20), "memory_graph.search_width", search_width,
        "1..1048576");
  check(entry_points >= 1 && entry_points <= 4096, "memory_graph.entry_points", entry_points, "1..4096");
  check(min_graph_rows >= 1, "memory_graph.min_graph_rows", min_graph_rows, ">= 1");
  check(routing_queries >= 0 && routing_queries <= 65536, "memory_graph.routing_queries", routing_queries,
        "0..65536 (0: no routing, the fixed entry points alone)");
  check(routes >= 1 && routes <= 256, "memory_graph.routes", routes, "1..256");
}

double GraphSearchStats::share_of_scan(int64_t memory_rows) const {
  if (queries == 0 || memory_rows == 0) return 0;
  return double(rows_scored) / (double(queries) * double(memory_rows));
}

void GraphSearchStats::add(const GraphSearchStats& o) { queries += o.queries, rows_scored += o.rows_scored; }

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void MemoryGraph::Impl::keep_query(int64_t h, const float* q) {
  HeadGraph& g = heads[size_t(h)];
  const int64_t D = memory->head_dim(), cap = config.training_queries;
  const int64_t kept = int64_t(g.samples.size()) / D;
  // Reservoir sampling: the i-th query given replaces a kept one with probability cap / (i + 1), so the kept ones
  // are a uniform sample of all given; the draw is a hash of (head, i), so the same calls keep the same sample.
  int64_t slot = kept;
  if (kept >= cap) {
    const uint64_t r = splitmix64(uint64_t(g.seen) * 0x100000001b3ull ^ uint64_t(h));
    slot = int64_t(r % uint64_t(g.seen + 1));
  }
  g.seen += 1;
  if (slot >= cap) return;
  if (slot == kept) g.samples.resize(size_t((kept + 1) * D));
  std::copy(q, q + D, g.samples.begin() + slot * D);
}

namespace {

// One query against a block of rn rows laid out by coordinate (row r0 + j's coordinate d at cols[d * stride + j]):
// its rows offered to `best` (the query's top Kq so far). 16 rows at a time: their scores stay in registers over
// the coordinates, and a group whose best score is below the worst kept (most of them, once the heap is full) is
// passed over with one comparison. The build's inner loop: compiled twice, for AVX2 with FMA where the CPU has
// them (chosen at run time) and for the baseline.
constexpr int64_t kLanes = 16;
template <int kTag>
inline void block_top_impl(const float* q, const float* cols, int64_t D, int64_t stride, int64_t rn, int64_t r0,
                           std::vector<ScoredRow>& best, int64_t Kq) {
  for (int64_t r = 0; r < rn; r += kLanes) {
    alignas(64) float acc[kLanes] = {};
    for (int64_t d = 0; d < D; ++d) {
      const float qd = q[d];
      const float* c = cols + d * stride + r;
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j) acc[j] += qd * c[j];
    }
    const int64_t valid = std::min(kLanes, rn - r);
    float top = acc[0];
    for (int64_t j = 1; j < valid; ++j) top = std::max(top, acc[j]);
    if (int64_t(best.size()) == Kq && !(top >= best.front().score)) continue;
    for (int64_t j = 0; j < valid; ++j) keep_best(best, Kq, {acc[j], r0 + r + j});
  }
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void block_top_avx2(const float* q, const float* cols, int64_t D, int64_t stride,
                                                        int64_t rn, int64_t r0, std::vector<ScoredRow>& best,
                                                        int64_t Kq) {
  block_top_impl<1>(q, cols, D, stride, rn, r0, best, Kq);
}
#endif
void block_top(const float* q, const float* cols, int64_t D, int64_t stride, int64_t rn, int64_t r0,
               std::vector<ScoredRow>& best, int64_t Kq) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return block_top_avx2(q, cols, D, stride, rn, r0, best, Kq);
#endif
  block_top_impl<0>(q, cols, D, stride, rn, r0, best, Kq);
}

// Each training query's exact top Kq rows of K (rows [0, n)), best first: out [m, Kq]. Blocks of queries against
// blocks of rows, so a block of keys is read from cache by every query of the block (the keys of a large memory
// do not fit in cache; streaming them once per query would be bound by memory bandwidth). A block's keys are laid
// out by coordinate ([D, rows]), so a query's scores over the block are one vectorised sweep per coordinate
// instead of a short dot product and a horizontal sum per row.
void training_top(const KeyRows& K, int64_t n, const float* T, int64_t m, int64_t Kq, int64_t* out) {
  const int64_t D = K.D;
  constexpr int64_t kQueryBlock = 32, kRowBlock = 1024;
  std::exception_ptr failed;
#pragma omp parallel
  {
    std::vector<std::vector<ScoredRow>> heaps(kQueryBlock);
    // Coordinate d of row r at cols[d * kStride + r]; the stride is not a multiple of 4 KiB, which would put every
    // coordinate of a row in the same cache set.
    constexpr int64_t kStride = kRowBlock + kLanes;
    std::vector<float> row(static_cast<size_t>(D)), cols(static_cast<size_t>(kStride * D), 0.0f);
#pragma omp for schedule(dynamic, 1)
    for (int64_t q0 = 0; q0 < m; q0 += kQueryBlock) try {
      const int64_t qn = std::min(kQueryBlock, m - q0);
      for (int64_t i = 0; i < qn; ++i) heaps[size_t(i)].clear();
      for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
        const int64_t rn = std::min(kRowBlock, n - r0);
        for (int64_t r = 0; r < rn; ++r) {
          const float* k = K.row(r0 + r, row.data());
          for (int64_t d = 0; d < D; ++d) cols[size_t(d * kStride + r)] = k[d];
        }
        for (int64_t i = 0; i < qn; ++i) {
          const float* q = T + (q0 + i) * D;
          std::vector<ScoredRow>& best = heaps[size_t(i)];
          block_top(q, cols.data(), D, kStride, rn, r0, best, Kq);
        }
      }
      for (int64_t i = 0; i < qn; ++i) {
        std::vector<ScoredRow>& best = heaps[size_t(i)];
        std::sort(best.begin(), best.end(), better_row);
        for (int64_t j = 0; j < Kq; ++j) out[(q0 + i) * Kq + j] = best[size_t(j)].row;
      }
    } catch (...) {
#pragma omp critical(rotary_memory_graph_build)
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

// One head's graph over rows [0, n) from its training queries' top lists (above), into g's graph fields (g's own
// sample is not read: `samples` is the head's).
void build_head(const std::vector<float>& samples, HeadGraph& g, const KeyRows& K, int64_t n,
                const MemoryGraphConfig& c) {
  const int64_t D = K.D;
  // The training set: the sample given, or (none given) a strided sample of the head's own keys.
  std::vector<float> own;
  const float* T = samples.data();
  int64_t m = int64_t(samples.size()) / D;
  if (m == 0) {
    m = std::min(c.training_queries, n);
    own.resize(size_t(m * D));
    std::vector<float> buf(static_cast<size_t>(D));
    for (int64_t i = 0; i < m; ++i) {
      const float* k = K.row(i * n / m, buf.data());
      std::copy(k, k + D, own.begin() + i * D);
    }
    T = own.data();
  }
  const int64_t Kq = std::min(c.query_neighbors, n);
  std::vector<int64_t> top(static_cast<size_t>(m * Kq));
  training_top(K, n, T, m, Kq, top.data());

  // The projection: the rows a training query ranks in its top Kq are linked to each other. Each row's linked rows
  // are gathered (a bucket per row: counted, then filled) and counted: a row keeps the neighbours the most
  // training queries ranked beside it (ties: the earlier row).
  std::vector<int64_t> bucket(static_cast<size_t>(n + 1), 0);
  for (int64_t i = 0; i < m * Kq; ++i) bucket[size_t(top[size_t(i)] + 1)] += Kq - 1;
  for (int64_t r = 0; r < n; ++r) bucket[size_t(r + 1)] += bucket[size_t(r)];
  std::vector<uint32_t> linked(static_cast<size_t>(bucket[size_t(n)]));
  {
    std::vector<int64_t> fill(bucket.begin(), bucket.end() - 1);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t* L = top.data() + i * Kq;
      for (int64_t a = 0; a < Kq; ++a)
        for (int64_t b = 0; b < Kq; ++b)
          if (a != b) linked[size_t(fill[size_t(L[a])]++)] = uint32_t(L[b]);
    }
  }
  g.rows = n;
  g.offsets.assign(size_t(n + 1), 0);
  g.edges.clear();
  g.edges.reserve(size_t(std::min<int64_t>(int64_t(linked.size()), n * c.degree) + 2 * n));
  std::vector<std::pair<int64_t, int64_t>> counted;  // (-count, to) of one row
  for (int64_t r = 0; r < n; ++r) {
    counted.clear();
    const auto first = linked.begin() + bucket[size_t(r)], last = linked.begin() + bucket[size_t(r + 1)];
    std::sort(first, last);
    for (auto p = first; p != last;) {
      auto q = p;
      while (q != last && *q == *p) ++q;
      counted.emplace_back(-int64_t(q - p), int64_t(*p));
      p = q;
    }
    std::sort(counted.begin(), counted.end());
    const size_t begin = g.edges.size();
    for (size_t i = 0; i < counted.size() && int64_t(i) < c.degree; ++i)
      g.edges.push_back(uint32_t(counted[i].second));
    // The text's order: every row reachable whatever the training queries ranked.
    for (const int64_t nb : {r - 1, r + 1})
      if (nb >= 0 && nb < n &&
          std::find(g.edges.begin() + int64_t(begin), g.edges.end(), uint32_t(nb)) == g.edges.end())
        g.edges.push_back(uint32_t(nb));
    g.offsets[size_t(r + 1)] = int64_t(g.edges.size());
  }
  // Routing queries: spread over the sample, at unit length (a search ranks them by cosine with its query).
  const int64_t routing = std::min(c.routing_queries, m);
  g.route_width = Kq;
  g.route_queries.assign(size_t(routing * D), 0.0f);
  g.route_rows.resize(size_t(routing * Kq));
  for (int64_t i = 0; i < routing; ++i) {
    const int64_t from = i * m / routing;
    const float* t = T + from * D;
    double norm = 0;
    for (int64_t d = 0; d < D; ++d) norm += double(t[d]) * double(t[d]);
    const float inv = norm > 0 ? float(1.0 / std::sqrt(norm)) : 0.0f;
    for (int64_t d = 0; d < D; ++d) g.route_queries[size_t(i * D + d)] = t[d] * inv;
    std::copy_n(top.begin() + from * Kq, Kq, g.route_rows.begin() + i * Kq);
  }
  // Entry points: the best rows of training queries spread over the sample, then rows spread over the memory.
  g.entries.clear();
  const int64_t want = std::min(c.entry_points, n);
  auto add_entry = [&](int64_t row) {
    if (int64_t(g.entries.size()) < want && std::find(g.entries.begin(), g.entries.end(), row) == g.entries.end())
      g.entries.push_back(row);
  };
  for (int64_t i = 0; i < want; ++i) add_entry(top[size_t((i * m / want) * Kq)]);
  for (int64_t i = 0; i < m && int64_t(g.entries.size()) < want; ++i) add_entry(top[size_t(i * Kq)]);
  for (int64_t i = 0; i < n && int64_t(g.entries.size()) < want; ++i) add_entry(i * n / want % n), add_entry(i);
}

}  // namespace

void MemoryGraph::Impl::build(int64_t n) {
  const int64_t D = memory->head_dim();
  check(n <= int64_t(UINT32_MAX), "memory_graph rows", n, "at most 2^32 - 1 (neighbours are 32-bit row numbers)");
  // Built apart from the graphs searched now (a failure, out of memory, leaves them searchable), without a copy
  // of them: only the new graphs' fields are filled, then moved in.
  std::vector<HeadGraph> next(heads.size());
  for (int64_t h = 0; h < memory->kv_heads(); ++h)
    build_head(heads[size_t(h)].samples, next[size_t(h)], KeyRows{memory->key_data(h), memory->storage(), D}, n,
               config);
  for (size_t h = 0; h < heads.size(); ++h) {
    heads[h].rows = next[h].rows;
    heads[h].offsets = std::move(next[h].offsets);
    heads[h].edges = std::move(next[h].edges);
    heads[h].entries = std::move(next[h].entries);
    heads[h].route_width = next[h].route_width;
    heads[h].route_queries = std::move(next[h].route_queries);
    heads[h].route_rows = std::move(next[h].route_rows);
  }
  graph_rows = n;
  builds += 1;
}

MemoryGraph::MemoryGraph(const KvMemory& memory, const MemoryGraphConfig& config) : impl_(std::make_unique<Impl>()) {
  config.validate();
  impl_->memory = &memory;
  impl_->config = config;
  impl_->heads.resize(size_t(memory.kv_heads()));
}

MemoryGraph::~MemoryGraph() = default;
MemoryGraph::MemoryGraph(MemoryGraph&&) noexcept = default;
MemoryGraph& MemoryGraph::operator=(MemoryGraph&&) noexcept = default;

void MemoryGraph::add_queries(int64_t kv_head, int64_t n, const float* queries) {
  Impl& m = *impl_;
  const int64_t D = m.memory->head_dim();
  check(kv_head >= 0 && kv_head < m.memory->kv_heads(), "memory_graph.add_queries kv_head", kv_head,
        "0..kv_heads - 1 = " + std::to_string(m.memory->kv_heads() - 1));
  check(n >= 0, "memory_graph.add_queries n", n, ">= 0");
  if (n == 0) return;
  check(queries != nullptr, "memory_graph.add_queries queries", "null", "[n, D] search vectors");
  for (int64_t i = 0; i < n * D; ++i)
    check(std::isfinite(queries[i]), "memory_graph.add_queries queries[" + std::to_string(i) + "]", queries[i],
          "a finite number");
  for (int64_t i = 0; i < n; ++i) m.keep_query(kv_head, queries + i * D);
}

void MemoryGraph::add_queries(const MemoryAttentionParams& p) {
  Impl& m = *impl_;
  const int64_t D = m.memory->head_dim(), kv = m.memory->kv_heads();
  check(p.tokens >= 0, "memory_graph.add_queries tokens", p.tokens, ">= 0");
  if (p.tokens == 0) return;
  check(p.q.data != nullptr && p.q_positions != nullptr, "memory_graph.add_queries q / q_positions", "null",
        "[tokens, Hq, D] queries and [tokens] positions");
  check(p.q.heads >= kv && p.q.heads % kv == 0, "memory_graph.add_queries q heads", p.q.heads,
        "a multiple of the memory's kv heads " + std::to_string(kv));
  std::vector<float> v(static_cast<size_t>(p.tokens * p.q.heads * D));
  detail::search_vectors(*m.memory, p, v.data());
  const int64_t Hq = p.q.heads, group = Hq / kv;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t h = 0; h < Hq; ++h) add_queries(h / group, 1, v.data() + (t * Hq + h) * D);
}

int64_t MemoryGraph::training_queries(int64_t kv_head) const {
  check(kv_head >= 0 && kv_head < impl_->memory->kv_heads(), "memory_graph.training_queries kv_head", kv_head,
        "0..kv_heads - 1 = " + std::to_string(impl_->memory->kv_heads() - 1));
  return int64_t(impl_->heads[size_t(kv_head)].samples.size()) / impl_->memory->head_dim();
}

void MemoryGraph::sync() {
  Impl& m = *impl_;
  const int64_t n = m.memory->size();
  check(n >= m.covered, "memory_graph.sync memory size", n,
        ">= the rows already taken in (" + std::to_string(m.covered) + "; the memory was cleared: make a new graph)");
  m.covered = n;
  const int64_t tail = n - m.graph_rows;
  if (tail > 0 && n >= m.config.min_graph_rows && tail >= m.graph_rows) m.build(n);
}

int64_t MemoryGraph::size() const { return impl_->covered; }
int64_t MemoryGraph::graph_rows() const { return impl_->graph_rows; }
int64_t MemoryGraph::builds() const { return impl_->builds; }
const MemoryGraphConfig& MemoryGraph::config() const { return impl_->config; }

void MemoryGraph::set_search_width(int64_t search_width) {
  MemoryGraphConfig next = impl_->config;
  next.search_width = search_width;
  next.validate();
  impl_->config = next;
}

GraphView MemoryGraph::graph(int64_t kv_head) const {
  check(kv_head >= 0 && kv_head < impl_->memory->kv_heads(), "memory_graph.graph kv_head", kv_head,
        "0..kv_heads - 1 = " + std::to_string(impl_->memory->kv_heads() - 1));
  const HeadGraph& g = impl_->heads[size_t(kv_head)];
  const int64_t D = impl_->memory->head_dim();
  return {g.rows,
          g.offsets.data(),
          g.edges.data(),
          g.entries.data(),
          int64_t(g.entries.size()),
          g.route_queries.data(),
          g.route_rows.data(),
          int64_t(g.route_queries.size()) / D,
          g.route_width};
}

namespace {

// The per-thread buffers of one search.
struct Scratch {
  std::vector<uint32_t> seen;  // [G]: the query's stamp where a row was scored
  uint32_t stamp = 0;
  std::vector<ScoredRow> beam, unexpanded, routes;
  std::vector<float> row;
};

// The unexpanded rows are a heap whose front is the best (better_row reversed as the "less").
bool after(const ScoredRow& a, const ScoredRow& b) { return better_row(b, a); }

// One query of one kv head over rows [0, n): fills rows / scores [k], best first.
void search_one(const HeadGraph& g, const KeyRows& K, int64_t n, int64_t width, int64_t routes, const float* q,
                int k, int64_t* rows, float* scores, GraphSearchStats& stats, Scratch& s) {
  const int64_t D = K.D, G = g.rows;
  s.row.resize(size_t(D));
  s.beam.clear(), s.unexpanded.clear();
  const int64_t W = std::max<int64_t>(width, k);
  if (G > 0) {
    if (int64_t(s.seen.size()) < G) s.seen.assign(size_t(G), 0), s.stamp = 0;
    if (++s.stamp == 0) std::fill(s.seen.begin(), s.seen.end(), 0u), s.stamp = 1;
    // s.beam is a heap whose front is the worst kept row (better_row as the "less").
    auto offer = [&](int64_t r) {
      s.seen[size_t(r)] = s.stamp;
      const ScoredRow c{search_dot(q, K.row(r, s.row.data()), D), r};
      stats.rows_scored += 1;
      if (!keep_best(s.beam, W, c)) return;
      s.unexpanded.push_back(c);
      std::push_heap(s.unexpanded.begin(), s.unexpanded.end(), after);
    };
    // Routed entry: the `routes` routing queries most like q (by cosine), their top rows first.
    const int64_t routing = int64_t(g.route_queries.size()) / D;
    if (routing > 0) {
      s.routes.clear();
      for (int64_t i = 0; i < routing; ++i) {
        const ScoredRow c{search_dot(q, g.route_queries.data() + i * D, D), i};
        keep_best(s.routes, routes, c);
      }
      stats.rows_scored += routing;  // vectors of length D scored, as rows are
      std::sort(s.routes.begin(), s.routes.end(), better_row);
      for (const ScoredRow& r : s.routes)
        for (int64_t j = 0; j < g.route_width; ++j) {
          const int64_t row = g.route_rows[size_t(r.row * g.route_width + j)];
          if (s.seen[size_t(row)] != s.stamp) offer(row);
        }
    }
    for (const int64_t e : g.entries)
      if (s.seen[size_t(e)] != s.stamp) offer(e);
    while (!s.unexpanded.empty()) {
      const ScoredRow c = s.unexpanded.front();
      if (int64_t(s.beam.size()) == W && better_row(s.beam.front(), c)) break;  // nothing better below it
      std::pop_heap(s.unexpanded.begin(), s.unexpanded.end(), after);
      s.unexpanded.pop_back();
      // The next row to expand is likely the best left now: its neighbour list is requested while this one's rows
      // are scored (a list is a likely cache miss in a graph of many MB).
      if (!s.unexpanded.empty()) {
        const int64_t next = s.unexpanded.front().row;
        const char* list = reinterpret_cast<const char*>(g.edges.data() + g.offsets[size_t(next)]);
        const char* end = reinterpret_cast<const char*>(g.edges.data() + g.offsets[size_t(next) + 1]);
        for (; list < end; list += 64) __builtin_prefetch(list);
      }
      const uint32_t* first = g.edges.data() + g.offsets[size_t(c.row)];
      const uint32_t* last = g.edges.data() + g.offsets[size_t(c.row) + 1];
      for (const uint32_t* e = first; e != last; ++e)
        if (s.seen[size_t(*e)] != s.stamp) K.prefetch(*e);
      for (const uint32_t* e = first; e != last; ++e)
        if (s.seen[size_t(*e)] != s.stamp) offer(*e);
    }
  }
  // The tail, scanned, into the same beam (now of k at most).
  std::sort(s.beam.begin(), s.beam.end(), better_row);
  if (int64_t(s.beam.size()) > k) s.beam.resize(size_t(k));
  std::make_heap(s.beam.begin(), s.beam.end(), better_row);
  for (int64_t r = G; r < n; ++r) {
    const ScoredRow c{search_dot(q, K.row(r, s.row.data()), D), r};
    keep_best(s.beam, k, c);
  }
  stats.rows_scored += n - G;
  stats.queries += 1;
  std::sort(s.beam.begin(), s.beam.end(), better_row);
  for (int i = 0; i < k; ++i) {
    const bool found = i < int(s.beam.size());
    rows[i] = found ? s.beam[size_t(i)].row : -1;
    scores[i] = found ? s.beam[size_t(i)].score : -std::numeric_limits<float>::infinity();
  }
}

// Searches `count` (kv head, query) pairs in parallel: head_of(i), query i at queries + i * D, outputs at i * k.
template <typename HeadOf>
void search_many(const KvMemory& memory, const std::vector<HeadGraph>& heads, int64_t n, int64_t width,
                 int64_t routes, int64_t count, HeadOf head_of, const float* queries, int k, int64_t* rows,
                 float* scores, GraphSearchStats* stats, int threads) {
  const int64_t D = memory.head_dim();
  detail::search_in_parallel<Scratch>(count, threads, stats, [&](int64_t i, GraphSearchStats& mine, Scratch& s) {
    const int64_t h = head_of(i);
    search_one(heads[size_t(h)], KeyRows{memory.key_data(h), memory.storage(), D}, n, width, routes,
               queries + i * D, k, rows + i * k, scores + i * k, mine, s);
  });
}

}  // namespace

void MemoryGraph::search(int64_t kv_head, int64_t n, const float* queries, int k, int64_t* rows, float* scores,
                         GraphSearchStats* stats, int threads) const {
  const Impl& m = *impl_;
  detail::check_search_call(*m.memory, "memory_graph", "rows taken in", m.covered, kv_head, n, queries, k, rows,
                            scores, threads);
  if (n == 0) return;
  search_many(*m.memory, m.heads, m.covered, m.config.search_width, m.config.routes, n,
              [kv_head](int64_t) { return kv_head; }, queries, k, rows, scores, stats, threads);
}

void MemoryGraph::candidates(const MemoryAttentionParams& p, int64_t* out, GraphSearchStats* stats) const {
  const Impl& m = *impl_;
  validate_memory_attention(*m.memory, p);
  detail::check_searchable(*m.memory, "memory_graph", "rows taken in", m.covered, p.top_k);
  check(out != nullptr || p.tokens == 0, "memory_graph.candidates out", "null", "[tokens, Hq, top_k] rows");
  const int64_t D = m.memory->head_dim(), Hq = p.q.heads, group = Hq / m.memory->kv_heads(), k = p.top_k;
  const int64_t count = p.tokens * Hq;
  std::vector<float> queries(size_t(count * D)), scores(size_t(count * k));
  detail::search_vectors(*m.memory, p, queries.data());
  search_many(*m.memory, m.heads, m.covered, m.config.search_width, m.config.routes, count,
              [Hq, group](int64_t i) { return (i % Hq) / group; }, queries.data(), p.top_k, out, scores.data(),
              stats, p.threads);
}

}  // namespace rotary
