// core/src/kv_memory.cpp: the retrieval memory (rotary/kv_memory.h) - storage, search query, exact top-k
// memory attention and its float64 oracle.
#include "rotary/kv_memory.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "rotary/error.h"
#include "storage.h"
#include "validate.h"

namespace rotary {

const char* memory_policy_name(MemoryPolicy p) {
  switch (p) {
    case MemoryPolicy::Exact: return "exact";
    case MemoryPolicy::Rerope: return "rerope";
    case MemoryPolicy::NoRotation: return "none";
  }
  return "?";
}

MemoryPolicy parse_memory_policy(const std::string& name) {
  if (name == "exact") return MemoryPolicy::Exact;
  if (name == "rerope") return MemoryPolicy::Rerope;
  if (name == "none") return MemoryPolicy::NoRotation;
  fail("memory_policy", name, "exact, rerope or none");
}

namespace {

// y = pair_scale R(pos) x over the rotary pairs of `f`'s layout; features past rotary_dim times pass_scale (the
// attention factor scales the rotated pairs only, as everywhere in the core). Angles in double from the exact
// position, so they are right at |pos| up to 2^53.
template <class T>
void rotate_row(const RopeFreqs& f, double pos, double pair_scale, double pass_scale, const T* x, T* y) {
  const int pairs = f.pairs(), r = f.rotary_dim;
  for (int i = 0; i < pairs; ++i) {
    const int a = f.layout == RopeLayout::Interleaved ? 2 * i : i;
    const int b = f.layout == RopeLayout::Interleaved ? 2 * i + 1 : i + r / 2;
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
  std::vector<std::vector<float>> keys, values;  // per kv head: [size, D]
  std::vector<int64_t> positions;

  // The search vector of query q at pos, in W (float or double), times `scale`.
  template <class W>
  void query(const float* q, int64_t pos, double scale, W* out) const {
    const int D = config.head_dim;
    const double lam = logn_factor(config.logn_train_len, pos) * scale;
    const double a = config.freqs ? freqs.attention_factor : 1.0;
    std::vector<W> in(static_cast<size_t>(D));
    for (int d = 0; d < D; ++d) in[size_t(d)] = W(q[d]);
    switch (config.policy) {
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
  for (auto& k : impl_->keys) k.clear();
  for (auto& v : impl_->values) v.clear();
  impl_->positions.clear();
}

int64_t KvMemory::size() const { return int64_t(impl_->positions.size()); }
int64_t KvMemory::kv_heads() const { return impl_->config.kv_heads; }
int KvMemory::head_dim() const { return impl_->config.head_dim; }
const KvMemoryConfig& KvMemory::config() const { return impl_->config; }
const float* KvMemory::keys(int64_t h) const { return impl_->keys.at(size_t(h)).data(); }
const float* KvMemory::values(int64_t h) const { return impl_->values.at(size_t(h)).data(); }
const int64_t* KvMemory::positions() const { return impl_->positions.data(); }

void KvMemory::search_query(const float* q, int64_t pos, double softmax_scale, float* out) const {
  const double scale = softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(double(impl_->config.head_dim));
  impl_->query(q, pos, scale, out);
}
void KvMemory::search_query(const float* q, int64_t pos, double softmax_scale, double* out) const {
  const double scale = softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(double(impl_->config.head_dim));
  impl_->query(q, pos, scale, out);
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
  detail::check_threads(p.threads);
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
  m.search_query(q, p.q_positions[t], p.softmax_scale, sq.data());  // the oracle's in double throughout
  const float* K = m.keys(kvh);
  const float* V = m.values(kvh);
  std::vector<std::pair<W, int64_t>> scored(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) {
    const float* kr = K + j * D;
    W s = 0;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; ++d) s += sq[size_t(d)] * W(kr[d]);
    scored[size_t(j)] = {s, j};
  }
  const size_t k = size_t(p.top_k);
  auto better = [](const std::pair<W, int64_t>& a, const std::pair<W, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (reference) {
    std::stable_sort(scored.begin(), scored.end(), better);
  } else {
    std::nth_element(scored.begin(), scored.begin() + std::ptrdiff_t(k - 1), scored.end(), better);
    std::sort(scored.begin(), scored.begin() + std::ptrdiff_t(k), better);
  }
  const W mx = scored[0].first;
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
  const int64_t base = (t * p.q.heads + h) * int64_t(k);
  for (size_t i = 0; i < k; ++i) {
    if (p.retrieved) p.retrieved[base + int64_t(i)] = scored[i].second;
    if (p.retrieved_scores) p.retrieved_scores[base + int64_t(i)] = float(scored[i].first);
  }
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
