// Fused attention forward (flash-attention-2 on the CPU): per (sequence, query head, query tile) an online
// softmax over key tiles, no N x N buffer. q and k are rotated once into scratch (attention_plan.h):
// Qn/Kn for RoPE scores, and for ReRoPE/Leaky also Qf/Kf for scores beyond the window. Each (query tile, key
// tile) pair is classified by its distance range: entirely inside the window -> one product Qn Kn^T, entirely
// beyond -> one product Qf Kf^T, straddling -> both, selected per element by pos_i - pos_j < w.
// RoPER keeps two accumulators under ReRoPE/Leaky (values R(pos_j) v_j inside, the far form beyond) and
// rotates each back once per row at the end.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_forward_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_kernels-inl.h"
#include "attention_prep-inl.h"
#include "attention_plan.h"
#include "hwy/highway.h"
#include "simd_targets.h"

#ifndef ROTARY_ATTENTION_FORWARD_SHARED_
#define ROTARY_ATTENTION_FORWARD_SHARED_
namespace rotary::attn {

// Per-call scratch of the forward: shared rotated inputs and per-thread tiles.
template <class T>
struct FwdBuffers {
  T *Qn = nullptr, *Qf = nullptr;    // rows [Hq][queries][Dp]: softmax_scale and log-n folded in
  T *KnT = nullptr, *KfT = nullptr;  // packed [Hkv][blocks][Dp][Bc]
  T *Vn = nullptr, *Vf = nullptr;    // rows [Hkv][tokens][Dp]
  uint8_t *vflag_n = nullptr, *vflag_f = nullptr;  // [Hkv][blocks]: block holds a non-finite value
  T* thread_base = nullptr;
  int64_t per_thread = 0;            // elements of T per thread: S, S2 [Br][Bc], acc, acc2 [Br][Dp], m, l [Br]
};

template <class T>
FwdBuffers<T> carve_forward(Arena& a, const Plan& pl, int threads) {
  FwdBuffers<T> b;
  const int64_t rows_q = pl.Hq * pl.queries() * pl.Dp, rows_kv = pl.Hkv * pl.tokens * pl.Dp;
  const int64_t packed = pl.Hkv * pl.nblocks * pl.Dp * kBlockKeys;
  b.Qn = a.take<T>(rows_q);
  b.KnT = a.take<T>(packed);
  b.Vn = a.take<T>(rows_kv);
  b.vflag_n = a.take<uint8_t>(pl.Hkv * pl.nblocks);
  if (pl.far) {
    b.Qf = a.take<T>(rows_q);
    b.KfT = a.take<T>(packed);
    if (pl.roper) {
      b.Vf = a.take<T>(rows_kv);
      b.vflag_f = a.take<uint8_t>(pl.Hkv * pl.nblocks);
    }
  }
  b.per_thread = (2 * int64_t(kBlockRows) * kBlockKeys + 2 * int64_t(kBlockRows) * pl.Dp + 2 * kBlockRows + 15) /
                 16 * 16;
  b.thread_base = a.take<T>(b.per_thread * threads);
  return b;
}

struct FwdItem {
  int64_t seq, head, qtile, cost;  // query tile qtile: rows from index first_query + qtile * kBlockRows of seq
};

inline std::vector<FwdItem> forward_items(const Plan& pl) {
  std::vector<FwdItem> items;
  for (int64_t s = 0; s < pl.batch; ++s) {
    const int64_t L = pl.seq_len(s), tiles = (L - pl.first_query + kBlockRows - 1) / kBlockRows;
    for (int64_t qt = 0; qt < tiles; ++qt) {
      const int64_t keys = pl.causal ? std::min(L, pl.first_query + (qt + 1) * kBlockRows) : L;
      for (int64_t h = 0; h < pl.Hq; ++h) items.push_back({s, h, qt, keys});
    }
  }
  // Longest first, so that dynamic scheduling ends with the short ones.
  std::stable_sort(items.begin(), items.end(), [](const FwdItem& x, const FwdItem& y) { return x.cost > y.cost; });
  return items;
}

}  // namespace rotary::attn
#endif  // ROTARY_ATTENTION_FORWARD_SHARED_

HWY_BEFORE_NAMESPACE();
namespace rotary::attn {
namespace HWY_NAMESPACE {

template <class T>
void ForwardItem(const AttentionParams& p, const Plan& pl, const FwdBuffers<T>& b, T* th, const FwdItem& it) {
  constexpr int64_t Br = kBlockRows, Bc = kBlockKeys;
  const int64_t Dp = pl.Dp, h = it.head, hk = h / pl.group, sb = pl.seq_start[size_t(it.seq)];
  const int64_t L = pl.seq_len(it.seq), i0 = pl.first_query + it.qtile * Br, rows = std::min(Br, L - i0);
  const int64_t blk_elems = Dp * Bc;
  const bool two_acc = pl.far && pl.roper;
  T* S = th;
  T* S2 = S + Br * Bc;
  T* acc = S2 + Br * Bc;
  T* acc2 = acc + Br * Dp;
  T* m = acc2 + Br * Dp;
  T* l = m + Br;
  std::fill(acc, acc + rows * Dp, T(0));
  if (two_acc) std::fill(acc2, acc2 + rows * Dp, T(0));
  std::fill(m, m + rows, -std::numeric_limits<T>::infinity());
  std::fill(l, l + rows, T(0));

  const int64_t* pos = pl.pos.data() + sb;
  const int64_t qpmin = *std::min_element(pos + i0, pos + i0 + rows);
  const int64_t qpmax = *std::max_element(pos + i0, pos + i0 + rows);
  // (first_query > 0 only with one sequence: sb = 0)
  const int64_t qrow = h * pl.queries() + sb + i0 - pl.first_query;
  const T* Qn = b.Qn + qrow * Dp;
  const T* Qf = pl.far ? b.Qf + qrow * Dp : nullptr;
  const int64_t nkt = pl.causal ? (i0 + rows - 1) / Bc + 1 : pl.blocks_of(it.seq);

  for (int64_t kt = 0; kt < nkt; ++kt) {
    const int64_t j0 = kt * Bc, kcount = std::min(Bc, L - j0);
    const int64_t blk = pl.blk_first[size_t(it.seq)] + kt;
    const TileKind kind = classify(pl, qpmin, qpmax, blk);
    const int64_t kblk = (hk * pl.nblocks + blk) * blk_elems;
    if (kind != TileKind::Far) TileGemm(rows, Bc, Dp, Qn, Dp, 1, b.KnT + kblk, Bc, S, Bc, false);
    if (kind != TileKind::Near)
      TileGemm(rows, Bc, Dp, Qf, Dp, 1, b.KfT + kblk, Bc, kind == TileKind::Far ? S : S2, Bc, false);
    const bool increasing = pl.blk_increasing[size_t(blk)];
    if (kind == TileKind::Straddle)
      for (int64_t r = 0; r < rows; ++r)
        select_far(pos + j0, kcount, pos[i0 + r] - pl.w, increasing, S + r * Bc, S2 + r * Bc);
    if (pl.bias != ScoreBias::None)
      for (int64_t r = 0; r < rows; ++r) add_score_bias(pl, h, pos[i0 + r], pos + j0, kcount, S + r * Bc);
    const bool diagonal = pl.causal && j0 + kcount - 1 > i0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t limit = diagonal ? std::min(kcount, i0 + r - j0 + 1) : kcount;
      MaskFrom(S + r * Bc, limit, Bc);
      const T alpha = SoftmaxRowStep(S + r * Bc, Bc, m[r], l[r]);
      if (alpha != T(1)) {
        ScaleRow(acc + r * Dp, Dp, alpha);
        if (two_acc) ScaleRow(acc2 + r * Dp, Dp, alpha);
      }
    }
    // P V. Under RoPER with ReRoPE/Leaky the probabilities split by kind: near ones weigh Vn into acc, far
    // ones Vf into acc2 (a straddling tile moves its far entries from S to S2).
    const T* Vn = b.Vn + (hk * pl.tokens + sb + j0) * Dp;
    const T* Vf = two_acc ? b.Vf + (hk * pl.tokens + sb + j0) * Dp : nullptr;
    if (two_acc && kind == TileKind::Straddle)
      for (int64_t r = 0; r < rows; ++r)
        split_far(pos + j0, kcount, pos[i0 + r] - pl.w, increasing, S + r * Bc, S2 + r * Bc);
    struct Product {
      const T* P;
      const T* V;
      T* acc;
      const uint8_t* flags;
    };
    Product prods[2];
    int nprod = 0;
    if (!two_acc || kind == TileKind::Near) prods[nprod++] = {S, Vn, acc, b.vflag_n};
    else if (kind == TileKind::Far) prods[nprod++] = {S, Vf, acc2, b.vflag_f};
    else prods[nprod++] = {S, Vn, acc, b.vflag_n}, prods[nprod++] = {S2, Vf, acc2, b.vflag_f};
    for (int k = 0; k < nprod; ++k) {
      const Product& pr = prods[k];
      // A masked probability is an exact 0, harmless unless the value it multiplies is not finite: such
      // blocks on the diagonal take one row at a time, each stopping at its own last visible key.
      if (diagonal && pr.flags[hk * pl.nblocks + blk]) {
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t limit = std::min(kcount, i0 + r - j0 + 1);
          if (limit > 0) TileGemm<T>(1, Dp, limit, pr.P + r * Bc, Bc, 1, pr.V, Dp, pr.acc + r * Dp, Dp, true);
        }
      } else {
        TileGemm<T>(rows, Dp, kcount, pr.P, Bc, 1, pr.V, Dp, pr.acc, Dp, true);
      }
    }
  }

  // o_i = acc_i / l_i (RoPER: rotated back, near and far accumulators each by its own rotation).
  alignas(64) T row[256 + 16];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = sb + i0 + r;
    const T inv_l = T(1) / l[r];
    ScaleRow(acc + r * Dp, Dp, inv_l);
    const T* out = acc + r * Dp;
    if (pl.roper) {
      TransformRow(pl, o_near(pl), t, acc + r * Dp, row, false);
      if (two_acc) {
        ScaleRow(acc2 + r * Dp, Dp, inv_l);
        TransformRow(pl, o_far(pl), t, acc2 + r * Dp, row, true);
      }
      out = row;
    }
    const int64_t at = t - pl.first_query;  // the row of o and lse
    StoreRow(pl, out, p.o, at, h);
    if (p.lse) {
      const T lse = m[r] + std::log(l[r]);
      if (pl.dtype == DType::F64) static_cast<double*>(p.lse)[at * pl.Hq + h] = double(lse);
      else static_cast<float*>(p.lse)[at * pl.Hq + h] = float(lse);
    }
  }
}

template <class T>
void ForwardTyped(const AttentionParams& p, const Plan& pl, Arena& arena, int threads) {
  const FwdBuffers<T> b = carve_forward<T>(arena, pl, threads);
  std::vector<PrepJob> jobs = {{p.q, q_near(pl), b.Qn, false, nullptr, pl.first_query},
                               {p.k, k_near(pl), b.KnT, true, nullptr},
                               {p.v, v_near(pl), b.Vn, false, b.vflag_n}};
  if (pl.far) {
    jobs.push_back({p.q, q_far(pl), b.Qf, false, nullptr, pl.first_query});
    jobs.push_back({p.k, k_far(pl), b.KfT, true, nullptr});
    if (pl.roper) jobs.push_back({p.v, v_far(pl), b.Vf, false, b.vflag_f});
  }
  Prep<T>(pl, jobs, threads);
  const std::vector<FwdItem> items = forward_items(pl);
#pragma omp parallel num_threads(threads)
  {
    T* th = b.thread_base + b.per_thread * omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < items.size(); ++i) ForwardItem<T>(p, pl, b, th, items[i]);
  }
}

void ForwardF32(const AttentionParams& p, const Plan& pl, Arena& arena, int threads) {
  ForwardTyped<float>(p, pl, arena, threads);
}
const char* ForwardTargetName() { return hwy::TargetName(HWY_TARGET); }

void ForwardF64(const AttentionParams& p, const Plan& pl, Arena& arena, int threads) {
  ForwardTyped<double>(p, pl, arena, threads);
}

}  // namespace HWY_NAMESPACE
}  // namespace rotary::attn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary {
namespace attn {
HWY_EXPORT(ForwardF32);
HWY_EXPORT(ForwardF64);
HWY_EXPORT(ForwardTargetName);

namespace {
int forward_threads(const Plan& pl, int threads) {
  if (threads <= 0) threads = omp_get_max_threads();
  const int64_t items = int64_t(forward_items(pl).size());
  return int(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
}
int64_t forward_bytes(const Plan& pl, int threads) {
  Arena counting(-1);
  if (pl.dtype == DType::F64) carve_forward<double>(counting, pl, threads);
  else carve_forward<float>(counting, pl, threads);
  return counting.used();
}
void run_forward(const AttentionParams& p, const Plan& pl, Arena& arena, int threads) {
  if (p.dtype == DType::F64) HWY_DYNAMIC_DISPATCH(ForwardF64)(p, pl, arena, threads);
  else HWY_DYNAMIC_DISPATCH(ForwardF32)(p, pl, arena, threads);
}
}  // namespace
}  // namespace attn

const char* detail::attention_forward_simd_target() {
  return HWY_DYNAMIC_DISPATCH(attn::ForwardTargetName)();
}

int64_t attention_forward_scratch_bytes(const AttentionParams& p, int threads) {
  validate_attention_params(p);
  if (p.tokens == p.first_query) return 0;
  const attn::Plan pl = attn::make_plan(p);
  return attn::forward_bytes(pl, attn::forward_threads(pl, threads > 0 ? threads : p.threads));
}

void attention_forward(const AttentionParams& p) {
  validate_attention_params(p);
  if (p.tokens == p.first_query) return;  // no queries (or no tokens)
  const attn::Plan pl = attn::make_plan(p);
  const int threads = attn::forward_threads(pl, p.threads);
  attn::Arena arena(attn::forward_bytes(pl, threads));
  attn::run_forward(p, pl, arena, threads);
}

}  // namespace rotary
#endif  // HWY_ONCE
