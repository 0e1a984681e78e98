// Fuzz target: the saved KvCache's reader (core/src/kv_cache_file.h read_kv_cache_file, which KvCache::open and
// open_bytes run before copying a file's rows into a cache; a file a user points `rotary generate --context` at,
// possibly truncated or crafted). Every count of the header must be checked against the bytes: a file that reads is
// touched whole - every position, every row block and scale block its view hands out - so ASan sees any view past
// the buffer. Each input is read twice, from an exact-size heap copy (8-byte aligned, as the reader requires):
//   1. as it is: the magic, ranges and checksum checks;
//   2. with its header checksum (FNV-1a) made right: the layout against the bytes and the positions.
// (The comparisons with the expected cache are KvCache::open_bytes's, tested in tests/core/test_decode.cpp; they
// read nothing the view does not hand out.)
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kv_cache_file.h"
#include "rotary/error.h"
#include "rotary/linear.h"

namespace {

using rotary::detail::KvCacheFileHeader;

constexpr size_t kFixed = 8 + sizeof(KvCacheFileHeader);  // magic + header; then inv_freq, checksum

void touch(const void* p, size_t bytes, unsigned& sum) {
  for (size_t i = 0; i < bytes; ++i) sum += static_cast<const uint8_t*>(p)[i];
}

void read(const std::vector<uint8_t>& bytes) {
  try {
    const rotary::detail::KvCacheFileView v = rotary::detail::read_kv_cache_file(bytes.data(), bytes.size(), "fuzz");
    const KvCacheFileHeader& h = v.header;
    unsigned sum = 0;
    touch(v.positions, size_t(h.size) * sizeof(int64_t), sum);
    for (const void* rows : v.rows) touch(rows, size_t(h.size * h.row_stride * v.element_bytes), sum);
    for (const float* s : v.scales) touch(s, size_t(h.size * (h.row_stride / rotary::kQ8Block)) * sizeof(float), sum);
    if (v.rows.size() != size_t(h.arrays * h.kv_heads)) __builtin_trap();
    volatile unsigned keep = sum;
    (void)keep;
  } catch (const rotary::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);  // operator new: aligned past 8 bytes
  read(bytes);
  if (bytes.size() < kFixed) return 0;
  KvCacheFileHeader h;
  std::memcpy(&h, bytes.data() + 8, sizeof h);
  if (h.rotary_dim < 0 || h.rotary_dim > 4096) return 0;
  const size_t at = kFixed + size_t(h.rotary_dim / 2) * sizeof(double);
  if (at + 8 > bytes.size()) return 0;
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (size_t i = 8; i < at; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ULL;
  std::memcpy(bytes.data() + at, &hash, 8);
  read(bytes);
  return 0;
}
