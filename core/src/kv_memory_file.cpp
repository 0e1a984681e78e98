// core/src/kv_memory_file.cpp: the retrieval memory's file (rotary/kv_memory.h) - KvMemory::save, open and
// open_bytes, the one reader of the format. The file plumbing (mapping, atomic write, checksum) is mapped_file.h's.
#include <cstring>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kv_memory_impl.h"
#include "mapped_file.h"
#include "rotary/error.h"
#include "rotary/kv_memory.h"
#include "validate.h"

namespace rotary {

// The memory file.
//
// All fields native little-endian, every block 64-byte aligned:
//   [0, 8)    magic "RTKVMEM2"
//   header    int64 kv_heads, head_dim, policy, window, logn_train_len, size, has_freqs, rotary_dim, layout;
//             uint64 fingerprint; double attention_factor; int64 storage (rotary::DType: 0 f32, 1 f16, 2 bf16);
//             double inv_freq[rotary_dim / 2]; uint64 FNV-1a of the header bytes before it
//   blocks    positions int64 [size]; then per kv head keys [size, D], values [size, D] in the storage dtype
// The file's size must be exactly what the header implies (a truncated or padded file is refused). The first
// format, "RTKVMEM1", has no storage field (f32): it is still read.
namespace {

constexpr char kMemoryMagic[8] = {'R', 'T', 'K', 'V', 'M', 'E', 'M', '2'};
constexpr char kMemoryMagicF32Only[8] = {'R', 'T', 'K', 'V', 'M', 'E', 'M', '1'};
constexpr size_t kAlign = 64;

struct FileHeader {
  int64_t kv_heads = 0, head_dim = 0, policy = 0, window = 0, logn_train_len = 0, size = 0, has_freqs = 0,
          rotary_dim = 0, layout = 0;
  uint64_t fingerprint = 0;
  double attention_factor = 1;
};

// The header after the magic; `storage` < 0: the first format's (no storage field).
std::string header_bytes(const FileHeader& h, int64_t storage, const std::vector<double>& inv_freq) {
  std::string b(reinterpret_cast<const char*>(&h), sizeof h);
  if (storage >= 0) b.append(reinterpret_cast<const char*>(&storage), sizeof storage);
  b.append(reinterpret_cast<const char*>(inv_freq.data()), inv_freq.size() * sizeof(double));
  const uint64_t hash = fnv1a64(b.data(), b.size());
  b.append(reinterpret_cast<const char*>(&hash), sizeof hash);
  return b;
}

// Offsets of the blocks after the header (positions, then keys / values of head 0, 1, ...), in int64 with every
// sum and product checked: a header's counts that imply more than 2^63 bytes are a rotary::Error naming them
// (`where`: "kv_memory.open: <file>" or "kv_memory.save: <file>"), never a wrapped size a small buffer matches.
struct FileLayout {
  int64_t positions = 0, head0 = 0, block = 0, total = 0;  // block: bytes of one [size, D] block, aligned
};


FileLayout file_layout(int64_t header_end, int64_t size, int64_t heads, int64_t D, int64_t element_bytes,
                       const std::string& where) {
  const std::string_view allowed = "counts whose blocks fit in 2^63 bytes";
  auto align = [&](int64_t n, const std::string& what) {
    return checked_add(n, int64_t(kAlign) - 1, where + ": " + what, allowed) / int64_t(kAlign) * int64_t(kAlign);
  };
  FileLayout l;
  l.positions = align(header_end, "header bytes");
  const int64_t position_bytes = checked_mul(size, int64_t(sizeof(int64_t)), where + ": size x 8", allowed);
  l.head0 = align(checked_add(l.positions, position_bytes, where + ": positions offset + bytes", allowed),
                  "positions offset + bytes");
  const int64_t elems = checked_mul(size, D, where + ": size x head_dim", allowed);
  l.block = align(checked_mul(elems, element_bytes, where + ": size x head_dim x element bytes", allowed),
                  "size x head_dim x element bytes");
  const int64_t blocks = checked_mul(checked_mul(2, heads, where + ": 2 x kv_heads", allowed), l.block,
                                     where + ": 2 x kv_heads x block bytes", allowed);
  l.total = checked_add(l.head0, blocks, where + ": first block offset + block bytes", allowed);
  return l;
}

}  // namespace

void KvMemory::save(const std::string& path, uint64_t fingerprint) const {
  const KvMemoryConfig& c = impl_->config;
  FileHeader h;
  h.kv_heads = c.kv_heads, h.head_dim = c.head_dim, h.policy = int64_t(c.policy), h.window = c.window;
  h.logn_train_len = c.logn_train_len, h.size = size(), h.fingerprint = fingerprint;
  std::vector<double> inv_freq;
  if (c.freqs) {
    h.has_freqs = 1, h.rotary_dim = impl_->freqs.rotary_dim, h.layout = int64_t(impl_->freqs.layout);
    h.attention_factor = impl_->freqs.attention_factor;
    inv_freq = impl_->freqs.inv_freq;
  }
  const std::string head = std::string(kMemoryMagic, 8) + header_bytes(h, int64_t(c.storage), inv_freq);
  const int64_t element_bytes = int64_t(dtype_size(c.storage));
  const FileLayout lay =
      file_layout(int64_t(head.size()), h.size, h.kv_heads, h.head_dim, element_bytes, "kv_memory.save: " + path);
  write_file_atomic(path, "kv_memory.save", [&](FileSink& out) {
    out.write(head.data(), head.size());
    out.pad_to(uint64_t(lay.positions));
    out.write(positions(), size_t(h.size) * sizeof(int64_t));
    const size_t row_bytes = size_t(h.size) * size_t(h.head_dim) * size_t(element_bytes);
    for (int64_t k = 0; k < h.kv_heads; ++k) {
      out.pad_to(uint64_t(lay.head0 + 2 * k * lay.block));
      out.write(key_data(k), row_bytes);
      out.pad_to(uint64_t(lay.head0 + (2 * k + 1) * lay.block));
      out.write(value_data(k), row_bytes);
    }
    out.pad_to(uint64_t(lay.total));
  });
}

KvMemory KvMemory::open(const std::string& path, const KvMemoryConfig& expected, uint64_t fingerprint) {
  KvMemory{expected};  // `expected` is validated before the file is looked at
  detail::MappedFile map =
      detail::MappedFile::open(path, "kv_memory.open path", "a rotary memory file (a regular file)", "kv_memory.open");
  KvMemory m = open_bytes(map.data(), map.size(), expected, fingerprint, path);  // the one reader of the format
  map.advise(detail::MappedFile::Access::Random);  // a search reads scattered rows (a scan, any order: it is cached)
  m.impl_->map = std::move(map);  // the memory owns the mapping its views point into
  return m;
}

KvMemory KvMemory::read(const std::string& path, const KvMemoryConfig& expected, uint64_t fingerprint) {
  const KvMemory mapped = open(path, expected, fingerprint);
  KvMemory owned(mapped.config());
  Impl& o = *owned.impl_;
  const size_t n = size_t(mapped.size()), elems = n * size_t(mapped.head_dim());
  o.positions.assign(mapped.positions(), mapped.positions() + n);
  for (int64_t h = 0; h < mapped.kv_heads(); ++h) {
    if (mapped.storage() == DType::F32) {
      o.keys[size_t(h)].assign(mapped.keys(h), mapped.keys(h) + elems);
      o.values[size_t(h)].assign(mapped.values(h), mapped.values(h) + elems);
    } else {
      const auto* k = static_cast<const uint16_t*>(mapped.key_data(h));
      const auto* v = static_cast<const uint16_t*>(mapped.value_data(h));
      o.keys16[size_t(h)].assign(k, k + elems);
      o.values16[size_t(h)].assign(v, v + elems);
    }
  }
  return owned;
}

KvMemory KvMemory::open_bytes(const void* data, size_t bytes, const KvMemoryConfig& expected, uint64_t fingerprint,
                              const std::string& source) {
  KvMemory m(expected);  // validates `expected`
  const detail::ReaderErrors errors{"kv_memory.open", source};
  auto bad = [&](const std::string& what) { return errors.bad(what); };
  auto damaged = [&](const char* field, int64_t value, const std::string& allowed) {
    return errors.damaged(field, value, allowed);
  };
  const auto* base = static_cast<const char*>(data);
  const bool f32_only = base != nullptr && bytes >= 8 && std::memcmp(base, kMemoryMagicF32Only, 8) == 0;
  const size_t fixed = 8 + sizeof(FileHeader) + (f32_only ? 0 : sizeof(int64_t));
  if (base == nullptr || bytes < fixed || (!f32_only && std::memcmp(base, kMemoryMagic, 8) != 0))
    throw bad("not a rotary memory file (no RTKVMEM2 or RTKVMEM1 magic)");
  // The views are int64 and float arrays at 64-byte multiples from the start: the start must hold an int64.
  errors.check_aligned(base);
  FileHeader h;
  std::memcpy(&h, base + 8, sizeof h);
  int64_t storage = int64_t(DType::F32);
  if (!f32_only) std::memcpy(&storage, base + 8 + sizeof h, sizeof storage);
  if (storage != int64_t(DType::F32) && storage != int64_t(DType::F16) && storage != int64_t(DType::BF16))
    throw damaged("storage", storage, "0 (f32), 1 (f16) or 2 (bf16)");
  if (h.has_freqs < 0 || h.has_freqs > 1) throw damaged("has_freqs", h.has_freqs, "0 or 1");
  if (h.rotary_dim < 0 || h.rotary_dim > 4096 || h.rotary_dim % 2 != 0)
    throw damaged("rotary_dim", h.rotary_dim, "an even number in 0..4096");
  if (h.kv_heads < 1 || h.kv_heads > 4096) throw damaged("kv_heads", h.kv_heads, "1..4096");
  if (h.head_dim < 2 || h.head_dim > 4096) throw damaged("head_dim", h.head_dim, "2..4096");
  if (h.size < 0 || h.size > (int64_t(1) << 40)) throw damaged("size", h.size, "0..2^40 rows");
  const size_t pairs = h.has_freqs ? size_t(h.rotary_dim / 2) : 0;  // at most 2048
  const size_t header_end = fixed + pairs * sizeof(double) + sizeof(uint64_t);
  if (bytes < header_end)
    throw bad("truncated inside its header (" + std::to_string(bytes) + " bytes where rotary_dim = " +
              std::to_string(h.rotary_dim) + " needs " + std::to_string(header_end) + ")");
  std::vector<double> inv_freq(pairs);
  if (pairs > 0) std::memcpy(inv_freq.data(), base + fixed, pairs * sizeof(double));
  uint64_t stored_hash = 0;
  std::memcpy(&stored_hash, base + header_end - sizeof(uint64_t), sizeof stored_hash);
  const std::string hb = header_bytes(h, f32_only ? -1 : storage, inv_freq);
  if (std::memcmp(hb.data() + hb.size() - sizeof(uint64_t), &stored_hash, sizeof stored_hash) != 0)
    throw bad("a damaged header (checksum)");
  // Every block offset and length, from counts the checksum vouches for but a crafted file can still choose:
  // in checked arithmetic, then the whole layout against the bytes there are.
  const FileLayout lay = file_layout(int64_t(header_end), h.size, h.kv_heads, h.head_dim,
                                     int64_t(dtype_size(DType(storage))), "kv_memory.open: " + source);
  if (uint64_t(lay.total) != uint64_t(bytes))
    throw bad("size " + std::to_string(bytes) + " bytes where its header implies " + std::to_string(lay.total) +
              (uint64_t(bytes) < uint64_t(lay.total) ? " (truncated)" : " (trailing bytes)") + " for size = " +
              std::to_string(h.size) + " rows, kv_heads = " + std::to_string(h.kv_heads) +
              ", head_dim = " + std::to_string(h.head_dim));
  const KvMemoryConfig& c = m.impl_->config;
  auto differs = [&](const std::string& field, const std::string& file, const std::string& want) {
    return bad("written for " + field + " = " + file + ", this model has " + want);
  };
  if (h.kv_heads != c.kv_heads) throw differs("kv_heads", std::to_string(h.kv_heads), std::to_string(c.kv_heads));
  if (h.head_dim != c.head_dim) throw differs("head_dim", std::to_string(h.head_dim), std::to_string(c.head_dim));
  if (h.policy != int64_t(c.policy))
    throw differs("policy",
                  h.policy >= 0 && h.policy <= int64_t(MemoryPolicy::Unlimiformer)
                      ? memory_policy_name(MemoryPolicy(h.policy))
                      : std::to_string(h.policy) + " (no policy)",
                  memory_policy_name(c.policy));
  if (h.window != c.window) throw differs("window", std::to_string(h.window), std::to_string(c.window));
  if (h.logn_train_len != c.logn_train_len)
    throw differs("logn_train_len", std::to_string(h.logn_train_len), std::to_string(c.logn_train_len));
  const RopeFreqs& f = m.impl_->freqs;
  const bool same_rotation = (h.has_freqs == 1) == (c.freqs != nullptr) &&
                             (!c.freqs || (h.rotary_dim == f.rotary_dim && h.layout == int64_t(f.layout) &&
                                           h.attention_factor == f.attention_factor && inv_freq == f.inv_freq));
  if (!same_rotation) throw bad("written for another rotation (frequencies, layout or attention factor)");
  if (storage != int64_t(c.storage))
    throw differs("storage", dtype_name(DType(storage)), dtype_name(c.storage));
  if (h.fingerprint != fingerprint)
    throw differs("fingerprint", std::to_string(h.fingerprint), std::to_string(fingerprint) + " (another model)");
  Impl& im = *m.impl_;
  im.borrowed = true;
  im.mapped_size = h.size;
  im.mapped_positions = reinterpret_cast<const int64_t*>(base + lay.positions);
  // The rule append() holds the rows to: a file whose header checks out may still hold positions no model uses
  // (|pos| past 2^53 turns into wrong angles and overflows pos - query_origin).
  detail::check_positions(im.mapped_positions, 0, h.size, "kv_memory.open " + source + ": ", c.logn_train_len > 1,
                          false);
  for (int64_t k = 0; k < h.kv_heads; ++k) {
    im.mapped_keys.push_back(base + lay.head0 + 2 * k * lay.block);
    im.mapped_values.push_back(base + lay.head0 + (2 * k + 1) * lay.block);
  }
  return m;
}

}  // namespace rotary
