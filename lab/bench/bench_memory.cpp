// `rotary bench memory`: one decode step of retrieval-memory attention (rotary/kv_memory.h) against the memory's
// size, with the core's exact scan and with FAISS indexes proposing the candidates (lab/memory/memory_index.h).
// Issue 9's goal: flat retrieval with k = 32 at 1M memory tokens per head, its decode-step latency reported, and
// an approximate index >= 10x faster than it at recall@32 >= 0.95.
//
// For each memory size N a fresh KvMemory of N tokens (positions 0..N-1) is filled and every index is built over
// it; then `--queries` decode steps (one query token at position N, all Hq query heads, GQA over Hkv kv heads)
// run through every method in turn (round robin, so a slow stretch of a shared machine hits all of them alike):
//   exact          memory_attention with no candidates: the core's flat scan of every row (the baseline)
//   flat           MemoryIndex flat (faiss::IndexFlatIP) proposes top_k rows, memory_attention scores them
//   hnsw_ef<E>     MemoryIndex hnsw with ef_search E (one graph for every E: set_search_effort between steps)
//   ivf_nprobe<P>  MemoryIndex ivf with nprobe P (one set of k-means lists for every P)
//   pages<P>       MemoryIndex pages (the core's page search, rotary/memory_pages.h: pages of consecutive
//                  tokens) reading P pages of --page-size rows per query; pages0 is its certified exact mode (one
//                  grouping for every P)
//   kdtree<P>      MemoryIndex kdtree: the same search over pages grouped by a k-d split of the keys
//   graph_w<W>     MemoryIndex graph (the core's query-routed graph, rotary/memory_graph.h) walked keeping the
//                  best W rows (one graph for every W), learnt from --graph-training-queries queries per kv head
//                  drawn like the timed ones (the prefill's queries of a model; not the timed queries themselves)
// A step's time is the whole call: candidates() (search vectors through the policy, the index search) plus
// memory_attention (exact scores of the candidates, softmax, merge). Recall@k: the share of the exact top-k rows
// (the exact method's retrieved rows of every query head) that a method retrieved. Speed claims are ratios against
// the exact scan measured in the same run. Scored: the vectors of length D a method scored per query (FAISS's
// distance counters; a page bound counts two), as a share of the exact scan's N.
//
// Bytes: the memory's own per token (keys and values fp32 per kv head, one int64 position) from its layout; an
// index's bytes are the growth of the process's resident set while it is built (after malloc_trim on both sides:
// FAISS does not report the size of an HNSW graph, and MemoryIndex does not expose its FAISS index).
//
// Keys: `gaussian` (every coordinate N(0, 1): no structure, the worst case for graphs and k-means lists) or
// `clustered` (a mixture of --clusters gaussians, centres N(0, 1), spread --cluster-spread around them, 0.5 by
// default: closer to a trained model's keys, which bunch by token and role; a small spread makes keys that nearly
// repeat, as a trained model's do). Queries are drawn from the same distribution as the keys.
//
// --mapped DIR: the memory and each page index (pages, kdtree) are saved in DIR (KvMemory::save, MemoryIndex::save)
// and the steps run over them mapped from their files (KvMemory::open, MemoryIndex::open); a later run with the
// same settings opens them instead of building them, so under a memory limit smaller than the memory (a cgroup)
// the searches read it from disk block by block. Each row then also counts the major page faults per step.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/command.h"
#include "common/files.h"
#include "common/machine.h"
#include "common/plots.h"
#include "memory/memory_index.h"
#include "rotary/error.h"
#include "rotary/kv_memory.h"
#include "rotary/rope_spec.h"

namespace rotary::cli {
namespace {

// Tokens per kv head at most: 4M rows of fp32 keys and values at D = 64 are 2.1 GB before any index (an HNSW
// graph at M = 32 adds about as much again), so the bound keeps a run inside an ordinary machine's memory.
constexpr int64_t kMaxMemoryRows = int64_t{4} << 20;
constexpr int64_t kMinMemoryTokens = 64;
constexpr int kMaxTopK = 4096;
constexpr int kMaxHeadDim = 256;
constexpr int64_t kMaxKvHeads = 8;
constexpr int kWarmupSteps = 2;  // untimed steps per method before the timed ones (page faults, FAISS's buffers)

struct BenchMemoryArgs {
  std::string sizes = "16k,64k,256k,1M";
  int head_dim = 64;
  int64_t kv_heads = 1;
  int64_t q_heads = 4;
  int top_k = 32;
  int queries = 200;
  int threads = 0;
  std::string keys = "gaussian";
  int clusters = 256;
  double cluster_spread = 0.5;
  std::string policy = "exact";
  std::string indexes = "flat,hnsw,ivf";
  std::string ef_search = "128";
  int hnsw_m = 32;
  int ef_construction = 64;
  std::string nprobe = "16";
  int ivf_lists = 0;
  std::string pages_read = "0,16,64";
  std::string graph_widths = "64,128,256";
  int graph_training_queries = 16384;
  std::string memory_dtype = "f32";
  int page_size = 32;
  uint64_t seed = 1;
  bool json = false;
  std::string out;
  std::string mapped;  // --mapped DIR: the memory and page indexes saved there and used mapped from their files
};

// "16k" = 16384, "1M" = 1048576, "5000" = 5000: sizes as people write them.
std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> out;
  const std::string allowed = "a comma-separated list of token counts in [" + std::to_string(kMinMemoryTokens) +
                              ", 4M = " + std::to_string(kMaxMemoryRows) +
                              "] (suffix k = 1024, M = 1048576), each once";
  for (std::string item : parse_name_list(text, "--sizes")) {
    int64_t scale = 1;
    if (item.back() == 'k' || item.back() == 'K') scale = 1024, item.pop_back();
    else if (item.back() == 'M') scale = 1 << 20, item.pop_back();
    int64_t n = 0;
    try {
      n = parse_integer(item, "--sizes", 1, kMaxMemoryRows) * scale;
    } catch (const Error&) {
      fail("--sizes", text, allowed);
    }
    check(n >= kMinMemoryTokens && n <= kMaxMemoryRows, "--sizes", text, allowed);
    check(std::find(out.begin(), out.end(), n) == out.end(), "--sizes", text, allowed);
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Keys (and queries) of one distribution: gaussian, or a mixture of gaussians around fixed centres.
class VectorSource {
 public:
  VectorSource(const std::string& kind, int clusters, float spread, int dim, uint64_t seed)
      : clustered_(kind == "clustered"), dim_(dim), spread_(spread) {
    if (!clustered_) return;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    centres_.resize(size_t(clusters) * size_t(dim));
    for (float& x : centres_) x = normal(rng);
  }
  // One vector of dim_ floats into out.
  void draw(std::mt19937_64& rng, float* out) {
    if (!clustered_) {
      for (int d = 0; d < dim_; ++d) out[d] = normal_(rng);
      return;
    }
    const int64_t clusters = int64_t(centres_.size()) / dim_;
    const float* centre = centres_.data() + std::uniform_int_distribution<int64_t>(0, clusters - 1)(rng) * dim_;
    for (int d = 0; d < dim_; ++d) out[d] = centre[d] + spread_ * normal_(rng);
  }

 private:
  bool clustered_;
  int dim_;
  float spread_;
  std::vector<float> centres_;
  std::normal_distribution<float> normal_;
};

struct Method {
  std::string name;                        // exact, flat, hnsw_ef128, ivf_nprobe16, pages16, kdtree0
  std::string kind;                        // exact | flat | hnsw | ivf | pages | kdtree | graph
  int ef_search = 0, nprobe = 0, pages_read = -1, graph_width = 0;
  double scored = 0;                       // vectors scored over the timed steps, as a share of the exact scan's
  std::shared_ptr<lab::MemoryIndex> index;  // null: the core's exact scan; one per kind, shared
  double build_s = 0;
  int64_t index_bytes = 0;                 // resident-set growth while building
  std::vector<double> seconds;             // per timed step
  int64_t found = 0, wanted = 0;           // exact top-k rows retrieved / asked for
  int64_t major_faults = 0;                // over the timed steps (pages read from disk, --mapped)
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[size_t(q * double(v.size() - 1) + 0.5)];
}

struct Row {
  std::string keys, method, kind;
  int64_t tokens = 0;
  int ef_search = 0, nprobe = 0, pages_read = -1, graph_width = 0;
  double build_s = 0, median_ms = 0, p90_ms = 0, min_ms = 0, speedup_vs_exact = 0, recall = 0, scored = 1;
  int64_t index_bytes = 0;
  double major_faults_per_step = 0;
};

// Appends n tokens (positions 0..n-1) of `source`'s keys and uniform values to `memory`, in chunks so the staging
// buffers stay small beside a multi-GB memory.
void fill_memory(KvMemory& memory, const BenchMemoryArgs& a, int64_t n, VectorSource& source) {
  const int D = a.head_dim;
  const int64_t Hkv = a.kv_heads;
  std::mt19937_64 rng(a.seed * 1000003 + uint64_t(n));
  std::uniform_real_distribution<float> uniform(-1, 1);
  const int64_t chunk = 65536;
  std::vector<float> k, v;
  std::vector<int64_t> positions;
  for (int64_t from = 0; from < n; from += chunk) {
    const int64_t rows = std::min(chunk, n - from);
    k.resize(size_t(rows * Hkv * D)), v.resize(k.size()), positions.resize(size_t(rows));
    for (int64_t r = 0; r < rows * Hkv; ++r) source.draw(rng, k.data() + r * D);
    for (float& x : v) x = uniform(rng);
    for (int64_t r = 0; r < rows; ++r) positions[size_t(r)] = from + r;
    memory.append(rows, {k.data(), Hkv, Hkv * D, D}, {v.data(), Hkv, Hkv * D, D}, positions.data());
  }
}

// --mapped: the path (without extension) of the files of a memory of n tokens, named by every setting that makes
// their bytes; "" without --mapped.
std::string mapped_stem(const BenchMemoryArgs& a, const std::string& keys, int64_t n) {
  return a.mapped.empty() ? std::string()
                          : lab::join_path(a.mapped, fmt::format("{}_{}x{}x{}_{}_{}_c{}s{}_seed{}", keys, n, a.kv_heads,
                                                                 a.head_dim, a.policy, a.memory_dtype, a.clusters,
                                                                 a.cluster_spread, a.seed));
}

// The memory the steps read: filled in memory, or (a stem: --mapped) opened from <stem>.mem, which is filled and
// saved first when it is absent or unreadable. The file's fingerprint is the hash of its name, so a file of other
// settings is never taken for this one.
std::unique_ptr<KvMemory> open_or_fill_memory(const BenchMemoryArgs& a, int64_t n, const KvMemoryConfig& config,
                                              VectorSource& source, const std::string& stem) {
  std::unique_ptr<KvMemory> held;
  if (stem.empty()) {
    held = std::make_unique<KvMemory>(config);
    fill_memory(*held, a, n, source);
    return held;
  }
  const uint64_t fingerprint = lab::fnv1a64(std::filesystem::path(stem).filename().string());
  const std::string path = stem + ".mem";
  if (std::filesystem::exists(path)) {
    try {
      held = std::make_unique<KvMemory>(KvMemory::open(path, config, fingerprint));
    } catch (const Error& e) {
      std::fprintf(stderr, "bench memory: %s: rebuilding (%s)\n", path.c_str(), e.what());
    }
  }
  if (!held) {
    KvMemory built(config);
    fill_memory(built, a, n, source);
    built.save(path, fingerprint);
    held = std::make_unique<KvMemory>(KvMemory::open(path, config, fingerprint));
  }
  return held;
}

// The methods --indexes and their search efforts ask for, after the exact scan.
std::vector<Method> methods_of(const BenchMemoryArgs& a) {
  std::vector<Method> methods(1);
  methods[0].name = methods[0].kind = "exact";  // first: each round's truth for the others' recall
  auto add = [&](std::string name, const char* kind, int ef_search, int nprobe, int pages_read = -1,
                 int graph_width = 0) {
    Method& m = methods.emplace_back();
    m.name = std::move(name), m.kind = kind, m.ef_search = ef_search, m.nprobe = nprobe, m.pages_read = pages_read;
    m.graph_width = graph_width;
  };
  for (const std::string& kind : parse_name_list(a.indexes, "--indexes")) {
    if (kind == "flat") add("flat", "flat", 0, 0);
    if (kind == "hnsw")
      for (int64_t ef : parse_integer_list(a.ef_search, "--ef-search", 1, 65536))
        add("hnsw_ef" + std::to_string(ef), "hnsw", int(ef), 0);
    if (kind == "ivf")
      for (int64_t nprobe : parse_integer_list(a.nprobe, "--nprobe", 1, 65536))
        add("ivf_nprobe" + std::to_string(nprobe), "ivf", 0, int(nprobe));
    if (kind == "pages" || kind == "kdtree")
      for (int64_t pages : parse_integer_list(a.pages_read, "--pages-read", 0, 1 << 30))
        add(kind + std::to_string(pages), kind == "pages" ? "pages" : "kdtree", 0, 0, int(pages));
    if (kind == "graph")
      for (int64_t width : parse_integer_list(a.graph_widths, "--graph-widths", 1, 1 << 20))
        add("graph_w" + std::to_string(width), "graph", 0, 0, -1, int(width));
  }
  return methods;
}

// The graph's training queries: as a model's prefill gives them, queries of the step's distribution at the step's
// position (through the memory's policy, as MemoryIndex::add_queries takes them), enough for the sample of every
// kv head, from their own seed: never the timed queries.
void learn_queries(lab::MemoryIndex& index, const BenchMemoryArgs& a, int64_t n, VectorSource& source) {
  const int D = a.head_dim;
  const int64_t Hq = a.q_heads;
  const int64_t group = Hq / a.kv_heads, tokens = (a.graph_training_queries + group - 1) / group;
  std::mt19937_64 rng(a.seed * 104729 + uint64_t(n));
  std::vector<float> tq(size_t(tokens * Hq * D));
  for (int64_t r = 0; r < tokens * Hq; ++r) source.draw(rng, tq.data() + r * D);
  const std::vector<int64_t> positions(size_t(tokens), n);
  MemoryAttentionParams tp;
  tp.tokens = tokens;
  tp.q = {tq.data(), Hq, Hq * D, D};
  tp.q_positions = positions.data();
  index.add_queries(tp);
}

// Builds the index of every method but the exact scan, with its build time and resident-set growth. One index per
// kind, shared by its methods: set_search_effort switches ef_search / nprobe / the graph's width between steps.
// With a stem (--mapped) a page index is opened from its file, built and saved first when it is absent.
void build_indexes(std::vector<Method>& methods, const BenchMemoryArgs& a, const std::string& keys, int64_t n,
                   const KvMemory& memory, VectorSource& source, const std::string& stem) {
  using clock = std::chrono::steady_clock;
  for (size_t i = 1; i < methods.size(); ++i) {
    Method& m = methods[i];
    const auto built = std::find_if(methods.begin() + 1, methods.begin() + std::ptrdiff_t(i),
                                    [&](const Method& o) { return o.kind == m.kind; });
    if (built != methods.begin() + std::ptrdiff_t(i)) {
      m.index = built->index, m.build_s = built->build_s, m.index_bytes = built->index_bytes;
      continue;
    }
    lab::MemoryIndexConfig ic;
    ic.kind = m.kind;
    ic.hnsw_m = a.hnsw_m;
    ic.hnsw_ef_construction = a.ef_construction;
    ic.ivf_lists = a.ivf_lists;
    ic.pages_page_size = a.page_size;
    ic.graph_training_queries = a.graph_training_queries;
    std::fprintf(stderr, "bench memory: %s keys, %lld tokens: building %s ...", keys.c_str(), (long long)n,
                 m.kind.c_str());
    std::fflush(stderr);
    const int64_t rss_before = lab::resident_bytes();
    const auto t0 = clock::now();
    const bool paged = !stem.empty() && (m.kind == "pages" || m.kind == "kdtree");
    const std::string index_path = stem + "_" + m.kind + std::to_string(a.page_size) + ".pages";
    if (paged && std::filesystem::exists(index_path)) {
      try {
        m.index = std::make_shared<lab::MemoryIndex>(lab::MemoryIndex::open(index_path, memory, ic));
      } catch (const Error& e) {
        std::fprintf(stderr, " rebuilding (%s) ...", e.what());
      }
    }
    if (!m.index) {
      m.index = std::make_shared<lab::MemoryIndex>(memory, ic);
      if (m.kind == "graph") learn_queries(*m.index, a, n, source);
      m.index->sync();
      if (paged) {
        m.index->save(index_path);
        m.index = std::make_shared<lab::MemoryIndex>(lab::MemoryIndex::open(index_path, memory, ic));
      }
    }
    m.build_s = std::chrono::duration<double>(clock::now() - t0).count();
    m.index_bytes = lab::resident_bytes() - rss_before;
    std::fprintf(stderr, " %.1f s\n", m.build_s);
  }
}

// One decode step over the memory: the query of every query head (one token at position n, no local window) and
// the memory's top-k rows through a method. Its buffers are pointed at by the call's parameters: not copied.
class DecodeStep {
 public:
  DecodeStep(const BenchMemoryArgs& a, int64_t n, int threads)
      : q_(size_t(a.q_heads * a.head_dim)), o_(q_.size()), lse_(static_cast<size_t>(a.q_heads)),
        candidates_(size_t(a.q_heads * a.top_k)), retrieved_(candidates_.size()), q_position_(n) {
    const int64_t Hq = a.q_heads, D = a.head_dim;
    p_.tokens = 1;
    p_.q = {q_.data(), Hq, Hq * D, D};
    p_.q_positions = &q_position_;
    p_.top_k = a.top_k;
    p_.o = {o_.data(), Hq, Hq * D, D};
    p_.lse = lse_.data();
    p_.retrieved = retrieved_.data();
    p_.threads = threads;
  }
  DecodeStep(const DecodeStep&) = delete;
  DecodeStep& operator=(const DecodeStep&) = delete;

  float* query() { return q_.data(); }
  // The rows the last step retrieved, top_k per query head.
  const std::vector<int64_t>& retrieved() const { return retrieved_; }

  // The seconds of one step through `m` (candidates, then memory_attention); adds its scored share to m.scored.
  double run(Method& m, const KvMemory& memory) {
    std::fill(lse_.begin(), lse_.end(), -std::numeric_limits<float>::infinity());  // no local window: memory alone
    const auto t0 = std::chrono::steady_clock::now();
    if (m.index) {
      const lab::SearchEffort defaults;
      m.index->set_search_effort({m.ef_search > 0 ? m.ef_search : defaults.hnsw_ef_search,
                                  m.nprobe > 0 ? m.nprobe : defaults.ivf_nprobe,
                                  m.pages_read >= 0 ? m.pages_read : defaults.pages_read,
                                  m.graph_width > 0 ? m.graph_width : defaults.graph_width});
      m.index->reset_work();
      m.index->candidates(p_, candidates_.data());
      m.scored += m.index->work().share_of_scan();
      p_.candidates = candidates_.data();
    } else {
      p_.candidates = nullptr;
      m.scored += 1;
    }
    memory_attention(memory, p_);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  std::vector<float> q_, o_, lse_;
  std::vector<int64_t> candidates_, retrieved_;
  int64_t q_position_;
  MemoryAttentionParams p_;
};

// The timed decode steps: after kWarmupSteps untimed rounds, `queries` rounds of one fresh query through every
// method in turn (round robin, so a slow stretch of a shared machine hits all of them alike), each method's
// seconds, major faults, scored share and recall of the exact scan's rows of the same round.
void time_steps(std::vector<Method>& methods, const BenchMemoryArgs& a, int64_t n, const KvMemory& memory,
                VectorSource& source, int threads) {
  const int D = a.head_dim;
  const int64_t Hq = a.q_heads;
  DecodeStep step(a, n, threads);
  std::vector<int64_t> exact_rows(step.retrieved().size());
  std::mt19937_64 query_rng(a.seed * 7919 + uint64_t(n));
  auto draw_query = [&] {
    for (int64_t h = 0; h < Hq; ++h) source.draw(query_rng, step.query() + h * D);
  };
  for (int w = 0; w < kWarmupSteps; ++w) {
    draw_query();
    for (Method& m : methods) step.run(m, memory);
  }
  for (Method& m : methods) m.scored = 0;  // the work of the timed steps only
  // methods[0] is the exact scan: each round it runs first, and its rows are the truth the others are scored on.
  for (int s = 0; s < a.queries; ++s) {
    draw_query();
    for (Method& m : methods) {
      const int64_t faults = lab::major_faults();
      m.seconds.push_back(step.run(m, memory));
      m.major_faults += lab::major_faults() - faults;
      const std::vector<int64_t>& retrieved = step.retrieved();
      if (m.kind == "exact") exact_rows = retrieved;
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t* truth = exact_rows.data() + h * a.top_k;
        const int64_t* got = retrieved.data() + h * a.top_k;
        for (int i = 0; i < a.top_k; ++i)
          m.found += std::find(got, got + a.top_k, truth[i]) != got + a.top_k ? 1 : 0;
        m.wanted += a.top_k;
      }
    }
  }
}

// One row per method from its timed steps, each also printed on stderr.
std::vector<Row> rows_of(const std::vector<Method>& methods, const BenchMemoryArgs& a, const std::string& keys,
                         int64_t n) {
  std::vector<Row> rows;
  const double exact_median = percentile(methods[0].seconds, 0.5);
  for (const Method& m : methods) {
    Row r;
    r.keys = keys, r.method = m.name, r.kind = m.kind, r.tokens = n, r.ef_search = m.ef_search, r.nprobe = m.nprobe;
    r.build_s = m.build_s, r.index_bytes = m.index_bytes;
    r.median_ms = percentile(m.seconds, 0.5) * 1e3;
    r.p90_ms = percentile(m.seconds, 0.9) * 1e3;
    r.min_ms = *std::min_element(m.seconds.begin(), m.seconds.end()) * 1e3;
    r.speedup_vs_exact = exact_median * 1e3 / r.median_ms;
    r.recall = double(m.found) / double(m.wanted);
    r.scored = m.scored / double(a.queries), r.pages_read = m.pages_read, r.graph_width = m.graph_width;
    r.major_faults_per_step = double(m.major_faults) / double(a.queries);
    rows.push_back(r);
    // Progress on stderr as each size finishes, so a long run's numbers survive an interruption.
    std::fprintf(stderr,
                 "bench memory: %s keys, %lld tokens, %s: median %.3f ms, %.2fx exact, recall %.4f, scored %.4f\n",
                 keys.c_str(), (long long)n, r.method.c_str(), r.median_ms, r.speedup_vs_exact, r.recall, r.scored);
  }
  return rows;
}

// Fills a memory of n tokens, builds the indexes, times `queries` decode steps through every method; one row each.
std::vector<Row> run_size(const BenchMemoryArgs& a, const std::string& keys, int64_t n, const RopeFreqs* freqs,
                          int threads) {
  KvMemoryConfig config;
  config.kv_heads = a.kv_heads;
  config.head_dim = a.head_dim;
  config.policy = parse_memory_policy(a.policy);
  config.storage = parse_dtype(a.memory_dtype);
  config.freqs = freqs;
  VectorSource source(keys, a.clusters, float(a.cluster_spread), a.head_dim, a.seed);
  const std::string stem = mapped_stem(a, keys, n);
  const std::unique_ptr<KvMemory> memory = open_or_fill_memory(a, n, config, source, stem);
  std::vector<Method> methods = methods_of(a);
  build_indexes(methods, a, keys, n, *memory, source, stem);
  time_steps(methods, a, n, *memory, source, threads);
  return rows_of(methods, a, keys, n);
}

// Issue 9's goal at the largest size, per key distribution: the fastest approximate method with recall >= 0.95
// and whether it is >= 10x faster than the exact scan.
struct GoalVerdict {
  std::string keys, best;  // best: "" when no approximate method reached the recall
  int64_t tokens = 0;
  double speedup = 0, recall = 0;
  bool met = false;
};
constexpr double kGoalRecall = 0.95, kGoalSpeedup = 10;

std::vector<GoalVerdict> goal_verdicts(const std::vector<Row>& rows, const std::vector<std::string>& key_kinds,
                                       int64_t largest) {
  std::vector<GoalVerdict> out;
  for (const std::string& keys : key_kinds) {
    GoalVerdict g;
    g.keys = keys, g.tokens = largest;
    for (const Row& r : rows)
      if (r.keys == keys && r.tokens == largest && r.kind != "exact" && r.kind != "flat" && r.recall >= kGoalRecall &&
          r.speedup_vs_exact > g.speedup)
        g.best = r.method, g.speedup = r.speedup_vs_exact, g.recall = r.recall;
    g.met = !g.best.empty() && g.speedup >= kGoalSpeedup;
    out.push_back(g);
  }
  return out;
}

// latency_vs_memory.png in out_dir: median step time against memory size, log-log, one line per (keys, method).
// gnuplot writes a temporary name that is renamed over the PNG, so the PNG is complete or absent.
std::string write_plot(const std::string& out_dir, const std::vector<Row>& rows,
                       const std::vector<std::string>& key_kinds, const BenchMemoryArgs& a) {
  std::vector<std::pair<std::string, std::string>> lines;  // (keys, method) in first-seen order
  for (const Row& r : rows)
    if (std::find(lines.begin(), lines.end(), std::make_pair(r.keys, r.method)) == lines.end())
      lines.push_back({r.keys, r.method});
  // One colour per method, solid for the first key distribution and dashed for the second.
  std::vector<std::string> methods;
  for (const auto& line : lines)
    if (std::find(methods.begin(), methods.end(), line.second) == methods.end()) methods.push_back(line.second);
  const std::string png = lab::join_path(out_dir, "latency_vs_memory.png");
  const std::string tmp_name = "latency_vs_memory.png.tmp." + std::to_string(getpid());
  lab::DataBlocks data;
  lab::Figure figure{tmp_name,
                     fmt::format("Memory attention, one decode step: {} query heads, {} kv head(s), D = {}, top-{}, "
                                 "policy {}", a.q_heads, a.kv_heads, a.head_dim, a.top_k, a.policy),
                     "memory tokens per kv head", "median ms per step", {"set logscale xy", "set key top left"}, {}};
  for (const auto& [keys, method] : lines) {
    const size_t colour = size_t(std::find(methods.begin(), methods.end(), method) - methods.begin()) + 1;
    const size_t dash = size_t(std::find(key_kinds.begin(), key_kinds.end(), keys) - key_kinds.begin()) + 1;
    std::vector<std::pair<double, double>> points;
    for (const Row& r : rows)
      if (r.keys == keys && r.method == method) points.push_back({double(r.tokens), r.median_ms});
    const int block = data.add(keys + " " + method + ": tokens median_ms", points);
    const std::string title = key_kinds.size() > 1 ? method + " (" + keys + ")" : method;
    figure.series.push_back(lab::data_series("latency_vs_memory.dat", block,
                                             fmt::format("linespoints lw 2 lc {} dt {}", colour, dash), title));
  }
  lab::write_file_atomic(lab::join_path(out_dir, "latency_vs_memory.dat"), data.text());
  const std::string problem = lab::run_gnuplot(out_dir, lab::figure_script({figure}));
  const std::string tmp = lab::join_path(out_dir, tmp_name);
  std::error_code ec;
  if (!problem.empty()) {
    std::filesystem::remove(tmp, ec);
    return problem;
  }
  std::filesystem::rename(tmp, png, ec);
  if (ec) return "could not rename " + tmp + " to " + png + ": " + ec.message();
  return "";
}

void run_bench_memory(const BenchMemoryArgs& a) {
  // Everything is checked before any work, naming the flag.
  const std::vector<int64_t> sizes = parse_sizes(a.sizes);
  const std::vector<std::string> key_kinds = parse_name_list(a.keys, "--keys");
  for (const std::string& keys : key_kinds)
    check(keys == "gaussian" || keys == "clustered", "--keys", keys,
          "gaussian or clustered (or both, comma-separated)");
  check(a.policy == "exact" || a.policy == "none", "--policy", a.policy, "exact or none");
  const DType memory_dtype = parse_dtype(a.memory_dtype);
  check(memory_dtype != DType::F64, "--memory-dtype", a.memory_dtype, "f32, bf16 or f16");
  for (const std::string& kind : parse_name_list(a.indexes, "--indexes"))
    check(std::find(std::begin(lab::kMemoryIndexKinds), std::end(lab::kMemoryIndexKinds), kind) !=
              std::end(lab::kMemoryIndexKinds),
          "--indexes", kind, "flat, hnsw, ivf, pages, kdtree or graph (comma-separated)");
  parse_integer_list(a.ef_search, "--ef-search", 1, 65536);
  parse_integer_list(a.graph_widths, "--graph-widths", 1, 1 << 20);
  parse_integer_list(a.nprobe, "--nprobe", 1, 65536);
  parse_integer_list(a.pages_read, "--pages-read", 0, 1 << 30);
  check(a.head_dim >= 2 && a.head_dim <= kMaxHeadDim && a.head_dim % 2 == 0, "--head-dim", a.head_dim,
        "an even number in [2, " + std::to_string(kMaxHeadDim) + "] (RoPE rotates pairs)");
  check(a.kv_heads >= 1 && a.kv_heads <= kMaxKvHeads, "--kv-heads", a.kv_heads, "1.." + std::to_string(kMaxKvHeads));
  check(a.q_heads >= a.kv_heads && a.q_heads % a.kv_heads == 0, "--q-heads", a.q_heads,
        "a multiple of --kv-heads = " + std::to_string(a.kv_heads));
  check(a.top_k >= 1 && a.top_k <= sizes.front(), "--top-k", a.top_k,
        "1..the smallest of --sizes = " + std::to_string(sizes.front()));
  check(sizes.back() * a.kv_heads <= kMaxMemoryRows, "--sizes", a.sizes,
        "sizes x --kv-heads <= 4M = " + std::to_string(kMaxMemoryRows) + " key rows in all (largest " +
            std::to_string(sizes.back()) + " x " + std::to_string(a.kv_heads) + " kv heads)");
  check(a.queries >= 1, "--queries", a.queries, ">= 1");
  check(a.threads >= 0, "--threads", a.threads, ">= 0 (0: OpenMP default)");
  lab::MemoryIndexConfig index_config;
  index_config.hnsw_m = a.hnsw_m, index_config.hnsw_ef_construction = a.ef_construction;
  index_config.ivf_lists = a.ivf_lists;
  index_config.pages_page_size = a.page_size;
  index_config.validate();
  check(a.ivf_lists <= sizes.front(), "--ivf-lists", a.ivf_lists,
        "0 (automatic) or at most the smallest of --sizes = " + std::to_string(sizes.front()));
  if (!a.out.empty()) lab::make_dirs(a.out);
  if (!a.mapped.empty()) lab::make_dirs(a.mapped);

  const int threads = a.threads > 0 ? a.threads : omp_get_max_threads();
  omp_set_num_threads(threads);  // FAISS's own parallel regions (index builds, batched searches) use this many
  RopeSpec spec;
  spec.head_dim = a.head_dim;
  spec.base = 10000.0;
  const RopeFreqs freqs = spec.freqs();
  const std::string load_before = lab::load_average();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Row> rows;
  for (const std::string& keys : key_kinds)
    for (int64_t n : sizes)
      for (Row& r : run_size(a, keys, n, a.policy == "exact" ? &freqs : nullptr, threads)) rows.push_back(r);
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<GoalVerdict> goals = goal_verdicts(rows, key_kinds, sizes.back());
  // The memory's own bytes per token: keys and values of every kv head in --memory-dtype, and one int64 position.
  const int64_t memory_bytes_per_token =
      a.kv_heads * 2 * a.head_dim * int64_t(dtype_size(memory_dtype)) + int64_t(sizeof(int64_t));
  const std::string cpu = lab::cpu_description();
  const unsigned nproc = std::thread::hardware_concurrency();

  std::string plot_problem;
  if (!a.out.empty()) plot_problem = write_plot(a.out, rows, key_kinds, a);

  nlohmann::json j;
  j["machine"] = {{"cpu", cpu}, {"nproc", nproc}, {"threads", threads}, {"load_average_before", load_before},
                  {"load_average_after", lab::load_average()}};
  j["settings"] = {{"sizes", sizes},       {"head_dim", a.head_dim},          {"kv_heads", a.kv_heads},
                   {"q_heads", a.q_heads}, {"top_k", a.top_k},                {"queries", a.queries},
                   {"keys", key_kinds},    {"clusters", a.clusters},          {"cluster_spread", a.cluster_spread},
                   {"policy", a.policy},   {"rope_base", spec.base},          {"hnsw_m", a.hnsw_m},
                   {"hnsw_ef_construction", a.ef_construction},               {"ivf_lists", a.ivf_lists},
                   {"page_size", a.page_size},
                   {"seed", a.seed},       {"warmup_steps", kWarmupSteps},    {"dtype", a.memory_dtype},
                   {"mapped", a.mapped}};
  j["memory_bytes_per_token"] = memory_bytes_per_token;
  j["index_bytes"] = "resident-set growth while the index was built (after malloc_trim)";
  j["seconds"] = total_s;
  for (const Row& r : rows) {
    nlohmann::json e = {{"keys", r.keys},
                        {"tokens", r.tokens},
                        {"method", r.method},
                        {"kind", r.kind},
                        {"median_ms", r.median_ms},
                        {"p90_ms", r.p90_ms},
                        {"min_ms", r.min_ms},
                        {"speedup_vs_exact", r.speedup_vs_exact},
                        {"recall", r.recall},
                        {"scored_share_of_scan", r.scored},
                        {"build_s", r.build_s},
                        {"index_bytes", r.index_bytes},
                        {"index_bytes_per_token", double(r.index_bytes) / double(r.tokens)},
                        {"major_faults_per_step", r.major_faults_per_step}};
    if (r.ef_search) e["ef_search"] = r.ef_search;
    if (r.nprobe) e["nprobe"] = r.nprobe;
    if (r.pages_read >= 0) e["pages_read"] = r.pages_read;
    if (r.graph_width) e["graph_width"] = r.graph_width;
    j["rows"].push_back(e);
  }
  for (const GoalVerdict& g : goals)
    j["goal"].push_back({{"keys", g.keys}, {"tokens", g.tokens}, {"best_method_at_recall_0.95", g.best},
                         {"speedup_vs_exact", g.speedup}, {"recall", g.recall}, {"met", g.met}});
  if (!a.out.empty()) {
    lab::write_file_atomic(lab::join_path(a.out, "bench_memory.json"), j.dump(2) + "\n");
    j["plot"] = plot_problem.empty() ? lab::join_path(a.out, "latency_vs_memory.png") : "none: " + plot_problem;
  }
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }

  std::printf("rotary bench memory: one decode step (1 token, %lld query heads over %lld kv head(s), D %d, memory "
              "%s), top-%d of the memory, policy %s; %d queries per size\n",
              (long long)a.q_heads, (long long)a.kv_heads, a.head_dim, dtype_name(memory_dtype), a.top_k,
              a.policy.c_str(), a.queries);
  std::printf("cpu: %s | nproc %u | threads %d | load average %s -> %s | %.0f s\n", cpu.c_str(), nproc, threads,
              load_before.c_str(), lab::load_average().c_str(), total_s);
  std::printf("memory: %lld bytes per token (keys + values %s, position int64); index MB = resident-set growth "
              "while building\n\n",
              (long long)memory_bytes_per_token, dtype_name(memory_dtype));
  if (!a.mapped.empty())
    std::printf("mapped from %s: the memory and page indexes used from their files (build_s: to open, or to build, "
                "save and open); faults = major page faults per step\n\n", a.mapped.c_str());
  std::printf("%-9s %9s %-16s %9s %10s %9s %9s %9s %9s %9s %9s%s\n", "keys", "tokens", "method", "build_s",
              "median_ms", "p90_ms", "x_exact", "recall", "scored", "index_MB", "idx_B/tok",
              a.mapped.empty() ? "" : "    faults");
  for (const Row& r : rows) {
    const bool index = r.kind != "exact";
    std::printf("%-9s %9lld %-16s %9s %10.3f %9.3f %9.2f %9.4f %9s %9s %9s%s\n", r.keys.c_str(),
                (long long)r.tokens, r.method.c_str(), index ? fmt::format("{:.1f}", r.build_s).c_str() : "-",
                r.median_ms, r.p90_ms, r.speedup_vs_exact, r.recall,
                std::isnan(r.scored) ? "-" : fmt::format("{:.4f}", r.scored).c_str(),
                index ? fmt::format("{:.1f}", double(r.index_bytes) / 1e6).c_str() : "-",
                index ? fmt::format("{:.0f}", double(r.index_bytes) / double(r.tokens)).c_str() : "-",
                a.mapped.empty() ? "" : fmt::format(" {:9.1f}", r.major_faults_per_step).c_str());
  }
  std::printf("\n");
  for (const GoalVerdict& g : goals) {
    if (g.best.empty())
      std::printf("goal (>= %.0fx the exact scan at recall@%d >= %.2f), %s keys, %lld tokens: not met - no "
                  "approximate method reached the recall\n",
                  kGoalSpeedup, a.top_k, kGoalRecall, g.keys.c_str(), (long long)g.tokens);
    else
      std::printf("goal (>= %.0fx the exact scan at recall@%d >= %.2f), %s keys, %lld tokens: %s - %s %.1fx at "
                  "recall %.4f\n",
                  kGoalSpeedup, a.top_k, kGoalRecall, g.keys.c_str(), (long long)g.tokens, g.met ? "met" : "not met",
                  g.best.c_str(), g.speedup, g.recall);
  }
  if (!a.out.empty())
    std::printf("%s\n", plot_problem.empty() ? ("plot: " + lab::join_path(a.out, "latency_vs_memory.png")).c_str()
                                             : ("no plot: " + plot_problem).c_str());
}

const CommandRegistrar kRegisterBenchMemory([](CLI::App& root) {
  auto args = std::make_shared<BenchMemoryArgs>();
  CLI::App& bench = subcommand_group(root, "bench", "benchmarks");
  CLI::App* cmd = bench.add_subcommand(
      "memory", "one decode step of retrieval-memory attention against the memory's size: the core's exact top-k "
                "scan beside FAISS flat, HNSW, IVF and the core's page search proposing candidates scored exactly; latency, recall@k, keys scored, build time, bytes");
  cmd->add_option("--sizes", args->sizes,
                  "memory tokens per kv head, comma-separated, each in [64, 4M = 4194304] (k = 1024, M = 1048576); "
                  "sizes x --kv-heads <= 4M rows (default 16k,64k,256k,1M)");
  cmd->add_option("--head-dim", args->head_dim, "head dim D, even (default 64)")->transform(integer_in(2, kMaxHeadDim));
  cmd->add_option("--kv-heads", args->kv_heads, "kv heads of the memory (default 1)")
      ->transform(integer_in(1, kMaxKvHeads));
  cmd->add_option("--q-heads", args->q_heads, "query heads of a step, a multiple of --kv-heads (default 4: GQA 4:1)")
      ->transform(integer_in(1, 64));
  cmd->add_option("--top-k", args->top_k, "memory keys per query head, at most the smallest size (default 32)")
      ->transform(integer_in(1, kMaxTopK));
  cmd->add_option("--queries", args->queries, "timed decode steps per size and method (default 200)")
      ->transform(integer_in(1, 100000));
  cmd->add_option("--threads", args->threads, "threads for every method and FAISS (0: OpenMP default)")
      ->transform(integer_in(0, kMaxThreads));
  cmd->add_option("--keys", args->keys, "key and query distribution: gaussian, clustered, or both comma-separated "
                                        "(default gaussian)");
  cmd->add_option("--clusters", args->clusters, "mixture components of --keys clustered (default 256)")
      ->transform(integer_in(1, 65536));
  cmd->add_option("--cluster-spread", args->cluster_spread,
                  "standard deviation of --keys clustered around their centres (default 0.5; small: keys that "
                  "nearly repeat, as a trained model's)")
      ->transform(finite_in(0.0, 10.0));
  cmd->add_option("--policy", args->policy, "memory policy: exact (RoPE base 10000, keys stored rotated) or none "
                                            "(default exact)");
  cmd->add_option("--indexes", args->indexes, "indexes to time beside the exact scan: FAISS flat, hnsw, ivf, the "
                                              "core's page search pages (consecutive tokens) and kdtree (pages "
                                              "of alike keys), and its query-routed graph (default flat,hnsw,ivf)");
  cmd->add_option("--ef-search", args->ef_search, "HNSW ef_search values, comma-separated, each in [1, 65536]; one "
                                                  "graph serves every value (default 128)");
  cmd->add_option("--hnsw-m", args->hnsw_m, "HNSW graph degree M (default 32)")->transform(integer_in(4, 256));
  cmd->add_option("--ef-construction", args->ef_construction, "HNSW efConstruction (default 64)")
      ->transform(integer_in(8, 4096));
  cmd->add_option("--nprobe", args->nprobe, "IVF lists scanned per query, comma-separated, each in [1, 65536]; "
                                            "one set of lists serves every value (default 16)");
  cmd->add_option("--ivf-lists", args->ivf_lists, "IVF lists (0: about 4 sqrt(N), at most N / 39)")
      ->transform(integer_in(0, 1 << 20));
  cmd->add_option("--pages-read", args->pages_read, "pages read per query by pages and kdtree, comma-separated, "
                                                    "each >= 0 (0: certified exact); one set of bounds serves every "
                                                    "value (default 0,16,64)");
  cmd->add_option("--graph-widths", args->graph_widths,
                  "rows the graph keeps while walking, comma-separated, each in [1, 2^20]; one graph serves every "
                  "value (default 64,128,256)");
  cmd->add_option("--graph-training-queries", args->graph_training_queries,
                  "queries per kv head the graph is built from, drawn like the timed ones (default 16384)")
      ->transform(integer_in(1, 1 << 20));
  cmd->add_option("--memory-dtype", args->memory_dtype, "the memory's keys and values: f32, bf16 or f16 (default f32)");
  cmd->add_option("--page-size", args->page_size, "rows per page of pages and kdtree (default 32)")
      ->transform(integer_in(1, 65536));
  cmd->add_option("--seed", args->seed, "seed of keys, values and queries (default 1)")
      ->transform(unsigned_up_to(std::numeric_limits<uint64_t>::max()));
  cmd->add_flag("--json", args->json, "print machine-readable results");
  cmd->add_option("--out", args->out, "directory for latency_vs_memory.png (gnuplot), its data and bench_memory.json");
  cmd->add_option("--mapped", args->mapped,
                  "directory where the memory and page indexes are saved and then used mapped from their files "
                  "(reused by a later run with the same settings: a memory larger than RAM read from disk)");
  cmd->callback([args] { run_bench_memory(*args); });
});

}  // namespace
}  // namespace rotary::cli
