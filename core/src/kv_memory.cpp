// core/src/kv_memory.cpp: the retrieval memory (rotary/kv_memory.h) - storage, the policies (what is stored, what
// the store is searched with), append, search_query and row_logit. Its file: kv_memory_file.cpp; memory attention:
// memory_attention.cpp, its float64 oracle memory_attention_reference.cpp; MemoryKvCache: memory_kv_cache.cpp.
#include "rotary/kv_memory.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kv_memory_impl.h"
#include "rotary/error.h"
#include "rotate_pair.h"
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
template <class T>
void rotate_row(const RopeFreqs& f, double pos, double pair_scale, double pass_scale, const T* x, T* y) {
  const int pairs = f.pairs(), r = f.rotary_dim;
  for (int i = 0; i < pairs; ++i) {
    const auto [a, b] = rope_pair(f.layout, r, i);
    const double angle = pos * f.inv_freq[size_t(i)];
    const auto turned = detail::rotate_pair(double(x[a]), double(x[b]), std::cos(angle), std::sin(angle));
    y[a] = T(pair_scale * turned.a);
    y[b] = T(pair_scale * turned.b);
  }
  for (int d = r; d < f.head_dim; ++d) y[d] = T(pass_scale * double(x[d]));
}

double logn_factor(int64_t train_len, int64_t pos) {
  if (train_len <= 1) return 1.0;
  return std::max(1.0, std::log(double(pos) + 1.0) / std::log(double(train_len)));
}

// The search vector of query q at pos, in W (float or double), times `scale` (kv_memory.h's table of policies).
template <class W>
void search_vector(const KvMemoryConfig& config, const RopeFreqs& freqs, const float* q, int64_t pos, double scale,
                   W* out, int64_t query_origin) {
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
        const auto [ia, ib] = rope_pair(freqs.layout, freqs.rotary_dim, i);
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

}  // namespace

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
  check(c.storage == DType::F32 || c.storage == DType::BF16 || c.storage == DType::F16, "kv_memory.storage",
        dtype_name(c.storage), "f32, bf16 or f16");
  impl_->config = c;
  if (c.freqs) impl_->freqs = *c.freqs, impl_->config.freqs = &impl_->freqs;
  if (c.storage == DType::F32) {
    impl_->keys.resize(size_t(c.kv_heads));
    impl_->values.resize(size_t(c.kv_heads));
  } else {
    impl_->keys16.resize(size_t(c.kv_heads));
    impl_->values16.resize(size_t(c.kv_heads));
  }
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
  const bool f32 = c.storage == DType::F32;
  const int64_t total = int64_t(old) + n;
  for (int64_t h = 0; h < c.kv_heads; ++h) {
    if (f32) {
      impl_->keys[size_t(h)].resize(size_t(total * D));
      impl_->values[size_t(h)].resize(size_t(total * D));
    } else {
      impl_->keys16[size_t(h)].resize(size_t(total * D));
      impl_->values16[size_t(h)].resize(size_t(total * D));
    }
    void* K = f32 ? static_cast<void*>(impl_->keys[size_t(h)].data()) : impl_->keys16[size_t(h)].data();
    void* V = f32 ? static_cast<void*>(impl_->values[size_t(h)].data()) : impl_->values16[size_t(h)].data();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t at = (int64_t(old) + t) * D;
      detail::load_row(k.data, dtype, t * k.token_stride + h * k.head_stride, D, row.data());
      if (c.policy == MemoryPolicy::Exact) {
        rotate_row(impl_->freqs, double(positions[t]), a, 1.0, row.data(), rotated.data());
        detail::store_row(K, c.storage, at, D, rotated.data());
      } else {
        detail::store_row(K, c.storage, at, D, row.data());
      }
      detail::load_row(v.data, dtype, t * v.token_stride + h * v.head_stride, D, row.data());
      detail::store_row(V, c.storage, at, D, row.data());
    }
  }
  impl_->positions.insert(impl_->positions.end(), positions, positions + n);
}

void KvMemory::clear() {
  check(!read_only(), "kv_memory.clear", "a memory opened from a file", "an owned memory");
  for (auto& k : impl_->keys) k.clear();
  for (auto& v : impl_->values) v.clear();
  for (auto& k : impl_->keys16) k.clear();
  for (auto& v : impl_->values16) v.clear();
  impl_->positions.clear();
}

bool KvMemory::read_only() const { return impl_->borrowed; }
int64_t KvMemory::size() const { return read_only() ? impl_->mapped_size : int64_t(impl_->positions.size()); }
int64_t KvMemory::kv_heads() const { return impl_->config.kv_heads; }
int KvMemory::head_dim() const { return impl_->config.head_dim; }
const KvMemoryConfig& KvMemory::config() const { return impl_->config; }
DType KvMemory::storage() const { return impl_->config.storage; }
const void* KvMemory::key_data(int64_t h) const {
  check(h >= 0 && h < kv_heads(), "kv_memory.key_data kv_head", h, "0..kv_heads - 1");
  if (read_only()) return impl_->mapped_keys[size_t(h)];
  if (storage() == DType::F32) return impl_->keys[size_t(h)].data();
  return impl_->keys16[size_t(h)].data();
}
const void* KvMemory::value_data(int64_t h) const {
  check(h >= 0 && h < kv_heads(), "kv_memory.value_data kv_head", h, "0..kv_heads - 1");
  if (read_only()) return impl_->mapped_values[size_t(h)];
  if (storage() == DType::F32) return impl_->values[size_t(h)].data();
  return impl_->values16[size_t(h)].data();
}
const float* KvMemory::keys(int64_t h) const {
  check(storage() == DType::F32, "kv_memory.storage", dtype_name(storage()),
        "f32 for keys() (key_data() and key_rows() read any storage)");
  return static_cast<const float*>(key_data(h));
}
const float* KvMemory::values(int64_t h) const {
  check(storage() == DType::F32, "kv_memory.storage", dtype_name(storage()),
        "f32 for values() (value_data() reads any storage)");
  return static_cast<const float*>(value_data(h));
}
void KvMemory::key_rows(int64_t h, int64_t first, int64_t n, float* out) const {
  check(first >= 0 && n >= 0 && first + n <= size(), "kv_memory.key_rows rows", std::to_string(first) + " + " + std::to_string(n),
        "inside 0..size = " + std::to_string(size()));
  detail::load_row(key_data(h), storage(), first * head_dim(), n * head_dim(), out);
}
const int64_t* KvMemory::positions() const {
  return read_only() ? impl_->mapped_positions : impl_->positions.data();
}

namespace {
double resolved_scale(const KvMemory& m, double softmax_scale) {
  return softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(double(m.head_dim()));
}
}  // namespace

void KvMemory::search_query(const float* q, int64_t pos, double softmax_scale, float* out,
                            int64_t query_origin) const {
  search_vector(impl_->config, impl_->freqs, q, pos, resolved_scale(*this, softmax_scale), out, query_origin);
}
void KvMemory::search_query(const float* q, int64_t pos, double softmax_scale, double* out,
                            int64_t query_origin) const {
  search_vector(impl_->config, impl_->freqs, q, pos, resolved_scale(*this, softmax_scale), out, query_origin);
}

double KvMemory::row_logit(const float* q, int64_t pos, int64_t kv_head, int64_t row, double softmax_scale,
                           int64_t query_origin, int64_t earliest_retrieved) const {
  const KvMemoryConfig& c = impl_->config;
  check(kv_head >= 0 && kv_head < c.kv_heads, "kv_memory.row_logit kv_head", kv_head, "0..kv_heads - 1");
  check(row >= 0 && row < size(), "kv_memory.row_logit row", row, "0..size - 1");
  const int D = c.head_dim;
  std::vector<double> k(static_cast<size_t>(D));
  detail::load_row(key_data(kv_head), storage(), row * D, D, k.data());
  std::vector<double> sq(static_cast<size_t>(D));
  if (c.policy != MemoryPolicy::Unlimiformer) {
    search_query(q, pos, softmax_scale, sq.data(), query_origin);
    double s = 0;
    for (int d = 0; d < D; ++d) s += sq[size_t(d)] * k[size_t(d)];
    return s;
  }
  // Unlimiformer's scoring: the query at m' = pos - query_origin, the key at n' = pos_j - earliest_retrieved.
  const double lam = logn_factor(c.logn_train_len, pos) * resolved_scale(*this, softmax_scale);
  const double a = impl_->freqs.attention_factor;
  std::vector<double> qd(static_cast<size_t>(D)), kd(static_cast<size_t>(D)), kr(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) qd[size_t(d)] = q[d], kd[size_t(d)] = k[size_t(d)];
  rotate_row(impl_->freqs, double(pos - query_origin), lam * a, lam, qd.data(), sq.data());
  rotate_row(impl_->freqs, double(positions()[row] - earliest_retrieved), a, 1.0, kd.data(), kr.data());
  double s = 0;
  for (int d = 0; d < D; ++d) s += sq[size_t(d)] * kr[size_t(d)];
  return s;
}

}  // namespace rotary
