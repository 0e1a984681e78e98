// core/src/rotate_pairs-inl.h (internal, per Highway target): the one SIMD pair rotation every kernel that rotates
// uses (rope_kernels_hwy.cpp, decode_chunk_hwy.cpp, attention_prep-inl.h). Rotating pair (x_a, x_b) by angle t is
//   forward  R(t):  (x_a cos t - x_b sin t,  x_a sin t + x_b cos t)
//   inverse R(-t):  (x_a cos t + x_b sin t,  x_b cos t - x_a sin t)
// as rope_pair in rotary/rope_spec.h defines it. Scales (the attention factor, a query scale) and the sign of a
// transpose are the caller's to fold into the cos/sin it passes. The scalar counterpart is rotate_pair.h.
//
// Layouts (r = rotary_dim, half = r / 2):
//   half-split: x_a = x[i], x_b = x[half + i]; one vector holds N pairs, tables per pair: c[i], s[i];
//   interleaved: x_a = x[2i], x_b = x[2i + 1]; one vector holds N / 2 whole pairs, so the tables are per feature
//     (SpreadToFeatures): cd = [c0 c0 c1 c1 ..], sd = [-s0 s0 -s1 s1 ..], and y = x cd + swap_adjacent(x) sd.
// Rows are loaded and stored through storage-inl.h, so x and y may be any storage type or the compute type; a
// partial last vector goes through zeroed scratch (no access past the row). Tables are read in whole vectors:
// c, s padded to a multiple of N pairs and cd, sd to a multiple of N features, the padding holding numbers.
#if defined(ROTARY_CORE_ROTATE_PAIRS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ROTARY_CORE_ROTATE_PAIRS_INL_H_
#undef ROTARY_CORE_ROTATE_PAIRS_INL_H_
#else
#define ROTARY_CORE_ROTATE_PAIRS_INL_H_
#endif

#include <cstddef>
#include <cstring>

#include "hwy/highway.h"
#include "storage-inl.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Which way a pair turns by the angle of the cos/sin given (see the file comment).
enum class Turn : bool { Forward, Inverse };

// One vector of pairs in registers: x_a lanes in xa, x_b lanes in xb, turned in place.
template <Turn kTurn, class D, class V = hn::Vec<D>>
HWY_INLINE void RotatePairLanes(D /*d*/, V& xa, V& xb, V c, V s) {
  const V a = xa;
  if constexpr (kTurn == Turn::Forward) {
    xa = hn::NegMulAdd(xb, s, hn::Mul(a, c));
    xb = hn::MulAdd(a, s, hn::Mul(xb, c));
  } else {
    xa = hn::MulAdd(xb, s, hn::Mul(a, c));
    xb = hn::NegMulAdd(a, s, hn::Mul(xb, c));
  }
}

#if HWY_TARGET != HWY_SCALAR
// One vector of whole interleaved pairs (lanes 2j, 2j+1): x cd + swap_adjacent(x) sd, sd signed for the forward
// turn (-s, s per pair); the inverse turn negates it.
template <Turn kTurn, class D, class V = hn::Vec<D>>
HWY_INLINE V RotateAdjacentLanes(D d, V x, V cd, V sd) {
  if constexpr (kTurn == Turn::Forward) return hn::MulAdd(x, cd, hn::Mul(hn::Reverse2(d, x), sd));
  return hn::NegMulAdd(hn::Reverse2(d, x), sd, hn::Mul(x, cd));
}
#endif

// The per-feature tables of the interleaved layout from the per-pair ones: cd = [c0 c0 c1 c1 ..],
// sd = [-s0 s0 -s1 s1 ..] for features [0, 2 * pairs).
template <class T>
HWY_INLINE void SpreadToFeatures(const T* HWY_RESTRICT c, const T* HWY_RESTRICT s, size_t pairs, T* HWY_RESTRICT cd,
                                 T* HWY_RESTRICT sd) {
  for (size_t i = 0; i < pairs; ++i) {
    cd[2 * i] = cd[2 * i + 1] = c[i];
    sd[2 * i] = -s[i];
    sd[2 * i + 1] = s[i];
  }
}

// Pairs [0, half) of a half-split row: (x[i], x[half + i]) -> (y[i], y[half + i]); c, s per pair. x == y rotates
// in place.
template <Turn kTurn, class D, class TX, class TY, class T = hn::TFromD<D>>
HWY_INLINE void RotateHalfSplitRow(D d, const TX* x, TY* y, size_t half, const T* HWY_RESTRICT c,
                                   const T* HWY_RESTRICT s) {
  const size_t N = hn::Lanes(d);
  auto one = [&](const TX* xa, const TX* xb, TY* ya, TY* yb, size_t i) {
    auto va = LoadStorage(d, xa), vb = LoadStorage(d, xb);
    RotatePairLanes<kTurn>(d, va, vb, hn::LoadU(d, c + i), hn::LoadU(d, s + i));
    StoreStorage(d, va, ya);
    StoreStorage(d, vb, yb);
  };
  size_t i = 0;
  for (; i + N <= half; i += N) one(x + i, x + half + i, y + i, y + half + i, i);
  if (i < half) {  // a partial last vector (an odd pair count) goes through scratch
    HWY_ALIGN TX xa[kMaxLanes] = {}, xb[kMaxLanes] = {};
    HWY_ALIGN TY ya[kMaxLanes], yb[kMaxLanes];
    const size_t rem = half - i;
    std::memcpy(xa, x + i, rem * sizeof(TX));
    std::memcpy(xb, x + half + i, rem * sizeof(TX));
    one(xa, xb, ya, yb, i);
    std::memcpy(y + i, ya, rem * sizeof(TY));
    std::memcpy(y + half + i, yb, rem * sizeof(TY));
  }
}

// Features [0, r) of an interleaved row: pairs (x[2i], x[2i+1]); cd, sd per feature (SpreadToFeatures). x == y
// rotates in place.
template <Turn kTurn, class D, class TX, class TY, class T = hn::TFromD<D>>
HWY_INLINE void RotateInterleavedRow(D d, const TX* x, TY* y, size_t r, const T* HWY_RESTRICT cd,
                                     const T* HWY_RESTRICT sd) {
#if HWY_TARGET == HWY_SCALAR
  // One lane cannot hold a whole pair: pair i as two one-lane vectors, its cos at cd[2i] and sin at sd[2i + 1].
  for (size_t i = 0; i < r / 2; ++i) {
    auto va = LoadStorage(d, x + 2 * i), vb = LoadStorage(d, x + 2 * i + 1);
    RotatePairLanes<kTurn>(d, va, vb, hn::LoadU(d, cd + 2 * i), hn::LoadU(d, sd + 2 * i + 1));
    StoreStorage(d, va, y + 2 * i);
    StoreStorage(d, vb, y + 2 * i + 1);
  }
#else
  const size_t N = hn::Lanes(d);  // even, so vectors hold whole pairs
  auto one = [&](const TX* xp, TY* yp, size_t i) {
    StoreStorage(d, RotateAdjacentLanes<kTurn>(d, LoadStorage(d, xp), hn::LoadU(d, cd + i), hn::LoadU(d, sd + i)),
                 yp);
  };
  size_t i = 0;
  for (; i + N <= r; i += N) one(x + i, y + i, i);
  if (i < r) {
    HWY_ALIGN TX xb[kMaxLanes] = {};
    HWY_ALIGN TY yb[kMaxLanes];
    const size_t rem = r - i;
    std::memcpy(xb, x + i, rem * sizeof(TX));
    one(xb, yb, i);
    std::memcpy(y + i, yb, rem * sizeof(TY));
  }
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace rotary::simd
HWY_AFTER_NAMESPACE();

#endif  // ROTARY_CORE_ROTATE_PAIRS_INL_H_
