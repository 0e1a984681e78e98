// KvCache: validation, storage and append (what is stored per mode: see rotary/kv_cache.h).
#include "rotary/kv_cache.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <new>
#include <string>
#include <type_traits>

#include "kv_cache_file.h"
#include "mapped_file.h"
#include "rotary/angles.h"
#include "rotary/error.h"
#include "rotate_pair.h"
#include "storage.h"
#include "validate.h"

namespace rotary {

namespace {

using detail::load_row;
using detail::store_row;

constexpr int64_t kMaxTableDistance = 8192;         // near table rows 0..min(w, this); farther distances computed

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct AlignedFree {
  void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
using AlignedBytes = std::unique_ptr<uint8_t[], AlignedFree>;
AlignedBytes allocate(size_t bytes) {
  return AlignedBytes(static_cast<uint8_t*>(::operator new[](std::max<size_t>(bytes, 64), std::align_val_t(64))));
}

// cos/sin of pos * inv_freq[i] times scale, in W. Fractional positions (Leaky) in float64 for both.
void cos_sin(const RopeFreqs& f, double pos, double scale, float* c, float* s) {
  rope_cos_sin_at(f.inv_freq.data(), f.pairs(), pos, scale, c, s);
}
void cos_sin(const RopeFreqs& f, double pos, double scale, double* c, double* s) {
  for (int i = 0; i < f.pairs(); ++i) {
    const double a = pos * f.inv_freq[i];
    c[i] = std::cos(a) * scale;
    s[i] = std::sin(a) * scale;
  }
}
void cos_sin(const RopeFreqs& f, int64_t pos, double scale, float* c, float* s) {
  rope_cos_sin(f.inv_freq.data(), f.pairs(), pos, scale, c, s);
}
void cos_sin(const RopeFreqs& f, int64_t pos, double scale, double* c, double* s) {
  rope_cos_sin_f64(f.inv_freq.data(), f.pairs(), pos, scale, c, s);
}

// The layout of a cache of `config` with `pairs` rotary pairs.
KvCacheLayout layout_of(const KvCacheConfig& config, int pairs) {
  constexpr int P = KvCacheLayout::kPad;
  KvCacheLayout l;
  l.half = int(round_up(pairs, P));
  l.pass = int(round_up(config.head_dim - 2 * pairs, P));
  if (config.storage == KvStorage::Q8) l.pass = int(round_up(2 * l.half + l.pass, kQ8Block)) - 2 * l.half;
  l.row_stride = 2 * l.half + l.pass;
  return l;
}
// Bytes of one stored array (keys, values or a far copy) of `rows` rows, scales included.
int64_t array_bytes(const KvCacheConfig& config, const KvCacheLayout& l, int64_t rows) {
  if (config.storage == KvStorage::Q8) return rows * l.row_stride + rows * (l.row_stride / kQ8Block) * 4;
  return rows * l.row_stride * int64_t(dtype_size(config.dtype));
}
int copies_of(const KvCacheConfig& config) {
  const bool leaky = config.pos.mode == PositionMode::LeakyRerope;
  return 2 + (leaky ? 1 : 0) + (leaky && config.pos.roper ? 1 : 0);
}

void check_config(const KvCacheConfig& config) {
  check(config.capacity >= 1 && config.capacity <= (int64_t(1) << 34), "capacity", config.capacity, "1..2^34");
  check(config.kv_heads >= 1 && config.kv_heads <= 65536, "kv_heads", config.kv_heads, "1..65536");
  check(config.head_dim >= 1 && config.head_dim <= 4096, "head_dim", config.head_dim, "1..4096");
  detail::check_dtype(config.dtype);
  check(config.storage == KvStorage::Dtype || config.storage == KvStorage::Q8, "storage", int(config.storage),
        "dtype, q8");
  if (config.storage == KvStorage::Q8)
    check(config.dtype != DType::F64, "dtype", dtype_name(config.dtype),
          "f32, bf16 or f16 with storage q8 (f64 caches are the reference precision: stored as given)");
  detail::check_position_params(config.pos, config.head_dim, "the cache's head_dim");
  detail::check_threads(config.threads);
}

}  // namespace

const char* kv_storage_name(KvStorage s) { return s == KvStorage::Q8 ? "q8" : "dtype"; }

int64_t kv_cache_bytes(const KvCacheConfig& config) {
  check_config(config);
  const int pairs = config.pos.mode == PositionMode::None ? 0 : config.pos.freqs->pairs();
  return copies_of(config) * array_bytes(config, layout_of(config, pairs), config.capacity * config.kv_heads);
}

struct KvCache::Impl {
  KvCacheConfig config;
  RopeFreqs freqs;  // own copy; config.pos.freqs points here
  KvCacheLayout layout;
  int64_t size = 0;
  std::vector<int64_t> positions;
  // Q8: each array's int8 quants, then its scales (at scale_offset bytes).
  AlignedBytes keys, keys_far, values, values_far, table;
  size_t scale_offset = 0;
  int64_t table_rows = 0;

  int pairs() const { return config.pos.mode == PositionMode::None ? 0 : freqs.pairs(); }
  template <class W>
  void build_table();
  template <class W>
  void write_token(const HeadsView& k, const HeadsView& v, int64_t t, int64_t slot, int64_t pos);
  // Stores row (rs elements) at element offset dst of array `a`: rounded to the dtype, or quantized (Q8).
  template <class W>
  void store(const AlignedBytes& a, int64_t dst, const std::vector<W>& row) const;
  // The stored arrays in the file's order: keys, [keys_far], values, [values_far].
  std::vector<const AlignedBytes*> arrays() const {
    std::vector<const AlignedBytes*> out{&keys};
    if (keys_far) out.push_back(&keys_far);
    out.push_back(&values);
    if (values_far) out.push_back(&values_far);
    return out;
  }
  const float* scales(const AlignedBytes& a) const {
    return a && config.storage == KvStorage::Q8 ? reinterpret_cast<const float*>(a.get() + scale_offset) : nullptr;
  }
};

template <class W>
void KvCache::Impl::store(const AlignedBytes& a, int64_t dst, const std::vector<W>& row) const {
  if (config.storage == KvStorage::Dtype) {
    store_row(a.get(), config.dtype, dst, layout.row_stride, row.data());
    return;
  }
  if constexpr (std::is_same_v<W, float>) {
    int8_t* quants = reinterpret_cast<int8_t*>(a.get()) + dst;
    float* s = reinterpret_cast<float*>(a.get() + scale_offset) + dst / kQ8Block;
    for (int64_t b = 0; b < layout.row_stride / kQ8Block; ++b)
      s[b] = q8_quantize_block(row.data() + b * kQ8Block, kQ8Block, quants + b * kQ8Block);
  }
}

template <class W>
void KvCache::Impl::build_table() {
  const int half = layout.half;
  table_rows = std::min(config.pos.window, kMaxTableDistance) + 1;
  table = allocate(size_t(table_rows * 2 * half) * sizeof(W));
  W* t = reinterpret_cast<W*>(table.get());
  std::fill(t, t + table_rows * 2 * half, W(0));
  for (int64_t d = 0; d < table_rows; ++d) cos_sin(freqs, d, 1.0, t + d * 2 * half, t + d * 2 * half + half);
}

// Writes token t of the views into cache slot `slot` for every kv head: rows permuted to the cache layout and
// rotated as the mode stores them, every pad zeroed.
template <class W>
void KvCache::Impl::write_token(const HeadsView& k, const HeadsView& v, int64_t t, int64_t slot, int64_t pos) {
  const PositionParams& pp = config.pos;
  const int D = config.head_dim, n = pairs(), half = layout.half, r = 2 * n;
  const int64_t rs = layout.row_stride, cap = config.capacity;
  const DType dt = config.dtype;
  const RopeLayout rl = freqs.layout;
  const double a = freqs.attention_factor;
  const size_t np = size_t(n) + 1;
  std::vector<W> x(static_cast<size_t>(D)), row(static_cast<size_t>(rs)), c(np), s(np), cl(np), sl(np), c1(np), s1(np),
      cl1(np), sl1(np);
  const bool rope = pp.mode == PositionMode::Rope, leaky = pp.mode == PositionMode::LeakyRerope;
  if (rope) cos_sin(freqs, pos, a, c.data(), s.data());
  if (leaky) cos_sin(freqs, double(pos) / pp.leaky_k, a, cl.data(), sl.data());
  if (rope && pp.roper) cos_sin(freqs, pos, 1.0, c1.data(), s1.data());
  if (leaky && pp.roper) cos_sin(freqs, double(pos) / pp.leaky_k, 1.0, cl1.data(), sl1.data());

  // Cache row from caller-order x: pair i -> (i, half + i), turned by (cc, ss) when given.
  auto to_row = [&](const W* cc, const W* ss) {
    std::fill(row.begin(), row.end(), W(0));
    for (int i = 0; i < n; ++i) {
      const auto [fa, fb] = rope_pair(rl, r, i);
      const auto [ya, yb] = cc ? detail::rotate_pair(x[size_t(fa)], x[size_t(fb)], cc[i], ss[i])
                               : detail::RotatedPair<W>{x[size_t(fa)], x[size_t(fb)]};
      row[size_t(i)] = ya;
      row[size_t(half + i)] = yb;
    }
    for (int f = r; f < D; ++f) row[size_t(2 * half + f - r)] = x[size_t(f)];
  };
  for (int64_t h = 0; h < config.kv_heads; ++h) {
    const int64_t dst = (h * cap + slot) * rs;
    load_row(k.data, dt, t * k.token_stride + h * k.head_stride, D, x.data());
    to_row(rope ? c.data() : nullptr, s.data());
    store(keys, dst, row);
    if (leaky) {
      to_row(cl.data(), sl.data());
      store(keys_far, dst, row);
    }
    load_row(v.data, dt, t * v.token_stride + h * v.head_stride, D, x.data());
    to_row(rope && pp.roper ? c1.data() : nullptr, s1.data());
    store(values, dst, row);
    if (leaky && pp.roper) {
      to_row(cl1.data(), sl1.data());
      store(values_far, dst, row);
    }
  }
}

KvCache::KvCache(const KvCacheConfig& config) : impl_(std::make_unique<Impl>()) {
  check_config(config);

  Impl& m = *impl_;
  m.config = config;
  if (config.pos.freqs) m.freqs = *config.pos.freqs;
  m.config.pos.freqs = config.pos.mode == PositionMode::None ? nullptr : &m.freqs;
  m.layout = layout_of(config, m.pairs());
  const int64_t rows = config.capacity * config.kv_heads;
  const size_t bytes = size_t(array_bytes(config, m.layout, rows));
  m.scale_offset = size_t(rows * m.layout.row_stride);  // Q8: the quants' bytes (a multiple of 32)
  const bool leaky = config.pos.mode == PositionMode::LeakyRerope;
  m.keys = allocate(bytes);
  m.values = allocate(bytes);
  if (leaky) m.keys_far = allocate(bytes);
  if (leaky && config.pos.roper) m.values_far = allocate(bytes);
  m.positions.reserve(size_t(std::min<int64_t>(config.capacity, 1 << 20)));
  if (config.pos.mode == PositionMode::Rerope || config.pos.mode == PositionMode::LeakyRerope) {
    if (config.dtype == DType::F64)
      m.build_table<double>();
    else
      m.build_table<float>();
  }
}

KvCache::~KvCache() = default;
KvCache::KvCache(KvCache&&) noexcept = default;
KvCache& KvCache::operator=(KvCache&&) noexcept = default;

void KvCache::append(int64_t n, const HeadsView& k, const HeadsView& v, const int64_t* positions) {
  Impl& m = *impl_;
  check(n >= 0, "kv_cache.append: n", n, ">= 0");
  if (n == 0) return;
  if (m.size + n > m.config.capacity)
    throw Error("rotary: kv_cache.append: size " + std::to_string(m.size) + " + " + std::to_string(n) +
                " exceeds capacity = " + std::to_string(m.config.capacity));
  if (positions == nullptr) fail("kv_cache.append: positions", "null", "a pointer to n int64 positions");
  detail::check_view(k, "kv_cache.append: k", n, m.config.head_dim, m.config.kv_heads, "the cache's kv_heads");
  detail::check_view(v, "kv_cache.append: v", n, m.config.head_dim, m.config.kv_heads, "the cache's kv_heads");
  detail::check_positions(positions, 0, n, "kv_cache.append: ", m.config.pos.logn_train_len > 0, true,
                          m.size > 0 ? &m.positions.back() : nullptr);
  const int64_t base = m.size;
  const bool f64 = m.config.dtype == DType::F64;
  const int threads = m.config.threads > 0 ? m.config.threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads) if (n * m.config.kv_heads >= 64)
  for (int64_t t = 0; t < n; ++t) {
    if (f64)
      m.write_token<double>(k, v, t, base + t, positions[t]);
    else
      m.write_token<float>(k, v, t, base + t, positions[t]);
  }
  m.positions.insert(m.positions.end(), positions, positions + n);
  m.size += n;
}

namespace {

// The header a cache writes (and a file for it must carry), size and fingerprint aside.
detail::KvCacheFileHeader file_header(const KvCacheConfig& c, const RopeFreqs& f, const KvCacheLayout& l,
                                      std::vector<double>& inv_freq) {
  detail::KvCacheFileHeader h;
  const PositionParams& pp = c.pos;
  const bool clipped = pp.mode == PositionMode::Rerope || pp.mode == PositionMode::LeakyRerope;
  h.kv_heads = c.kv_heads, h.head_dim = c.head_dim, h.mode = int64_t(pp.mode), h.window = clipped ? pp.window : 0;
  h.logn_train_len = pp.logn_train_len, h.roper = pp.roper ? 1 : 0, h.dtype = int64_t(c.dtype);
  h.storage = int64_t(c.storage), h.row_stride = l.row_stride, h.arrays = copies_of(c);
  h.leaky_k = pp.mode == PositionMode::LeakyRerope ? pp.leaky_k : 1;  // (the settings a mode does not read: fixed)
  inv_freq.clear();
  if (pp.mode != PositionMode::None) {
    h.rotary_dim = f.rotary_dim, h.layout = int64_t(f.layout), h.attention_factor = f.attention_factor;
    inv_freq = f.inv_freq;
  }
  return h;
}

}  // namespace

void KvCache::save(const std::string& path, uint64_t fingerprint) const {
  const Impl& m = *impl_;
  std::vector<double> inv_freq;
  detail::KvCacheFileHeader h = file_header(m.config, m.freqs, m.layout, inv_freq);
  h.size = m.size, h.fingerprint = fingerprint;
  const std::string head = detail::kv_cache_file_head(h, inv_freq);
  const bool q8 = m.config.storage == KvStorage::Q8;
  const int64_t elt = q8 ? 1 : int64_t(dtype_size(m.config.dtype)), rs = m.layout.row_stride;
  const detail::KvCacheFileLayout lay =
      detail::kv_cache_file_layout(h, elt, int64_t(head.size()), "kv_cache.save: " + path);
  const std::vector<const AlignedBytes*> arrays = m.arrays();
  const int64_t H = m.config.kv_heads, cap = m.config.capacity;
  write_file_atomic(path, "kv_cache.save", [&](FileSink& out) {
    out.write(head.data(), head.size());
    out.pad_to(uint64_t(lay.positions));
    out.write(m.positions.data(), size_t(m.size) * sizeof(int64_t));
    for (size_t a = 0; a < arrays.size(); ++a)
      for (int64_t g = 0; g < H; ++g) {
        out.pad_to(uint64_t(lay.rows_at(int64_t(a), g, H)));
        out.write(arrays[a]->get() + g * cap * rs * elt, size_t(m.size * rs * elt));
      }
    if (q8)
      for (size_t a = 0; a < arrays.size(); ++a)
        for (int64_t g = 0; g < H; ++g) {
          out.pad_to(uint64_t(lay.scales_at(int64_t(a), g, H)));
          out.write(arrays[a]->get() + m.scale_offset + size_t(g * cap * (rs / kQ8Block)) * 4,
                    size_t(m.size * (rs / kQ8Block)) * 4);
        }
    out.pad_to(uint64_t(lay.total));
  });
}

KvCache KvCache::open(const std::string& path, const KvCacheConfig& expected, uint64_t fingerprint) {
  check_config(expected);  // before the file is looked at
  const detail::MappedFile map =
      detail::MappedFile::open(path, "kv_cache.open path", "a rotary KV cache file (a regular file)", "kv_cache.open");
  return open_bytes(map.data(), map.size(), expected, fingerprint, path);
}

KvCache KvCache::open_bytes(const void* data, size_t bytes, const KvCacheConfig& expected, uint64_t fingerprint,
                            const std::string& source) {
  check_config(expected);
  const detail::KvCacheFileView v = detail::read_kv_cache_file(data, bytes, source);
  const detail::KvCacheFileHeader& h = v.header;
  const detail::ReaderErrors errors{"kv_cache.open", source};
  check(expected.capacity <= (int64_t(1) << 34) - h.size, "capacity", expected.capacity,
        "<= 2^34 - the " + std::to_string(h.size) + " tokens saved in " + source);
  KvCacheConfig config = expected;
  config.capacity = h.size + expected.capacity;
  KvCache cache(config);
  Impl& m = *cache.impl_;
  // What this cache would write, field by field: a file for another cache is named by its first difference.
  std::vector<double> want_freq;
  const detail::KvCacheFileHeader want = file_header(m.config, m.freqs, m.layout, want_freq);
  auto differs = [&](const std::string& field, const std::string& file, const std::string& here) {
    return errors.bad("saved for " + field + " = " + file + ", this cache has " + here);
  };
  auto same = [&](const char* field, int64_t file, int64_t here) {
    if (file != here) throw differs(field, std::to_string(file), std::to_string(here));
  };
  same("kv_heads", h.kv_heads, want.kv_heads), same("head_dim", h.head_dim, want.head_dim);
  same("mode", h.mode, want.mode), same("window", h.window, want.window);
  same("logn_train_len", h.logn_train_len, want.logn_train_len), same("roper", h.roper, want.roper);
  if (h.dtype != want.dtype)
    throw differs("dtype", dtype_name(DType(h.dtype)), dtype_name(m.config.dtype));
  if (h.storage != want.storage)
    throw differs("storage", kv_storage_name(KvStorage(h.storage)), kv_storage_name(m.config.storage));
  if (h.leaky_k != want.leaky_k) throw differs("leaky_k", to_text(h.leaky_k), to_text(want.leaky_k));
  if (h.rotary_dim != want.rotary_dim || h.layout != want.layout || h.attention_factor != want.attention_factor ||
      v.inv_freq != want_freq)
    throw errors.bad("saved for another rotation (frequencies, layout, rotary_dim or attention factor)");
  same("row_stride", h.row_stride, want.row_stride), same("arrays", h.arrays, want.arrays);
  if (h.fingerprint != fingerprint)
    throw differs("fingerprint", std::to_string(h.fingerprint), std::to_string(fingerprint) + " (another model)");
  if (m.config.pos.logn_train_len > 0)
    detail::check_positions(v.positions, 0, h.size, "kv_cache.open " + source + ": ", true, true, nullptr);
  const int64_t elt = v.element_bytes, rs = m.layout.row_stride, H = config.kv_heads, cap = config.capacity;
  const std::vector<const AlignedBytes*> arrays = m.arrays();
  for (size_t a = 0; a < arrays.size(); ++a)
    for (int64_t g = 0; g < H; ++g) {
      const size_t i = a * size_t(H) + size_t(g);
      std::memcpy(arrays[a]->get() + g * cap * rs * elt, v.rows[i], size_t(h.size * rs * elt));
      if (!v.scales.empty())
        std::memcpy(arrays[a]->get() + m.scale_offset + size_t(g * cap * (rs / kQ8Block)) * 4, v.scales[i],
                    size_t(h.size * (rs / kQ8Block)) * 4);
    }
  m.positions.assign(v.positions, v.positions + h.size);
  m.size = h.size;
  return cache;
}

KvCache KvCache::copy_prefix(int64_t n, int64_t capacity) const {
  const Impl& m = *impl_;
  check(n >= 0 && n <= m.size, "kv_cache.copy_prefix: n", n, "in [0, size = " + std::to_string(m.size) + "]");
  check(capacity >= n, "kv_cache.copy_prefix: capacity", capacity, ">= n = " + std::to_string(n));
  KvCacheConfig config = m.config;
  config.capacity = capacity;
  KvCache copy(config);
  Impl& c = *copy.impl_;
  const bool q8 = m.config.storage == KvStorage::Q8;
  const int64_t elt = q8 ? 1 : int64_t(dtype_size(m.config.dtype)), rs = m.layout.row_stride;
  const int64_t H = m.config.kv_heads, from_cap = m.config.capacity, to_cap = capacity;
  const std::vector<const AlignedBytes*> from = m.arrays(), to = c.arrays();
  for (size_t a = 0; a < from.size(); ++a)
    for (int64_t g = 0; g < H; ++g) {
      std::memcpy(to[a]->get() + g * to_cap * rs * elt, from[a]->get() + g * from_cap * rs * elt, size_t(n * rs * elt));
      if (q8)
        std::memcpy(to[a]->get() + c.scale_offset + size_t(g * to_cap * (rs / kQ8Block)) * 4,
                    from[a]->get() + m.scale_offset + size_t(g * from_cap * (rs / kQ8Block)) * 4,
                    size_t(n * (rs / kQ8Block)) * 4);
    }
  c.positions.assign(m.positions.begin(), m.positions.begin() + n);
  c.size = n;
  return copy;
}

void KvCache::clear() {
  impl_->size = 0;
  impl_->positions.clear();
}

int64_t KvCache::size() const { return impl_->size; }
int64_t KvCache::capacity() const { return impl_->config.capacity; }
int64_t KvCache::kv_heads() const { return impl_->config.kv_heads; }
int KvCache::head_dim() const { return impl_->config.head_dim; }
DType KvCache::dtype() const { return impl_->config.dtype; }
KvStorage KvCache::storage() const { return impl_->config.storage; }
const PositionParams& KvCache::pos() const { return impl_->config.pos; }
const KvCacheLayout& KvCache::layout() const { return impl_->layout; }
int64_t KvCache::last_position() const {
  check(impl_->size > 0, "kv_cache.size", 0, ">= 1 (the cache is empty)");
  return impl_->positions.back();
}
const int64_t* KvCache::positions() const { return impl_->positions.data(); }
const void* KvCache::keys() const { return impl_->keys.get(); }
const void* KvCache::keys_far() const { return impl_->keys_far.get(); }
const void* KvCache::values() const { return impl_->values.get(); }
const void* KvCache::values_far() const { return impl_->values_far.get(); }
const float* KvCache::key_scales() const { return impl_->scales(impl_->keys); }
const float* KvCache::key_far_scales() const { return impl_->scales(impl_->keys_far); }
const float* KvCache::value_scales() const { return impl_->scales(impl_->values); }
const float* KvCache::value_far_scales() const { return impl_->scales(impl_->values_far); }
const void* KvCache::near_table() const { return impl_->table.get(); }
int64_t KvCache::near_table_rows() const { return impl_->table_rows; }

}  // namespace rotary
