// core/src/kv_cache_file.h (internal): the file of a saved KvCache (KvCache::save / open, rotary/kv_cache.h) - its
// header, its layout and its one reader, apart from the cache so that the fuzz target reads files without the
// cache's kernels. The file plumbing (mapping, atomic write, checksum, reader errors) is mapped_file.h's.
//
// All fields native little-endian, every block 64-byte aligned:
//   [0, 8)   magic "RTKVCAC1"
//   header   KvCacheFileHeader (int64 x 13, double x 2, uint64 fingerprint); double inv_freq[rotary_dim / 2];
//            uint64 FNV-1a of the header bytes before it
//   blocks   positions int64 [size]; then per stored array (keys, Leaky's far keys, values, RoPER-Leaky's far
//            values: `arrays` of them, in that order) and kv head its rows [size, row_stride] (elements of the
//            dtype, or int8 with storage q8); then, with storage q8, per array and kv head the rows' scales
//            [size, row_stride / 32] float
// The file's size must be exactly what the header implies (a truncated or padded file is refused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rotary::detail {

struct KvCacheFileHeader {
  int64_t kv_heads = 0, head_dim = 0, mode = 0, window = 0, logn_train_len = 0, roper = 0, dtype = 0, storage = 0,
          size = 0, row_stride = 0, arrays = 0, rotary_dim = 0, layout = 0;
  double leaky_k = 1, attention_factor = 1;
  uint64_t fingerprint = 0;
};

// Byte offsets of the blocks, from counts in checked arithmetic (a header whose blocks would pass 2^63 bytes is
// refused by name, never wrapped).
struct KvCacheFileLayout {
  int64_t positions = 0, first_rows = 0, rows_block = 0, first_scales = 0, scales_block = 0, total = 0;
  int64_t rows_at(int64_t array, int64_t head, int64_t heads) const { return first_rows + (array * heads + head) * rows_block; }
  int64_t scales_at(int64_t array, int64_t head, int64_t heads) const {
    return first_scales + (array * heads + head) * scales_block;
  }
};

// A file's contents, checked: the magic, every field in the range the writer writes, the header checksum, the size
// against the layout, the positions increasing within |p| <= 2^53. Views into the bytes given.
struct KvCacheFileView {
  KvCacheFileHeader header;
  std::vector<double> inv_freq;          // rotary_dim / 2 of them
  const int64_t* positions = nullptr;    // [size]
  std::vector<const void*> rows;         // [arrays x kv_heads]: [size, row_stride] elements each
  std::vector<const float*> scales;      // storage q8: [arrays x kv_heads]: [size, row_stride / 32] each; else empty
  int64_t element_bytes = 0;             // of a row's elements (1 with storage q8)
};

inline constexpr char kKvCacheMagic[8] = {'R', 'T', 'K', 'V', 'C', 'A', 'C', '1'};

// The magic and header bytes of a file (the checksum appended).
std::string kv_cache_file_head(const KvCacheFileHeader& h, const std::vector<double>& inv_freq);
// The blocks' offsets after a head of `head_bytes`; `where` names the reader or writer in errors.
KvCacheFileLayout kv_cache_file_layout(const KvCacheFileHeader& h, int64_t element_bytes, int64_t head_bytes,
                                       const std::string& where);
// The one reader (bytes 8-byte aligned). Errors "rotary: kv_cache.open: <source>: ...".
KvCacheFileView read_kv_cache_file(const void* data, size_t bytes, const std::string& source);

}  // namespace rotary::detail
