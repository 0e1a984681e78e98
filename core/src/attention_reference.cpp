// The float64 oracle of the fused attention kernels: per sequence and head, the score matrices are
// materialised as the seed does it - the full RoPE score matrix and, for ReRoPE / Leaky ReRoPE, a second matrix
// from the beyond-window rotations, selected elementwise by pos_i - pos_j < w - then a plain softmax and the
// weighted sum. RoPER values are rotated per (query, key) pair by R(-delta_ij) directly (not through the
// R(-pos_i) ... R(pos_j) factorisation the fused kernel uses). The backward applies the analytic gradients
// to the same materialised matrices.
// Its pair rotation is written out here, not taken from rotate_pair.h / rotate_pairs-inl.h: an oracle that shared
// the fast path's code would share its mistakes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "rotary/attention.h"
#include "rotary/t5_bias.h"

namespace rotary {

namespace {

using Vec = std::vector<double>;

struct Ref {
  const AttentionParams& p;
  int D = 0, rot = 0;
  double A = 1, scale = 0;
  bool far = false;
  std::vector<int64_t> pos;

  explicit Ref(const AttentionParams& params) : p(params) {
    D = p.head_dim;
    const RopeFreqs* f = p.pos.mode == PositionMode::None ? nullptr : p.pos.freqs;
    rot = f ? f->rotary_dim : 0;
    A = f ? f->attention_factor : 1.0;
    scale = p.softmax_scale != 0 ? p.softmax_scale : 1.0 / std::sqrt(double(D));
    far = p.pos.mode == PositionMode::Rerope || p.pos.mode == PositionMode::LeakyRerope;
    pos.resize(size_t(p.tokens));
    for (int64_t s = 0; s < p.batch; ++s)
      for (int64_t t = seq_begin(s); t < seq_end(s); ++t)
        pos[size_t(t)] = p.positions ? p.positions[t] : t - seq_begin(s);
  }
  int64_t seq_begin(int64_t s) const { return p.cu_seqlens ? p.cu_seqlens[s] : 0; }
  int64_t seq_end(int64_t s) const { return p.cu_seqlens ? p.cu_seqlens[s + 1] : p.tokens; }

  // y = diag(factor * R(angle), I) x, R(angle) turning pair i by angle * inv_freq[i].
  void rotate(double angle, double factor, const double* x, double* y) const {
    const RopeFreqs& f = *p.pos.freqs;
    for (int d = rot; d < D; ++d) y[d] = x[d];
    for (int i = 0; i < rot / 2; ++i) {
      const auto [a, b] = rope_pair(f.layout, rot, i);
      const double c = std::cos(angle * f.inv_freq[size_t(i)]) * factor;
      const double s = std::sin(angle * f.inv_freq[size_t(i)]) * factor;
      const double x1 = x[a], x2 = x[b];
      y[a] = x1 * c - x2 * s;
      y[b] = x1 * s + x2 * c;
    }
  }
  double logn(int64_t t) const {
    if (p.pos.logn_train_len <= 0) return 1.0;
    return std::max(1.0, std::log(double(pos[size_t(t)]) + 1.0) / std::log(double(p.pos.logn_train_len)));
  }
  // The rotations of the query and key inside the window (M_n) and beyond it (M_f), as angle and factor.
  void near_q(int64_t t, double& angle, double& factor) const { angle = double(pos[size_t(t)]), factor = A; }
  void near_k(int64_t t, double& angle, double& factor) const { angle = double(pos[size_t(t)]), factor = A; }
  void far_q(int64_t t, double& angle, double& factor) const {
    const double w = double(p.pos.window), k = p.pos.leaky_k;
    if (p.pos.mode == PositionMode::Rerope) angle = w, factor = A * A;
    else angle = (double(pos[size_t(t)]) - w) / k + w, factor = A;
  }
  // Leaky only: ReRoPE's far keys are not rotated.
  void far_k(int64_t t, double& angle, double& factor) const {
    angle = double(pos[size_t(t)]) / p.pos.leaky_k, factor = A;
  }
  // The score bias of query token i, key token j, head h, straight from rotary/t5_bias.h (not the kernels'
  // table by distance); with it, T5's bucket (-1 without a T5 bias).
  int bucket(int64_t i, int64_t j) const {
    const ScoreBiasParams& b = p.bias;
    if (b.kind != ScoreBias::T5) return -1;
    return t5_relative_bucket(pos[size_t(i)], pos[size_t(j)], b.t5_bidirectional, b.t5_num_buckets, b.t5_max_distance);
  }
  double bias(int64_t h, int64_t i, int64_t j) const {
    const ScoreBiasParams& b = p.bias;
    if (b.kind == ScoreBias::Alibi) return -b.alibi_slopes[h] * double(pos[size_t(i)] - pos[size_t(j)]);
    if (b.kind == ScoreBias::T5) return load_as_double(b.t5_table, p.dtype, int64_t(bucket(i, j)) * p.q.heads + h);
    return 0.0;
  }
  bool near(int64_t i, int64_t j) const { return !far || pos[size_t(i)] - pos[size_t(j)] < p.pos.window; }
  // The effective relative distance the score of (i, j) sees.
  double delta(int64_t i, int64_t j) const {
    const double d = double(pos[size_t(i)] - pos[size_t(j)]);
    if (near(i, j)) return d;
    const double w = double(p.pos.window);
    return p.pos.mode == PositionMode::Rerope ? w : w + (d - w) / p.pos.leaky_k;
  }
};

Vec load_head(const HeadsView& v, DType t, int64_t tok, int64_t h, int D) {
  Vec x(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) x[size_t(d)] = load_as_double(v.data, t, tok * v.token_stride + h * v.head_stride + d);
  return x;
}

void store_head(const HeadsView& v, DType t, int64_t tok, int64_t h, const double* x, int D) {
  for (int d = 0; d < D; ++d) store_from_double(v.data, t, tok * v.token_stride + h * v.head_stride + d, x[d]);
}

// One sequence, one query head: the materialised scores, probabilities and the rotated query/key rows.
struct HeadMatrices {
  int64_t L = 0;
  std::vector<Vec> qn, kn, qf, kf;  // [L][D] rows entering the near and far score products (log-n in q)
  Vec s1, s2, prob;                  // [L][L] near scores, far scores, softmax probabilities
  Vec lse;                           // [L]
};

HeadMatrices head_matrices(const Ref& r, int64_t b, int64_t h) {
  const AttentionParams& p = r.p;
  const int D = r.D;
  const int64_t begin = r.seq_begin(b), L = r.seq_end(b) - begin, hk = h / (p.q.heads / p.k.heads);
  HeadMatrices m;
  m.L = L;
  const bool rotary = p.pos.mode != PositionMode::None;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t t = begin + i;
    // (rows before first_query have no query: their scores are computed from zeros and never read)
    Vec q = t >= p.first_query ? load_head(p.q, p.dtype, t - p.first_query, h, D) : Vec(size_t(D), 0.0);
    Vec k = load_head(p.k, p.dtype, t, hk, D);
    const double lam = r.logn(t);
    for (double& x : q) x *= lam;
    Vec qn(q), kn(k), qf(q), kf(k);
    double angle, factor;
    if (rotary) {
      r.near_q(t, angle, factor), r.rotate(angle, factor, q.data(), qn.data());
      r.near_k(t, angle, factor), r.rotate(angle, factor, k.data(), kn.data());
    }
    if (r.far) {
      r.far_q(t, angle, factor), r.rotate(angle, factor, q.data(), qf.data());
      // ReRoPE's far keys are the raw keys (not a rotation by 0, which would turn an Inf into Inf * 0 = NaN).
      if (p.pos.mode == PositionMode::LeakyRerope)
        r.far_k(t, angle, factor), r.rotate(angle, factor, k.data(), kf.data());
    }
    m.qn.push_back(qn), m.kn.push_back(kn), m.qf.push_back(qf), m.kf.push_back(kf);
  }
  auto dot = [D](const Vec& a, const Vec& c) {
    double s = 0;
    for (int d = 0; d < D; ++d) s += a[size_t(d)] * c[size_t(d)];
    return s;
  };
  m.s1.assign(size_t(L * L), 0), m.s2.assign(size_t(L * L), 0), m.prob.assign(size_t(L * L), 0);
  m.lse.assign(size_t(L), 0);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < L; ++j) {
      const double bias = r.bias(h, begin + i, begin + j);
      m.s1[size_t(i * L + j)] = r.scale * dot(m.qn[size_t(i)], m.kn[size_t(j)]) + bias;
      if (r.far) m.s2[size_t(i * L + j)] = r.scale * dot(m.qf[size_t(i)], m.kf[size_t(j)]) + bias;
    }
  for (int64_t i = 0; i < L; ++i) {
    const int64_t jend = p.causal ? i + 1 : L;
    auto score = [&](int64_t j) {
      return r.near(begin + i, begin + j) ? m.s1[size_t(i * L + j)] : m.s2[size_t(i * L + j)];
    };
    // The maximum ignores NaN; a NaN score still reaches the sum below and makes the row NaN.
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < jend; ++j) mx = std::max(mx, score(j));
    double l = 0;
    for (int64_t j = 0; j < jend; ++j) l += std::exp(score(j) - mx);
    for (int64_t j = 0; j < jend; ++j) m.prob[size_t(i * L + j)] = std::exp(score(j) - mx) / l;
    m.lse[size_t(i)] = mx + std::log(l);
  }
  return m;
}

// u = diag(R(sign * delta_ij), I) x for RoPER (a pure rotation), x otherwise.
Vec value_rotation(const Ref& r, int64_t i, int64_t j, double sign, const Vec& x) {
  if (!r.p.pos.roper) return x;
  Vec y(x.size());
  r.rotate(sign * r.delta(i, j), 1.0, x.data(), y.data());
  return y;
}

}  // namespace

void attention_forward_reference(const AttentionParams& p) {
  validate_attention_params(p);
  if (p.tokens == p.first_query) return;
  const Ref r(p);
  const int D = r.D;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t begin = r.seq_begin(b);
    for (int64_t h = 0; h < p.q.heads; ++h) {
      const HeadMatrices m = head_matrices(r, b, h);
      const int64_t L = m.L, hk = h / (p.q.heads / p.k.heads);
      for (int64_t i = p.first_query; i < L; ++i) {  // (first_query > 0: one sequence, begin = 0)
        Vec o(size_t(D), 0.0);
        const int64_t jend = p.causal ? i + 1 : L;
        for (int64_t j = 0; j < jend; ++j) {
          const Vec u = value_rotation(r, begin + i, begin + j, -1.0, load_head(p.v, p.dtype, begin + j, hk, D));
          for (int d = 0; d < D; ++d) o[size_t(d)] += m.prob[size_t(i * L + j)] * u[size_t(d)];
        }
        store_head(p.o, p.dtype, begin + i - p.first_query, h, o.data(), D);
        if (p.lse) {
          const int64_t at = (begin + i - p.first_query) * p.q.heads + h;
          if (p.dtype == DType::F64) static_cast<double*>(p.lse)[at] = m.lse[size_t(i)];
          else static_cast<float*>(p.lse)[at] = float(m.lse[size_t(i)]);
        }
      }
    }
  }
}

void attention_backward_reference(const AttentionGradParams& g) {
  validate_attention_grad_params(g);
  const AttentionParams& p = g.fwd;
  std::vector<double> dtable(p.bias.kind == ScoreBias::T5 ? size_t(p.bias.t5_num_buckets * p.q.heads) : 0, 0.0);
  auto store_dtable = [&] {
    for (size_t e = 0; e < dtable.size(); ++e) store_from_double(g.dt5_table, p.dtype, int64_t(e), dtable[e]);
  };
  if (p.tokens == 0) return store_dtable();
  const Ref r(p);
  const int D = r.D;
  const int64_t Hq = p.q.heads, Hkv = p.k.heads, group = Hq / Hkv;
  // dk, dv sum over the query heads of a group: [tokens][Hkv][D] in float64 until the end.
  std::vector<double> dk(size_t(p.tokens * Hkv * D), 0.0), dv(dk.size(), 0.0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t begin = r.seq_begin(b);
    for (int64_t h = 0; h < Hq; ++h) {
      const HeadMatrices m = head_matrices(r, b, h);
      const int64_t L = m.L, hk = h / group;
      std::vector<Vec> dout, vrow;
      for (int64_t i = 0; i < L; ++i) {
        dout.push_back(load_head(g.dout, p.dtype, begin + i, h, D));
        vrow.push_back(load_head(p.v, p.dtype, begin + i, hk, D));
      }
      // dP_ij = dout_i . u_ij;  dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij');  dv_j += P_ij R(delta_ij) dout_i.
      Vec ds(size_t(L * L), 0.0);
      for (int64_t i = 0; i < L; ++i) {
        const int64_t jend = p.causal ? i + 1 : L;
        Vec dp(size_t(L), 0.0);
        double rowdot = 0;
        for (int64_t j = 0; j < jend; ++j) {
          const Vec u = value_rotation(r, begin + i, begin + j, -1.0, vrow[size_t(j)]);
          for (int d = 0; d < D; ++d) dp[size_t(j)] += dout[size_t(i)][size_t(d)] * u[size_t(d)];
          rowdot += m.prob[size_t(i * L + j)] * dp[size_t(j)];
          const Vec gv = value_rotation(r, begin + i, begin + j, +1.0, dout[size_t(i)]);
          double* dvj = &dv[size_t(((begin + j) * Hkv + hk) * D)];
          for (int d = 0; d < D; ++d) dvj[d] += m.prob[size_t(i * L + j)] * gv[size_t(d)];
        }
        for (int64_t j = 0; j < jend; ++j) {
          ds[size_t(i * L + j)] = m.prob[size_t(i * L + j)] * (dp[size_t(j)] - rowdot);
          // The bias enters the score with weight 1: its table entry collects dS.
          if (!dtable.empty()) dtable[size_t(r.bucket(begin + i, begin + j) * Hq + h)] += ds[size_t(i * L + j)];
        }
      }
      // Scores s = scale * qn.kn (near) or scale * qf.kf (far): gradients of the rotated rows, then back
      // through the rotations' transposes (and the log-n factor of the query).
      for (int64_t i = 0; i < L; ++i) {
        Vec gqn(size_t(D), 0.0), gqf(size_t(D), 0.0);
        for (int64_t j = 0; j < L; ++j) {
          const double dsij = ds[size_t(i * L + j)] * r.scale;
          if (dsij == 0) continue;
          const bool nr = r.near(begin + i, begin + j);
          const Vec& kr = nr ? m.kn[size_t(j)] : m.kf[size_t(j)];
          Vec& gq = nr ? gqn : gqf;
          for (int d = 0; d < D; ++d) gq[size_t(d)] += dsij * kr[size_t(d)];
        }
        Vec dq(static_cast<size_t>(D), 0.0), tmp(static_cast<size_t>(D));
        double angle, factor;
        if (p.pos.mode == PositionMode::None) {
          dq = gqn;
        } else {
          r.near_q(begin + i, angle, factor), r.rotate(-angle, factor, gqn.data(), tmp.data());
          for (int d = 0; d < D; ++d) dq[size_t(d)] += tmp[size_t(d)];
          if (r.far) {
            r.far_q(begin + i, angle, factor), r.rotate(-angle, factor, gqf.data(), tmp.data());
            for (int d = 0; d < D; ++d) dq[size_t(d)] += tmp[size_t(d)];
          }
        }
        const double lam = r.logn(begin + i);
        for (double& x : dq) x *= lam;
        store_head(g.dq, p.dtype, begin + i, h, dq.data(), D);
      }
      for (int64_t j = 0; j < L; ++j) {
        Vec gkn(size_t(D), 0.0), gkf(size_t(D), 0.0);
        for (int64_t i = 0; i < L; ++i) {
          const double dsij = ds[size_t(i * L + j)] * r.scale;
          if (dsij == 0) continue;
          const bool nr = r.near(begin + i, begin + j);
          const Vec& qr = nr ? m.qn[size_t(i)] : m.qf[size_t(i)];
          Vec& gk = nr ? gkn : gkf;
          for (int d = 0; d < D; ++d) gk[size_t(d)] += dsij * qr[size_t(d)];
        }
        double* dkj = &dk[size_t(((begin + j) * Hkv + hk) * D)];
        Vec tmp(static_cast<size_t>(D));
        double angle, factor;
        if (p.pos.mode == PositionMode::None) {
          for (int d = 0; d < D; ++d) dkj[d] += gkn[size_t(d)];
          continue;
        }
        r.near_k(begin + j, angle, factor), r.rotate(-angle, factor, gkn.data(), tmp.data());
        for (int d = 0; d < D; ++d) dkj[d] += tmp[size_t(d)];
        if (p.pos.mode == PositionMode::Rerope) {
          for (int d = 0; d < D; ++d) dkj[d] += gkf[size_t(d)];
        } else if (r.far) {
          r.far_k(begin + j, angle, factor), r.rotate(-angle, factor, gkf.data(), tmp.data());
          for (int d = 0; d < D; ++d) dkj[d] += tmp[size_t(d)];
        }
      }
    }
  }
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      store_head(g.dk, p.dtype, t, hk, &dk[size_t((t * Hkv + hk) * D)], D);
      store_head(g.dv, p.dtype, t, hk, &dv[size_t((t * Hkv + hk) * D)], D);
    }
  store_dtable();
}

}  // namespace rotary
