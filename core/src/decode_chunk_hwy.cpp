// core/src/decode_chunk_hwy.cpp: the Highway kernel of one decode task (decode_chunk.h): scores of G query heads
// against a range of cached keys, online softmax, weighted values; near keys turned by R(-d) from the table.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "decode_chunk.h"
#include "simd_targets.h"
#include "rotary/angles.h"
#include "rotary/kv_cache.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "decode_chunk_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// (foreach_target must come first: it re-includes this file once per target)
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
// math-inl needs highway.h before it
#include <hwy/contrib/math/math-inl.h>

#include "rotate_pairs-inl.h"
#include "storage-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::decode_detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes of storage type T as the compute type of d (bf16/f16 widen to f32): the shared storage conversion.
template <class D, class T>
HWY_INLINE hn::Vec<D> LoadAs(D d, const T* p) {
  return simd::HWY_NAMESPACE::LoadStorage(d, p);
}

// Rows of a Q8 cache (KvStorage::Q8): int8 quants with a float scale per kQ8Block elements. `e` counts elements
// from the array's start, so element e's scale is s[e / kQ8Block]; the kernels add offsets to it as to a pointer.
struct Q8Rows {
  const int8_t* q = nullptr;
  const float* s = nullptr;
  int64_t e = 0;
  Q8Rows operator+(int64_t n) const { return {q, s, e + n}; }
};
// A vector lies in one block: it has at most kPad lanes and starts at a multiple of its width within a row, and
// rows are a multiple of kQ8Block long. quant x scale in float: one rounding, as the reference's product.
template <class D>
HWY_INLINE hn::Vec<D> LoadAs(D d, Q8Rows p) {
  static_assert(std::is_same_v<hn::TFromD<D>, float>, "q8 caches compute in float");
  const hn::Rebind<int32_t, D> di;
  const hn::Rebind<int8_t, D> d8;
  return hn::Mul(hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, p.q + p.e))), hn::Set(d, p.s[p.e / kQ8Block]));
}

// The rows an array of ChunkArgs starts: a typed pointer, or Q8Rows with the array's scales.
template <class T>
HWY_INLINE auto RowsOf(const void* p, const float* scales) {
  if constexpr (std::is_same_v<T, Q8Rows>)
    return Q8Rows{static_cast<const int8_t*>(p), scales, 0};
  else
    return static_cast<const T*>(p);
}

inline void near_cos_sin(const ChunkArgs& a, int64_t dist, float* c, float* s) {
  rope_cos_sin(a.inv_freq, a.pairs, dist, 1.0, c, s);
}
inline void near_cos_sin(const ChunkArgs& a, int64_t dist, double* c, double* s) {
  rope_cos_sin_f64(a.inv_freq, a.pairs, dist, 1.0, c, s);
}

// out = R(-d) row (the shared pair rotation, inverse turn) with cs = [cos | sin] of d; pass-through copied. Cache
// rows are half-split with half a multiple of the lanes (KvCacheLayout::kPad), so no partial vector occurs.
template <class D, class T>
HWY_INLINE void TurnBack(D d, const T* row, const hn::TFromD<D>* cs, int half, int64_t rs, hn::TFromD<D>* out) {
  const int64_t L = int64_t(hn::Lanes(d));
  simd::HWY_NAMESPACE::RotateHalfSplitRow<simd::HWY_NAMESPACE::Turn::Inverse>(d, row, out, size_t(half), cs,
                                                                             cs + half);
  for (int64_t i = 2 * half; i < rs; i += L) hn::StoreU(LoadAs(d, row + i), d, out + i);
}
// A Q8 row: widened into `out` first, then turned there.
template <class D>
HWY_INLINE void TurnBack(D d, Q8Rows row, const hn::TFromD<D>* cs, int half, int64_t rs, hn::TFromD<D>* out) {
  const int64_t L = int64_t(hn::Lanes(d));
  for (int64_t i = 0; i < rs; i += L) hn::StoreU(LoadAs(d, row + i), d, out + i);
  simd::HWY_NAMESPACE::RotateHalfSplitRow<simd::HWY_NAMESPACE::Turn::Inverse>(d, out, out, size_t(half), cs,
                                                                             cs + half);
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
template <int NH, int NK, class D, class P>
HWY_INLINE void ScoreTile(D d, const hn::TFromD<D>* q, P rows, int64_t rs, hn::TFromD<D>* s, int64_t s_stride) {
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
template <class D, class P>
HWY_INLINE void Scores(D d, const hn::TFromD<D>* q, int G, P rows, int64_t n, int64_t rs, hn::TFromD<D>* s,
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
template <int NH, int NV, class D, class P>
HWY_INLINE void AccumulateTile(D d, P rows, int64_t n, int64_t rs, int64_t i, const hn::TFromD<D>* p,
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
template <class D, class P>
HWY_INLINE void Accumulate(D d, P rows, int64_t n, int64_t rs, const hn::TFromD<D>* p, int64_t p_stride, int G,
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
  const auto kp = RowsOf<T>(a.k_plain, a.k_plain_scales);
  const auto kn = RowsOf<T>(a.k_near, a.k_near_scales);
  const auto vp = RowsOf<T>(a.v_plain, a.v_plain_scales);
  const auto vn = RowsOf<T>(a.v_near, a.v_near_scales);
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
void ChunkQ8(const ChunkArgs& a) { Chunk<Q8Rows, float>(a); }

const char* DecodeTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace rotary::decode_detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary::decode_detail {
HWY_EXPORT(ChunkF32);
HWY_EXPORT(ChunkBF16);
HWY_EXPORT(ChunkF16);
HWY_EXPORT(ChunkF64);
HWY_EXPORT(ChunkQ8);
HWY_EXPORT(DecodeTargetName);

void run_chunk(DType t, KvStorage storage, const ChunkArgs& a) {
  if (storage == KvStorage::Q8) return HWY_DYNAMIC_DISPATCH(ChunkQ8)(a);
  switch (t) {
    case DType::F32: HWY_DYNAMIC_DISPATCH(ChunkF32)(a); break;
    case DType::BF16: HWY_DYNAMIC_DISPATCH(ChunkBF16)(a); break;
    case DType::F16: HWY_DYNAMIC_DISPATCH(ChunkF16)(a); break;
    case DType::F64: HWY_DYNAMIC_DISPATCH(ChunkF64)(a); break;
  }
}

}  // namespace rotary::decode_detail

const char* rotary::detail::decode_simd_target() {
  return HWY_DYNAMIC_DISPATCH(decode_detail::DecodeTargetName)();
}
#endif  // HWY_ONCE
