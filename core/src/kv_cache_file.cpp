// core/src/kv_cache_file.cpp: the saved KvCache's file (kv_cache_file.h) - its head, layout and one reader.
#include "kv_cache_file.h"

#include <cmath>
#include <cstring>
#include <string>
#include <string_view>

#include "mapped_file.h"
#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/linear.h"  // kQ8Block (a constant: no kernel is linked)
#include "validate.h"

namespace rotary::detail {

constexpr int64_t kAlign = 64;  // every block starts at a multiple of this

std::string kv_cache_file_head(const KvCacheFileHeader& h, const std::vector<double>& inv_freq) {
  std::string b(reinterpret_cast<const char*>(&h), sizeof h);
  b.append(reinterpret_cast<const char*>(inv_freq.data()), inv_freq.size() * sizeof(double));
  const uint64_t hash = fnv1a64(b.data(), b.size());
  b.append(reinterpret_cast<const char*>(&hash), sizeof hash);
  return std::string(kKvCacheMagic, 8) + b;
}

KvCacheFileLayout kv_cache_file_layout(const KvCacheFileHeader& h, int64_t element_bytes, int64_t head_bytes,
                                       const std::string& where) {
  const std::string_view allowed = "counts whose blocks fit in 2^63 bytes";
  auto align = [&](int64_t n, const std::string& what) {
    return checked_add(n, kAlign - 1, where + ": " + what, allowed) / kAlign * kAlign;
  };
  auto mul = [&](int64_t a, int64_t b, const std::string& what) { return checked_mul(a, b, where + ": " + what, allowed); };
  KvCacheFileLayout l;
  l.positions = align(head_bytes, "header bytes");
  l.first_rows = align(checked_add(l.positions, mul(h.size, 8, "size x 8"), where + ": positions end", allowed),
                       "positions end");
  l.rows_block = align(mul(mul(h.size, h.row_stride, "size x row_stride"), element_bytes, "row bytes"), "row bytes");
  const int64_t blocks = mul(h.arrays, h.kv_heads, "arrays x kv_heads");
  l.first_scales = checked_add(l.first_rows, mul(blocks, l.rows_block, "row blocks"), where + ": rows end", allowed);
  l.scales_block =
      h.storage == 1 ? align(mul(mul(h.size, h.row_stride / kQ8Block, "size x scales"), 4, "scale bytes"),
                             "scale bytes")
                     : 0;
  l.total = checked_add(l.first_scales, mul(blocks, l.scales_block, "scale blocks"), where + ": scales end", allowed);
  return l;
}

KvCacheFileView read_kv_cache_file(const void* data, size_t bytes, const std::string& source) {
  const ReaderErrors errors{"kv_cache.open", source};
  auto damaged = [&](const char* field, int64_t value, const std::string& allowed) {
    return errors.damaged(field, value, allowed);
  };
  const auto* base = static_cast<const char*>(data);
  constexpr size_t kFixed = 8 + sizeof(KvCacheFileHeader);
  if (base == nullptr || bytes < kFixed || std::memcmp(base, kKvCacheMagic, 8) != 0)
    throw errors.bad("not a rotary KV cache file (no RTKVCAC1 magic)");
  errors.check_aligned(base);  // the positions and scales are int64 and float views at 64-byte multiples
  KvCacheFileView v;
  KvCacheFileHeader& h = v.header;
  std::memcpy(&h, base + 8, sizeof h);
  // Every field in the range a KvCache can write (rotary/kv_cache.h's limits), before any is used.
  if (h.kv_heads < 1 || h.kv_heads > 65536) throw damaged("kv_heads", h.kv_heads, "1..65536");
  if (h.head_dim < 1 || h.head_dim > 4096) throw damaged("head_dim", h.head_dim, "1..4096");
  if (h.mode < 0 || h.mode > 3) throw damaged("mode", h.mode, "0..3 (none, rope, rerope, leaky_rerope)");
  if (h.dtype < 0 || h.dtype > 3) throw damaged("dtype", h.dtype, "0..3 (f32, f16, bf16, f64)");
  if (h.storage < 0 || h.storage > 1 || (h.storage == 1 && h.dtype == 3))
    throw damaged("storage", h.storage, "0 (the dtype) or 1 (q8, with dtype f32, f16 or bf16)");
  if (h.size < 0 || h.size > (int64_t(1) << 34)) throw damaged("size", h.size, "0..2^34 tokens");
  const int64_t block = h.storage == 1 ? kQ8Block : 16;
  if (h.row_stride < h.head_dim || h.row_stride > 2 * 4096 + 64 || h.row_stride % block != 0)
    throw damaged("row_stride", h.row_stride,
                  "head_dim..8256 in multiples of " + std::to_string(block) + " (the cache's padded rows)");
  if (h.arrays < 2 || h.arrays > 4) throw damaged("arrays", h.arrays, "2..4 (keys, values and far copies)");
  if (h.rotary_dim < 0 || h.rotary_dim > h.head_dim || h.rotary_dim % 2 != 0 || (h.mode == 0) != (h.rotary_dim == 0))
    throw damaged("rotary_dim", h.rotary_dim, "an even number in 2..head_dim (0 for mode none)");
  if (h.layout < 0 || h.layout > 1) throw damaged("layout", h.layout, "0 (interleaved) or 1 (half-split)");
  if (h.roper < 0 || h.roper > 1) throw damaged("roper", h.roper, "0 or 1");
  const size_t pairs = size_t(h.rotary_dim / 2);
  const size_t header_end = kFixed + pairs * sizeof(double) + sizeof(uint64_t);
  if (bytes < header_end)
    throw errors.bad("truncated inside its header (" + std::to_string(bytes) + " bytes where rotary_dim = " +
                     std::to_string(h.rotary_dim) + " needs " + std::to_string(header_end) + ")");
  v.inv_freq.resize(pairs);
  if (pairs > 0) std::memcpy(v.inv_freq.data(), base + kFixed, pairs * sizeof(double));
  const std::string head = kv_cache_file_head(h, v.inv_freq);
  if (std::memcmp(head.data() + head.size() - 8, base + header_end - 8, 8) != 0)
    throw errors.bad("a damaged header (checksum)");
  v.element_bytes = h.storage == 1 ? 1 : h.dtype == 3 ? 8 : h.dtype == 0 ? 4 : 2;
  const KvCacheFileLayout lay =
      kv_cache_file_layout(h, v.element_bytes, int64_t(header_end), "kv_cache.open: " + source);
  if (uint64_t(lay.total) != uint64_t(bytes))
    throw errors.bad("size " + std::to_string(bytes) + " bytes where its header implies " + std::to_string(lay.total) +
                     (uint64_t(bytes) < uint64_t(lay.total) ? " (truncated)" : " (trailing bytes)") + " for size = " +
                     std::to_string(h.size) + " tokens, kv_heads = " + std::to_string(h.kv_heads) +
                     ", row_stride = " + std::to_string(h.row_stride));
  v.positions = reinterpret_cast<const int64_t*>(base + lay.positions);
  check_positions(v.positions, 0, h.size, "kv_cache.open " + source + ": ", false, true, nullptr);
  for (int64_t a = 0; a < h.arrays; ++a)
    for (int64_t g = 0; g < h.kv_heads; ++g) {
      v.rows.push_back(base + lay.rows_at(a, g, h.kv_heads));
      if (h.storage == 1) v.scales.push_back(reinterpret_cast<const float*>(base + lay.scales_at(a, g, h.kv_heads)));
    }
  return v;
}

}  // namespace rotary::detail
