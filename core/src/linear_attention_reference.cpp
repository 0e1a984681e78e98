// float64 oracle of linear attention with RoPE: per (sequence, head) the N x N numerator matrix
// A[m][n] = (a R(pos_m) phi(q_m)) . (a R(pos_n) phi(k_n)) and denominator matrix B[m][n] = phi(q_m) . phi(k_n)
// are materialised (causal: n <= m), o_m = sum_n A v_n / sum_n B; the backward differentiates those matrices.
// Its pair rotation is written out here, not taken from rotate_pair.h / rotate_pairs-inl.h: an oracle that shared
// the fast path's code would share its mistakes.
#include <cmath>
#include <vector>

#include "rotary/linear_attention.h"

namespace rotary {

namespace {

using Vec = std::vector<double>;

Vec load(const HeadsView& v, DType t, int64_t tok, int64_t h, int n) {
  Vec x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) x[size_t(i)] = load_as_double(v.data, t, tok * v.token_stride + h * v.head_stride + i);
  return x;
}
void store(const HeadsView& v, DType t, int64_t tok, int64_t h, const Vec& x) {
  for (size_t i = 0; i < x.size(); ++i)
    store_from_double(v.data, t, tok * v.token_stride + h * v.head_stride + int64_t(i), x[i]);
}

double phi(double x, FeatureMap f) { return f == FeatureMap::Identity ? x : x > 0 ? x + 1 : std::exp(x); }
double dphi(double x, FeatureMap f) { return f == FeatureMap::Identity ? 1 : x > 0 ? 1 : std::exp(x); }

// a R(pos) x (sign +1) or its transpose (sign -1), straight from std::cos/std::sin.
Vec turn(const RopeFreqs* f, const Vec& x, int64_t pos, double sign) {
  Vec y(x);
  if (!f) return y;
  const int r = f->rotary_dim;
  for (int i = 0; i < r / 2; ++i) {
    const auto [a, b] = rope_pair(f->layout, r, i);
    const double ang = double(pos) * f->inv_freq[size_t(i)];
    const double c = std::cos(ang) * f->attention_factor, s = sign * std::sin(ang) * f->attention_factor;
    y[size_t(a)] = x[size_t(a)] * c - x[size_t(b)] * s;
    y[size_t(b)] = x[size_t(a)] * s + x[size_t(b)] * c;
  }
  return y;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// One (sequence, head): inputs, features and the two matrices.
struct Head {
  int64_t t0 = 0, L = 0;
  std::vector<int64_t> pos;
  std::vector<Vec> q, k, v, phq, phk, qr, kr;
  Vec A, B, den;       // [L*L], [L*L], [L]
  std::vector<Vec> o;  // [L][Dv]
};

Head build(const LinearAttentionParams& p, int64_t b, int64_t h) {
  Head m;
  m.t0 = p.cu_seqlens ? p.cu_seqlens[b] : 0;
  m.L = (p.cu_seqlens ? p.cu_seqlens[b + 1] : p.tokens) - m.t0;
  const int D = p.head_dim, Dv = p.value_dim > 0 ? p.value_dim : p.head_dim;
  for (int64_t i = 0; i < m.L; ++i) {
    const int64_t t = m.t0 + i, pos = p.positions ? p.positions[t] : i;
    m.pos.push_back(pos);
    m.q.push_back(load(p.q, p.dtype, t, h, D));
    m.k.push_back(load(p.k, p.dtype, t, h, D));
    m.v.push_back(load(p.v, p.dtype, t, h, Dv));
    Vec pq(m.q.back()), pk(m.k.back());
    for (double& x : pq) x = phi(x, p.feature_map);
    for (double& x : pk) x = phi(x, p.feature_map);
    m.phq.push_back(pq), m.phk.push_back(pk);
    m.qr.push_back(turn(p.freqs, pq, pos, 1)), m.kr.push_back(turn(p.freqs, pk, pos, 1));
  }
  const int64_t L = m.L;
  m.A.assign(size_t(L * L), 0), m.B.assign(size_t(L * L), 0), m.den.assign(size_t(L), 0);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < (p.causal ? i + 1 : L); ++j) {
      m.A[size_t(i * L + j)] = dot(m.qr[size_t(i)], m.kr[size_t(j)]);
      m.B[size_t(i * L + j)] = dot(m.phq[size_t(i)], m.phk[size_t(j)]);
    }
  for (int64_t i = 0; i < L; ++i) {
    Vec o(static_cast<size_t>(Dv), 0.0);
    // Only the keys row i sees: a masked entry's zero weight times a later NaN value would still be NaN.
    for (int64_t j = 0; j < (p.causal ? i + 1 : L); ++j) {
      m.den[size_t(i)] += m.B[size_t(i * L + j)];
      for (int e = 0; e < Dv; ++e) o[size_t(e)] += m.A[size_t(i * L + j)] * m.v[size_t(j)][size_t(e)];
    }
    for (double& x : o) x /= m.den[size_t(i)];
    m.o.push_back(o);
  }
  return m;
}

}  // namespace

void linear_attention_forward_reference(const LinearAttentionParams& p) {
  validate_linear_attention_params(p);
  if (p.tokens == 0) return;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q.heads; ++h) {
      const Head m = build(p, b, h);
      for (int64_t i = 0; i < m.L; ++i) store(p.o, p.dtype, m.t0 + i, h, m.o[size_t(i)]);
    }
}

void linear_attention_backward_reference(const LinearAttentionGradParams& g) {
  validate_linear_attention_grad_params(g);
  const LinearAttentionParams& p = g.fwd;
  if (p.tokens == 0) return;
  const int D = p.head_dim, Dv = p.value_dim > 0 ? p.value_dim : p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q.heads; ++h) {
      const Head m = build(p, b, h);
      const int64_t L = m.L;
      // dL/dA[i][j] = g_i . v_j and dL/dB[i][j] = dden_i, with g_i = dO_i / den_i, dden_i = -(dO_i . o_i) / den_i.
      std::vector<Vec> gi;
      Vec dden(static_cast<size_t>(L));
      for (int64_t i = 0; i < L; ++i) {
        Vec d = load(g.dout, p.dtype, m.t0 + i, h, Dv);
        dden[size_t(i)] = -dot(d, m.o[size_t(i)]) / m.den[size_t(i)];
        for (double& x : d) x /= m.den[size_t(i)];
        gi.push_back(d);
      }
      for (int64_t i = 0; i < L; ++i) {  // dq_i
        Vec dqr(static_cast<size_t>(D), 0.0), dph(static_cast<size_t>(D), 0.0);
        for (int64_t j = 0; j < (p.causal ? i + 1 : L); ++j) {
          const double dA = dot(gi[size_t(i)], m.v[size_t(j)]);
          for (int d = 0; d < D; ++d) {
            dqr[size_t(d)] += dA * m.kr[size_t(j)][size_t(d)];
            dph[size_t(d)] += dden[size_t(i)] * m.phk[size_t(j)][size_t(d)];
          }
        }
        const Vec back = turn(p.freqs, dqr, m.pos[size_t(i)], -1);
        Vec dq(static_cast<size_t>(D));
        for (int d = 0; d < D; ++d)
          dq[size_t(d)] = (back[size_t(d)] + dph[size_t(d)]) * dphi(m.q[size_t(i)][size_t(d)], p.feature_map);
        store(g.dq, p.dtype, m.t0 + i, h, dq);
      }
      for (int64_t j = 0; j < L; ++j) {  // dk_j, dv_j
        Vec dkr(static_cast<size_t>(D), 0.0), dph(static_cast<size_t>(D), 0.0), dv(static_cast<size_t>(Dv), 0.0);
        for (int64_t i = p.causal ? j : 0; i < L; ++i) {
          const double dA = dot(gi[size_t(i)], m.v[size_t(j)]), A = m.A[size_t(i * L + j)];
          for (int d = 0; d < D; ++d) {
            dkr[size_t(d)] += dA * m.qr[size_t(i)][size_t(d)];
            dph[size_t(d)] += dden[size_t(i)] * m.phq[size_t(i)][size_t(d)];
          }
          for (int e = 0; e < Dv; ++e) dv[size_t(e)] += A * gi[size_t(i)][size_t(e)];
        }
        const Vec back = turn(p.freqs, dkr, m.pos[size_t(j)], -1);
        Vec dk(static_cast<size_t>(D));
        for (int d = 0; d < D; ++d)
          dk[size_t(d)] = (back[size_t(d)] + dph[size_t(d)]) * dphi(m.k[size_t(j)][size_t(d)], p.feature_map);
        store(g.dk, p.dtype, m.t0 + j, h, dk);
        store(g.dv, p.dtype, m.t0 + j, h, dv);
      }
    }
}

}  // namespace rotary
