// The page indexes whose files seed the memory_pages fuzz target (fuzz/corpus/memory_pages/), shared by the target
// and tests/core/test_memory_pages.cpp (which checks that the checked-in seeds are what MemoryPages::save writes
// for these, and rewrites them with ROTARY_WRITE_FUZZ_SEEDS=1). The memory is the same for every seed and is
// built by the target itself: an index only opens over the rows it was saved with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rotary/kv_memory.h"
#include "rotary/memory_pages.h"

namespace rotary::fuzz {

inline constexpr int64_t kPagesSeedRows = 40;     // the memory's rows, appended as 24 then 16 (two segments)
inline constexpr int64_t kPagesSeedFirstRows = 24;

// 2 kv heads of 4, no rotation, f32: row t of head h holds key k_d = 0.25 (t % 9) - 0.5 h + d / 8 + drift (t / 9)
// (keys that repeat in part, as a trained model's do), value -k, position 3t. (The graph seeds take drift 1/8, so
// that every key is a multiple of 1/8: memory_graph_seeds.h.)
inline void append_pages_seed_rows(KvMemory& m, int64_t from, int64_t to, float drift = 0.1f) {
  const int64_t H = 2, D = 4, n = to - from;
  std::vector<float> k(size_t(n * H * D)), v(k.size());
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t t = from; t < to; ++t) {
    pos[size_t(t - from)] = 3 * t;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        const size_t i = size_t(((t - from) * H + h) * D + d);
        k[i] = 0.25f * float(t % 9) - 0.5f * float(h) + float(d) / 8 + drift * float(t / 9);
        v[i] = -k[i];
      }
  }
  m.append(n, {k.data(), H, H * D, D}, {v.data(), H, H * D, D}, pos.data());
}

inline KvMemoryConfig pages_seed_memory_config() { return {2, 4, MemoryPolicy::NoRotation, nullptr, 0, 0}; }

// The whole memory, as an index of a seed is opened over.
inline KvMemory pages_seed_memory() {
  KvMemory m(pages_seed_memory_config());
  append_pages_seed_rows(m, 0, kPagesSeedRows);
  return m;
}

struct MemoryPagesSeed {
  std::string file;  // under fuzz/corpus/memory_pages/
  MemoryPagesConfig config;
};

inline std::vector<MemoryPagesSeed> memory_pages_seeds() {
  return {{"tokens_p4.pages", {4, 0, PageGrouping::Tokens}}, {"keys_p3.pages", {3, 0, PageGrouping::Keys}}};
}

// Seed `s`'s index written to `path`: synced over the first 24 rows, then over all 40 (two segments).
inline void write_pages_seed(const MemoryPagesSeed& s, const std::string& path) {
  KvMemory m(pages_seed_memory_config());
  append_pages_seed_rows(m, 0, kPagesSeedFirstRows);
  MemoryPages pages(m, s.config);
  pages.sync();
  append_pages_seed_rows(m, kPagesSeedFirstRows, kPagesSeedRows);
  pages.sync();
  pages.save(path);
}

}  // namespace rotary::fuzz
