// The memories whose files seed the kv_memory fuzz target (fuzz/corpus/kv_memory/), shared by the target (its
// fixed config is seed 0's) and tests/core/test_kv_memory.cpp (which checks that the checked-in seeds are what
// KvMemory::save writes for these, and rewrites them with ROTARY_WRITE_FUZZ_SEEDS=1). Policies that store keys
// as given, so the files do not depend on the platform's sin / cos.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rotary/kv_memory.h"
#include "rotary/rope_spec.h"

namespace rotary::fuzz {

// Seed 0's rotation: 4 of 8 features rotated, interleaved, attention factor 1.25.
inline RopeFreqs kv_memory_seed_freqs() {
  RopeFreqs f;
  f.head_dim = 8;
  f.rotary_dim = 4;
  f.layout = RopeLayout::Interleaved;
  f.inv_freq = {1.0, 0.125};
  f.attention_factor = 1.25;
  return f;
}

struct KvMemorySeed {
  std::string file;          // under fuzz/corpus/kv_memory/
  KvMemoryConfig config;     // config.freqs: null or kv_memory_seed_freqs() (the caller's copy, `freqs`)
  int64_t tokens = 0;
  uint64_t fingerprint = 0;
};

// 0: rerope (window 4, log-n 16), 2 kv heads of 8, 3 rows, fingerprint 42;
// 1: none without a rotation, 1 kv head of 4, 5 rows, no fingerprint;
// 2: rerope stored in bf16, 1 kv head of 8, 4 rows, fingerprint 7.
inline std::vector<KvMemorySeed> kv_memory_seeds(const RopeFreqs* freqs) {
  return {{"rerope_2x8_3rows.mem", {2, 8, MemoryPolicy::Rerope, freqs, 4, 16}, 3, 42},
          {"none_1x4_5rows.mem", {1, 4, MemoryPolicy::NoRotation, nullptr, 0, 0}, 5, 0},
          {"rerope_bf16_1x8_4rows.mem", {1, 8, MemoryPolicy::Rerope, freqs, 4, 0, DType::BF16}, 4, 7}};
}

// The memory of `seed`: row t of head h holds keys 0.25 (t + 1) - 0.5 h + d / 8, values the negated keys,
// positions 2t + 1.
inline KvMemory kv_memory_seed_memory(const KvMemorySeed& seed) {
  const KvMemoryConfig& c = seed.config;
  KvMemory m(c);
  const int64_t row = c.kv_heads * c.head_dim;
  std::vector<float> k(size_t(seed.tokens * row)), v(k.size());
  std::vector<int64_t> pos(size_t(seed.tokens));
  for (int64_t t = 0; t < seed.tokens; ++t) {
    pos[size_t(t)] = 2 * t + 1;
    for (int64_t h = 0; h < c.kv_heads; ++h)
      for (int d = 0; d < c.head_dim; ++d) {
        const size_t i = size_t(t * row + h * c.head_dim + d);
        k[i] = 0.25f * float(t + 1) - 0.5f * float(h) + float(d) / 8;
        v[i] = -k[i];
      }
  }
  m.append(seed.tokens, {k.data(), c.kv_heads, row, c.head_dim}, {v.data(), c.kv_heads, row, c.head_dim}, pos.data());
  return m;
}

}  // namespace rotary::fuzz
