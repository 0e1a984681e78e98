// core/src/memory_pages_file.cpp: the page index's file (rotary/memory_pages.h) - MemoryPages::save, open and
// open_bytes, the one reader of the format. The file plumbing (mapping, atomic write, FNV-1a) is mapped_file.h's.
#include <algorithm>
#include <cstring>

#include <string>
#include <utility>
#include <vector>

#include "mapped_file.h"
#include "memory_pages_impl.h"
#include "rotary/error.h"
#include "rotary/memory_pages.h"

namespace rotary {

// The page index file.
//
// All fields native little-endian, every block 64-byte aligned:
//   [0, 8)    magic "RTKVPGS1"
//   header    int64 kv_heads, head_dim, storage (rotary::DType), size (rows covered), page_size, grouping
//             (0 tokens, 1 keys), segments; uint64 memory_check (below); uint64 FNV-1a of the header bytes before it
//   body      segments int64 [segments, 2] (begin, end); then per kv head: rows int64 [size] (grouped: each node's
//             rows contiguous), boxes f32 [nodes, 2, head_dim] (each node's hi then lo), absmax f32 [head_dim]
//   uint64    FNV-1a of the body's bytes (padding included)
//   keys      per kv head, its keys in page order [size, head_dim] in the storage dtype (entry i the key of row
//             rows[i]), so the rows of a page are one block here where they are scattered over the memory's file
//             (a k-d page gathers alike keys from the whole text); not in the checksum (reading them at open is
//             what the file is for not doing). A damaged key can only change which rows a search proposes:
//             memory_attention scores the proposed rows from the memory's own keys.
// Nodes are not stored: their shape (preorder, per segment) follows from each segment's size and the page size, so
// the reader lays them out again and a file cannot describe a tree whose nodes point outside it. memory_check:
// key_rows.h's fingerprint of the memory the index was built over.
using detail::memory_check;

namespace {

constexpr char kPagesMagic[8] = {'R', 'T', 'K', 'V', 'P', 'G', 'S', '1'};
constexpr int64_t kAlign = 64;
constexpr int64_t kMaxSegments = 64;  // a binary counter over at most 2^40 rows keeps ~41

struct PagesHeader {
  int64_t kv_heads = 0, head_dim = 0, storage = 0, size = 0, page_size = 0, grouping = 0, segments = 0;
  uint64_t memory_check = 0;
};

int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Offsets of the body's blocks. Every count has been compared with the memory's (which exists in RAM or a
// mapping) before this runs, so the sizes are bounded by real data; the products are still checked.
struct PagesLayout {
  int64_t body = 0, head0 = 0, rows = 0, boxes = 0, absmax = 0, per_head = 0, checksum = 0, keys0 = 0, keys = 0,
          total = 0;
};

PagesLayout pages_layout(const PagesHeader& h, int64_t nodes, const std::string& where) {
  const std::string_view allowed = "counts whose blocks fit in 2^63 bytes";
  PagesLayout l;
  l.body = align_up(8 + int64_t(sizeof(PagesHeader)) + 8);
  l.head0 = align_up(l.body + checked_mul(h.segments, 16, where + ": segments x 16", allowed));
  l.rows = align_up(checked_mul(h.size, 8, where + ": size x 8", allowed));
  l.boxes = align_up(checked_mul(checked_mul(nodes, 2 * h.head_dim, where + ": nodes x 2 head_dim", allowed), 4,
                                 where + ": box bytes", allowed));
  l.absmax = align_up(4 * h.head_dim);
  l.per_head = l.rows + l.boxes + l.absmax;
  l.checksum = l.head0 + checked_mul(h.kv_heads, l.per_head, where + ": kv_heads x head bytes", allowed);
  l.keys0 = align_up(l.checksum + 8);
  l.keys = align_up(checked_mul(checked_mul(h.size, h.head_dim, where + ": size x head_dim", allowed),
                                int64_t(dtype_size(DType(h.storage))), where + ": key bytes", allowed));
  l.total = l.keys0 + checked_mul(h.kv_heads, l.keys, where + ": kv_heads x key bytes", allowed);
  return l;
}

// Nodes and roots of every segment, as lay_out_tree makes them without grouping.
void lay_out_nodes(detail::HeadTrees& t, const std::vector<detail::PageSegment>& segments,
                   const MemoryPagesConfig& c, int64_t D) {
  std::vector<float> unused;
  t.nodes.clear(), t.roots.clear();
  for (const detail::PageSegment& s : segments)
    t.roots.push_back(detail::lay_out_tree(t, nullptr, D, c, s.begin, s.end - s.begin, unused));
}

}  // namespace

void MemoryPages::save(const std::string& path) const {
  const Impl& m = *impl_;
  check(m.covered == m.memory->size(), "memory_pages.save rows grouped", m.covered,
        "the memory's size " + std::to_string(m.memory->size()) + " (sync after appending)");
  PagesHeader h;
  h.kv_heads = m.memory->kv_heads(), h.head_dim = m.memory->head_dim(), h.storage = int64_t(m.memory->storage());
  h.size = m.covered, h.page_size = m.config.page_size, h.grouping = int64_t(m.config.grouping);
  h.segments = int64_t(m.segments.size()), h.memory_check = memory_check(*m.memory);
  const int64_t nodes = m.heads.empty() ? 0 : int64_t(m.heads[0].nodes.size());
  const PagesLayout lay = pages_layout(h, nodes, "memory_pages.save: " + path);
  write_file_atomic(path, "memory_pages.save", [&](FileSink& out) {
    out.write(kPagesMagic, 8);
    out.write(&h, sizeof h);
    const uint64_t header_hash = fnv1a64(&h, sizeof h);
    out.write(&header_hash, sizeof header_hash);
    out.pad_to(uint64_t(lay.body));
    detail::HashingSink body(out);
    for (const detail::PageSegment& s : m.segments) body.write(&s.begin, 8), body.write(&s.end, 8);
    for (int64_t k = 0; k < h.kv_heads; ++k) {
      const detail::HeadTrees& t = m.heads[size_t(k)];
      const int64_t at = lay.head0 + k * lay.per_head;
      body.pad_to(uint64_t(at));
      body.write(t.rows_at, size_t(h.size) * 8);
      body.pad_to(uint64_t(at + lay.rows));
      body.write(t.boxes_at, size_t(nodes * 2 * h.head_dim) * 4);
      body.pad_to(uint64_t(at + lay.rows + lay.boxes));
      body.write(t.absmax_at, size_t(h.head_dim) * 4);
    }
    body.pad_to(uint64_t(lay.checksum));
    const uint64_t body_hash = body.hash();
    out.write(&body_hash, sizeof body_hash);
    const int64_t row_bytes = h.head_dim * int64_t(dtype_size(m.memory->storage()));
    std::vector<char> block;
    for (int64_t k = 0; k < h.kv_heads; ++k) {
      out.pad_to(uint64_t(lay.keys0 + k * lay.keys));
      const char* keys = static_cast<const char*>(m.memory->key_data(k));
      const int64_t* rows = m.heads[size_t(k)].rows_at;
      for (int64_t first = 0; first < h.size; first += 4096) {  // gathered a block of rows at a time
        const int64_t n = std::min<int64_t>(4096, h.size - first);
        block.resize(size_t(n * row_bytes));
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(block.data() + i * row_bytes, keys + rows[first + i] * row_bytes, size_t(row_bytes));
        out.write(block.data(), block.size());
      }
    }
    out.pad_to(uint64_t(lay.total));
  });
}

MemoryPages MemoryPages::open(const std::string& path, const KvMemory& memory, const MemoryPagesConfig& config) {
  config.validate();  // before the file is looked at
  detail::MappedFile map = detail::MappedFile::open(path, "memory_pages.open path",
                                                    "a rotary page index file (a regular file)", "memory_pages.open");
  MemoryPages pages = open_bytes(map.data(), map.size(), memory, config, path);  // the one reader of the format
  map.advise(detail::MappedFile::Access::Random);  // read whole for its checksums; searches then read scattered boxes
  pages.impl_->map = std::move(map);  // the index owns the mapping its views point into
  return pages;
}

MemoryPages MemoryPages::open_bytes(const void* data, size_t bytes, const KvMemory& memory,
                                    const MemoryPagesConfig& config, const std::string& source) {
  MemoryPages pages(memory, config);  // validates the config
  const detail::ReaderErrors errors{"memory_pages.open", source};
  auto bad = [&](const std::string& what) { return errors.bad(what); };
  auto damaged = [&](const char* field, int64_t value, const std::string& allowed) {
    return errors.damaged(field, value, allowed);
  };
  const auto* base = static_cast<const char*>(data);
  const size_t fixed = 8 + sizeof(PagesHeader) + 8;
  if (base == nullptr || bytes < fixed || std::memcmp(base, kPagesMagic, 8) != 0)
    throw bad("not a rotary page index file (no RTKVPGS1 magic)");
  errors.check_aligned(base);
  PagesHeader h;
  std::memcpy(&h, base + 8, sizeof h);
  uint64_t header_hash = 0;
  std::memcpy(&header_hash, base + 8 + sizeof h, 8);
  if (header_hash != fnv1a64(&h, sizeof h)) throw bad("a damaged header (checksum)");
  detail::check_index_file_memory(errors, h.kv_heads, h.head_dim, h.storage, h.size, h.memory_check, memory);
  if (h.page_size < 1 || h.page_size > 65536) throw damaged("page_size", h.page_size, "1..65536");
  if (h.grouping != int64_t(PageGrouping::Tokens) && h.grouping != int64_t(PageGrouping::Keys))
    throw damaged("grouping", h.grouping, "0 (tokens) or 1 (keys)");
  if (h.segments < (h.size > 0 ? 1 : 0) || h.segments > std::min<int64_t>(kMaxSegments, h.size))
    throw damaged("segments", h.segments,
                  h.size > 0 ? "1..min(64, size = " + std::to_string(h.size) + ")" : std::string("0 (no rows)"));
  // The run's settings against the file, before any block is looked at.
  auto differs = [&](const std::string& field, const std::string& file, const std::string& want) {
    return bad("written for " + field + " = " + file + ", " + want);
  };
  if (h.page_size != config.page_size)
    throw differs("page_size", std::to_string(h.page_size), "this run asks " + std::to_string(config.page_size));
  if (h.grouping != int64_t(config.grouping))
    throw differs("grouping", page_grouping_name(PageGrouping(h.grouping)),
                  std::string("this run asks ") + page_grouping_name(config.grouping));
  // The segments, then the nodes they imply, then the layout against the bytes there are.
  const int64_t body_at = align_up(int64_t(fixed));
  if (uint64_t(bytes) < uint64_t(body_at + 16 * h.segments))
    throw bad("truncated inside its segments (" + std::to_string(bytes) + " bytes)");
  Impl& m = *pages.impl_;
  int64_t covered = 0;
  for (int64_t s = 0; s < h.segments; ++s) {
    detail::PageSegment seg;
    std::memcpy(&seg.begin, base + body_at + 16 * s, 8);
    std::memcpy(&seg.end, base + body_at + 16 * s + 8, 8);
    if (seg.begin != covered || seg.end <= seg.begin || seg.end > h.size)
      throw bad("a damaged body: segment " + std::to_string(s) + " = [" + std::to_string(seg.begin) + ", " +
                std::to_string(seg.end) + ") is invalid; allowed: non-empty, from row " + std::to_string(covered) +
                ", within the " + std::to_string(h.size) + " rows");
    covered = seg.end;
    m.segments.push_back(seg);
  }
  if (covered != h.size)
    throw bad("a damaged body: the segments cover " + std::to_string(covered) + " of " + std::to_string(h.size) +
              " rows");
  const int64_t D = h.head_dim;
  for (detail::HeadTrees& t : m.heads) lay_out_nodes(t, m.segments, config, D);
  const int64_t nodes = m.heads.empty() ? 0 : int64_t(m.heads[0].nodes.size());
  const PagesLayout lay = pages_layout(h, nodes, "memory_pages.open: " + source);
  if (uint64_t(lay.total) != uint64_t(bytes))
    throw bad("size " + std::to_string(bytes) + " bytes where its header implies " + std::to_string(lay.total) +
              (uint64_t(bytes) < uint64_t(lay.total) ? " (truncated)" : " (trailing bytes)") + " for size = " +
              std::to_string(h.size) + " rows, kv_heads = " + std::to_string(h.kv_heads) + ", head_dim = " +
              std::to_string(D) + ", page_size = " + std::to_string(h.page_size));
  uint64_t body_hash = 0;
  std::memcpy(&body_hash, base + lay.checksum, 8);
  if (body_hash != fnv1a64(base + lay.body, size_t(lay.checksum - lay.body)))
    throw bad("a damaged body (checksum)");
  // Each segment's rows a permutation of its own rows: a search indexes the memory with them.
  std::vector<uint8_t> seen(static_cast<size_t>(h.size));
  for (int64_t k = 0; k < h.kv_heads; ++k) {
    detail::HeadTrees& t = m.heads[size_t(k)];
    const char* at = base + lay.head0 + k * lay.per_head;
    t.rows_at = reinterpret_cast<const int64_t*>(at);
    t.boxes_at = reinterpret_cast<const float*>(at + lay.rows);
    t.absmax_at = reinterpret_cast<const float*>(at + lay.rows + lay.boxes);
    t.keys_at = base + lay.keys0 + k * lay.keys;
    std::fill(seen.begin(), seen.end(), uint8_t(0));
    for (const detail::PageSegment& seg : m.segments)
      for (int64_t i = seg.begin; i < seg.end; ++i) {
        const int64_t row = t.rows_at[i];
        if (row < seg.begin || row >= seg.end || seen[size_t(row)])
          throw bad("a damaged body: kv head " + std::to_string(k) + " rows[" + std::to_string(i) +
                    "] = " + std::to_string(row) + " is invalid; allowed: each row of its segment [" +
                    std::to_string(seg.begin) + ", " + std::to_string(seg.end) + ") once");
        seen[size_t(row)] = 1;
      }
  }
  m.covered = h.size;
  m.from_bytes = true;
  return pages;
}

}  // namespace rotary
