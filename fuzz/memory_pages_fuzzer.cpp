// Fuzz target: MemoryPages::open_bytes (rotary/memory_pages.h), the one reader of a page index file (open() runs
// it on its mapping; a file a user points us at, possibly truncated or crafted), over the memory its seeds were
// saved for (fuzz/memory_pages_seeds.h). An index that loads is used: every row, node and box of every head's
// tree read, and certified and budgeted searches run, so ASan sees any view past the buffer and any row index
// past the memory. Each input is read twice, from an exact-size heap copy (8-byte aligned, as the reader
// requires), with the page size and grouping its header names (so mutated ones are laid out):
//   1. as it is: the magic, ranges and both checksums;
//   2. with both checksums (FNV-1a, docs/memory.md) made right: the segments, the layout against the size, the
//      rows' permutation check, and searches over whatever boxes it holds.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "memory_pages_seeds.h"
#include "rotary/error.h"
#include "rotary/memory_pages.h"

namespace {

constexpr size_t kHeaderFields = 8;           // after the magic: int64 x 7, uint64 memory_check
constexpr size_t kHeaderHash = 8 + 64;        // FNV-1a of the fields
constexpr size_t kBody = 128;                 // the body's first byte (64-aligned after the header)

uint64_t fnv(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

int64_t field(const std::vector<uint8_t>& b, int i, int64_t fallback) {
  if (b.size() < kHeaderFields + 8 * size_t(i + 1)) return fallback;
  int64_t v = 0;
  std::memcpy(&v, b.data() + kHeaderFields + 8 * size_t(i), 8);
  return v;
}

volatile uint64_t sink;

void use(rotary::MemoryPages& pages, const rotary::KvMemory& memory) {
  uint64_t sum = 0;
  for (int64_t h = 0; h < memory.kv_heads(); ++h) {
    const rotary::PageTree t = pages.tree(h);
    for (int64_t i = 0; i < pages.size(); ++i) sum += uint64_t(t.rows[i]);
    for (int64_t i = 0; i < t.node_count; ++i) {
      sum += uint64_t(t.nodes[i].first + t.nodes[i].count + t.nodes[i].left + t.nodes[i].right);
      for (int64_t d = 0; d < 2 * memory.head_dim(); ++d) {
        uint32_t bits = 0;
        std::memcpy(&bits, t.boxes + i * 2 * memory.head_dim() + d, 4);
        sum += bits;
      }
    }
    for (int64_t r = 0; r < t.root_count; ++r) sum += uint64_t(t.roots[r]);
  }
  if (pages.size() > 0) {
    const int k = int(std::min<int64_t>(3, pages.size()));
    const float queries[2 * 4] = {1.0f, -0.5f, 0.25f, 2.0f, -1.0f, 0.0f, 0.5f, -0.125f};
    std::vector<int64_t> rows(size_t(2 * k));
    std::vector<float> scores(rows.size());
    for (int64_t pages_read : {0, 2}) {
      pages.set_pages_read(pages_read);
      for (int64_t h = 0; h < memory.kv_heads(); ++h) {
        pages.search(h, 2, queries, k, rows.data(), scores.data(), nullptr, 1);
        for (int64_t r : rows) sum += uint64_t(r);
      }
    }
  }
  sink = sum;
}

void try_open(const std::vector<uint8_t>& bytes, const rotary::KvMemory& memory) {
  rotary::MemoryPagesConfig config;
  const int64_t page_size = field(bytes, 4, 4), grouping = field(bytes, 5, 0);
  config.page_size = page_size >= 1 && page_size <= 65536 ? page_size : 4;
  config.grouping = grouping == 1 ? rotary::PageGrouping::Keys : rotary::PageGrouping::Tokens;
  std::vector<int64_t> aligned((bytes.size() + 7) / 8);
  if (!bytes.empty()) std::memcpy(aligned.data(), bytes.data(), bytes.size());
  try {
    rotary::MemoryPages pages =
        rotary::MemoryPages::open_bytes(aligned.data(), bytes.size(), memory, config, "fuzz input");
    use(pages, memory);
  } catch (const rotary::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const rotary::KvMemory memory = rotary::fuzz::pages_seed_memory();
  std::vector<uint8_t> bytes(data, data + size);
  try_open(bytes, memory);
  if (bytes.size() >= kBody + 8) {
    const uint64_t header = fnv(bytes.data() + 8, kHeaderHash - 8);
    std::memcpy(bytes.data() + kHeaderHash, &header, 8);
    const uint64_t body = fnv(bytes.data() + kBody, bytes.size() - 8 - kBody);
    std::memcpy(bytes.data() + bytes.size() - 8, &body, 8);
    try_open(bytes, memory);
  }
  return 0;
}
