// content_hash64: blocks hashed independently (so on any number of threads with the same result), then folded in
// order. The round and the avalanche are xxHash64's constants and shape; the blocking and folding are ours.
#include "rotary/content_hash.h"

#include "mapped_file.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace rotary {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL, kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL, kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t mix_round(uint64_t acc, uint64_t word) { return rotl(acc + word * kP2, 31) * kP1; }
inline uint64_t merge(uint64_t h, uint64_t lane) { return (h ^ mix_round(0, lane)) * kP1 + kP4; }
inline uint64_t avalanche(uint64_t h) {
  h ^= h >> 33, h *= kP2, h ^= h >> 29, h *= kP3, h ^= h >> 32;
  return h;
}
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint64_t hash_block(const unsigned char* p, size_t n, uint64_t seed) {
  uint64_t a = seed + kP1 + kP2, b = seed + kP2, c = seed, d = seed - kP1;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = mix_round(a, load64(p + i)), b = mix_round(b, load64(p + i + 8));
    c = mix_round(c, load64(p + i + 16)), d = mix_round(d, load64(p + i + 24));
  }
  uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
  h = merge(merge(merge(merge(h, a), b), c), d);
  h += uint64_t(n);
  for (; i + 8 <= n; i += 8) h = rotl(h ^ mix_round(0, load64(p + i)), 27) * kP1 + kP4;
  for (; i < n; ++i) h = rotl(h ^ (uint64_t(p[i]) * kP5), 11) * kP1;
  return avalanche(h);
}

}  // namespace

uint64_t content_hash_mix(uint64_t hash, uint64_t value) { return avalanche(rotl(hash ^ mix_round(0, value), 27) * kP1 + kP4); }

uint64_t content_hash64(const void* data, size_t bytes, uint64_t seed, int threads) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t blocks = (bytes + kContentHashBlock - 1) / kContentHashBlock;
  uint64_t h = content_hash_mix(seed, uint64_t(bytes));
  if (blocks <= 1) return content_hash_mix(h, hash_block(p, bytes, seed));
  std::vector<uint64_t> block_hash(blocks);
  const int t = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(t)
  for (int64_t b = 0; b < int64_t(blocks); ++b) {
    const size_t at = size_t(b) * kContentHashBlock;
    block_hash[size_t(b)] = hash_block(p + at, std::min(kContentHashBlock, bytes - at), seed);
  }
  for (uint64_t bh : block_hash) h = content_hash_mix(h, bh);
  return h;
}

uint64_t content_hash_file(const std::string& path, std::string_view field, int64_t* bytes, int threads) {
  const detail::MappedFile map = detail::MappedFile::open(path, field, "a readable regular file", field);
  if (bytes) *bytes = int64_t(map.size());
  return content_hash64(map.data(), map.size(), 0, threads);
}

}  // namespace rotary
