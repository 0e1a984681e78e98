// Fuzz target: KvMemory::open_bytes (rotary/kv_memory.h), the one reader of a retrieval memory file (open() runs
// it on its mapping; a file a user points us at, possibly truncated or crafted). Every count of the header must
// be checked against the bytes: a memory that loads is queried - a search query and row_logit of every row of
// every head, memory attention and its oracle over all rows, every byte of every view summed - so ASan sees any
// view past the buffer. Each input is read three ways, all from an exact-size heap copy (8-byte aligned, as the
// reader requires; ASan catches one byte too far):
//   1. as it is, expecting seed 0's config (fuzz/kv_memory_seeds.h): the magic, ranges and checksum checks;
//   2. with its header checksum (FNV-1a, docs/memory.md) made right, expecting seed 0's config: the comparisons
//      with the model's config;
//   3. the same bytes expecting the config the header itself describes (kv_heads, head_dim, policy, window, log-n,
//      the rotation and the fingerprint read from it): any header whose layout matches the size loads, so the
//      views of mutated counts are read.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "kv_memory_seeds.h"
#include "rotary/error.h"
#include "rotary/kv_memory.h"

namespace {

constexpr size_t kFields = 8;        // after the magic: int64 x 9, uint64 fingerprint, double attention factor,
                                     // int64 storage
constexpr size_t kHeader = 8 + 96;   // magic + those fields; then double inv_freq[rotary_dim / 2], uint64 checksum

int64_t field(const std::vector<uint8_t>& b, int i) {
  int64_t v = 0;
  std::memcpy(&v, b.data() + kFields + 8 * size_t(i), 8);
  return v;
}

// Where the checksum sits for this header, if inside the bytes.
std::optional<size_t> checksum_at(const std::vector<uint8_t>& b) {
  if (b.size() < kHeader) return std::nullopt;
  const int64_t has_freqs = field(b, 6), rotary_dim = field(b, 7);
  const uint64_t pairs = has_freqs == 1 && rotary_dim >= 0 && rotary_dim <= 4096 ? uint64_t(rotary_dim / 2) : 0;
  const uint64_t at = kHeader + 8 * pairs;
  if (at + 8 > b.size()) return std::nullopt;
  return size_t(at);
}

void touch(const void* p, size_t bytes, unsigned& sum) {
  for (size_t i = 0; i < bytes; ++i) sum += static_cast<const uint8_t*>(p)[i];
}

void query(const rotary::KvMemory& m) {
  if (!m.read_only()) std::abort();  // a memory on borrowed bytes never appends
  const int64_t H = m.kv_heads(), N = m.size();
  const int D = m.head_dim();
  unsigned sum = 0;
  touch(m.positions(), size_t(N) * sizeof(int64_t), sum);
  const size_t element = rotary::dtype_size(m.storage());
  for (int64_t h = 0; h < H; ++h) {
    touch(m.key_data(h), size_t(N) * size_t(D) * element, sum);
    touch(m.value_data(h), size_t(N) * size_t(D) * element, sum);
  }
  std::vector<float> q(static_cast<size_t>(D)), sq(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) q[size_t(d)] = 0.25f * float(d % 7) - 0.5f;
  const int64_t pos = 1000;
  m.search_query(q.data(), pos, 0, sq.data());
  double logits = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t row = 0; row < N; ++row) logits += m.row_logit(q.data(), pos, h, row, 0, 0, 0);
  if (N > 0) {  // then H x N x D x 8 bytes lie inside the input: the buffers below are small
    std::vector<float> qs(static_cast<size_t>(H * D)), o(static_cast<size_t>(H * D), 0.f), lse(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) std::memcpy(qs.data() + h * D, q.data(), size_t(D) * sizeof(float));
    rotary::MemoryAttentionParams p;
    p.tokens = 1;
    p.q = {qs.data(), H, H * D, D};
    p.q_positions = &pos;
    p.top_k = int(std::min<int64_t>(N, 4));
    p.o = {o.data(), H, H * D, D};
    p.lse = lse.data();
    p.threads = 1;
    for (const bool reference : {false, true}) {
      std::fill(o.begin(), o.end(), 0.f);
      std::fill(lse.begin(), lse.end(), -std::numeric_limits<float>::infinity());
      if (reference) {
        rotary::memory_attention_reference(m, p);
      } else {
        rotary::memory_attention(m, p);
      }
      for (const float x : o) logits += double(x);
    }
  }
  volatile double keep = logits + sum;
  (void)keep;
}

void read(const std::vector<uint8_t>& bytes, const rotary::KvMemoryConfig& cfg, uint64_t fingerprint) {
  try {
    query(rotary::KvMemory::open_bytes(bytes.data(), bytes.size(), cfg, fingerprint, "fuzz"));
  } catch (const rotary::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const rotary::RopeFreqs seed_freqs = rotary::fuzz::kv_memory_seed_freqs();
  static const rotary::fuzz::KvMemorySeed seed = rotary::fuzz::kv_memory_seeds(&seed_freqs)[0];
  std::vector<uint8_t> bytes(data, data + size);  // operator new: aligned past 8 bytes
  read(bytes, seed.config, seed.fingerprint);

  const std::optional<size_t> at = checksum_at(bytes);
  if (!at) return 0;
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (size_t i = kFields; i < *at; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  std::memcpy(bytes.data() + *at, &hash, 8);
  read(bytes, seed.config, seed.fingerprint);

  // The config the header describes, where its fields can be one (the KvMemory constructor checks the rest).
  const int64_t kv_heads = field(bytes, 0), head_dim = field(bytes, 1), policy = field(bytes, 2),
                has_freqs = field(bytes, 6), rotary_dim = field(bytes, 7), layout = field(bytes, 8),
                storage = field(bytes, 11);
  if (head_dim < 2 || head_dim > 4096 || policy < 0 || policy > 3 || storage < 0 || storage > 2) return 0;
  rotary::RopeFreqs freqs;
  rotary::KvMemoryConfig cfg;
  cfg.kv_heads = kv_heads;
  cfg.head_dim = int(head_dim);
  cfg.policy = rotary::MemoryPolicy(policy);
  cfg.window = field(bytes, 3);
  cfg.logn_train_len = field(bytes, 4);
  cfg.storage = rotary::DType(storage);
  if (has_freqs == 1) {
    // (rotary_dim outside 0..4096: checksum_at placed the checksum as if there were no frequencies)
    if (layout < 0 || layout > 1 || rotary_dim < 0 || rotary_dim > 4096) return 0;
    freqs.head_dim = int(head_dim);
    freqs.rotary_dim = int(rotary_dim);  // its inv_freq inside the bytes: checksum_at
    freqs.layout = rotary::RopeLayout(layout);
    freqs.inv_freq.resize(size_t(rotary_dim / 2));
    if (!freqs.inv_freq.empty())
      std::memcpy(freqs.inv_freq.data(), bytes.data() + kHeader, freqs.inv_freq.size() * sizeof(double));
    std::memcpy(&freqs.attention_factor, bytes.data() + kFields + 80, sizeof(double));
    cfg.freqs = &freqs;
  }
  uint64_t fingerprint = 0;
  std::memcpy(&fingerprint, bytes.data() + kFields + 72, sizeof fingerprint);
  read(bytes, cfg, fingerprint);
  return 0;
}
