// lab/memory/memory_index.cpp
#include "memory/memory_index.h"

#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVFFlat.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "rotary/error.h"
#include "rotary/memory_graph.h"
#include "rotary/memory_pages.h"
#include "rotary/parse_number.h"

namespace rotary::lab {

void MemoryIndexConfig::validate() const {
  check(std::find(std::begin(kMemoryIndexKinds), std::end(kMemoryIndexKinds), kind) != std::end(kMemoryIndexKinds),
        "memory_index.kind", kind, "flat, hnsw, ivf, pages, kdtree or graph");
  check(hnsw_m >= 4 && hnsw_m <= 256, "memory_index.hnsw_m", hnsw_m, "4..256");
  check(hnsw_ef_construction >= 8 && hnsw_ef_construction <= 4096, "memory_index.hnsw_ef_construction",
        hnsw_ef_construction, "8..4096");
  check(hnsw_ef_search >= 1 && hnsw_ef_search <= 65536, "memory_index.hnsw_ef_search", hnsw_ef_search, "1..65536");
  check(ivf_lists >= 0 && ivf_lists <= (1 << 20), "memory_index.ivf_lists", ivf_lists, "0 (automatic) or 1..2^20");
  check(ivf_nprobe >= 1 && ivf_nprobe <= (1 << 20), "memory_index.ivf_nprobe", ivf_nprobe, "1..2^20");
  check(pages_page_size >= 1 && pages_page_size <= 65536, "memory_index.pages_page_size", pages_page_size, "1..65536");
  check(pages_read >= 0, "memory_index.pages_read", pages_read, ">= 0 (0: certified exact)");
  check(graph_width >= 1 && graph_width <= (1 << 20), "memory_index.graph_width", graph_width, "1..2^20");
  check(graph_degree >= 1 && graph_degree <= 1024, "memory_index.graph_degree", graph_degree, "1..1024");
  check(graph_training_queries >= 1 && graph_training_queries <= (1 << 20), "memory_index.graph_training_queries",
        graph_training_queries, "1..2^20");
}

MemoryGraphConfig MemoryIndexConfig::graph_config() const {
  MemoryGraphConfig c;
  c.search_width = graph_width, c.degree = graph_degree, c.training_queries = graph_training_queries;
  return c;
}

MemoryIndexConfig memory_index_from_name(const std::string& name, std::string_view field) {
  const std::string allowed =
      "flat, hnsw, ivf, pages or kdtree (certified exact), pages<P> or kdtree<P> (P pages read per query, 1..2^30), "
      "graph or graph<W> (search width W, 1..2^20)";
  MemoryIndexConfig c;
  for (const std::string kind : {"pages", "kdtree", "graph"}) {
    if (name.rfind(kind, 0) != 0 || name.size() == kind.size()) continue;
    const std::optional<int64_t> effort =
        read_integer(std::string_view(name).substr(kind.size()), 1, kind == "graph" ? (1LL << 20) : (1LL << 30));
    check(effort.has_value(), field, name, allowed);
    c.kind = kind;
    (kind == "graph" ? c.graph_width : c.pages_read) = int(*effort);
    return c;
  }
  check(std::find(std::begin(kMemoryIndexKinds), std::end(kMemoryIndexKinds), name) != std::end(kMemoryIndexKinds),
        field, name, allowed);
  c.kind = name;
  return c;
}

namespace {
// Rows [first, first + n) of kv head h's keys as fp32, which FAISS takes: the memory's own block when it is f32,
// a widened copy (in `copy`) when it is half precision.
const float* f32_key_rows(const KvMemory& memory, int64_t h, int64_t first, int64_t n, std::vector<float>& copy) {
  if (memory.storage() == DType::F32) return memory.keys(h) + first * memory.head_dim();
  copy.resize(size_t(n * memory.head_dim()));
  memory.key_rows(h, first, n, copy.data());
  return copy.data();
}

// A page search's stats as SearchWork: its bounds count two vectors each.
void add_page_work(const PageSearchStats& stats, int64_t rows, SearchWork& work) {
  work.queries += stats.queries;
  work.scan_vectors += double(stats.queries) * double(rows);
  work.vectors += 2.0 * double(stats.bounds) + double(stats.rows_scored);
}
void add_graph_work(const GraphSearchStats& stats, int64_t rows, SearchWork& work) {
  work.queries += stats.queries;
  work.scan_vectors += double(stats.queries) * double(rows);
  work.vectors += double(stats.rows_scored);
}
}  // namespace

struct MemoryIndex::Impl {
  const KvMemory* memory = nullptr;
  MemoryIndexConfig config;
  std::vector<std::unique_ptr<faiss::IndexFlatIP>> quantizers;  // ivf: the coarse quantizer of each index
  std::vector<std::unique_ptr<faiss::Index>> indexes;           // per kv head
  std::unique_ptr<MemoryPages> pages;                           // kind pages: every kv head
  std::unique_ptr<MemoryGraph> graph;                           // kind graph: every kv head
  int64_t indexed = 0;
  SearchWork work;

  std::unique_ptr<faiss::Index> make(int64_t head, int64_t rows) {
    const int D = memory->head_dim();
    if (config.kind == "flat") return std::make_unique<faiss::IndexFlatIP>(D);
    if (config.kind == "hnsw") {
      auto h = std::make_unique<faiss::IndexHNSWFlat>(D, config.hnsw_m, faiss::METRIC_INNER_PRODUCT);
      h->hnsw.efConstruction = config.hnsw_ef_construction;
      h->hnsw.efSearch = config.hnsw_ef_search;
      return h;
    }
    // ivf: lists trained on the rows there are.
    int lists = config.ivf_lists;
    if (lists == 0) lists = int(std::clamp<int64_t>(int64_t(4 * std::sqrt(double(rows))), 1, std::max<int64_t>(1, rows / 39)));
    check(rows >= lists, "memory_index.ivf_lists", lists,
          "at most the rows present at the first sync (" + std::to_string(rows) + ")");
    quantizers[size_t(head)] = std::make_unique<faiss::IndexFlatIP>(D);
    auto ivf = std::make_unique<faiss::IndexIVFFlat>(quantizers[size_t(head)].get(), D, size_t(lists),
                                                     faiss::METRIC_INNER_PRODUCT);
    ivf->cp.seed = 1234;  // the same lists on every run
    std::vector<float> copy;
    ivf->train(rows, f32_key_rows(*memory, head, 0, rows, copy));
    ivf->nprobe = size_t(std::min(config.ivf_nprobe, lists));
    return ivf;
  }
};

MemoryIndex::MemoryIndex(const KvMemory& memory, const MemoryIndexConfig& config) : impl_(std::make_unique<Impl>()) {
  config.validate();
  impl_->memory = &memory;
  impl_->config = config;
  impl_->indexes.resize(size_t(memory.kv_heads()));
  impl_->quantizers.resize(size_t(memory.kv_heads()));
  if (config.kind == "pages" || config.kind == "kdtree")
    impl_->pages = std::make_unique<MemoryPages>(
        memory, MemoryPagesConfig{config.pages_page_size, config.pages_read,
                                  config.kind == "pages" ? PageGrouping::Tokens : PageGrouping::Keys});
  if (config.kind == "graph") impl_->graph = std::make_unique<MemoryGraph>(memory, config.graph_config());
}

MemoryIndex::~MemoryIndex() = default;
MemoryIndex::MemoryIndex(MemoryIndex&&) noexcept = default;
MemoryIndex& MemoryIndex::operator=(MemoryIndex&&) noexcept = default;

void MemoryIndex::sync() {
  Impl& m = *impl_;
  const int64_t n = m.memory->size();
  check(n >= m.indexed, "memory_index.sync memory size", n,
        ">= the rows already indexed (" + std::to_string(m.indexed) + "; the memory was cleared: make a new index)");
  if (n == m.indexed) return;
  if (m.pages || m.graph) {
    m.pages ? m.pages->sync() : m.graph->sync();
    m.indexed = n;
    return;
  }
  for (int64_t h = 0; h < m.memory->kv_heads(); ++h) {
    if (!m.indexes[size_t(h)]) m.indexes[size_t(h)] = m.make(h, n);
    std::vector<float> copy;
    m.indexes[size_t(h)]->add(n - m.indexed, f32_key_rows(*m.memory, h, m.indexed, n - m.indexed, copy));
  }
  m.indexed = n;
}

void MemoryIndex::save(const std::string& path) const {
  check(impl_->pages != nullptr || impl_->graph != nullptr, "memory_index.kind", impl_->config.kind,
        "pages, kdtree (a page index) or graph to save");
  if (impl_->pages) impl_->pages->save(path);
  if (impl_->graph) impl_->graph->save(path);
}

MemoryIndex MemoryIndex::open(const std::string& path, const KvMemory& memory, const MemoryIndexConfig& config) {
  MemoryIndex index(memory, config);  // validates the config
  Impl& m = *index.impl_;
  check(m.pages != nullptr || m.graph != nullptr, "memory_index.kind", config.kind,
        "pages, kdtree (a page index) or graph to open");
  if (m.pages) m.pages = std::make_unique<MemoryPages>(MemoryPages::open(path, memory, m.pages->config()));
  if (m.graph) m.graph = std::make_unique<MemoryGraph>(MemoryGraph::open(path, memory, m.graph->config()));
  m.indexed = memory.size();
  return index;
}

void MemoryIndex::add_queries(const MemoryAttentionParams& p) {
  if (impl_->graph) impl_->graph->add_queries(p);
}

int64_t MemoryIndex::size() const { return impl_->indexed; }

void MemoryIndex::set_search_effort(const SearchEffort& effort) {
  MemoryIndexConfig next = impl_->config;
  next.hnsw_ef_search = effort.hnsw_ef_search, next.ivf_nprobe = effort.ivf_nprobe;
  next.pages_read = effort.pages_read, next.graph_width = effort.graph_width;
  next.validate();
  impl_->config = next;
  for (const auto& index : impl_->indexes) {  // heads not built yet take the values from config when they are
    if (auto* h = dynamic_cast<faiss::IndexHNSWFlat*>(index.get())) h->hnsw.efSearch = effort.hnsw_ef_search;
    if (auto* ivf = dynamic_cast<faiss::IndexIVFFlat*>(index.get()))
      ivf->nprobe = std::min<size_t>(size_t(effort.ivf_nprobe), ivf->nlist);
  }
  if (impl_->pages) impl_->pages->set_pages_read(effort.pages_read);
  if (impl_->graph) impl_->graph->set_search_width(effort.graph_width);
}
const MemoryIndexConfig& MemoryIndex::config() const { return impl_->config; }
const SearchWork& MemoryIndex::work() const { return impl_->work; }
void MemoryIndex::reset_work() { impl_->work = {}; }

void MemoryIndex::search(int64_t kv_head, int64_t n, const float* queries, int k, int64_t* rows, float* scores) const {
  Impl& m = *impl_;  // (the work counters change: a const search still counts)
  check(kv_head >= 0 && kv_head < m.memory->kv_heads(), "memory_index.search kv_head", kv_head,
        "0..kv_heads - 1 = " + std::to_string(m.memory->kv_heads() - 1));
  check(m.indexed > 0, "memory_index.search rows indexed", m.indexed, "> 0 (sync after appending)");
  check(k >= 1 && k <= m.indexed, "memory_index.search k", k, "1..the rows indexed " + std::to_string(m.indexed));
  // Work is counted from FAISS's global counters around this call (one search at a time per index, as here).
  SearchWork& work = m.work;
  if (m.pages) {
    PageSearchStats stats;
    m.pages->search(kv_head, n, queries, k, rows, scores, &stats);
    add_page_work(stats, m.indexed, work);
    return;
  }
  if (m.graph) {
    GraphSearchStats stats;
    m.graph->search(kv_head, n, queries, k, rows, scores, &stats);
    add_graph_work(stats, m.indexed, work);
    return;
  }
  work.queries += n;
  work.scan_vectors += double(n) * double(m.indexed);
  const size_t ivf_before = faiss::indexIVF_stats.ndis;
  std::vector<faiss::Index::idx_t> ids(size_t(n) * size_t(k));
  m.indexes[size_t(kv_head)]->search(n, queries, k, scores, ids.data());
  for (size_t i = 0; i < ids.size(); ++i) rows[i] = int64_t(ids[i]);
  if (m.config.kind == "flat") work.vectors += double(n) * double(m.indexed);
  // Debian's FAISS 1.7.3 leaves hnsw_stats at 0 through IndexHNSW::search: HNSW's work is not known.
  if (m.config.kind == "hnsw") work.vectors = std::nan("");
  if (auto* ivf = dynamic_cast<faiss::IndexIVFFlat*>(m.indexes[size_t(kv_head)].get()))  // the lists + the centroids
    work.vectors += double(faiss::indexIVF_stats.ndis - ivf_before) + double(n) * double(ivf->nlist);
}

void MemoryIndex::candidates(const MemoryAttentionParams& p, int64_t* out) const {
  Impl& m = *impl_;
  validate_memory_attention(*m.memory, p);
  check(m.indexed == m.memory->size(), "memory_index rows indexed", m.indexed,
        "the memory's size " + std::to_string(m.memory->size()) + " (sync after appending)");
  if (m.pages) {  // every (token, query head) in one parallel search
    PageSearchStats stats;
    m.pages->candidates(p, out, &stats);
    add_page_work(stats, m.indexed, m.work);
    return;
  }
  if (m.graph) {
    GraphSearchStats stats;
    m.graph->candidates(p, out, &stats);
    add_graph_work(stats, m.indexed, m.work);
    return;
  }
  const int D = m.memory->head_dim();
  const int64_t Hq = p.q.heads, group = Hq / m.memory->kv_heads();
  // One batched search per kv head: every (token, query head of its group).
  for (int64_t g = 0; g < m.memory->kv_heads(); ++g) {
    const int64_t n = p.tokens * group;
    std::vector<float> queries(size_t(n) * size_t(D)), scores(size_t(n) * size_t(p.top_k));
    std::vector<int64_t> rows(size_t(n) * size_t(p.top_k));
    for (int64_t t = 0; t < p.tokens; ++t)
      for (int64_t j = 0; j < group; ++j) {
        const int64_t h = g * group + j;
        const float* q = static_cast<const float*>(p.q.data) + t * p.q.token_stride + h * p.q.head_stride;
        m.memory->search_query(q, p.q_positions[t], p.softmax_scale, queries.data() + (t * group + j) * D,
                               p.query_origin);
      }
    search(g, n, queries.data(), p.top_k, rows.data(), scores.data());
    for (int64_t t = 0; t < p.tokens; ++t)
      for (int64_t j = 0; j < group; ++j)
        std::copy_n(rows.data() + (t * group + j) * p.top_k, p.top_k, out + (t * Hq + g * group + j) * p.top_k);
  }
}

}  // namespace rotary::lab
