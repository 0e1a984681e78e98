// Fused attention backward (flash-attention-2 recomputation, no N x N storage). Per (sequence, query head):
// for each key tile, for each query tile that sees it, recompute the scores from the rotated scratch rows and
// P = exp(S - lse), then
//   dP = dO' V'^T,  dS = P (dP - D_i),  D_i = do_i . o_i
//   dV' += P^T dO',  dK' += dS^T Q',  dQ' += dS K'
// where the primes are the rotated forms of the forward (Qn/Kn inside the window, Qf/Kf beyond; under RoPER
// V' = R(pos_j) v_j and dO' = R(pos_i) do_i, the adjoint of the output rotation R(-pos_i), with far forms
// for ReRoPE/Leaky). The accumulators live in scratch rows per query head, owned by one work item, so no
// atomics; at the end they go back through the transposes of the rotations (and of the log-n and softmax
// scales) and dk/dv sum over the query heads of their group.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_backward_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attention_kernels-inl.h"
#include "attention_prep-inl.h"
#include "attention_plan.h"
#include "hwy/highway.h"
#include "simd_targets.h"
#include "validate.h"

#ifndef ROTARY_ATTENTION_BACKWARD_SHARED_
#define ROTARY_ATTENTION_BACKWARD_SHARED_
namespace rotary::attn {

template <class T>
struct BwdBuffers {
  T *Qn = nullptr, *Qf = nullptr;                // rows [Hq][tokens][Dp] (scale and log-n folded in)
  T *KnT = nullptr, *KfT = nullptr;              // packed [Hkv][blocks][Dp][Bc]
  T *Kn = nullptr, *Kf = nullptr;                // rows [Hkv][tokens][Dp]
  T *VnT = nullptr, *VfT = nullptr;              // packed [Hkv][blocks][Dp][Bc]
  T *dOn = nullptr, *dOf = nullptr;              // rows [Hq][tokens][Dp]
  T *Drow = nullptr, *lse = nullptr;             // [Hq][tokens]
  T *dQn = nullptr, *dQf = nullptr;              // accumulators, rows [Hq][tokens][Dp]
  T *dKn = nullptr, *dKf = nullptr, *dVn = nullptr, *dVf = nullptr;  // per query head, rows [Hq][tokens][Dp]
  T* thread_base = nullptr;
  int64_t per_thread = 0;                        // four [Br][Bc] tiles
  double* dlut = nullptr;                        // T5: per thread [Hq][lut_width] sums of dS by clamped distance
};

template <class T>
BwdBuffers<T> carve_backward(Arena& a, const Plan& pl, int threads) {
  BwdBuffers<T> b;
  const bool two_acc = pl.far && pl.roper;
  const int64_t rows_q = pl.Hq * pl.tokens * pl.Dp, rows_kv = pl.Hkv * pl.tokens * pl.Dp;
  const int64_t packed = pl.Hkv * pl.nblocks * pl.Dp * kBlockKeys;
  b.Qn = a.take<T>(rows_q), b.KnT = a.take<T>(packed), b.Kn = a.take<T>(rows_kv), b.VnT = a.take<T>(packed);
  b.dOn = a.take<T>(rows_q), b.Drow = a.take<T>(pl.Hq * pl.tokens), b.lse = a.take<T>(pl.Hq * pl.tokens);
  b.dQn = a.take<T>(rows_q), b.dKn = a.take<T>(rows_q), b.dVn = a.take<T>(rows_q);
  if (pl.far) {
    b.Qf = a.take<T>(rows_q), b.KfT = a.take<T>(packed), b.Kf = a.take<T>(rows_kv);
    b.dQf = a.take<T>(rows_q), b.dKf = a.take<T>(rows_q);
    if (two_acc) b.VfT = a.take<T>(packed), b.dOf = a.take<T>(rows_q), b.dVf = a.take<T>(rows_q);
  }
  b.per_thread = 4 * int64_t(kBlockRows) * kBlockKeys;
  b.thread_base = a.take<T>(b.per_thread * threads);
  if (pl.bias == ScoreBias::T5) b.dlut = a.take<double>(pl.Hq * pl.lut_width() * threads);
  return b;
}

struct BwdItem {
  int64_t seq, head, cost;
};

inline std::vector<BwdItem> backward_items(const Plan& pl) {
  std::vector<BwdItem> items;
  for (int64_t s = 0; s < pl.batch; ++s)
    for (int64_t h = 0; h < pl.Hq; ++h) items.push_back({s, h, pl.seq_len(s) * pl.seq_len(s)});
  std::stable_sort(items.begin(), items.end(), [](const BwdItem& x, const BwdItem& y) { return x.cost > y.cost; });
  return items;
}

}  // namespace rotary::attn
#endif  // ROTARY_ATTENTION_BACKWARD_SHARED_

HWY_BEFORE_NAMESPACE();
namespace rotary::attn {
namespace HWY_NAMESPACE {

// P[r][j] = exp(S[r][j] - lse_r) for j < limit_r, else 0; then dS = P (dP - D_r) in place of dP.
template <class T>
HWY_INLINE void ProbsAndDs(T* HWY_RESTRICT S, T* HWY_RESTRICT dP, int64_t limit, T lse, T Dr) {
  const Tag<T> d;
  const int64_t NL = int64_t(hn::Lanes(d));
  const auto vl = hn::Set(d, lse), vD = hn::Set(d, Dr);
  for (int64_t j = 0; j < kBlockKeys; j += NL) {
    auto p = ExpKeepNaN(d, hn::Sub(hn::LoadU(d, S + j), vl));
    const auto idx = hn::Add(hn::Iota(d, T(0)), hn::Set(d, T(j)));
    p = hn::IfThenElseZero(hn::Lt(idx, hn::Set(d, T(limit))), p);
    hn::StoreU(p, d, S + j);
    hn::StoreU(hn::Mul(p, hn::Sub(hn::LoadU(d, dP + j), vD)), d, dP + j);
  }
}

template <class T>
void BackwardItem(const Plan& pl, const BwdBuffers<T>& b, T* th, double* dlut, const BwdItem& it) {
  constexpr int64_t Br = kBlockRows, Bc = kBlockKeys;
  const int64_t Dp = pl.Dp, h = it.head, hk = h / pl.group, sb = pl.seq_start[size_t(it.seq)];
  const int64_t L = pl.seq_len(it.seq), blk_elems = Dp * Bc;
  const bool two_acc = pl.far && pl.roper;
  T* S = th;            // scores, then P (near part under a straddle)
  T* S2 = S + Br * Bc;  // far scores, then far P
  T* dP = S2 + Br * Bc; // dP, then dS (near part)
  T* dP2 = dP + Br * Bc;  // far dP, then far dS
  const int64_t* pos = pl.pos.data() + sb;
  const int64_t qtiles = (L + Br - 1) / Br;
  const int64_t rq = h * pl.tokens + sb;   // first row of this head and sequence in [Hq][tokens] arrays
  const int64_t rk = hk * pl.tokens + sb;  // ... in [Hkv][tokens] arrays

  for (int64_t kt = 0; kt < pl.blocks_of(it.seq); ++kt) {
    const int64_t j0 = kt * Bc, kcount = std::min(Bc, L - j0);
    const int64_t blk = pl.blk_first[size_t(it.seq)] + kt;
    const T* KnT = b.KnT + (hk * pl.nblocks + blk) * blk_elems;
    const T* KfT = pl.far ? b.KfT + (hk * pl.nblocks + blk) * blk_elems : nullptr;
    const T* VnT = b.VnT + (hk * pl.nblocks + blk) * blk_elems;
    const T* VfT = two_acc ? b.VfT + (hk * pl.nblocks + blk) * blk_elems : nullptr;
    T* dKn = b.dKn + (rq + j0) * Dp;
    T* dVn = b.dVn + (rq + j0) * Dp;
    T* dKf = pl.far ? b.dKf + (rq + j0) * Dp : nullptr;
    T* dVf = two_acc ? b.dVf + (rq + j0) * Dp : nullptr;
    const T* Kn = b.Kn + (rk + j0) * Dp;
    const T* Kf = pl.far ? b.Kf + (rk + j0) * Dp : nullptr;

    for (int64_t qt = pl.causal ? j0 / Br : 0; qt < qtiles; ++qt) {
      const int64_t i0 = qt * Br, rows = std::min(Br, L - i0);
      const int64_t qpmin = *std::min_element(pos + i0, pos + i0 + rows);
      const int64_t qpmax = *std::max_element(pos + i0, pos + i0 + rows);
      const TileKind kind = classify(pl, qpmin, qpmax, blk);
      const T* Qn = b.Qn + (rq + i0) * Dp;
      const T* Qf = pl.far ? b.Qf + (rq + i0) * Dp : nullptr;
      const T* dOn = b.dOn + (rq + i0) * Dp;
      const T* dOf = two_acc ? b.dOf + (rq + i0) * Dp : nullptr;

      // Scores and dP, each from the near and/or far product.
      if (kind != TileKind::Far) TileGemm(rows, Bc, Dp, Qn, Dp, 1, KnT, Bc, S, Bc, false);
      if (kind != TileKind::Near) TileGemm(rows, Bc, Dp, Qf, Dp, 1, KfT, Bc, kind == TileKind::Far ? S : S2, Bc, false);
      if (!two_acc) {
        TileGemm(rows, Bc, Dp, dOn, Dp, 1, VnT, Bc, dP, Bc, false);
      } else {
        if (kind != TileKind::Far) TileGemm(rows, Bc, Dp, dOn, Dp, 1, VnT, Bc, dP, Bc, false);
        if (kind != TileKind::Near)
          TileGemm(rows, Bc, Dp, dOf, Dp, 1, VfT, Bc, kind == TileKind::Far ? dP : dP2, Bc, false);
      }
      const bool increasing = pl.blk_increasing[size_t(blk)];
      if (kind == TileKind::Straddle)
        for (int64_t r = 0; r < rows; ++r) {
          select_far(pos + j0, kcount, pos[i0 + r] - pl.w, increasing, S + r * Bc, S2 + r * Bc);
          if (two_acc) select_far(pos + j0, kcount, pos[i0 + r] - pl.w, increasing, dP + r * Bc, dP2 + r * Bc);
        }
      if (pl.bias != ScoreBias::None)
        for (int64_t r = 0; r < rows; ++r) add_score_bias(pl, h, pos[i0 + r], pos + j0, kcount, S + r * Bc);
      const bool diagonal = pl.causal && j0 + kcount - 1 > i0;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t limit = diagonal ? std::min(kcount, i0 + r - j0 + 1) : kcount;
        ProbsAndDs(S + r * Bc, dP + r * Bc, limit, b.lse[rq + i0 + r], b.Drow[rq + i0 + r]);
        // T5: the table entry of (h, bucket) receives dS of every pair in that bucket, gathered by distance.
        if (dlut) {
          double* row = dlut + h * pl.lut_width();
          for (int64_t j = 0; j < limit; ++j) row[pl.lut_index(pos[i0 + r] - pos[j0 + j])] += double(dP[r * Bc + j]);
        }
      }
      // dV takes the whole P unless RoPER splits the values into near and far forms.
      if (!two_acc) TileGemm(kcount, Dp, rows, S, 1, Bc, dOn, Dp, dVn, Dp, true);
      // Split P and dS by kind: near entries stay in S / dP, far ones move to S2 / dP2.
      const T *Pn = S, *dSn = dP, *Pf = S, *dSf = dP;
      if (kind == TileKind::Straddle) {
        for (int64_t r = 0; r < rows; ++r) {
          split_far(pos + j0, kcount, pos[i0 + r] - pl.w, increasing, S + r * Bc, S2 + r * Bc);
          split_far(pos + j0, kcount, pos[i0 + r] - pl.w, increasing, dP + r * Bc, dP2 + r * Bc);
        }
        Pf = S2, dSf = dP2;
      }
      if (kind != TileKind::Far) {
        if (two_acc) TileGemm(kcount, Dp, rows, Pn, 1, Bc, dOn, Dp, dVn, Dp, true);
        TileGemm(kcount, Dp, rows, dSn, 1, Bc, Qn, Dp, dKn, Dp, true);
        TileGemm(rows, Dp, kcount, dSn, Bc, 1, Kn, Dp, b.dQn + (rq + i0) * Dp, Dp, true);
      }
      if (kind != TileKind::Near) {
        if (two_acc) TileGemm(kcount, Dp, rows, Pf, 1, Bc, dOf, Dp, dVf, Dp, true);
        TileGemm(kcount, Dp, rows, dSf, 1, Bc, Qf, Dp, dKf, Dp, true);
        TileGemm(rows, Dp, kcount, dSf, Bc, 1, Kf, Dp, b.dQf + (rq + i0) * Dp, Dp, true);
      }
    }
  }
}

template <class T>
void BackwardTyped(const AttentionGradParams& g, const Plan& pl, Arena& arena, int threads) {
  const AttentionParams& p = g.fwd;
  const BwdBuffers<T> b = carve_backward<T>(arena, pl, threads);
  const bool two_acc = pl.far && pl.roper;
  const int64_t rows_q = pl.Hq * pl.tokens * pl.Dp;
  std::vector<PrepJob> jobs = {{p.q, q_near(pl), b.Qn, false, nullptr},
                               {p.k, k_near(pl), b.KnT, true, nullptr},
                               {p.k, k_near(pl), b.Kn, false, nullptr},
                               {p.v, v_near(pl), b.VnT, true, nullptr},
                               {g.dout, pl.roper ? adjoint(o_near(pl)) : RowTransform{}, b.dOn, false, nullptr}};
  if (pl.far) {
    jobs.push_back({p.q, q_far(pl), b.Qf, false, nullptr});
    jobs.push_back({p.k, k_far(pl), b.KfT, true, nullptr});
    jobs.push_back({p.k, k_far(pl), b.Kf, false, nullptr});
    if (two_acc) {
      jobs.push_back({p.v, v_far(pl), b.VfT, true, nullptr});
      jobs.push_back({g.dout, adjoint(o_far(pl)), b.dOf, false, nullptr});
    }
  }
  Prep<T>(pl, jobs, threads);
  for (T* acc : {b.dQn, b.dKn, b.dVn, b.dQf, b.dKf, b.dVf})
    if (acc) std::memset(acc, 0, sizeof(T) * size_t(rows_q));
  // D_i = do_i . o_i (storage values), and the forward's lse, per [head][token].
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < pl.tokens; ++t)
    for (int64_t h = 0; h < pl.Hq; ++h) {
      T dot = 0;
      for (int d = 0; d < pl.D; ++d)
        dot += T(load_as_double(g.dout.data, pl.dtype, t * g.dout.token_stride + h * g.dout.head_stride + d)) *
               T(load_as_double(p.o.data, pl.dtype, t * p.o.token_stride + h * p.o.head_stride + d));
      b.Drow[h * pl.tokens + t] = dot;
      b.lse[h * pl.tokens + t] = pl.dtype == DType::F64 ? T(static_cast<const double*>(p.lse)[t * pl.Hq + h])
                                                        : T(static_cast<const float*>(p.lse)[t * pl.Hq + h]);
    }

  const std::vector<BwdItem> items = backward_items(pl);
  const int64_t lut_elems = pl.Hq * pl.lut_width();
  if (b.dlut) std::fill(b.dlut, b.dlut + lut_elems * threads, 0.0);
#pragma omp parallel num_threads(threads)
  {
    T* th = b.thread_base + b.per_thread * omp_get_thread_num();
    double* dlut = b.dlut ? b.dlut + lut_elems * omp_get_thread_num() : nullptr;
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < items.size(); ++i) BackwardItem<T>(pl, b, th, dlut, items[i]);
  }
  if (b.dlut) {  // threads summed, then distances into their buckets: d table[bucket][h]
    std::vector<double> dtable(size_t(p.bias.t5_num_buckets * pl.Hq), 0.0);
    for (int t = 0; t < threads; ++t)
      for (int64_t h = 0; h < pl.Hq; ++h)
        for (int64_t i = 0; i < pl.lut_width(); ++i)
          dtable[size_t(pl.lut_bucket[size_t(i)] * pl.Hq + h)] += b.dlut[lut_elems * t + h * pl.lut_width() + i];
    for (size_t e = 0; e < dtable.size(); ++e) store_from_double(g.dt5_table, pl.dtype, int64_t(e), dtable[e]);
  }

  // Back through the transposes: dq from both query forms; dk, dv summed over the group's query heads.
#pragma omp parallel num_threads(threads)
  {
    alignas(64) T y[256 + 16], sum_n[256 + 16], sum_f[256 + 16];
    const int64_t Dp = pl.Dp;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < pl.tokens; ++t) {
      for (int64_t h = 0; h < pl.Hq; ++h) {
        TransformRow(pl, adjoint(q_near(pl)), t, b.dQn + (h * pl.tokens + t) * Dp, y, false);
        if (pl.far) TransformRow(pl, adjoint(q_far(pl)), t, b.dQf + (h * pl.tokens + t) * Dp, y, true);
        StoreRow(pl, y, g.dq, t, h);
      }
      for (int64_t hk = 0; hk < pl.Hkv; ++hk) {
        auto group_sum = [&](const T* acc, T* out) {
          std::fill(out, out + Dp, T(0));
          for (int64_t h = hk * pl.group; h < (hk + 1) * pl.group; ++h) {
            const T* row = acc + (h * pl.tokens + t) * Dp;
            for (int64_t d = 0; d < Dp; ++d) out[d] += row[d];
          }
        };
        group_sum(b.dKn, sum_n);
        TransformRow(pl, adjoint(k_near(pl)), t, sum_n, y, false);
        if (pl.far) {
          group_sum(b.dKf, sum_f);
          TransformRow(pl, adjoint(k_far(pl)), t, sum_f, y, true);
        }
        StoreRow(pl, y, g.dk, t, hk);
        group_sum(b.dVn, sum_n);
        TransformRow(pl, adjoint(v_near(pl)), t, sum_n, y, false);
        if (two_acc) {
          group_sum(b.dVf, sum_f);
          TransformRow(pl, adjoint(v_far(pl)), t, sum_f, y, true);
        }
        StoreRow(pl, y, g.dv, t, hk);
      }
    }
  }
}

void BackwardF32(const AttentionGradParams& g, const Plan& pl, Arena& arena, int threads) {
  BackwardTyped<float>(g, pl, arena, threads);
}
const char* BackwardTargetName() { return hwy::TargetName(HWY_TARGET); }

void BackwardF64(const AttentionGradParams& g, const Plan& pl, Arena& arena, int threads) {
  BackwardTyped<double>(g, pl, arena, threads);
}

}  // namespace HWY_NAMESPACE
}  // namespace rotary::attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary {
namespace attn {
HWY_EXPORT(BackwardF32);
HWY_EXPORT(BackwardF64);
HWY_EXPORT(BackwardTargetName);

namespace {
int backward_threads(const Plan& pl, int threads) {
  if (threads <= 0) threads = omp_get_max_threads();
  return int(std::max<int64_t>(1, std::min<int64_t>(threads, pl.batch * pl.Hq)));
}
int64_t backward_bytes(const Plan& pl, int threads) {
  Arena counting(-1);
  if (pl.dtype == DType::F64) carve_backward<double>(counting, pl, threads);
  else carve_backward<float>(counting, pl, threads);
  return counting.used();
}
void run_backward(const AttentionGradParams& g, const Plan& pl, Arena& arena, int threads) {
  if (pl.dtype == DType::F64) HWY_DYNAMIC_DISPATCH(BackwardF64)(g, pl, arena, threads);
  else HWY_DYNAMIC_DISPATCH(BackwardF32)(g, pl, arena, threads);
}
}  // namespace
}  // namespace attn

const char* detail::attention_backward_simd_target() {
  return HWY_DYNAMIC_DISPATCH(attn::BackwardTargetName)();
}

int64_t attention_backward_scratch_bytes(const AttentionGradParams& g, int threads) {
  validate_attention_grad_params(g);
  if (g.fwd.tokens == 0) return 0;
  const attn::Plan pl = attn::make_plan(g.fwd);
  return attn::backward_bytes(pl, attn::backward_threads(pl, threads > 0 ? threads : g.fwd.threads));
}

void attention_backward(const AttentionGradParams& g) {
  validate_attention_grad_params(g);
  if (g.fwd.tokens == 0) {
    detail::clear_t5_gradient(g);
    return;
  }
  const attn::Plan pl = attn::make_plan(g.fwd);
  const int threads = attn::backward_threads(pl, g.fwd.threads);
  attn::Arena arena(attn::backward_bytes(pl, threads));
  attn::run_backward(g, pl, arena, threads);
}

}  // namespace rotary
#endif  // HWY_ONCE
