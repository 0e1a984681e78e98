// Linear attention with RoPE (rotary/linear_attention.h): validation and the fast running-state forward and
// backward. One OpenMP task per (sequence, head); inside it a scan over tokens with a [D, Dv] state, so the cost
// is O(N D Dv) and no N x N buffer exists. fp32 arithmetic for f32/f16/bf16 storage, fp64 for f64.
#include "rotary/linear_attention.h"

#include <omp.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "rotary/angles.h"
#include "rotary/error.h"
#include "rotate_pair.h"
#include "storage.h"
#include "validate.h"

namespace rotary {

namespace {

template <class W>
void load(const HeadsView& v, DType t, int64_t tok, int64_t h, int n, W* out) {
  detail::load_row(v.data, t, tok * v.token_stride + h * v.head_stride, n, out);
}
template <class W>
void store(const HeadsView& v, DType t, int64_t tok, int64_t h, int n, const W* in) {
  detail::store_row(v.data, t, tok * v.token_stride + h * v.head_stride, n, in);
}

// phi = elu + 1 and its derivative (both exp(x) for x <= 0), or the identity (the caller's features).
template <class W>
inline W phi(W x, FeatureMap f) {
  if (f == FeatureMap::Identity) return x;
  return x > 0 ? x + W(1) : std::exp(x);
}
template <class W>
inline W dphi(W x, FeatureMap f) {
  if (f == FeatureMap::Identity) return W(1);
  return x > 0 ? W(1) : std::exp(x);
}

// The rotation a R(pos) of one token, and its transpose.
template <class W>
struct Turn {
  const RopeFreqs* f = nullptr;
  std::vector<W> c, s;
  explicit Turn(const RopeFreqs* freqs) : f(freqs), c(f ? size_t(f->pairs()) : 0), s(c.size()) {}
  void at(int64_t pos) {
    if (!f) return;
    if constexpr (std::is_same_v<W, double>)
      rope_cos_sin_f64(f->inv_freq.data(), f->pairs(), pos, f->attention_factor, c.data(), s.data());
    else
      rope_cos_sin(f->inv_freq.data(), f->pairs(), pos, f->attention_factor, c.data(), s.data());
  }
  // y = a R x (sign +1) or y = (a R)^T x (sign -1); features past rotary_dim copied.
  void apply(const W* x, W* y, int D, W sign) const {
    for (int d = 0; d < D; ++d) y[d] = x[d];
    if (!f) return;
    const int r = f->rotary_dim;
    for (int i = 0; i < r / 2; ++i) {
      const auto [a, b] = rope_pair(f->layout, r, i);
      const auto [ya, yb] = detail::rotate_pair(x[a], x[b], c[size_t(i)], sign * s[size_t(i)]);
      y[a] = ya;
      y[b] = yb;
    }
  }
};

struct Seqs {
  const LinearAttentionParams& p;
  int64_t begin(int64_t b) const { return p.cu_seqlens ? p.cu_seqlens[b] : 0; }
  int64_t end(int64_t b) const { return p.cu_seqlens ? p.cu_seqlens[b + 1] : p.tokens; }
  int64_t pos(int64_t b, int64_t t) const { return p.positions ? p.positions[t] : t - begin(b); }
};

int value_dim(const LinearAttentionParams& p) { return p.value_dim > 0 ? p.value_dim : p.head_dim; }

// State updates: S += x y^T ([D, Dv] row-major), out = x^T S, out = S y.
template <class W>
void add_outer(W* S, const W* x, const W* y, int D, int Dv) {
  for (int i = 0; i < D; ++i) {
    const W xi = x[i];
    W* row = S + size_t(i) * size_t(Dv);
    for (int e = 0; e < Dv; ++e) row[e] += xi * y[e];
  }
}
template <class W>
void left_mul(const W* S, const W* x, int D, int Dv, W* out) {
  for (int e = 0; e < Dv; ++e) out[e] = 0;
  for (int i = 0; i < D; ++i) {
    const W xi = x[i];
    const W* row = S + size_t(i) * size_t(Dv);
    for (int e = 0; e < Dv; ++e) out[e] += xi * row[e];
  }
}
template <class W>
void right_mul(const W* S, const W* y, int D, int Dv, W* out) {
  for (int i = 0; i < D; ++i) {
    const W* row = S + size_t(i) * size_t(Dv);
    W acc = 0;
    for (int e = 0; e < Dv; ++e) acc += row[e] * y[e];
    out[i] = acc;
  }
}
template <class W>
W dot(const W* a, const W* b, int n) {
  W s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Token t of head h: phi(x) and a R(pos) phi(x).
template <class W>
void feature(const HeadsView& v, DType dt, FeatureMap f, int64_t t, int64_t h, int D, Turn<W>& turn, int64_t pos,
             W* x, W* ph, W* rotated) {
  load(v, dt, t, h, D, x);
  for (int d = 0; d < D; ++d) ph[d] = phi(x[d], f);
  turn.at(pos);
  turn.apply(ph, rotated, D, W(1));
}

template <class W>
void forward_head(const LinearAttentionParams& p, int64_t b, int64_t h) {
  const Seqs sq{p};
  const int D = p.head_dim, Dv = value_dim(p);
  const size_t nD = size_t(D), nV = size_t(Dv);
  std::vector<W> S(nD * nV, W(0)), z(nD, W(0)), x(nD), ph(nD), r(nD), v(nV), o(nV);
  Turn<W> turn(p.freqs);
  auto absorb = [&](int64_t t) {  // S += (a R phi(k_t)) v_t^T, z += phi(k_t)
    feature(p.k, p.dtype, p.feature_map, t, h, D, turn, sq.pos(b, t), x.data(), ph.data(), r.data());
    load(p.v, p.dtype, t, h, Dv, v.data());
    add_outer(S.data(), r.data(), v.data(), D, Dv);
    for (int d = 0; d < D; ++d) z[size_t(d)] += ph[size_t(d)];
  };
  if (!p.causal)
    for (int64_t t = sq.begin(b); t < sq.end(b); ++t) absorb(t);
  for (int64_t t = sq.begin(b); t < sq.end(b); ++t) {
    if (p.causal) absorb(t);
    feature(p.q, p.dtype, p.feature_map, t, h, D, turn, sq.pos(b, t), x.data(), ph.data(), r.data());
    left_mul(S.data(), r.data(), D, Dv, o.data());
    const W den = dot(ph.data(), z.data(), D);
    for (int e = 0; e < Dv; ++e) o[size_t(e)] /= den;
    store(p.o, p.dtype, t, h, Dv, o.data());
  }
}

template <class W>
void backward_head(const LinearAttentionGradParams& g, int64_t b, int64_t h) {
  const LinearAttentionParams& p = g.fwd;
  const Seqs sq{p};
  const int D = p.head_dim, Dv = value_dim(p);
  const int64_t t0 = sq.begin(b), L = sq.end(b) - t0;
  const size_t DDv = size_t(D) * size_t(Dv);
  const size_t nD = size_t(D), nV = size_t(Dv);
  std::vector<W> S(DDv, W(0)), z(nD, W(0)), x(nD), ph(nD), r(nD), v(nV), o(nV), dout(nV), tmp(nD), grad(nD);
  // Per token of the pass below: g_m = dO_m / den_m [Dv] and dden_m = -(dO_m . o_m) / den_m.
  std::vector<W> gm(size_t(L) * nV), dden(static_cast<size_t>(L));
  Turn<W> turn(p.freqs);

  // Forward scan: recompute o_m, then dq_m = phi'(q_m) * ((a R)^T S_m g_m + dden_m z_m).
  auto absorb = [&](int64_t t) {
    feature(p.k, p.dtype, p.feature_map, t, h, D, turn, sq.pos(b, t), x.data(), ph.data(), r.data());
    load(p.v, p.dtype, t, h, Dv, v.data());
    add_outer(S.data(), r.data(), v.data(), D, Dv);
    for (int d = 0; d < D; ++d) z[size_t(d)] += ph[size_t(d)];
  };
  if (!p.causal)
    for (int64_t t = t0; t < t0 + L; ++t) absorb(t);
  for (int64_t m = 0; m < L; ++m) {
    const int64_t t = t0 + m;
    if (p.causal) absorb(t);
    feature(p.q, p.dtype, p.feature_map, t, h, D, turn, sq.pos(b, t), x.data(), ph.data(), r.data());
    left_mul(S.data(), r.data(), D, Dv, o.data());
    const W den = dot(ph.data(), z.data(), D);
    load(g.dout, p.dtype, t, h, Dv, dout.data());
    W* gmm = gm.data() + size_t(m) * size_t(Dv);
    W od = 0;  // o holds the numerator here, so od = dO_m . o_m
    for (int e = 0; e < Dv; ++e) {
      gmm[e] = dout[size_t(e)] / den;
      od += gmm[e] * o[size_t(e)];
    }
    dden[size_t(m)] = -od / den;
    right_mul(S.data(), gmm, D, Dv, tmp.data());
    turn.apply(tmp.data(), grad.data(), D, W(-1));
    for (int d = 0; d < D; ++d)
      grad[size_t(d)] = (grad[size_t(d)] + dden[size_t(m)] * z[size_t(d)]) * dphi(x[size_t(d)], p.feature_map);
    store(g.dq, p.dtype, t, h, D, grad.data());
  }

  // Reverse scan: P_n = sum_{m>=n} (a R phi(q_m)) g_m^T, u_n = sum_{m>=n} dden_m phi(q_m);
  // dv_n = P_n^T (a R phi(k_n)), dk_n = phi'(k_n) * ((a R)^T P_n v_n + u_n).
  std::vector<W>& P = S;
  std::vector<W>& u = z;
  std::fill(P.begin(), P.end(), W(0));
  std::fill(u.begin(), u.end(), W(0));
  auto absorb_q = [&](int64_t m) {
    feature(p.q, p.dtype, p.feature_map, t0 + m, h, D, turn, sq.pos(b, t0 + m), x.data(), ph.data(), r.data());
    add_outer(P.data(), r.data(), gm.data() + size_t(m) * size_t(Dv), D, Dv);
    for (int d = 0; d < D; ++d) u[size_t(d)] += dden[size_t(m)] * ph[size_t(d)];
  };
  if (!p.causal)
    for (int64_t m = 0; m < L; ++m) absorb_q(m);
  for (int64_t n = L - 1; n >= 0; --n) {
    const int64_t t = t0 + n;
    if (p.causal) absorb_q(n);
    feature(p.k, p.dtype, p.feature_map, t, h, D, turn, sq.pos(b, t), x.data(), ph.data(), r.data());
    load(p.v, p.dtype, t, h, Dv, v.data());
    left_mul(P.data(), r.data(), D, Dv, o.data());  // dv_n
    store(g.dv, p.dtype, t, h, Dv, o.data());
    right_mul(P.data(), v.data(), D, Dv, tmp.data());
    turn.apply(tmp.data(), grad.data(), D, W(-1));
    for (int d = 0; d < D; ++d) grad[size_t(d)] = (grad[size_t(d)] + u[size_t(d)]) * dphi(x[size_t(d)], p.feature_map);
    store(g.dk, p.dtype, t, h, D, grad.data());
  }
}

int resolve_threads(int t) { return t > 0 ? t : omp_get_max_threads(); }

// feature_map = Identity: every value of q and k must be > 0 (NaN passes, as an input NaN does elsewhere).
void check_positive_features(const HeadsView& v, const char* name, DType t, int64_t tokens, int D) {
  std::vector<double> row(static_cast<size_t>(D));
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int64_t h = 0; h < v.heads; ++h) {
      load(v, t, tok, h, D, row.data());
      for (int d = 0; d < D; ++d)
        if (row[size_t(d)] <= 0)
          fail(name, to_text(row[size_t(d)]) + " at token " + std::to_string(tok) + ", head " + std::to_string(h) +
                         ", feature " + std::to_string(d),
               "> 0 with feature_map = identity (positive features keep the normaliser positive)");
    }
}

}  // namespace

const char* feature_map_name(FeatureMap f) { return f == FeatureMap::Identity ? "identity" : "elu_plus_one"; }

FeatureMap parse_feature_map(const std::string& name) {
  for (FeatureMap f : {FeatureMap::EluPlusOne, FeatureMap::Identity})
    if (name == feature_map_name(f)) return f;
  fail("feature_map", "\"" + name + "\"", "elu_plus_one or identity");
}

void validate_linear_attention_params(const LinearAttentionParams& p) {
  check(p.tokens >= 0, "tokens", p.tokens, ">= 0");
  check(p.head_dim >= 1 && p.head_dim <= 1024, "head_dim", p.head_dim, "1..1024");
  check(p.value_dim >= 0 && p.value_dim <= 1024, "value_dim", p.value_dim, "1..1024, or 0 for head_dim");
  detail::check_dtype(p.dtype);
  if (p.freqs) {
    p.freqs->validate();
    if (p.freqs->head_dim != p.head_dim)
      fail("freqs->head_dim", to_text(p.freqs->head_dim), "head_dim = " + std::to_string(p.head_dim));
  }
  detail::check_threads(p.threads);
  detail::check_sequences(p.cu_seqlens, p.batch, p.tokens);
  if (p.tokens == 0) return;
  const int Dv = value_dim(p);
  detail::check_view(p.q, "q", p.tokens, p.head_dim);
  detail::check_view(p.k, "k", p.tokens, p.head_dim, p.q.heads, "q.heads");
  detail::check_view(p.v, "v", p.tokens, Dv, p.q.heads, "q.heads");
  detail::check_view(p.o, "o", p.tokens, Dv, p.q.heads, "q.heads");
  if (p.positions) detail::check_positions(p.positions, 0, p.tokens, "", false, false);
  check(p.feature_map == FeatureMap::EluPlusOne || p.feature_map == FeatureMap::Identity, "feature_map",
        int(p.feature_map), "EluPlusOne or Identity");
  if (p.feature_map == FeatureMap::Identity) {
    check_positive_features(p.q, "q", p.dtype, p.tokens, p.head_dim);
    check_positive_features(p.k, "k", p.dtype, p.tokens, p.head_dim);
  }
}

void validate_linear_attention_grad_params(const LinearAttentionGradParams& g) {
  const LinearAttentionParams& p = g.fwd;
  LinearAttentionParams no_o = p;  // the backward does not read o
  if (no_o.o.data == nullptr) no_o.o = p.v;
  validate_linear_attention_params(no_o);
  if (p.tokens == 0) return;
  const int Dv = value_dim(p);
  detail::check_view(g.dout, "dout", p.tokens, Dv, p.q.heads, "q.heads");
  detail::check_view(g.dq, "dq", p.tokens, p.head_dim, p.q.heads, "q.heads");
  detail::check_view(g.dk, "dk", p.tokens, p.head_dim, p.q.heads, "q.heads");
  detail::check_view(g.dv, "dv", p.tokens, Dv, p.q.heads, "q.heads");
}

void linear_attention_forward(const LinearAttentionParams& p) {
  validate_linear_attention_params(p);
  if (p.tokens == 0) return;
  const int64_t H = p.q.heads, tasks = p.batch * H;
#pragma omp parallel for schedule(dynamic, 1) num_threads(resolve_threads(p.threads))
  for (int64_t i = 0; i < tasks; ++i) {
    if (p.dtype == DType::F64)
      forward_head<double>(p, i / H, i % H);
    else
      forward_head<float>(p, i / H, i % H);
  }
}

void linear_attention_backward(const LinearAttentionGradParams& g) {
  validate_linear_attention_grad_params(g);
  const LinearAttentionParams& p = g.fwd;
  if (p.tokens == 0) return;
  const int64_t H = p.q.heads, tasks = p.batch * H;
#pragma omp parallel for schedule(dynamic, 1) num_threads(resolve_threads(p.threads))
  for (int64_t i = 0; i < tasks; ++i) {
    if (p.dtype == DType::F64)
      backward_head<double>(g, i / H, i % H);
    else
      backward_head<float>(g, i / H, i % H);
  }
}

}  // namespace rotary
