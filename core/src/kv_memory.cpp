// core/src/kv_memory.cpp: the retrieval memory (rotary/kv_memory.h) - storage, search query, exact top-k
// memory attention and its float64 oracle.
#include "rotary/kv_memory.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rotary/error.h"
#include "rotary/files.h"
#include "storage.h"
#include "validate.h"

namespace rotary {

const char* memory_policy_name(MemoryPolicy p) {
  switch (p) {
    case MemoryPolicy::Exact: return "exact";
    case MemoryPolicy::Rerope: return "rerope";
    case MemoryPolicy::NoRotation: return "none";
    case MemoryPolicy::Unlimiformer: return "unlimiformer";
  }
  return "?";
}

MemoryPolicy parse_memory_policy(const std::string& name) {
  if (name == "exact") return MemoryPolicy::Exact;
  if (name == "rerope") return MemoryPolicy::Rerope;
  if (name == "none") return MemoryPolicy::NoRotation;
  if (name == "unlimiformer") return MemoryPolicy::Unlimiformer;
  fail("memory_policy", name, "exact, rerope, none or unlimiformer");
}

namespace {

// y = pair_scale R(pos) x over the rotary pairs of `f`'s layout; features past rotary_dim times pass_scale (the
// attention factor scales the rotated pairs only, as everywhere in the core). Angles in double from the exact
// position, so they are right at |pos| up to 2^53.
// The two features of rotary pair i in f's layout.
std::pair<int, int> pair_index(const RopeFreqs& f, int i) {
  return f.layout == RopeLayout::Interleaved ? std::pair{2 * i, 2 * i + 1} : std::pair{i, i + f.rotary_dim / 2};
}

template <class T>
void rotate_row(const RopeFreqs& f, double pos, double pair_scale, double pass_scale, const T* x, T* y) {
  const int pairs = f.pairs(), r = f.rotary_dim;
  for (int i = 0; i < pairs; ++i) {
    const auto [a, b] = pair_index(f, i);
    const double angle = pos * f.inv_freq[size_t(i)];
    const double c = std::cos(angle), s = std::sin(angle);
    const double x0 = double(x[a]), x1 = double(x[b]);
    y[a] = T(pair_scale * (x0 * c - x1 * s));
    y[b] = T(pair_scale * (x0 * s + x1 * c));
  }
  for (int d = r; d < f.head_dim; ++d) y[d] = T(pass_scale * double(x[d]));
}

double logn_factor(int64_t train_len, int64_t pos) {
  if (train_len <= 1) return 1.0;
  return std::max(1.0, std::log(double(pos) + 1.0) / std::log(double(train_len)));
}

}  // namespace

struct KvMemory::Impl {
  KvMemoryConfig config;
  RopeFreqs freqs;
  std::vector<std::vector<float>> keys, values;  // per kv head: [size, D] (owned storage)
  std::vector<int64_t> positions;
  // A memory read by open_bytes (open(): from its file's mapping): the storage is borrowed, read-only, and these
  // point into it. `map`: the mapping open() made, owned (unmapped with the memory); null for open_bytes' caller's
  // bytes.
  bool borrowed = false;
  void* map = nullptr;
  size_t map_size = 0;
  int64_t mapped_size = 0;
  const int64_t* mapped_positions = nullptr;
  std::vector<const float*> mapped_keys, mapped_values;

  ~Impl() {
    if (map) ::munmap(map, map_size);
  }

  // The search vector of query q at pos, in W (float or double), times `scale`.
  template <class W>
  void query(const float* q, int64_t pos, double scale, W* out, int64_t query_origin) const {
    const int D = config.head_dim;
    const double lam = logn_factor(config.logn_train_len, pos) * scale;
    const double a = config.freqs ? freqs.attention_factor : 1.0;
    std::vector<W> in(static_cast<size_t>(D));
    for (int d = 0; d < D; ++d) in[size_t(d)] = W(q[d]);
    switch (config.policy) {
      case MemoryPolicy::Unlimiformer: {
        // y = R(m') q, then (I + P)^T y: each pair (y_a, y_b) -> (y_a + y_b, y_b - y_a) (cos = sin).
        rotate_row(freqs, double(pos - query_origin), lam * a * a, lam, in.data(), out);
        for (int i = 0; i < freqs.pairs(); ++i) {
          const auto [ia, ib] = pair_index(freqs, i);
          const W ya = out[ia], yb = out[ib];
          out[ia] = ya + yb;
          out[ib] = yb - ya;
        }
        break;
      }
      case MemoryPolicy::Exact: rotate_row(freqs, double(pos), lam * a, lam, in.data(), out); break;
      case MemoryPolicy::Rerope: rotate_row(freqs, double(config.window), lam * a * a, lam, in.data(), out); break;
      case MemoryPolicy::NoRotation:
        if (config.freqs) {
          rotate_row(freqs, 0.0, lam * a * a, lam, in.data(), out);
        } else {
          for (int d = 0; d < D; ++d) out[d] = W(lam * double(in[size_t(d)]));
        }
        break;
    }
  }
};

KvMemory::KvMemory(const KvMemoryConfig& c) : impl_(std::make_unique<Impl>()) {
  check(c.kv_heads >= 1 && c.kv_heads <= 4096, "kv_memory.kv_heads", c.kv_heads, "1..4096");
  check(c.head_dim >= 2 && c.head_dim <= 4096, "kv_memory.head_dim", c.head_dim, "2..4096");
  check(c.logn_train_len == 0 || c.logn_train_len > 1, "kv_memory.logn_train_len", c.logn_train_len,
        "0 (off) or > 1");
  const bool needs_freqs = c.policy != MemoryPolicy::NoRotation;
  check(!needs_freqs || c.freqs != nullptr, "kv_memory.freqs", "null",
        std::string("the model's frequencies (policy ") + memory_policy_name(c.policy) + " rotates)");
  if (c.freqs) {
    c.freqs->validate();
    check(c.freqs->head_dim == c.head_dim, "kv_memory.freqs.head_dim", c.freqs->head_dim,
          "kv_memory.head_dim = " + std::to_string(c.head_dim));
  }
  check(c.policy != MemoryPolicy::Rerope || c.window >= 1, "kv_memory.window", c.window,
        ">= 1 (policy rerope places every memory key at distance w)");
  impl_->config = c;
  if (c.freqs) impl_->freqs = *c.freqs, impl_->config.freqs = &impl_->freqs;
  impl_->keys.resize(size_t(c.kv_heads));
  impl_->values.resize(size_t(c.kv_heads));
}

KvMemory::~KvMemory() = default;
KvMemory::KvMemory(KvMemory&&) noexcept = default;
KvMemory& KvMemory::operator=(KvMemory&&) noexcept = default;

void KvMemory::append(int64_t n, const HeadsView& k, const HeadsView& v, const int64_t* positions, DType dtype) {
  const KvMemoryConfig& c = impl_->config;
  check(!read_only(), "kv_memory.append", "a memory opened from a file",
        "an owned memory (a mapped file is read-only: append to a new KvMemory, or save a larger one)");
  check(n >= 0, "kv_memory.append n", n, ">= 0");
  if (n == 0) return;
  detail::check_dtype(dtype, "kv_memory.append dtype");
  detail::check_view(k, "kv_memory.append k", n, c.head_dim, c.kv_heads, "the memory's kv_heads");
  detail::check_view(v, "kv_memory.append v", n, c.head_dim, c.kv_heads, "the memory's kv_heads");
  check(positions != nullptr, "kv_memory.append positions", "null", "[n] positions");
  detail::check_positions(positions, 0, n, "kv_memory.append ", c.logn_train_len > 1, false);
  const int D = c.head_dim;
  const size_t old = impl_->positions.size();
  const double a = c.freqs ? impl_->freqs.attention_factor : 1.0;
  std::vector<double> row(static_cast<size_t>(D)), rotated(static_cast<size_t>(D));
  for (int64_t h = 0; h < c.kv_heads; ++h) {
    std::vector<float>& K = impl_->keys[size_t(h)];
    std::vector<float>& V = impl_->values[size_t(h)];
    K.resize((old + size_t(n)) * size_t(D));
    V.resize((old + size_t(n)) * size_t(D));
    for (int64_t t = 0; t < n; ++t) {
      float* kr = K.data() + (old + size_t(t)) * size_t(D);
      detail::load_row(k.data, dtype, t * k.token_stride + h * k.head_stride, D, row.data());
      if (c.policy == MemoryPolicy::Exact) {
        rotate_row(impl_->freqs, double(positions[t]), a, 1.0, row.data(), rotated.data());
        for (int d = 0; d < D; ++d) kr[d] = float(rotated[size_t(d)]);
      } else {
        for (int d = 0; d < D; ++d) kr[d] = float(row[size_t(d)]);
      }
      detail::load_row(v.data, dtype, t * v.token_stride + h * v.head_stride, D,
                       V.data() + (old + size_t(t)) * size_t(D));
    }
  }
  impl_->positions.insert(impl_->positions.end(), positions, positions + n);
}

void KvMemory::clear() {
  check(!read_only(), "kv_memory.clear", "a memory opened from a file", "an owned memory");
  for (auto& k : impl_->keys) k.clear();
  for (auto& v : impl_->values) v.clear();
  impl_->positions.clear();
}

bool KvMemory::read_only() const { return impl_->borrowed; }
int64_t KvMemory::size() const { return read_only() ? impl_->mapped_size : int64_t(impl_->positions.size()); }
int64_t KvMemory::kv_heads() const { return impl_->config.kv_heads; }
int KvMemory::head_dim() const { return impl_->config.head_dim; }
const KvMemoryConfig& KvMemory::config() const { return impl_->config; }
const float* KvMemory::keys(int64_t h) const {
  return read_only() ? impl_->mapped_keys.at(size_t(h)) : impl_->keys.at(size_t(h)).data();
}
const float* KvMemory::values(int64_t h) const {
  return read_only() ? impl_->mapped_values.at(size_t(h)) : impl_->values.at(size_t(h)).data();
}
const int64_t* KvMemory::positions() const {
  return read_only() ? impl_->mapped_positions : impl_->positions.data();
}

// ---- the memory file ----------------------------------------------------------------------------------------
//
// All fields native little-endian, every block 64-byte aligned:
//   [0, 8)    magic "RTKVMEM1"
//   header    int64 kv_heads, head_dim, policy, window, logn_train_len, size, has_freqs, rotary_dim, layout;
//             uint64 fingerprint; double attention_factor; double inv_freq[rotary_dim / 2]; uint64 FNV-1a of the
//             header bytes before it
//   blocks    positions int64 [size]; then per kv head keys f32 [size, D], values f32 [size, D]
// The file's size must be exactly what the header implies (a truncated or padded file is refused).
namespace {

constexpr char kMemoryMagic[8] = {'R', 'T', 'K', 'V', 'M', 'E', 'M', '1'};
constexpr size_t kAlign = 64;

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ULL) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

struct FileHeader {
  int64_t kv_heads = 0, head_dim = 0, policy = 0, window = 0, logn_train_len = 0, size = 0, has_freqs = 0,
          rotary_dim = 0, layout = 0;
  uint64_t fingerprint = 0;
  double attention_factor = 1;
};

std::string header_bytes(const FileHeader& h, const std::vector<double>& inv_freq) {
  std::string b(reinterpret_cast<const char*>(&h), sizeof h);
  b.append(reinterpret_cast<const char*>(inv_freq.data()), inv_freq.size() * sizeof(double));
  const uint64_t hash = fnv1a(b.data(), b.size());
  b.append(reinterpret_cast<const char*>(&hash), sizeof hash);
  return b;
}

// Offsets of the blocks after the header (positions, then keys / values of head 0, 1, ...), in int64 with every
// sum and product checked: a header's counts that imply more than 2^63 bytes are a rotary::Error naming them
// (`where`: "kv_memory.open: <file>" or "kv_memory.save: <file>"), never a wrapped size a small buffer matches.
struct FileLayout {
  int64_t positions = 0, head0 = 0, block = 0, total = 0;  // block: bytes of one [size, D] f32 block, aligned
};

int64_t checked_add(int64_t a, int64_t b, std::string_view field, std::string_view allowed) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) fail(field, to_text(a) + " + " + to_text(b) + " (past 2^63)", allowed);
  return sum;
}

FileLayout file_layout(int64_t header_end, int64_t size, int64_t heads, int64_t D, const std::string& where) {
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
  l.block = align(checked_mul(elems, int64_t(sizeof(float)), where + ": size x head_dim x 4", allowed),
                  "size x head_dim x 4");
  const int64_t blocks = checked_mul(checked_mul(2, heads, where + ": 2 x kv_heads", allowed), l.block,
                                     where + ": 2 x kv_heads x block bytes", allowed);
  l.total = checked_add(l.head0, blocks, where + ": first block offset + block bytes", allowed);
  return l;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error("rotary: kv_memory.save: writing " + path + ": " + std::strerror(errno));
    p += w, n -= size_t(w);
  }
}

// The mapping of open(): unmapped unless handed on to the memory it backs.
struct Mapping {
  void* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data) ::munmap(data, size);
  }
};

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
  const std::string head = std::string(kMemoryMagic, 8) + header_bytes(h, inv_freq);
  const FileLayout lay = file_layout(int64_t(head.size()), h.size, h.kv_heads, h.head_dim, "kv_memory.save: " + path);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("rotary: kv_memory.save: cannot create " + tmp + ": " + std::strerror(errno));
  try {
    const std::string zeros(kAlign, '\0');
    size_t at = 0;
    auto put = [&](const void* data, size_t n) { write_all(fd, data, n, tmp), at += n; };
    auto pad_to = [&](int64_t offset) { put(zeros.data(), size_t(offset) - at); };
    put(head.data(), head.size());
    pad_to(lay.positions);
    put(positions(), size_t(h.size) * sizeof(int64_t));
    const size_t row_bytes = size_t(h.size) * size_t(h.head_dim) * sizeof(float);
    for (int64_t k = 0; k < h.kv_heads; ++k) {
      pad_to(lay.head0 + 2 * k * lay.block);
      put(keys(k), row_bytes);
      pad_to(lay.head0 + (2 * k + 1) * lay.block);
      put(values(k), row_bytes);
    }
    pad_to(lay.total);
    if (::fsync(fd) != 0) throw Error("rotary: kv_memory.save: fsync " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error("rotary: kv_memory.save: cannot rename " + tmp + " to " + path + ": " + std::strerror(e));
  }
  // The rename is durable only once the directory entry is on disk: without this a crash right after save()
  // returns can leave the old file (or none) in place.
  sync_directory_of(path, "kv_memory.save");
}

KvMemory KvMemory::open(const std::string& path, const KvMemoryConfig& expected, uint64_t fingerprint) {
  KvMemory{expected};  // `expected` is validated before the file is looked at
  const int fd = open_regular_file(path, "kv_memory.open path", "a rotary memory file (a regular file)");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error("rotary: kv_memory.open: cannot open " + path + ": " + std::strerror(e));
  }
  Mapping map;
  map.size = size_t(st.st_size);
  void* data = map.size > 0 ? ::mmap(nullptr, map.size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  const int e = errno;
  ::close(fd);
  if (data == MAP_FAILED) throw Error("rotary: kv_memory.open: cannot map " + path + ": " + std::strerror(e));
  map.data = data;
  KvMemory m = open_bytes(map.data, map.size, expected, fingerprint, path);  // the one reader of the format
  m.impl_->map = std::exchange(map.data, nullptr);  // the memory owns the mapping its views point into
  m.impl_->map_size = map.size;
  return m;
}

KvMemory KvMemory::open_bytes(const void* data, size_t bytes, const KvMemoryConfig& expected, uint64_t fingerprint,
                              const std::string& source) {
  KvMemory m(expected);  // validates `expected`
  auto bad = [&](const std::string& what) -> Error {
    return Error("rotary: kv_memory.open: " + source + ": " + what);
  };
  // A header field outside what save() can write: named with its value and what is allowed.
  auto damaged = [&](const char* field, int64_t value, const std::string& allowed) -> Error {
    return bad("a damaged header: " + std::string(field) + " = " + std::to_string(value) +
               " is invalid; allowed: " + allowed);
  };
  const auto* base = static_cast<const char*>(data);
  if (base == nullptr || bytes < 8 + sizeof(FileHeader) || std::memcmp(base, kMemoryMagic, 8) != 0)
    throw bad("not a rotary memory file (no RTKVMEM1 magic)");
  // The views are int64 and float arrays at 64-byte multiples from the start: the start must hold an int64.
  if (reinterpret_cast<uintptr_t>(base) % alignof(int64_t) != 0)
    throw bad("bytes at address " + std::to_string(reinterpret_cast<uintptr_t>(base)) +
              " are invalid; allowed: an address aligned to 8 bytes (a mapping or a heap buffer)");
  FileHeader h;
  std::memcpy(&h, base + 8, sizeof h);
  if (h.has_freqs < 0 || h.has_freqs > 1) throw damaged("has_freqs", h.has_freqs, "0 or 1");
  if (h.rotary_dim < 0 || h.rotary_dim > 4096 || h.rotary_dim % 2 != 0)
    throw damaged("rotary_dim", h.rotary_dim, "an even number in 0..4096");
  if (h.kv_heads < 1 || h.kv_heads > 4096) throw damaged("kv_heads", h.kv_heads, "1..4096");
  if (h.head_dim < 2 || h.head_dim > 4096) throw damaged("head_dim", h.head_dim, "2..4096");
  if (h.size < 0 || h.size > (int64_t(1) << 40)) throw damaged("size", h.size, "0..2^40 rows");
  const size_t pairs = h.has_freqs ? size_t(h.rotary_dim / 2) : 0;  // at most 2048
  const size_t header_end = 8 + sizeof h + pairs * sizeof(double) + sizeof(uint64_t);
  if (bytes < header_end)
    throw bad("truncated inside its header (" + std::to_string(bytes) + " bytes where rotary_dim = " +
              std::to_string(h.rotary_dim) + " needs " + std::to_string(header_end) + ")");
  std::vector<double> inv_freq(pairs);
  if (pairs > 0) std::memcpy(inv_freq.data(), base + 8 + sizeof h, pairs * sizeof(double));
  uint64_t stored_hash = 0;
  std::memcpy(&stored_hash, base + header_end - sizeof(uint64_t), sizeof stored_hash);
  const std::string hb = header_bytes(h, inv_freq);
  if (std::memcmp(hb.data() + hb.size() - sizeof(uint64_t), &stored_hash, sizeof stored_hash) != 0)
    throw bad("a damaged header (checksum)");
  // Every block offset and length, from counts the checksum vouches for but a crafted file can still choose:
  // in checked arithmetic, then the whole layout against the bytes there are.
  const FileLayout lay = file_layout(int64_t(header_end), h.size, h.kv_heads, h.head_dim, "kv_memory.open: " + source);
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
    im.mapped_keys.push_back(reinterpret_cast<const float*>(base + lay.head0 + 2 * k * lay.block));
    im.mapped_values.push_back(reinterpret_cast<const float*>(base + lay.head0 + (2 * k + 1) * lay.block));
  }
  return m;
}

namespace {
double resolved_scale(const KvMemory& m, double softmax_scale) {
  return softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(double(m.head_dim()));
}
}  // namespace

void KvMemory::search_query(const float* q, int64_t pos, double softmax_scale, float* out,
                            int64_t query_origin) const {
  impl_->query(q, pos, resolved_scale(*this, softmax_scale), out, query_origin);
}
void KvMemory::search_query(const float* q, int64_t pos, double softmax_scale, double* out,
                            int64_t query_origin) const {
  impl_->query(q, pos, resolved_scale(*this, softmax_scale), out, query_origin);
}

double KvMemory::row_logit(const float* q, int64_t pos, int64_t kv_head, int64_t row, double softmax_scale,
                           int64_t query_origin, int64_t earliest_retrieved) const {
  const KvMemoryConfig& c = impl_->config;
  check(kv_head >= 0 && kv_head < c.kv_heads, "kv_memory.row_logit kv_head", kv_head, "0..kv_heads - 1");
  check(row >= 0 && row < size(), "kv_memory.row_logit row", row, "0..size - 1");
  const int D = c.head_dim;
  const float* k = keys(kv_head) + row * D;
  std::vector<double> sq(static_cast<size_t>(D));
  if (c.policy != MemoryPolicy::Unlimiformer) {
    search_query(q, pos, softmax_scale, sq.data(), query_origin);
    double s = 0;
    for (int d = 0; d < D; ++d) s += sq[size_t(d)] * double(k[d]);
    return s;
  }
  // Unlimiformer's scoring: the query at m' = pos - query_origin, the key at n' = pos_j - earliest_retrieved.
  const double lam = logn_factor(c.logn_train_len, pos) * resolved_scale(*this, softmax_scale);
  const double a = impl_->freqs.attention_factor;
  std::vector<double> qd(static_cast<size_t>(D)), kd(static_cast<size_t>(D)), kr(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) qd[size_t(d)] = q[d], kd[size_t(d)] = k[d];
  rotate_row(impl_->freqs, double(pos - query_origin), lam * a, lam, qd.data(), sq.data());
  rotate_row(impl_->freqs, double(positions()[row] - earliest_retrieved), a, 1.0, kd.data(), kr.data());
  double s = 0;
  for (int d = 0; d < D; ++d) s += sq[size_t(d)] * kr[size_t(d)];
  return s;
}

void validate_memory_attention(const KvMemory& m, const MemoryAttentionParams& p) {
  check(p.tokens >= 0, "memory_attention.tokens", p.tokens, ">= 0");
  check(m.size() > 0, "memory_attention memory size", m.size(), "> 0 (append before attending)");
  check(p.top_k >= 1 && p.top_k <= m.size(), "memory_attention.top_k", p.top_k,
        "1..the memory size " + std::to_string(m.size()));
  check(p.q.heads >= 1 && p.q.heads % m.kv_heads() == 0, "memory_attention.q.heads", p.q.heads,
        "a multiple of the memory's kv_heads = " + std::to_string(m.kv_heads()));
  detail::check_view(p.q, "memory_attention.q", p.tokens, m.head_dim());
  detail::check_view(p.o, "memory_attention.o", p.tokens, m.head_dim(), p.q.heads, "q.heads");
  check(p.q_positions != nullptr || p.tokens == 0, "memory_attention.q_positions", "null", "[tokens] positions");
  check(p.lse != nullptr || p.tokens == 0, "memory_attention.lse", "null", "[tokens, Hq] local log-sum-exp");
  if (p.tokens > 0)
    detail::check_positions(p.q_positions, 0, p.tokens, "memory_attention.q_", m.config().logn_train_len > 1, false);
  check(std::isfinite(p.softmax_scale) && p.softmax_scale >= 0, "memory_attention.softmax_scale", p.softmax_scale,
        ">= 0 (0: 1/sqrt(D))");
  for (int64_t t = 0; t < p.tokens; ++t)
    check(p.query_origin <= p.q_positions[t], "memory_attention.query_origin", p.query_origin,
          "<= every query position (q_positions[" + std::to_string(t) + "] = " + std::to_string(p.q_positions[t]) +
              ")");
  detail::check_threads(p.threads);
  if (p.candidates) {
    const int64_t k = p.top_k, n = m.size();
    for (int64_t i = 0; i < p.tokens * p.q.heads * k; ++i)
      check(p.candidates[i] >= -1 && p.candidates[i] < n, "memory_attention.candidates[" + std::to_string(i) + "]",
            p.candidates[i], "a memory row in [0, " + std::to_string(n) + ") or -1 (none)");
  }
}

namespace {

// One (token, head) of memory attention in W: scores of every row, top-k (score descending, row ascending on
// ties), softmax over them, merged into o / lse.
template <class W>
void attend_one(const KvMemory& m, const MemoryAttentionParams& p, int64_t t, int64_t h, bool reference) {
  const int D = m.head_dim();
  const int64_t N = m.size(), group = p.q.heads / m.kv_heads(), kvh = h / group;
  const float* q = static_cast<const float*>(p.q.data) + t * p.q.token_stride + h * p.q.head_stride;
  std::vector<W> sq(static_cast<size_t>(D));
  m.search_query(q, p.q_positions[t], p.softmax_scale, sq.data(), p.query_origin);  // the oracle's in double
  const float* K = m.keys(kvh);
  const float* V = m.values(kvh);
  auto score = [&](int64_t j) {
    const float* kr = K + j * D;
    W s = 0;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; ++d) s += sq[size_t(d)] * W(kr[d]);
    return s;
  };
  std::vector<std::pair<W, int64_t>> scored;
  size_t k = size_t(p.top_k);
  if (p.candidates) {  // rows an index found: scored exactly, the -1 fillers dropped
    const int64_t* c = p.candidates + (t * p.q.heads + h) * int64_t(k);
    for (size_t i = 0; i < k; ++i)
      if (c[i] >= 0) scored.push_back({score(c[i]), c[i]});
    k = scored.size();
  } else {
    scored.resize(static_cast<size_t>(N));
    for (int64_t j = 0; j < N; ++j) scored[size_t(j)] = {score(j), j};
  }
  auto better = [](const std::pair<W, int64_t>& a, const std::pair<W, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const int64_t base = (t * p.q.heads + h) * int64_t(p.top_k);
  auto report = [&] {  // the rows retrieved, best first, and their logits; -1 / -inf past the k there are
    for (size_t i = 0; i < size_t(p.top_k); ++i) {
      if (p.retrieved) p.retrieved[base + int64_t(i)] = i < k ? scored[i].second : -1;
      if (p.retrieved_scores)
        p.retrieved_scores[base + int64_t(i)] =
            i < k ? float(scored[i].first) : -std::numeric_limits<float>::infinity();
    }
  };
  if (k == 0) {  // an index found nothing for this head: it attends to the window alone (o, lse as they came)
    if (p.memory_mass) p.memory_mass[t * p.q.heads + h] = 0.0f;
    report();
    return;
  }
  if (reference || p.candidates) {
    std::stable_sort(scored.begin(), scored.end(), better);
  } else {
    std::nth_element(scored.begin(), scored.begin() + std::ptrdiff_t(k - 1), scored.end(), better);
    std::sort(scored.begin(), scored.begin() + std::ptrdiff_t(k), better);
  }
  if (m.config().policy == MemoryPolicy::Unlimiformer) {
    // Retrieved by the approximate score, attended with Unlimiformer's re-rotated logits (kv_memory.h). The rows
    // keep their retrieval order; retrieved_scores report the logits attended with.
    int64_t earliest = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < k; ++i) earliest = std::min(earliest, m.positions()[scored[i].second]);
    for (size_t i = 0; i < k; ++i)
      scored[i].first = W(m.row_logit(q, p.q_positions[t], kvh, scored[i].second, p.softmax_scale, p.query_origin,
                                       earliest));
  }
  W mx = scored[0].first;
  for (size_t i = 1; i < k; ++i) mx = std::max(mx, scored[i].first);
  W sum = 0;
  std::vector<W> acc(static_cast<size_t>(D), W(0));
  for (size_t i = 0; i < k; ++i) {
    const W e = std::exp(scored[i].first - mx);
    sum += e;
    const float* vr = V + scored[i].second * D;
    for (int d = 0; d < D; ++d) acc[size_t(d)] += e * W(vr[d]);
  }
  const W lse_mem = mx + std::log(sum);
  float* o = static_cast<float*>(p.o.data) + t * p.o.token_stride + h * p.o.head_stride;
  float& lse = p.lse[t * p.q.heads + h];
  const W lse_local = W(lse);
  const W merged = std::isinf(lse_local) && lse_local < 0
                       ? lse_mem
                       : std::max(lse_local, lse_mem) + std::log1p(std::exp(-std::abs(lse_local - lse_mem)));
  const W w_local = std::isinf(lse_local) && lse_local < 0 ? W(0) : std::exp(lse_local - merged);
  const W w_mem = std::exp(lse_mem - merged);
  for (int d = 0; d < D; ++d) o[d] = float(w_local * W(o[d]) + w_mem * acc[size_t(d)] / sum);
  lse = float(merged);
  if (p.memory_mass) p.memory_mass[t * p.q.heads + h] = float(w_mem);
  report();
}

template <class W>
void run(const KvMemory& m, const MemoryAttentionParams& p, bool reference) {
  validate_memory_attention(m, p);
  const int64_t tasks = p.tokens * p.q.heads;
  const int threads = p.threads > 0 ? p.threads : omp_get_max_threads();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (tasks > 1 && !reference)
  for (int64_t i = 0; i < tasks; ++i) attend_one<W>(m, p, i / p.q.heads, i % p.q.heads, reference);
}

}  // namespace

void memory_attention(const KvMemory& m, const MemoryAttentionParams& p) { run<float>(m, p, false); }
void memory_attention_reference(const KvMemory& m, const MemoryAttentionParams& p) { run<double>(m, p, true); }

}  // namespace rotary
