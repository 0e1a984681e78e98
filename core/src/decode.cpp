// Fast one-token attention over KvCaches: query preparation, split-K tasks (flash-decoding), the Highway kernel
// of one task, the combine step; and the seed's re-rotating baseline, which runs the same kernel on keys it
// re-rotates every step (so the two differ only in what the seed's algorithm costs).
#ifndef ROTARY_DECODE_ONCE_
#define ROTARY_DECODE_ONCE_

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "rotary/angles.h"
#include "rotary/error.h"
#include "rotary/kv_cache.h"
#include "validate.h"

namespace rotary::decode_detail {

// One split-K task: the G query heads of one kv head against keys [begin, end) of one sequence.
// Keys [begin, near_begin) ("plain") score q_plain . k_plain[j] and add p_j v_plain[j] to acc; keys
// [near_begin, end) ("near") score q_near . R(-d) k_near[j], d = q_pos - pos[j] (cos/sin row d of the near table),
// and add p_j v_near[j] to acc_near - turned by R(-d) first when rotate_near_values (RoPER with ReRoPE/Leaky).
struct ChunkArgs {
  const void* k_plain = nullptr;  // [n, row_stride] storage type
  const void* k_near = nullptr;   // [n, row_stride] storage type (un-rotated keys)
  const void* v_plain = nullptr;  // [n, row_stride] storage type
  const void* v_near = nullptr;   // [n, row_stride] storage type
  const int64_t* pos = nullptr;   // [n]
  int64_t begin = 0, end = 0, near_begin = 0, q_pos = 0;
  const void* q_plain = nullptr;  // [G, row_stride] compute type
  const void* q_near = nullptr;   // [G, row_stride] compute type
  int groups = 1;
  int64_t row_stride = 0;
  int half = 0, pairs = 0;
  const void* table = nullptr;  // [table_rows, 2 * half] compute type
  int64_t table_rows = 0;
  const double* inv_freq = nullptr;  // for distances past the table
  bool rotate_near_values = false;
  void* m = nullptr;         // [G] running max of the scaled scores
  void* l = nullptr;         // [G] running sum of exp(score - m)
  void* acc = nullptr;       // [G, row_stride] running sum of exp(score - m) v over plain keys
  void* acc_near = nullptr;  // [G, row_stride] the same over near keys; may equal acc
};

}  // namespace rotary::decode_detail

#endif  // ROTARY_DECODE_ONCE_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "decode.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// (foreach_target must come first: it re-includes this file once per target)
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
// math-inl needs highway.h before it
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace rotary::decode_detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Loads lanes of storage type T as the compute type of d (bf16/f16 widen to f32).
template <class D, class T>
HWY_INLINE hn::Vec<D> LoadAs(D d, const T* p) {
  if constexpr (std::is_same_v<T, hn::TFromD<D>>)
    return hn::LoadU(d, p);
  else
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<T, D>(), p));
}

inline void near_cos_sin(const ChunkArgs& a, int64_t dist, float* c, float* s) {
  rope_cos_sin(a.inv_freq, a.pairs, dist, 1.0, c, s);
}
inline void near_cos_sin(const ChunkArgs& a, int64_t dist, double* c, double* s) {
  rope_cos_sin_f64(a.inv_freq, a.pairs, dist, 1.0, c, s);
}

// out = R(-d) row: rotary pairs (x1 c + x2 s, x2 c - x1 s) with cs = [cos | sin] of d; pass-through copied.
template <class D, class T>
HWY_INLINE void TurnBack(D d, const T* row, const hn::TFromD<D>* cs, int half, int64_t rs, hn::TFromD<D>* out) {
  const int64_t L = int64_t(hn::Lanes(d));
  for (int64_t i = 0; i < half; i += L) {
    const auto x1 = LoadAs(d, row + i), x2 = LoadAs(d, row + half + i);
    const auto co = hn::LoadU(d, cs + i), si = hn::LoadU(d, cs + half + i);
    hn::StoreU(hn::MulAdd(x2, si, hn::Mul(x1, co)), d, out + i);
    hn::StoreU(hn::NegMulAdd(x1, si, hn::Mul(x2, co)), d, out + half + i);
  }
  for (int64_t i = 2 * half; i < rs; i += L) hn::StoreU(LoadAs(d, row + i), d, out + i);
}

// Register tiles. Accumulators live in arrays of vectors that the compiler keeps in registers (fixed trip counts);
// that needs non-scalable vectors, which every x86 target has. kHeads query heads per tile: 4 where the target has
// 32 vector registers (AVX-512), else 2.
#if HWY_TARGET <= HWY_AVX3
constexpr int kHeads = 4;
#else
constexpr int kHeads = 2;
#endif
constexpr int kKeys = 4;  // keys per score tile
constexpr int kVecs = 2;  // vectors of a value row per accumulate tile

// s[h * s_stride + c] = q[h] . row[c] for NH heads and NK consecutive rows: each loaded vector serves NH * NK
// products, and the NH * NK sums are reduced once at the end.
template <int NH, int NK, class D, class T>
HWY_INLINE void ScoreTile(D d, const hn::TFromD<D>* q, const T* rows, int64_t rs, hn::TFromD<D>* s, int64_t s_stride) {
  const int64_t L = int64_t(hn::Lanes(d));
  hn::Vec<D> acc[NH][NK];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NK; ++c) acc[h][c] = hn::Zero(d);
  for (int64_t i = 0; i < rs; i += L) {
    hn::Vec<D> k[NK];
    for (int c = 0; c < NK; ++c) k[c] = LoadAs(d, rows + c * rs + i);
    for (int h = 0; h < NH; ++h) {
      const auto x = hn::LoadU(d, q + h * rs + i);
      for (int c = 0; c < NK; ++c) acc[h][c] = hn::MulAdd(x, k[c], acc[h][c]);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < NK; ++c) s[h * s_stride + c] = hn::GetLane(hn::SumOfLanes(d, acc[h][c]));
}

// Scores of n consecutive rows against G queries: s[h * s_stride + c], c < n.
template <class D, class T>
HWY_INLINE void Scores(D d, const hn::TFromD<D>* q, int G, const T* rows, int64_t n, int64_t rs, hn::TFromD<D>* s,
                       int64_t s_stride) {
  int64_t c = 0;
  for (; c + kKeys <= n; c += kKeys) {
    int h = 0;
    for (; h + kHeads <= G; h += kHeads)
      ScoreTile<kHeads, kKeys>(d, q + h * rs, rows + c * rs, rs, s + h * s_stride + c, s_stride);
    for (; h < G; ++h) ScoreTile<1, kKeys>(d, q + h * rs, rows + c * rs, rs, s + h * s_stride + c, s_stride);
  }
  for (; c < n; ++c) {
    int h = 0;
    for (; h + kHeads <= G; h += kHeads)
      ScoreTile<kHeads, 1>(d, q + h * rs, rows + c * rs, rs, s + h * s_stride + c, s_stride);
    for (; h < G; ++h) ScoreTile<1, 1>(d, q + h * rs, rows + c * rs, rs, s + h * s_stride + c, s_stride);
  }
}

// acc[h][i .. i + NV*L) += sum_c p[h * p_stride + c] row[c][i ..] for NH heads: the accumulators stay in registers
// over all n rows, each row vector is loaded once for the NH heads.
template <int NH, int NV, class D, class T>
HWY_INLINE void AccumulateTile(D d, const T* rows, int64_t n, int64_t rs, int64_t i, const hn::TFromD<D>* p,
                               int64_t p_stride, hn::TFromD<D>* acc) {
  const int64_t L = int64_t(hn::Lanes(d));
  hn::Vec<D> a[NH][NV];
  for (int h = 0; h < NH; ++h)
    for (int k = 0; k < NV; ++k) a[h][k] = hn::LoadU(d, acc + h * rs + i + k * L);
  for (int64_t c = 0; c < n; ++c) {
    hn::Vec<D> v[NV];
    for (int k = 0; k < NV; ++k) v[k] = LoadAs(d, rows + c * rs + i + k * L);
    for (int h = 0; h < NH; ++h) {
      const auto pb = hn::Set(d, p[h * p_stride + c]);
      for (int k = 0; k < NV; ++k) a[h][k] = hn::MulAdd(pb, v[k], a[h][k]);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int k = 0; k < NV; ++k) hn::StoreU(a[h][k], d, acc + h * rs + i + k * L);
}

// acc[h] += sum_c p[h * p_stride + c] row[c] for G heads over n consecutive rows (acc rows of length rs).
template <class D, class T>
HWY_INLINE void Accumulate(D d, const T* rows, int64_t n, int64_t rs, const hn::TFromD<D>* p, int64_t p_stride, int G,
                           hn::TFromD<D>* acc) {
  if (n <= 0) return;
  const int64_t L = int64_t(hn::Lanes(d));
  int h = 0;
  auto heads = [&](auto nh) {
    constexpr int NH = decltype(nh)::value;
    int64_t i = 0;
    for (; i + kVecs * L <= rs; i += kVecs * L)
      AccumulateTile<NH, kVecs>(d, rows, n, rs, i, p + h * p_stride, p_stride, acc + h * rs);
    for (; i < rs; i += L) AccumulateTile<NH, 1>(d, rows, n, rs, i, p + h * p_stride, p_stride, acc + h * rs);
  };
  for (; h + kHeads <= G; h += kHeads) heads(std::integral_constant<int, kHeads>());
  for (; h < G; ++h) heads(std::integral_constant<int, 1>());
}

template <class T, class C>
void Chunk(const ChunkArgs& a) {
  const hn::CappedTag<C, KvCacheLayout::kPad> d;
  const int64_t L = int64_t(hn::Lanes(d));
  constexpr int64_t kBlock = 32;  // keys per online-softmax block (their rows stay in L1 between the passes)
  const int G = a.groups, half = a.half;
  const int64_t rs = a.row_stride;
  const T* kp = static_cast<const T*>(a.k_plain);
  const T* kn = static_cast<const T*>(a.k_near);
  const T* vp = static_cast<const T*>(a.v_plain);
  const T* vn = static_cast<const T*>(a.v_near);
  const C* qp = static_cast<const C*>(a.q_plain);
  const C* qn = static_cast<const C*>(a.q_near);
  const C* table = static_cast<const C*>(a.table);
  C* m = static_cast<C*>(a.m);
  C* l = static_cast<C*>(a.l);
  C* acc = static_cast<C*>(a.acc);
  C* acc_near = static_cast<C*>(a.acc_near);
  const bool two_acc = acc_near != acc;
  const C kNegInf = -std::numeric_limits<C>::infinity();

  auto s = hwy::AllocateAligned<C>(size_t(G * kBlock));        // [G, kBlock] scores, then probabilities
  auto turned = hwy::AllocateAligned<C>(size_t(kBlock * rs));  // the block's near keys (values) turned by R(-d)
  auto far_cs = hwy::AllocateAligned<C>(size_t(kBlock * 2 * half + 1));  // cos/sin rows past the table
  std::vector<const C*> cs_of(static_cast<size_t>(kBlock));              // cos/sin row of each near key
  std::fill(far_cs.get(), far_cs.get() + kBlock * 2 * half + 1, C(0));
  for (int h = 0; h < G; ++h) m[h] = kNegInf, l[h] = 0;
  std::fill(acc, acc + G * rs, C(0));
  if (two_acc) std::fill(acc_near, acc_near + G * rs, C(0));

  for (int64_t blk = a.begin; blk < a.end; blk += kBlock) {
    const int64_t nb = std::min(kBlock, a.end - blk);
    const int64_t np = std::clamp<int64_t>(a.near_begin - blk, 0, nb);  // [0, np) plain keys, [np, nb) near keys
    for (int64_t c = np; c < nb; ++c) {
      const int64_t j = blk + c, dist = a.q_pos - a.pos[j];
      const C* cr = table + dist * 2 * half;
      if (dist >= a.table_rows) {
        C* own = far_cs.get() + c * 2 * half;
        near_cos_sin(a, dist, own, own + half);
        cr = own;
      }
      cs_of[size_t(c)] = cr;
      TurnBack(d, kn + j * rs, cr, half, rs, turned.get() + (c - np) * rs);
    }
    Scores(d, qp, G, kp + blk * rs, np, rs, s.get(), kBlock);
    Scores(d, qn, G, turned.get(), nb - np, rs, s.get() + np, kBlock);

    // Online softmax over the block, per query head.
    const int64_t nbv = (nb + L - 1) / L * L;
    for (int h = 0; h < G; ++h) {
      C* sh = s.get() + h * kBlock;
      for (int64_t c = nb; c < nbv; ++c) sh[c] = kNegInf;
      auto vmax = hn::Set(d, kNegInf);
      bool nan = false;  // Highway's Exp maps NaN to 0: a NaN score must poison the row explicitly
      for (int64_t c = 0; c < nbv; c += L) {
        const auto x = hn::LoadU(d, sh + c);
        nan |= !hn::AllFalse(d, hn::IsNaN(x));
        vmax = hn::Max(vmax, x);
      }
      const C m_new = std::max(m[h], hn::GetLane(hn::MaxOfLanes(d, vmax)));
      const C alpha = std::exp(m[h] - m_new);  // 0 on the first block (m = -inf)
      const auto vm = hn::Set(d, m_new);
      auto vsum = hn::Zero(d);
      for (int64_t c = 0; c < nbv; c += L) {
        const auto p = hn::Exp(d, hn::Sub(hn::LoadU(d, sh + c), vm));  // exp(-inf) = 0 for the pad
        hn::StoreU(p, d, sh + c);
        vsum = hn::Add(vsum, p);
      }
      l[h] = nan ? std::numeric_limits<C>::quiet_NaN() : l[h] * alpha + hn::GetLane(hn::SumOfLanes(d, vsum));
      m[h] = m_new;
      if (alpha != C(1)) {
        const auto va = hn::Set(d, alpha);
        for (int64_t i = 0; i < rs; i += L)
          hn::StoreU(hn::Mul(va, hn::LoadU(d, acc + h * rs + i)), d, acc + h * rs + i);
        if (two_acc)
          for (int64_t i = 0; i < rs; i += L)
            hn::StoreU(hn::Mul(va, hn::LoadU(d, acc_near + h * rs + i)), d, acc_near + h * rs + i);
      }
    }

    Accumulate(d, vp + blk * rs, np, rs, s.get(), kBlock, G, acc);
    if (a.rotate_near_values) {
      for (int64_t c = np; c < nb; ++c)
        TurnBack(d, vn + (blk + c) * rs, cs_of[size_t(c)], half, rs, turned.get() + (c - np) * rs);
      Accumulate(d, turned.get(), nb - np, rs, s.get() + np, kBlock, G, acc_near);
    } else {
      Accumulate(d, vn + (blk + np) * rs, nb - np, rs, s.get() + np, kBlock, G, acc_near);
    }
  }
}

void ChunkF32(const ChunkArgs& a) { Chunk<float, float>(a); }
void ChunkBF16(const ChunkArgs& a) { Chunk<hwy::bfloat16_t, float>(a); }
void ChunkF16(const ChunkArgs& a) { Chunk<hwy::float16_t, float>(a); }
void ChunkF64(const ChunkArgs& a) { Chunk<double, double>(a); }

}  // namespace rotary::decode_detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary {
namespace decode_detail {
HWY_EXPORT(ChunkF32);
HWY_EXPORT(ChunkBF16);
HWY_EXPORT(ChunkF16);
HWY_EXPORT(ChunkF64);
}  // namespace decode_detail

namespace {

using decode_detail::ChunkArgs;

void run_chunk(DType t, const ChunkArgs& a) {
  switch (t) {
    case DType::F32: HWY_DYNAMIC_DISPATCH(decode_detail::ChunkF32)(a); break;
    case DType::BF16: HWY_DYNAMIC_DISPATCH(decode_detail::ChunkBF16)(a); break;
    case DType::F16: HWY_DYNAMIC_DISPATCH(decode_detail::ChunkF16)(a); break;
    case DType::F64: HWY_DYNAMIC_DISPATCH(decode_detail::ChunkF64)(a); break;
  }
}

inline void pair_features(RopeLayout layout, int r, int i, int& a, int& b) {
  a = layout == RopeLayout::Interleaved ? 2 * i : i;
  b = layout == RopeLayout::Interleaved ? 2 * i + 1 : i + r / 2;
}

int pairs_of(const KvCache& c) { return c.pos().mode == PositionMode::None ? 0 : c.pos().freqs->pairs(); }

// What one sequence's tasks read.
struct SeqPlan {
  int64_t n = 0, q_pos = 0, near_begin = 0;
  const void* k_plain = nullptr;
  int64_t k_plain_head = 0;  // elements from one kv head's k_plain rows to the next
  const void* k_near = nullptr;
  const void* v_plain = nullptr;
  const void* v_near = nullptr;
  bool rotate_near_values = false;
  int64_t chunks = 1, first_task = 0;
};

// cos and sin (times `scale`) of angle pos * inv_freq[i] for every rotary pair of the cache, in float64.
struct Turn {
  std::vector<double> c, s;
  Turn(const KvCache& cache, double pos, double scale) {
    const int n = pairs_of(cache);
    for (int i = 0; i < n; ++i) {
      const double ang = pos * cache.pos().freqs->inv_freq[size_t(i)];
      c.push_back(std::cos(ang) * scale);
      s.push_back(std::sin(ang) * scale);
    }
  }
};

// Writes x (caller's feature order, length D) as a cache-layout row y (row_stride, pads zero), the rotary pairs
// turned by t.
template <class C>
void to_row(const KvCache& cache, const double* x, const Turn& t, C* y) {
  const KvCacheLayout& lay = cache.layout();
  const int D = cache.head_dim(), n = pairs_of(cache), r = 2 * n;
  std::fill(y, y + lay.row_stride, C(0));
  for (int i = 0; i < n; ++i) {
    int fa, fb;
    pair_features(cache.pos().freqs->layout, r, i, fa, fb);
    const double c = t.c[size_t(i)], s = t.s[size_t(i)];
    y[i] = C(x[fa] * c - x[fb] * s);
    y[lay.half + i] = C(x[fa] * s + x[fb] * c);
  }
  for (int f = r; f < D; ++f) y[2 * lay.half + f - r] = C(x[f]);
}

// Prepared queries of sequence b, softmax scale and log-n folded in: plain[Hq, row_stride] scores the plain keys,
// near[Hq, row_stride] (rotary part times a^2, as the table is a pure rotation) the near ones. `baseline`: the
// keys were re-rotated by R(-d), so plain = near.
template <class C>
void prepare_queries(const KvCache& cache, const DecodeParams& p, int64_t b, int64_t q_pos, double scale, bool baseline,
                     C* plain, C* near) {
  const PositionParams& pp = cache.pos();
  const int D = cache.head_dim();
  const int64_t rs = cache.layout().row_stride, Hq = p.q.heads;
  double c = scale;
  if (pp.logn_train_len > 1) c *= std::max(1.0, std::log(double(q_pos) + 1) / std::log(double(pp.logn_train_len)));
  const double a = pp.freqs ? pp.freqs->attention_factor : 1.0, w = double(pp.window);
  const bool clipped = pp.mode == PositionMode::Rerope || pp.mode == PositionMode::LeakyRerope;
  // The plain keys' query turn: Rope R(pos_i) (factor a, keys carry the other a); Rerope R(w) (a^2, keys bare);
  // Leaky R((pos_i - w)/k + w) (a, the far copy carries the other a); the baseline's keys are turned already.
  double angle = 0, factor = 1;
  if (pp.mode == PositionMode::Rope) angle = double(q_pos), factor = a;
  if (pp.mode == PositionMode::Rerope) angle = baseline ? 0.0 : w, factor = a * a;
  if (pp.mode == PositionMode::LeakyRerope)
    angle = baseline ? 0.0 : double(q_pos - pp.window) / pp.leaky_k + w, factor = baseline ? a * a : a;
  const Turn plain_turn(cache, angle, factor), near_turn(cache, 0.0, a * a);
  std::vector<double> x(static_cast<size_t>(D));
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t off = b * p.q.token_stride + h * p.q.head_stride;
    for (int f = 0; f < D; ++f) x[size_t(f)] = c * load_as_double(p.q.data, cache.dtype(), off + f);
    to_row(cache, x.data(), plain_turn, plain + h * rs);
    if (clipped) to_row(cache, x.data(), near_turn, near + h * rs);
  }
}

// The rotation RoPER applies to the plain-key sum (as an angle in positions; NaN: none).
double roper_plain_angle(const KvCache& c, int64_t q_pos) {
  const PositionParams& pp = c.pos();
  if (!pp.roper) return std::nan("");
  const double w = double(pp.window);
  switch (pp.mode) {
    case PositionMode::Rope: return -double(q_pos);  // values stored R(pos_j) v_j
    case PositionMode::Rerope: return -w;            // far values v_j, distance clipped at w
    case PositionMode::LeakyRerope: return w / pp.leaky_k - w - double(q_pos) / pp.leaky_k;  // R(pos_j/k) v_j
    default: return std::nan("");
  }
}

int64_t auto_chunks(int64_t n, int64_t tasks_without_split, int threads) {
  const int64_t want = (4 * int64_t(threads) + tasks_without_split - 1) / tasks_without_split;
  return std::max<int64_t>(1, std::min(want, n / 1024));
}

// Runs the tasks of every sequence and combines them into o and lse.
template <class C>
void decode_planned(std::span<const KvCache* const> caches, const DecodeParams& p, std::vector<SeqPlan>& plans,
                    const std::vector<C>& q_plain, const std::vector<C>& q_near, DType key_type, int threads) {
  const KvCache& c0 = *caches[0];
  const int64_t B = int64_t(caches.size()), Hkv = c0.kv_heads(), Hq = p.q.heads, G = Hq / Hkv;
  const int D = c0.head_dim();
  const KvCacheLayout& lay = c0.layout();
  const int64_t rs = lay.row_stride;
  const size_t elt = dtype_size(c0.dtype());

  int64_t tasks = 0;
  for (int64_t b = 0; b < B; ++b) {
    SeqPlan& sp = plans[size_t(b)];
    sp.chunks = p.split_keys > 0 ? (sp.n + p.split_keys - 1) / p.split_keys : auto_chunks(sp.n, B * Hkv, threads);
    sp.first_task = tasks;
    tasks += Hkv * sp.chunks;
  }
  // Per task: m [G], l [G], acc [G, rs], acc_near [G, rs].
  std::vector<C> part_m(static_cast<size_t>(tasks * G)), part_l(static_cast<size_t>(tasks * G)),
      part_acc(static_cast<size_t>(tasks * 2 * G * rs));

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t t = 0; t < tasks; ++t) {
    int64_t b = 0;
    while (b + 1 < B && plans[size_t(b + 1)].first_task <= t) ++b;
    const SeqPlan& sp = plans[size_t(b)];
    const KvCache& cache = *caches[size_t(b)];
    const int64_t g = (t - sp.first_task) / sp.chunks, ci = (t - sp.first_task) % sp.chunks;
    const size_t head = size_t(g * cache.capacity() * rs) * elt;
    auto at = [](const void* base, size_t bytes) { return static_cast<const uint8_t*>(base) + bytes; };
    ChunkArgs a;
    a.k_plain = at(sp.k_plain, size_t(g * sp.k_plain_head) * dtype_size(key_type));
    a.k_near = at(sp.k_near, head);
    a.v_plain = at(sp.v_plain, head);
    a.v_near = at(sp.v_near, head);
    a.pos = cache.positions();
    a.begin = sp.n * ci / sp.chunks;
    a.end = sp.n * (ci + 1) / sp.chunks;
    a.near_begin = sp.near_begin;
    a.q_pos = sp.q_pos;
    a.q_plain = q_plain.data() + (b * Hq + g * G) * rs;
    a.q_near = q_near.data() + (b * Hq + g * G) * rs;
    a.groups = int(G);
    a.row_stride = rs;
    a.half = lay.half;
    a.pairs = pairs_of(cache);
    a.table = cache.near_table();
    a.table_rows = cache.near_table_rows();
    a.inv_freq = a.pairs ? cache.pos().freqs->inv_freq.data() : nullptr;
    a.rotate_near_values = sp.rotate_near_values;
    a.m = part_m.data() + t * G;
    a.l = part_l.data() + t * G;
    a.acc = part_acc.data() + t * 2 * G * rs;
    a.acc_near = sp.rotate_near_values ? part_acc.data() + (t * 2 + 1) * G * rs : a.acc;
    run_chunk(key_type, a);
  }

  std::vector<Turn> roper_turns;  // per sequence: RoPER's turn of the plain-key sum
  for (int64_t b = 0; b < B; ++b) {
    const double angle = roper_plain_angle(*caches[size_t(b)], plans[size_t(b)].q_pos);
    roper_turns.emplace_back(*caches[size_t(b)], std::isnan(angle) ? 0.0 : angle, 1.0);
  }

  // Combine the chunks of each (sequence, query head): rescale to the common max, sum, turn (RoPER), normalise.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t bh = 0; bh < B * Hq; ++bh) {
    const int64_t b = bh / Hq, h = bh % Hq, g = h / G, hh = h % G;
    const SeqPlan& sp = plans[size_t(b)];
    const KvCache& cache = *caches[size_t(b)];
    auto task = [&](int64_t ci) { return sp.first_task + g * sp.chunks + ci; };
    double M = -std::numeric_limits<double>::infinity(), Lsum = 0;
    for (int64_t ci = 0; ci < sp.chunks; ++ci) M = std::max(M, double(part_m[size_t(task(ci) * G + hh)]));
    std::vector<double> plain(static_cast<size_t>(rs), 0.0), near(static_cast<size_t>(rs), 0.0);
    for (int64_t ci = 0; ci < sp.chunks; ++ci) {
      const int64_t t = task(ci);
      const double w = std::exp(double(part_m[size_t(t * G + hh)]) - M);
      Lsum += w * double(part_l[size_t(t * G + hh)]);
      const C* ac = part_acc.data() + (t * 2 * G + hh) * rs;
      for (int64_t i = 0; i < rs; ++i) plain[size_t(i)] += w * double(ac[i]);
      if (sp.rotate_near_values) {
        const C* an = part_acc.data() + ((t * 2 + 1) * G + hh) * rs;
        for (int64_t i = 0; i < rs; ++i) near[size_t(i)] += w * double(an[i]);
      }
    }
    const int n = pairs_of(cache), half = lay.half, r = 2 * n;
    if (cache.pos().roper)
      for (int i = 0; i < n; ++i) {
        const Turn& t = roper_turns[size_t(b)];
        const double c = t.c[size_t(i)], s = t.s[size_t(i)];
        const double x1 = plain[size_t(i)], x2 = plain[size_t(half + i)];
        plain[size_t(i)] = x1 * c - x2 * s;
        plain[size_t(half + i)] = x1 * s + x2 * c;
      }
    std::vector<double> out(static_cast<size_t>(D));  // back to the caller's feature order
    for (int i = 0; i < n; ++i) {
      int fa, fb;
      pair_features(cache.pos().freqs->layout, r, i, fa, fb);
      out[size_t(fa)] = (plain[size_t(i)] + near[size_t(i)]) / Lsum;
      out[size_t(fb)] = (plain[size_t(half + i)] + near[size_t(half + i)]) / Lsum;
    }
    for (int f = r; f < D; ++f)
      out[size_t(f)] = (plain[size_t(2 * half + f - r)] + near[size_t(2 * half + f - r)]) / Lsum;
    const int64_t off = b * p.o.token_stride + h * p.o.head_stride;
    for (int i = 0; i < D; ++i) store_from_double(p.o.data, cache.dtype(), off + i, out[size_t(i)]);
    if (p.lse) {
      const double lse = M + std::log(Lsum);
      if (cache.dtype() == DType::F64)
        static_cast<double*>(p.lse)[bh] = lse;
      else
        static_cast<float*>(p.lse)[bh] = float(lse);
    }
  }
}

int resolve_threads(const DecodeParams& p) { return p.threads > 0 ? p.threads : omp_get_max_threads(); }
double resolve_scale(const DecodeParams& p, int D) {
  return p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(D));
}
int64_t resolve_q_pos(const KvCache& c, const DecodeParams& p, int64_t b) {
  return p.q_positions ? p.q_positions[b] : c.last_position();
}

template <class C>
void decode_fast(std::span<const KvCache* const> caches, const DecodeParams& p) {
  const KvCache& c0 = *caches[0];
  const int64_t B = int64_t(caches.size()), Hq = p.q.heads, rs = c0.layout().row_stride;
  std::vector<C> q_plain(static_cast<size_t>(B * Hq * rs)), q_near(static_cast<size_t>(B * Hq * rs));
  std::vector<SeqPlan> plans(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const KvCache& c = *caches[size_t(b)];
    SeqPlan& sp = plans[size_t(b)];
    const PositionMode mode = c.pos().mode;
    const bool clipped = mode == PositionMode::Rerope || mode == PositionMode::LeakyRerope;
    sp.n = c.size();
    sp.q_pos = resolve_q_pos(c, p, b);
    sp.near_begin = sp.n;
    if (clipped)  // the first key with q_pos - pos_j < w
      sp.near_begin = std::upper_bound(c.positions(), c.positions() + sp.n, sp.q_pos - c.pos().window) - c.positions();
    sp.k_plain = mode == PositionMode::LeakyRerope ? c.keys_far() : c.keys();
    sp.k_plain_head = c.capacity() * rs;
    sp.k_near = c.keys();
    sp.v_plain = c.values_far() ? c.values_far() : c.values();
    sp.v_near = c.values();
    sp.rotate_near_values = clipped && c.pos().roper;
    prepare_queries(c, p, b, sp.q_pos, resolve_scale(p, c.head_dim()), false, q_plain.data() + b * Hq * rs,
                    q_near.data() + b * Hq * rs);
  }
  decode_planned(caches, p, plans, q_plain, q_near, c0.dtype(), resolve_threads(p));
}

}  // namespace

void validate_decode_params(std::span<const KvCache* const> caches, const DecodeParams& p) {
  check(!caches.empty(), "caches.size()", 0, ">= 1 (one KvCache per sequence)");
  for (size_t b = 0; b < caches.size(); ++b) {
    const std::string name = "caches[" + std::to_string(b) + "]";
    check(caches[b] != nullptr, name, "null", "a KvCache");
    const KvCache& c = *caches[b];
    check(c.size() >= 1, name + ".size()", c.size(), ">= 1 (append the new token's k and v before decoding it)");
    if (b == 0) continue;
    check(c.dtype() == caches[0]->dtype(), name + ".dtype()", dtype_name(c.dtype()),
          std::string("the dtype of caches[0] = ") + dtype_name(caches[0]->dtype()));
    check(c.head_dim() == caches[0]->head_dim(), name + ".head_dim()", c.head_dim(),
          "the head_dim of caches[0] = " + std::to_string(caches[0]->head_dim()));
    check(c.kv_heads() == caches[0]->kv_heads(), name + ".kv_heads()", c.kv_heads(),
          "the kv_heads of caches[0] = " + std::to_string(caches[0]->kv_heads()));
  }
  const KvCache& c0 = *caches[0];
  const int64_t B = int64_t(caches.size()), Hkv = c0.kv_heads();
  if (!(p.q.heads >= 1 && p.q.heads % Hkv == 0))
    fail("q.heads", to_text(p.q.heads),
         "a positive multiple of the caches' kv_heads = " + std::to_string(Hkv) + " (MHA, GQA or MQA)");
  detail::check_view(p.q, "q", B, c0.head_dim());
  detail::check_view(p.o, "o", B, c0.head_dim(), p.q.heads, "q.heads");
  if (p.q_positions)
    for (int64_t b = 0; b < B; ++b)
      check(p.q_positions[b] >= caches[size_t(b)]->last_position(), "q_positions[" + std::to_string(b) + "]",
            p.q_positions[b],
            ">= the last cached position " + std::to_string(caches[size_t(b)]->last_position()) +
                " (the cache holds the keys the query may see)");
  check(std::isfinite(p.softmax_scale) && p.softmax_scale >= 0, "softmax_scale", p.softmax_scale,
        "a finite value > 0, or 0 for 1/sqrt(head_dim)");
  detail::check_threads(p.threads);
  check(p.split_keys >= 0, "split_keys", p.split_keys, ">= 0 (0: automatic)");
}

void attention_decode(std::span<const KvCache* const> caches, const DecodeParams& p) {
  validate_decode_params(caches, p);
  if (caches[0]->dtype() == DType::F64)
    decode_fast<double>(caches, p);
  else
    decode_fast<float>(caches, p);
}

void attention_decode_rerotate_baseline(const KvCache& cache, const DecodeParams& p, std::vector<float>& scratch) {
  const KvCache* one[1] = {&cache};
  const std::span<const KvCache* const> caches(one, 1);
  validate_decode_params(caches, p);
  const PositionParams& pp = cache.pos();
  check(cache.dtype() == DType::F32, "cache.dtype()", dtype_name(cache.dtype()), "f32 (the baseline is fp32 only)");
  check(pp.mode == PositionMode::Rerope || pp.mode == PositionMode::LeakyRerope, "cache.pos().mode", int(pp.mode),
        "Rerope or LeakyRerope (the baseline re-rotates un-rotated keys)");
  check(!pp.roper, "cache.pos().roper", "true", "false (the baseline has no RoPER)");
  const KvCacheLayout& lay = cache.layout();
  const int64_t n = cache.size(), Hkv = cache.kv_heads(), cap = cache.capacity(), rs = lay.row_stride;
  const int half = lay.half, pairs = pp.freqs->pairs();
  const int64_t q_pos = resolve_q_pos(cache, p, 0), w = pp.window, rows = cache.near_table_rows();
  const int threads = resolve_threads(p);
  scratch.resize(size_t(Hkv * n * rs));
  const float* keys = static_cast<const float*>(cache.keys());
  const float* table = static_cast<const float*>(cache.near_table());
  const int64_t* pos = cache.positions();

  // Step 1 (the seed's): every key of every head turned by its clipped / leaky relative distance.
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> cs(static_cast<size_t>(2 * half), 0.0f);
#pragma omp for schedule(static)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t dist = q_pos - pos[j];
      const float* cr = nullptr;
      if (pp.mode == PositionMode::Rerope || dist < w) {
        const int64_t dd = std::min(dist, w);
        if (dd < rows) {
          cr = table + dd * 2 * half;
        } else {
          rope_cos_sin(pp.freqs->inv_freq.data(), pairs, dd, 1.0, cs.data(), cs.data() + half);
          cr = cs.data();
        }
      } else {
        rope_cos_sin_at(pp.freqs->inv_freq.data(), pairs, double(w) + double(dist - w) / pp.leaky_k, 1.0, cs.data(),
                        cs.data() + half);
        cr = cs.data();
      }
      for (int64_t g = 0; g < Hkv; ++g) {
        const float* src = keys + (g * cap + j) * rs;
        float* dst = scratch.data() + (g * n + j) * rs;
        for (int i = 0; i < half; ++i) {
          const float k1 = src[i], k2 = src[half + i], c = cr[i], s = cr[half + i];
          dst[i] = k1 * c + k2 * s;
          dst[half + i] = k2 * c - k1 * s;
        }
        for (int64_t i = 2 * half; i < rs; ++i) dst[i] = src[i];
      }
    }
  }

  // Step 2: plain attention over the re-rotated keys.
  std::vector<float> q_plain(static_cast<size_t>(p.q.heads * rs)), q_near(static_cast<size_t>(p.q.heads * rs));
  std::vector<SeqPlan> plans(1);
  SeqPlan& sp = plans[0];
  sp.n = n;
  sp.q_pos = q_pos;
  sp.near_begin = n;
  sp.k_plain = scratch.data();
  sp.k_plain_head = n * rs;
  sp.k_near = cache.keys();
  sp.v_plain = sp.v_near = cache.values();
  prepare_queries(cache, p, 0, q_pos, resolve_scale(p, cache.head_dim()), true, q_plain.data(), q_near.data());
  decode_planned(caches, p, plans, q_plain, q_near, DType::F32, threads);
}

}  // namespace rotary
#endif  // HWY_ONCE
