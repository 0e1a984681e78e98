// float64 oracle of attention_decode: one (sequence, query head) at a time, every score straight from its mode's
// definition with std::cos/std::sin of the exact distance (no near table, no leaky far-key copy, no split).
// Its pair rotation is written out here, not taken from rotate_pair.h / rotate_pairs-inl.h: an oracle that shared
// the fast path's code would share its mistakes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "rotary/error.h"
#include "rotary/kv_cache.h"

namespace rotary {

namespace {

// Element e of a stored array as float64: in the cache's dtype, or (Q8) quant x its block's scale.
double stored(const KvCache& c, const void* base, const float* scales, int64_t e) {
  if (c.storage() == KvStorage::Q8) return double(static_cast<const int8_t*>(base)[e]) * double(scales[e / kQ8Block]);
  return load_as_double(base, c.dtype(), e);
}

// Stored row j of kv head g (cache layout) back in the caller's feature order, as float64.
void read_row(const KvCache& c, const void* base, const float* scales, int64_t g, int64_t j, std::vector<double>& out) {
  const KvCacheLayout& lay = c.layout();
  const int D = c.head_dim();
  const int n = c.pos().mode == PositionMode::None ? 0 : c.pos().freqs->pairs(), r = 2 * n;
  const int64_t row = (g * c.capacity() + j) * lay.row_stride;
  for (int i = 0; i < n; ++i) {
    const auto [fa, fb] = rope_pair(c.pos().freqs->layout, r, i);
    out[size_t(fa)] = stored(c, base, scales, row + i);
    out[size_t(fb)] = stored(c, base, scales, row + lay.half + i);
  }
  for (int f = r; f < D; ++f) out[size_t(f)] = stored(c, base, scales, row + 2 * lay.half + f - r);
}

// q . (a^2 R(-dist) k) on the rotary pairs plus q . k on the pass-through features.
double relative_score(const RopeFreqs& f, const std::vector<double>& q, const std::vector<double>& k, double dist) {
  const int r = f.rotary_dim;
  const double a2 = f.attention_factor * f.attention_factor;
  double s = 0;
  for (int i = 0; i < r / 2; ++i) {
    const auto [fa, fb] = rope_pair(f.layout, r, i);
    const double ang = dist * f.inv_freq[size_t(i)], c = std::cos(ang), sn = std::sin(ang);
    const double k1 = k[size_t(fa)] * c + k[size_t(fb)] * sn, k2 = -k[size_t(fa)] * sn + k[size_t(fb)] * c;
    s += a2 * (q[size_t(fa)] * k1 + q[size_t(fb)] * k2);
  }
  for (int d = r; d < f.head_dim; ++d) s += q[size_t(d)] * k[size_t(d)];
  return s;
}

// x <- scale * R(sign * pos) x in the caller's layout (rotary pairs only).
void rotate(const RopeFreqs& f, std::vector<double>& x, double pos, double scale) {
  const int r = f.rotary_dim;
  for (int i = 0; i < r / 2; ++i) {
    const auto [fa, fb] = rope_pair(f.layout, r, i);
    const double ang = pos * f.inv_freq[size_t(i)], c = std::cos(ang) * scale, s = std::sin(ang) * scale;
    const double x1 = x[size_t(fa)], x2 = x[size_t(fb)];
    x[size_t(fa)] = x1 * c - x2 * s;
    x[size_t(fb)] = x1 * s + x2 * c;
  }
}

void decode_one(const KvCache& c, const DecodeParams& p, int64_t b, int64_t h) {
  const PositionParams& pp = c.pos();
  const int D = c.head_dim();
  const int64_t n = c.size(), G = p.q.heads / c.kv_heads(), g = h / G;
  const int64_t q_pos = p.q_positions ? p.q_positions[b] : c.last_position();
  double scale = p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(D));
  if (pp.logn_train_len > 1) scale *= std::max(1.0, std::log(double(q_pos) + 1) / std::log(double(pp.logn_train_len)));
  std::vector<double> q(static_cast<size_t>(D)), k(static_cast<size_t>(D)), s(static_cast<size_t>(n)),
      o(static_cast<size_t>(D), 0.0);
  const int64_t qoff = b * p.q.token_stride + h * p.q.head_stride;
  for (int d = 0; d < D; ++d) q[size_t(d)] = scale * load_as_double(p.q.data, c.dtype(), qoff + d);
  if (pp.mode == PositionMode::Rope) rotate(*pp.freqs, q, double(q_pos), pp.freqs->attention_factor);

  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    read_row(c, c.keys(), c.key_scales(), g, j, k);
    const double dist = double(q_pos - c.positions()[j]), w = double(pp.window);
    double sj = 0;
    switch (pp.mode) {
      case PositionMode::None:
      case PositionMode::Rope:  // keys stored as a R(pos_j) k_j
        for (int d = 0; d < D; ++d) sj += q[size_t(d)] * k[size_t(d)];
        break;
      case PositionMode::Rerope: sj = relative_score(*pp.freqs, q, k, std::min(dist, w)); break;
      case PositionMode::LeakyRerope:
        sj = relative_score(*pp.freqs, q, k, dist < w ? dist : w + (dist - w) / pp.leaky_k);
        break;
    }
    s[size_t(j)] = sj;
    mx = std::max(mx, sj);
  }
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(s[size_t(j)] - mx);
  for (int64_t j = 0; j < n; ++j) {
    const double pj = std::exp(s[size_t(j)] - mx) / sum;
    read_row(c, c.values(), c.value_scales(), g, j, k);
    if (pp.roper && pp.mode != PositionMode::Rope) {  // value turned by R(-delta), delta the distance the score saw
      const double dist = double(q_pos - c.positions()[j]), w = double(pp.window);
      double delta = dist;
      if (dist >= w) delta = pp.mode == PositionMode::Rerope ? w : w + (dist - w) / pp.leaky_k;
      rotate(*pp.freqs, k, -delta, 1.0);
    }
    for (int d = 0; d < D; ++d) o[size_t(d)] += pj * k[size_t(d)];
  }
  if (pp.roper && pp.mode == PositionMode::Rope) rotate(*pp.freqs, o, -double(q_pos), 1.0);  // values R(pos_j) v_j
  const int64_t ooff = b * p.o.token_stride + h * p.o.head_stride;
  for (int d = 0; d < D; ++d) store_from_double(p.o.data, c.dtype(), ooff + d, o[size_t(d)]);
  if (p.lse) {
    const int64_t i = b * p.q.heads + h;
    if (c.dtype() == DType::F64)
      static_cast<double*>(p.lse)[i] = mx + std::log(sum);
    else
      static_cast<float*>(p.lse)[i] = float(mx + std::log(sum));
  }
}

}  // namespace

void attention_decode_reference(std::span<const KvCache* const> caches, const DecodeParams& p) {
  validate_decode_params(caches, p);
  for (int64_t b = 0; b < int64_t(caches.size()); ++b)
    for (int64_t h = 0; h < p.q.heads; ++h) decode_one(*caches[size_t(b)], p, b, h);
}

}  // namespace rotary
