// rotary/memory_pages.h: page search over a KvMemory. The oracles: the exact scan (memory_attention without
// candidates: its retrieved rows and scores) for the certified mode and for P = every page; brute force for the
// bounds (every row's score under its page's bound, hi / lo the pages' max / min); the float64 oracle
// (memory_pages_search_reference) for P < every page; and memory_attention over the pages' candidates against the
// exact scan's output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>
#include <random>
#include <vector>

#include "../../fuzz/memory_pages_seeds.h"
#include "expect_error.h"
#include "mapped_file.h"
#include "rotary/kv_memory.h"
#include "rotary/memory_pages.h"
#include "rotary/rope_spec.h"

namespace rotary {
namespace {

RopeFreqs test_freqs(int D) {
  RopeSpec s;
  s.head_dim = D;
  s.base = 10000;
  return s.freqs();
}

// A memory of n tokens of Hkv kv heads; keys drift slowly along the sequence plus noise of 0.3 (so pages differ,
// as a model's keys do), or pure gaussian.
struct Fixture {
  int D;
  int64_t Hkv, n;
  RopeFreqs freqs;
  KvMemory memory;
  Fixture(int64_t tokens, int head_dim = 32, int64_t kv_heads = 2, MemoryPolicy policy = MemoryPolicy::Exact,
          bool drift = true, uint32_t seed = 3)
      : D(head_dim), Hkv(kv_heads), n(tokens), freqs(test_freqs(head_dim)),
        memory(KvMemoryConfig{kv_heads, head_dim, policy, &freqs, policy == MemoryPolicy::Rerope ? 16 : 0, 0}) {
    append(0, tokens, drift, seed);
  }
  void append(int64_t first, int64_t count, bool drift, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0, 1);
    std::vector<float> k(size_t(count * Hkv * D)), v(k.size());
    for (int64_t t = 0; t < count; ++t)
      for (int64_t i = 0; i < Hkv * D; ++i) {
        const float slow = drift ? 2.0f * std::sin(0.002f * float(first + t) * float(1 + i % 7) + float(i)) : 0.0f;
        k[size_t(t * Hkv * D + i)] = slow + (drift ? 0.3f : 1.0f) * g(rng);
        v[size_t(t * Hkv * D + i)] = g(rng);
      }
    std::vector<int64_t> pos(static_cast<size_t>(count));
    for (int64_t t = 0; t < count; ++t) pos[size_t(t)] = first + t;
    memory.append(count, {k.data(), Hkv, Hkv * D, D}, {v.data(), Hkv, Hkv * D, D}, pos.data());
  }
  std::vector<float> queries(int64_t count, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0, 1);
    std::vector<float> q(size_t(count * D));
    for (float& x : q) x = g(rng);
    return q;
  }
};

// The exact scan's top-k for search vectors: brute force over every row in double (row order on ties).
std::vector<int64_t> exact_top_k(const KvMemory& m, int64_t h, const float* q, int k) {
  std::vector<std::pair<double, int64_t>> all;
  for (int64_t j = 0; j < m.size(); ++j) {
    double s = 0;
    for (int d = 0; d < m.head_dim(); ++d) s += double(q[d]) * double(m.keys(h)[j * m.head_dim() + d]);
    all.push_back({s, j});
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int64_t> rows;
  for (int i = 0; i < k; ++i) rows.push_back(all[size_t(i)].second);
  return rows;
}

// Every row once; a node's rows are its children's; pages hold at most B rows; each box is its rows' exact
// max / min, so its bound (in double) is above every row's score; token grouping keeps token order.
void expect_valid_trees(const Fixture& f, const MemoryPages& pages, const std::vector<float>& q, int64_t nq) {
  const int64_t B = pages.config().page_size;
  for (int64_t h = 0; h < f.Hkv; ++h) {
    const PageTree t = pages.tree(h);
    std::vector<int> seen(size_t(f.memory.size()), 0);
    for (int64_t i = 0; i < f.memory.size(); ++i) seen[size_t(t.rows[i])] += 1;
    ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; })) << "rows not a permutation";
    int64_t covered = 0;
    for (int64_t r = 0; r < t.root_count; ++r) {
      ASSERT_EQ(t.nodes[t.roots[r]].first, covered) << "segment " << r;
      covered += t.nodes[t.roots[r]].count;
    }
    ASSERT_EQ(covered, f.memory.size());
    const float* K = f.memory.keys(h);
    for (int64_t i = 0; i < t.node_count; ++i) {
      const PageNode& node = t.nodes[i];
      if (node.left >= 0) {
        ASSERT_EQ(t.nodes[node.left].first, node.first);
        ASSERT_EQ(t.nodes[node.right].first, node.first + t.nodes[node.left].count);
        ASSERT_EQ(t.nodes[node.left].count + t.nodes[node.right].count, node.count);
      } else {
        ASSERT_LE(node.count, B);
        ASSERT_GE(node.count, 1);
      }
      const float* hi = t.boxes + i * 2 * f.D;
      const float* lo = hi + f.D;
      for (int d = 0; d < f.D; ++d) {
        float want_hi = -INFINITY, want_lo = INFINITY;
        for (int64_t r = node.first; r < node.first + node.count; ++r)
          want_hi = std::max(want_hi, K[t.rows[r] * f.D + d]), want_lo = std::min(want_lo, K[t.rows[r] * f.D + d]);
        ASSERT_EQ(hi[d], want_hi) << "node " << i << " d " << d;
        ASSERT_EQ(lo[d], want_lo) << "node " << i << " d " << d;
      }
      for (int64_t j = 0; j < nq; ++j) {
        double bound = 0;
        for (int d = 0; d < f.D; ++d) {
          const double qd = q[size_t(j * f.D + d)];
          bound += std::max(qd * hi[d], qd * lo[d]);
        }
        for (int64_t r = node.first; r < node.first + node.count; ++r) {
          double s = 0;
          for (int d = 0; d < f.D; ++d) s += double(q[size_t(j * f.D + d)]) * double(K[t.rows[r] * f.D + d]);
          ASSERT_LE(s, bound + 1e-12 * std::abs(bound));
        }
      }
    }
    if (pages.config().grouping == PageGrouping::Tokens) {
      for (int64_t i = 0; i < f.memory.size(); ++i) ASSERT_EQ(t.rows[i], i);
    }
  }
}

TEST(MemoryPages, TreesPartitionTheRowsAndTheirBoxesBoundThem) {
  for (PageGrouping g : {PageGrouping::Tokens, PageGrouping::Keys}) {
    Fixture f(1000, 32, 2);  // 1000 rows: pages of 32, the last one short
    MemoryPages pages(f.memory, {32, 0, g});
    pages.sync();
    EXPECT_EQ(pages.pages(), 32) << page_grouping_name(g);
    const std::vector<float> q = f.queries(5, 9);
    expect_valid_trees(f, pages, q, 5);
    // Grown in steps of uneven size, synced after each: segments merge, the trees stay valid.
    for (int64_t first : {1000, 1130, 1131, 1600}) {
      f.append(first, first == 1600 ? 77 : (first == 1130 ? 1 : 130), true, uint32_t(first));
      pages.sync();
      expect_valid_trees(f, pages, q, 5);
    }
    EXPECT_EQ(pages.size(), 1000 + 130 + 1 + 130 + 77);
    EXPECT_LE(pages.tree(0).root_count, 4) << "segments do not merge";
  }
}

// Certified mode (P = 0) and P = every page both give the exact scan's rows; across page sizes (1, one that does
// not divide N, one larger than N), k up to N, head dims, the drifting and the structureless keys.
TEST(MemoryPages, CertifiedAndAllPagesAreTheExactTopK) {
  struct Case {
    int64_t n, page;
    int D, k;
    bool drift;
  };
  for (const Case& c : {Case{1000, 32, 32, 8, true}, Case{1000, 7, 16, 32, true}, Case{777, 64, 64, 1, false},
                        Case{300, 1, 8, 5, true}, Case{50, 128, 32, 50, true}, Case{2048, 16, 32, 32, false}}) {
    Fixture f(c.n, c.D, 2, MemoryPolicy::Exact, c.drift);
    const int64_t all_pages = (c.n + c.page - 1) / c.page;
    for (int64_t P : {int64_t{0}, all_pages})
    for (PageGrouping g : {PageGrouping::Tokens, PageGrouping::Keys}) {
      MemoryPages pages(f.memory, {c.page, P, g});
      pages.sync();
      const int64_t nq = 12;
      const std::vector<float> q = f.queries(nq, 11);
      for (int64_t h = 0; h < f.Hkv; ++h) {
        std::vector<int64_t> rows(size_t(nq * c.k));
        std::vector<float> scores(rows.size());
        PageSearchStats stats;
        pages.search(h, nq, q.data(), c.k, rows.data(), scores.data(), &stats, 2);
        for (int64_t i = 0; i < nq; ++i) {
          const std::vector<int64_t> want = exact_top_k(f.memory, h, q.data() + i * c.D, c.k);
          for (int j = 0; j < c.k; ++j) {
            ASSERT_EQ(rows[size_t(i * c.k + j)], want[size_t(j)]) << "n " << c.n << " page " << c.page << " P " << P
                                                                  << " " << page_grouping_name(g) << " query " << i
                                                                  << " rank " << j;
            double s = 0;
            for (int d = 0; d < c.D; ++d) s += double(q[size_t(i * c.D + d)]) * f.memory.keys(h)[want[size_t(j)] * c.D + d];
            ASSERT_NEAR(scores[size_t(i * c.k + j)], s, 1e-4 * (1 + std::abs(s)));
          }
        }
        EXPECT_EQ(stats.queries, nq);
        EXPECT_LE(stats.bounds, nq * (2 * all_pages - 1));  // at most every node of the tree
        if (P == all_pages) {
          EXPECT_EQ(stats.rows_scored, nq * c.n);
          EXPECT_EQ(stats.pages_read, nq * all_pages);
        }
        EXPECT_LE(stats.rows_scored, nq * c.n);
      }
    }
  }
}

// On keys with structure the certificate stops early and stays exact: drifting keys grouped by tokens (Quest's
// case), and keys that repeat - 24 distinct vectors in 8192 rows, as a trained model's first layer stores one key
// per character - grouped by keys, where token order gives no tight page at all.
TEST(MemoryPages, CertifiedSearchScoresFewRowsOnStructuredKeys) {
  struct Case {
    PageGrouping grouping;
    bool repeated;
    double least, most;  // share of an exact scan's work
  };
  // (Token order over repeated keys in shuffled order: every page holds every key, nothing is pruned.)
  for (const Case& c : {Case{PageGrouping::Tokens, false, 0.0, 0.75}, Case{PageGrouping::Keys, true, 0.0, 0.05},
                        Case{PageGrouping::Tokens, true, 0.5, 1.2}}) {
    // (Repeated keys in a memory that stores keys as given - rerope's - so the copies stay equal.)
    Fixture f(8192, 32, 1, c.repeated ? MemoryPolicy::Rerope : MemoryPolicy::Exact);
    if (c.repeated) {  // every row a copy of one of 24 keys, drawn at random
      Fixture distinct(24, 32, 1, MemoryPolicy::Exact, false, 5);
      std::vector<float> k(size_t(8192 * 32)), v(k.size(), 0.5f);
      std::mt19937 rng(2);
      for (int64_t j = 0; j < 8192; ++j) std::copy_n(distinct.memory.keys(0) + (rng() % 24) * 32, 32, k.data() + j * 32);
      std::vector<int64_t> pos(8192);
      for (int64_t j = 0; j < 8192; ++j) pos[size_t(j)] = j;
      f.memory.clear();
      f.memory.append(8192, {k.data(), 1, 32, 32}, {v.data(), 1, 32, 32}, pos.data());
    }
    MemoryPages pages(f.memory, {32, 0, c.grouping});
    pages.sync();
    // Queries along stored keys, scaled (a peaked softmax, as a retrieving head's).
    std::vector<float> q(size_t(4 * f.D));
    for (int i = 0; i < 4; ++i)
      for (int d = 0; d < f.D; ++d) q[size_t(i * f.D + d)] = 2.0f * f.memory.keys(0)[(1000 + 1700 * i) * f.D + d];
    const int k = 8;
    std::vector<int64_t> rows(4 * k);
    std::vector<float> scores(rows.size());
    PageSearchStats stats;
    pages.search(0, 4, q.data(), k, rows.data(), scores.data(), &stats);
    for (int i = 0; i < 4; ++i) {  // by score: repeated keys tie, and which copies come back is the search's choice
      const std::vector<int64_t> want = exact_top_k(f.memory, 0, q.data() + i * f.D, k);
      double kth = 0;
      for (int d = 0; d < f.D; ++d) kth += double(q[size_t(i * f.D + d)]) * f.memory.keys(0)[want[k - 1] * f.D + d];
      for (int j = 0; j < k; ++j) EXPECT_GE(scores[size_t(i * k + j)], kth - 1e-4 * (1 + std::abs(kth)));
    }
    std::printf("certified search, %s grouping, %s keys: %lld of %lld rows scored, %.4f of a scan's work\n",
                page_grouping_name(c.grouping), c.repeated ? "repeated" : "drifting", (long long)stats.rows_scored,
                4LL * 8192, stats.share_of_scan(8192));
    EXPECT_LT(stats.share_of_scan(8192), c.most) << page_grouping_name(c.grouping);
    EXPECT_GT(stats.share_of_scan(8192), c.least) << page_grouping_name(c.grouping);
  }
}

// P < every page: the fast path reads the pages the float64 oracle reads and returns its rows.
TEST(MemoryPages, TopPagesMatchTheFloat64Oracle) {
  for (MemoryPolicy policy : {MemoryPolicy::Exact, MemoryPolicy::Rerope}) {
    Fixture f(3000, 32, 2, policy);
    for (int64_t P : {1, 4, 20})
    for (PageGrouping g : {PageGrouping::Tokens, PageGrouping::Keys}) {
      MemoryPages pages(f.memory, {64, P, g});
      pages.sync();
      const int64_t nq = 10;
      const std::vector<float> q = f.queries(nq, 21);
      for (int k : {1, 8, 100}) {
        std::vector<int64_t> rows(size_t(nq * k)), ref_rows(rows.size());
        std::vector<float> scores(rows.size());
        std::vector<double> ref_scores(rows.size());
        PageSearchStats stats;
        pages.search(1, nq, q.data(), k, rows.data(), scores.data(), &stats);
        memory_pages_search_reference(f.memory, pages, 1, nq, q.data(), k, ref_rows.data(), ref_scores.data());
        for (size_t i = 0; i < rows.size(); ++i) {
          ASSERT_EQ(rows[i], ref_rows[i]) << "P " << P << " k " << k << " " << page_grouping_name(g) << " at " << i;
          ASSERT_NEAR(scores[i], ref_scores[i], 1e-4 * (1 + std::abs(ref_scores[i])));
        }
        // P pages, or enough for k rows: ceil(k / 64) pages (one more if a short page is among them).
        const int64_t min_pages = std::max<int64_t>(P, (k + 63) / 64);
        EXPECT_GE(stats.pages_read, nq * min_pages);
        EXPECT_LE(stats.pages_read, nq * (min_pages + 1));
      }
    }
  }
}

TEST(MemoryPages, CertifiedOracleIsTheExactTopK) {
  Fixture f(900, 16, 1);
  const std::vector<float> q = f.queries(6, 5);
  std::vector<int64_t> rows(6 * 10);
  std::vector<double> scores(rows.size());
  MemoryPages pages(f.memory, {16, 0, PageGrouping::Keys});
  pages.sync();
  memory_pages_search_reference(f.memory, pages, 0, 6, q.data(), 10, rows.data(), scores.data());
  for (int i = 0; i < 6; ++i) {
    const std::vector<int64_t> want = exact_top_k(f.memory, 0, q.data() + i * 16, 10);
    for (int j = 0; j < 10; ++j) EXPECT_EQ(rows[size_t(i * 10 + j)], want[size_t(j)]);
  }
}

// Synced after each of many small appends (a decoder moving W tokens at a time): the segments merge like a binary
// counter (O(log N) of them), and the searches equal those of an index synced once.
TEST(MemoryPages, ManySmallSyncsMergeSegmentsAndSearchAsOneSync) {
  Fixture grown(100, 32, 2);
  MemoryPages incremental(grown.memory, {16, 0, PageGrouping::Keys});
  incremental.sync();
  for (int64_t first = 100; first < 100 + 60 * 64; first += 64) {
    grown.append(first, 64, true, uint32_t(first));
    incremental.sync();
  }
  const int64_t n = grown.memory.size();
  ASSERT_EQ(n, 100 + 60 * 64);
  EXPECT_LE(incremental.tree(0).root_count, int64_t(std::log2(double(n) / 64)) + 2);
  MemoryPages once(grown.memory, {16, 0, PageGrouping::Keys});
  once.sync();
  const std::vector<float> q = grown.queries(16, 8);
  for (int64_t h = 0; h < 2; ++h) {
    std::vector<int64_t> a(16 * 10), b(a.size());
    std::vector<float> sa(a.size()), sb(a.size());
    incremental.search(h, 16, q.data(), 10, a.data(), sa.data());
    once.search(h, 16, q.data(), 10, b.data(), sb.data());
    EXPECT_EQ(a, b);
  }
}

// A large sync groups the kv heads on threads (rotary/memory_pages.cpp: once rows x heads pass 65536); each
// head's trees are its own keys' alone, so they equal those of a one-head memory holding that head's keys (grouped
// without threads).
TEST(MemoryPages, HeadsGroupedOnThreadsEqualEachHeadAlone) {
  Fixture f(20000, 8, 4, MemoryPolicy::NoRotation);
  MemoryPages pages(f.memory, {32, 0, PageGrouping::Keys});
  pages.sync();
  const std::vector<float> q = f.queries(2, 4);
  expect_valid_trees(f, pages, q, 2);
  std::vector<int64_t> positions(size_t(f.n));
  for (int64_t t = 0; t < f.n; ++t) positions[size_t(t)] = t;
  for (int64_t h = 0; h < f.Hkv; ++h) {
    KvMemory alone(KvMemoryConfig{1, f.D, MemoryPolicy::NoRotation, nullptr, 0, 0});
    alone.append(f.n, {const_cast<float*>(f.memory.keys(h)), 1, f.D, f.D},
                 {const_cast<float*>(f.memory.values(h)), 1, f.D, f.D}, positions.data());
    MemoryPages one(alone, {32, 0, PageGrouping::Keys});
    one.sync();
    const PageTree a = pages.tree(h), b = one.tree(0);
    ASSERT_EQ(a.node_count, b.node_count) << "head " << h;
    EXPECT_TRUE(std::equal(a.rows, a.rows + f.n, b.rows)) << "head " << h;
    EXPECT_TRUE(std::equal(a.boxes, a.boxes + a.node_count * 2 * f.D, b.boxes)) << "head " << h;
    for (int64_t i = 0; i < a.node_count; ++i)
      ASSERT_TRUE(a.nodes[i].first == b.nodes[i].first && a.nodes[i].count == b.nodes[i].count &&
                  a.nodes[i].left == b.nodes[i].left && a.nodes[i].right == b.nodes[i].right)
          << "head " << h << " node " << i;
  }
}

// save() then open() over the memory's own file, both mapped: the same trees and bitwise the same searches as the
// index built in RAM, for both groupings, with several segments; what does not belong is refused by name.
TEST(MemoryPages, SavedIndexMapsBackOverItsMemoryAndForeignOrDamagedFilesAreRefused) {
  const std::string dir = ::testing::TempDir() + "/rotary_pages_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  for (PageGrouping g : {PageGrouping::Tokens, PageGrouping::Keys}) {
    Fixture f(1000, 16, 2, MemoryPolicy::Exact);
    const MemoryPagesConfig config{16, 0, g};
    MemoryPages built(f.memory, config);
    built.sync();
    f.append(1000, 300, true, 7);  // a second segment
    built.sync();
    ASSERT_EQ(built.tree(0).root_count, 2);
    const std::string memory_path = dir + "/memory.mem", pages_path = dir + "/memory.pages";
    f.memory.save(memory_path);
    built.save(pages_path);
    const KvMemoryConfig mc{f.Hkv, f.D, MemoryPolicy::Exact, &f.freqs, 0, 0};
    const KvMemory mapped = KvMemory::open(memory_path, mc);
    MemoryPages opened = MemoryPages::open(pages_path, mapped, config);
    EXPECT_EQ(opened.size(), 1300);
    EXPECT_EQ(opened.pages(), built.pages());
    for (int64_t h = 0; h < f.Hkv; ++h) {
      const PageTree a = built.tree(h), b = opened.tree(h);
      ASSERT_EQ(a.node_count, b.node_count);
      ASSERT_EQ(a.root_count, b.root_count);
      EXPECT_TRUE(std::equal(a.rows, a.rows + 1300, b.rows)) << page_grouping_name(g);
      EXPECT_TRUE(std::equal(a.boxes, a.boxes + a.node_count * 2 * f.D, b.boxes)) << page_grouping_name(g);
      for (int64_t i = 0; i < a.node_count; ++i)
        ASSERT_TRUE(a.nodes[i].first == b.nodes[i].first && a.nodes[i].count == b.nodes[i].count &&
                    a.nodes[i].left == b.nodes[i].left && a.nodes[i].right == b.nodes[i].right);
      const std::vector<float> q = f.queries(12, uint32_t(20 + h));
      for (int64_t pages_read : {0, 3}) {
        built.set_pages_read(pages_read), opened.set_pages_read(pages_read);
        std::vector<int64_t> ra(12 * 5), rb(ra.size());
        std::vector<float> sa(ra.size()), sb(ra.size());
        PageSearchStats wa, wb;
        built.search(h, 12, q.data(), 5, ra.data(), sa.data(), &wa);
        opened.search(h, 12, q.data(), 5, rb.data(), sb.data(), &wb);
        EXPECT_EQ(ra, rb);
        EXPECT_EQ(sa, sb);
        EXPECT_EQ(wa.bounds, wb.bounds);
        EXPECT_EQ(wa.rows_scored, wb.rows_scored);
      }
    }
    // The in-RAM memory holds the same rows: the index opens over it too, and cannot grow with it.
    MemoryPages over_ram = MemoryPages::open(pages_path, f.memory, config);
    over_ram.sync();  // nothing new: no-op
    f.append(1300, 10, true, 8);
    test::expect_error([&] { over_ram.sync(); }, {"memory_pages.sync", "opened from a file"});
    test::expect_error([&] { built.save(pages_path); }, {"memory_pages.save", "sync after appending"});
    // Another memory or other settings.
    test::expect_error([&] { MemoryPages::open(pages_path, f.memory, config); }, {pages_path, "size = 1300"});
    test::expect_error([&] { MemoryPages::open(pages_path, mapped, {32, 0, g}); },
                       {"page_size = 16", "this run asks 32"});
    test::expect_error(
        [&] {
          MemoryPages::open(pages_path, mapped,
                            {16, 0, g == PageGrouping::Keys ? PageGrouping::Tokens : PageGrouping::Keys});
        },
        "grouping");
    Fixture other(1300, 16, 2, MemoryPolicy::Exact, true, 99);  // same shape, other keys
    test::expect_error([&] { MemoryPages::open(pages_path, other.memory, config); }, "memory_check");
    // Damaged bytes: read whole, changed, opened with open_bytes (a heap copy: 8-byte aligned).
    std::ifstream in(pages_path, std::ios::binary);
    const std::vector<char> good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto open_copy = [&](std::vector<char> b) {
      std::vector<int64_t> aligned((b.size() + 7) / 8);
      std::memcpy(aligned.data(), b.data(), b.size());
      MemoryPages::open_bytes(aligned.data(), b.size(), mapped, config, "crafted");
    };
    open_copy(good);  // the copy itself opens
    std::vector<char> b = good;
    b[3] = 'X';
    test::expect_error([&] { open_copy(b); }, {"crafted", "not a rotary page index"});
    b = good, b[8 + 8 * 4] ^= 1;  // the size field
    test::expect_error([&] { open_copy(b); }, "a damaged header (checksum)");
    b = good, b.pop_back();
    test::expect_error([&] { open_copy(b); }, "truncated");
    b = good, b.push_back(0);
    test::expect_error([&] { open_copy(b); }, "trailing bytes");
    // The body at 64 x ceil((8 + 64 + 8) / 64); the checksum after each head's rows, boxes and absmax (64-aligned
    // blocks), before the keys in page order.
    const size_t body = 128, rows_bytes = (1300 * 8 + 63) / 64 * 64,
                 checksum = body + 64 + 2 * (rows_bytes + size_t(built.tree(0).node_count) * 2 * 16 * 4 + 64);
    b = good, b[body + 16 * 2 + 100] ^= 1;  // in head 0's rows
    test::expect_error([&] { open_copy(b); }, "a damaged body (checksum)");
    b = good, b[checksum] ^= 1;  // the checksum itself: where the test places it
    test::expect_error([&] { open_copy(b); }, "a damaged body (checksum)");
    // The keys in page order are the memory's rows gathered (not checksummed: a search reads them, attention
    // rescored from the memory's own keys).
    for (int64_t h = 0; h < f.Hkv; ++h) {
      const PageTree t = built.tree(h);
      const size_t keys_at = (checksum + 8 + 63) / 64 * 64 + size_t(h) * ((1300 * 16 * 4 + 63) / 64 * 64);
      for (int64_t i = 0; i < 1300; i += 97)
        ASSERT_EQ(0, std::memcmp(good.data() + keys_at + size_t(i) * 16 * 4, f.memory.keys(h) + t.rows[i] * 16, 64))
            << "head " << h << " entry " << i;
    }
    auto seal = [&](std::vector<char>& x) {  // the body's checksum made right
      const uint64_t h = fnv1a64(x.data() + body, checksum - body);  // the file's own checksum function
      std::memcpy(x.data() + checksum, &h, 8);
    };
    b = good;
    int64_t end0 = 999;  // segment 0 = [0, 999): does not meet segment 1
    std::memcpy(b.data() + body + 8, &end0, 8);
    seal(b);
    test::expect_error([&] { open_copy(b); }, {"segment 1", "is invalid"});
    b = good;
    const size_t head0 = body + 64;  // segments (2 x 16 bytes) padded to 64
    int64_t row = 0;
    std::memcpy(&row, b.data() + head0, 8);
    std::memcpy(b.data() + head0 + 8, &row, 8);  // rows[1] = rows[0]: a row twice
    seal(b);
    test::expect_error([&] { open_copy(b); }, {"rows[1]", "once"});
    row = 5000;  // past the memory
    b = good, std::memcpy(b.data() + head0, &row, 8), seal(b);
    test::expect_error([&] { open_copy(b); }, {"rows[0] = 5000", "is invalid"});
    std::filesystem::remove(pages_path), std::filesystem::remove(memory_path);
  }
  std::filesystem::remove_all(dir);
}

// The fuzz target's seeds (fuzz/corpus/memory_pages/) are what save() writes for fuzz/memory_pages_seeds.h's
// indexes, and open over its memory; ROTARY_WRITE_FUZZ_SEEDS=1 rewrites them after a change of the format.
TEST(MemoryPages, FuzzSeedsAreWhatSaveWrites) {
  const bool rewrite = std::getenv("ROTARY_WRITE_FUZZ_SEEDS") != nullptr;
  const KvMemory memory = fuzz::pages_seed_memory();
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  for (const fuzz::MemoryPagesSeed& seed : fuzz::memory_pages_seeds()) {
    SCOPED_TRACE(seed.file);
    const std::string tmp = ::testing::TempDir() + "/rotary_seed_" + std::to_string(::getpid()) + ".pages";
    fuzz::write_pages_seed(seed, tmp);
    const std::string saved = bytes(tmp);
    std::remove(tmp.c_str());
    const std::string checked_in = std::string(ROTARY_SOURCE_DIR) + "/fuzz/corpus/memory_pages/" + seed.file;
    if (rewrite) std::ofstream(checked_in, std::ios::binary) << saved;
    EXPECT_EQ(bytes(checked_in), saved) << checked_in << " is not what save() writes";
    const MemoryPages opened = MemoryPages::open(checked_in, memory, seed.config);
    EXPECT_EQ(opened.tree(0).root_count, 2);
  }
}

// memory_attention over the certified pages' candidates = memory_attention's own exact scan, output and lse; with
// P pages it attends what the pages proposed.
TEST(MemoryPages, CandidatesThroughMemoryAttentionEqualTheExactScan) {
  Fixture f(4000, 32, 2, MemoryPolicy::Exact);
  const int64_t tokens = 3, Hq = 4;
  const int k = 16;
  std::mt19937 rng(4);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> q(size_t(tokens * Hq * 32));
  for (float& x : q) x = 3 * g(rng);
  const std::vector<int64_t> q_pos{4000, 4001, 4005};
  auto run = [&](const int64_t* candidates, std::vector<float>& o, std::vector<float>& lse, std::vector<int64_t>& ids) {
    o.assign(q.size(), 0.5f);
    lse.assign(size_t(tokens * Hq), 1.0f);
    ids.assign(size_t(tokens * Hq * k), -7);
    MemoryAttentionParams p;
    p.tokens = tokens;
    p.q = {q.data(), Hq, Hq * 32, 32};
    p.q_positions = q_pos.data();
    p.top_k = k;
    p.o = {o.data(), Hq, Hq * 32, 32};
    p.lse = lse.data();
    p.candidates = candidates;
    p.retrieved = ids.data();
    memory_attention(f.memory, p);
    return p;
  };
  std::vector<float> o_exact, lse_exact, o_pages, lse_pages;
  std::vector<int64_t> ids_exact, ids_pages;
  MemoryAttentionParams p = run(nullptr, o_exact, lse_exact, ids_exact);
  MemoryPages pages(f.memory, {32, 0, PageGrouping::Keys});
  pages.sync();
  std::vector<int64_t> cand(size_t(tokens * Hq * k));
  PageSearchStats stats;
  pages.candidates(p, cand.data(), &stats);
  EXPECT_EQ(stats.queries, tokens * Hq);
  run(cand.data(), o_pages, lse_pages, ids_pages);
  EXPECT_EQ(ids_pages, ids_exact);
  for (size_t i = 0; i < o_exact.size(); ++i) ASSERT_NEAR(o_pages[i], o_exact[i], 1e-6) << i;
  for (size_t i = 0; i < lse_exact.size(); ++i) ASSERT_NEAR(lse_pages[i], lse_exact[i], 1e-6) << i;
}

// A memory stored in bf16: the boxes are over the widened stored keys, so certified search still returns the exact
// top-k of what is stored (and the oracle reads the same stored bits).
TEST(MemoryPages, HalfPrecisionMemoriesSearchTheirStoredKeys) {
  const RopeFreqs freqs = test_freqs(32);
  KvMemory memory(KvMemoryConfig{1, 32, MemoryPolicy::Exact, &freqs, 0, 0, DType::BF16});
  Fixture f(2000, 32, 1);  // its keys and values, appended again to the bf16 memory
  std::vector<float> k(size_t(2000 * 32)), v(k.size(), 0.25f);
  std::mt19937 rng(6);
  std::normal_distribution<float> g(0, 1);
  for (float& x : k) x = g(rng);
  std::vector<int64_t> pos(2000);
  for (int64_t j = 0; j < 2000; ++j) pos[size_t(j)] = j;
  memory.append(2000, {k.data(), 1, 32, 32}, {v.data(), 1, 32, 32}, pos.data());
  for (const PageGrouping g2 : {PageGrouping::Tokens, PageGrouping::Keys}) {
    MemoryPages pages(memory, {16, 0, g2});
    pages.sync();
    const std::vector<float> q = f.queries(6, 3);
    std::vector<int64_t> rows(6 * 8), ref_rows(rows.size());
    std::vector<float> scores(rows.size());
    std::vector<double> ref_scores(rows.size());
    pages.search(0, 6, q.data(), 8, rows.data(), scores.data());
    memory_pages_search_reference(memory, pages, 0, 6, q.data(), 8, ref_rows.data(), ref_scores.data());
    EXPECT_EQ(rows, ref_rows) << page_grouping_name(g2);
    std::vector<float> widened(size_t(2000 * 32));
    memory.key_rows(0, 0, 2000, widened.data());
    for (int i = 0; i < 6; ++i) {  // brute force over the widened rows
      std::vector<std::pair<double, int64_t>> all;
      for (int64_t j = 0; j < 2000; ++j) {
        double s = 0;
        for (int d = 0; d < 32; ++d) s += double(q[size_t(i * 32 + d)]) * widened[size_t(j * 32 + d)];
        all.push_back({-s, j});
      }
      std::sort(all.begin(), all.end());
      for (int j = 0; j < 8; ++j) EXPECT_EQ(rows[size_t(i * 8 + j)], all[size_t(j)].second);
    }
  }
}

TEST(MemoryPages, BadInputNamesTheField) {
  Fixture f(100, 16, 2);
  test::expect_error([&] { MemoryPages(f.memory, {0, 0}); }, {"memory_pages.page_size = 0", "1..65536"});
  test::expect_error([&] { MemoryPages(f.memory, {16, -1}); }, "memory_pages.pages_read = -1");
  test::expect_error([&] { MemoryPages(f.memory, {16, 0, PageGrouping(7)}); }, {"memory_pages.grouping = 7", "tokens or keys"});
  MemoryPages pages(f.memory, {16, 2});
  std::vector<float> q(16, 1.0f), scores(200);
  std::vector<int64_t> rows(200);
  test::expect_error([&] { pages.search(0, 1, q.data(), 4, rows.data(), scores.data()); }, "sync after appending");
  pages.sync();
  test::expect_error([&] { pages.search(2, 1, q.data(), 4, rows.data(), scores.data()); }, "kv_head = 2");
  test::expect_error([&] { pages.search(0, 1, q.data(), 0, rows.data(), scores.data()); }, "k = 0");
  test::expect_error([&] { pages.search(0, 1, q.data(), 101, rows.data(), scores.data()); }, {"k = 101", "1..the rows"});
  test::expect_error([&] { pages.search(0, 1, nullptr, 4, rows.data(), scores.data()); }, "queries");
  test::expect_error([&] { pages.set_pages_read(-3); }, "pages_read = -3");
  EXPECT_EQ(pages.config().pages_read, 2);  // a refused change keeps the old one
  f.append(100, 5, true, 1);
  test::expect_error([&] { pages.search(0, 1, q.data(), 4, rows.data(), scores.data()); }, "sync after appending");
  f.memory.clear();
  test::expect_error([&] { pages.sync(); }, "cleared");
}

}  // namespace
}  // namespace rotary
