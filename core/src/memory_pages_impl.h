// core/src/memory_pages_impl.h (internal): MemoryPages' state, shared by memory_pages.cpp (grouping, search) and
// memory_pages_file.cpp (save, open, open_bytes).
#pragma once

#include <cstdint>
#include <vector>

#include "key_rows.h"
#include "mapped_file.h"
#include "rotary/memory_pages.h"
#include "storage.h"

namespace rotary {
namespace detail {

struct PageSegment {
  int64_t begin = 0, end = 0;  // memory rows [begin, end)
};

// One kv head's trees: a tree per segment, nodes in preorder, the segments' trees one after the other.
struct HeadTrees {
  std::vector<int64_t> rows;     // [N] grouped
  std::vector<PageNode> nodes;
  std::vector<float> boxes;      // [nodes, 2, D]
  std::vector<int64_t> roots;    // per segment
  std::vector<float> absmax;     // [D]: max |key_d| over the rows covered (the certificate's slack)
  // What a search reads: the vectors above, or for an index opened from a file its mapping (rows, boxes and
  // absmax are then not copied; nodes and roots are laid out again from the segments).
  const int64_t* rows_at = nullptr;
  const float* boxes_at = nullptr;
  const float* absmax_at = nullptr;
  // An opened index: the keys in page order ([N, D] in the memory's storage, entry i the key of rows_at[i]), so a
  // page's keys are one block of the file rather than rows scattered over the memory's. Null: the memory's keys.
  const void* keys_at = nullptr;
  void read_owned() { rows_at = rows.data(), boxes_at = boxes.data(), absmax_at = absmax.data(); }
};

// The subtree over rows[first, first + count) of t, nodes appended in preorder; returns its node. The shape
// depends on count and the page size alone (every page full but the last of a segment). With K, the rows are
// grouped (Keys: a k-d split) and each node's box computed; without, only the nodes are laid out (an index read
// from a file, whose rows and boxes are the file's).
int64_t lay_out_tree(HeadTrees& t, const KeyRows* K, int64_t D, const MemoryPagesConfig& c, int64_t first,
                     int64_t count, std::vector<float>& buf);

}  // namespace detail

struct MemoryPages::Impl {
  const KvMemory* memory = nullptr;
  MemoryPagesConfig config;
  int64_t covered = 0;
  std::vector<detail::PageSegment> segments;
  std::vector<detail::HeadTrees> heads;
  detail::MappedFile map;  // an index opened from a file: the mapping rows_at / boxes_at / absmax_at point into
  bool from_bytes = false; // opened (open / open_bytes): read-only, cannot grow
};

}  // namespace rotary
