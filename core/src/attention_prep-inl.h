// core/src/attention_prep-inl.h (internal, per Highway target): the pre-rotation of q, k, v (and do)
// into scratch (PrepJob, attention_plan.h), vectorised: it is O(N) work but at N = 1024 a scalar
// version took ~10% of a forward call.
//
// A row through a transform: its rotated pairs turned by the shared pair rotation (rotate_pairs-inl.h) with the
// token's cos/sin pre-multiplied by the row's factor (the sign of a transpose folded into the sin); y[a] = qs x[a]
// for pass-through features; y[D:Dp] = 0.
#if defined(ROTARY_ATTENTION_PREP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ROTARY_ATTENTION_PREP_INL_H_
#undef ROTARY_ATTENTION_PREP_INL_H_
#else
#define ROTARY_ATTENTION_PREP_INL_H_
#endif

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "attention_kernels-inl.h"
#include "attention_plan.h"
#include "rotate_pairs-inl.h"
#include "storage-inl.h"
#include "storage.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::attn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using simd::HWY_NAMESPACE::LoadRow;
using simd::HWY_NAMESPACE::RotateHalfSplitRow;
using simd::HWY_NAMESPACE::RotateInterleavedRow;
using simd::HWY_NAMESPACE::Turn;

// The token's cos/sin for one transform, times the row's factor, sign of a transpose folded into S, in the
// tables the shared pair rotation reads (rotate_pairs-inl.h): per pair (C, S [half]) for half-split, per feature
// (C, S [r]) for interleaved. Returns the pass-through factor qs.
template <class T>
HWY_INLINE T ExpandAngles(const Plan& pl, const RowTransform& tr, int64_t t, const T* c, const T* s, T* C, T* S) {
  const T qs = tr.query_scale ? T(pl.query_scale(t)) : T(1);
  if (tr.angle == Angle::None || pl.pairs == 0) return qs;
  const double af = pl.freqs->attention_factor;
  const T mr = T(double(qs) * (tr.factor_power == 0 ? 1.0 : tr.factor_power == 1 ? af : af * af));
  const T ms = tr.transpose ? -mr : mr;
  const int half = pl.pairs, NL = int(hn::Lanes(Tag<T>()));
  int n = half;
  if (pl.freqs->layout == RopeLayout::Interleaved) {
    for (int i = 0; i < half; ++i) {
      C[2 * i] = C[2 * i + 1] = c[i] * mr;
      S[2 * i] = -(s[i] * ms), S[2 * i + 1] = s[i] * ms;
    }
    n = 2 * half;
  } else {
    for (int i = 0; i < half; ++i) C[i] = c[i] * mr, S[i] = s[i] * ms;
  }
  // A partial last vector reads the tables up to a whole vector (its extra lanes discarded): they must be numbers.
  for (int i = n; i < (n + NL - 1) / NL * NL; ++i) C[i] = S[i] = T(0);
  return qs;
}

// y = transform(x) (one row; y has Dp elements, padding zeroed).
template <class T>
HWY_INLINE void RotateRow(const Plan& pl, bool rotate, const T* HWY_RESTRICT C, const T* HWY_RESTRICT S, T qs,
                          const T* HWY_RESTRICT x, T* HWY_RESTRICT y) {
  const Tag<T> d;
  const int r = rotate ? pl.freqs->rotary_dim : 0, D = pl.D;
  if (r > 0) {
    // C, S hold the per-pair tables (half-split) or the per-feature ones (interleaved): ExpandAngles.
    if (pl.freqs->layout == RopeLayout::Interleaved)
      RotateInterleavedRow<Turn::Forward>(d, x, y, size_t(r), C, S);
    else
      RotateHalfSplitRow<Turn::Forward>(d, x, y, size_t(r / 2), C, S);
  }
  for (int a = r; a < D; ++a) y[a] = qs * x[a];
  for (int a = D; a < pl.Dp; ++a) y[a] = T(0);
}

// One row through a transform at token t: y[0:D] (=|+=) transform(x[0:D]) (the output side of the kernels).
template <class T>
HWY_INLINE void TransformRow(const Plan& pl, const RowTransform& tr, int64_t t, const T* x, T* y, bool accumulate) {
  alignas(64) T c[kMaxPairs], s[kMaxPairs], C[2 * kMaxPairs], S[2 * kMaxPairs], tmp[256 + 16];
  const bool rotate = tr.angle != Angle::None && pl.pairs > 0;
  if (rotate) angles_at(pl, tr.angle, t, c, s);
  const T qs = ExpandAngles(pl, tr, t, c, s, C, S);
  RotateRow(pl, rotate, C, S, qs, x, accumulate ? tmp : y);
  if (accumulate)
    for (int a = 0; a < pl.D; ++a) y[a] += tmp[a];
}

// Writes row[0:D] into a storage view at (token t, head h), rounding once.
template <class T>
HWY_INLINE void StoreRow(const Plan& pl, const T* HWY_RESTRICT row, const HeadsView& dst, int64_t t, int64_t h) {
  detail::store_row(dst.data, pl.dtype, t * dst.token_stride + h * dst.head_stride, pl.D, row);
}

// True when some y[0:D] is NaN or Inf.
template <class T>
HWY_INLINE bool AnyNonFinite(const T* y, int D) {
  T probe = 0;
  for (int a = 0; a < D; ++a) probe += y[a] * T(0);
  return probe != probe;
}

// All jobs in one parallel pass over tokens; a token's angles are computed once per angle kind.
template <class T>
void Prep(const Plan& pl, const std::vector<PrepJob>& jobs, int threads) {
  const int64_t blk_elems = int64_t(pl.Dp) * kBlockKeys;
  for (const PrepJob& j : jobs) {
    // Packed columns past a sequence's end stay zero.
    if (j.packed) std::memset(j.dst, 0, sizeof(T) * size_t(j.src.heads * pl.nblocks * blk_elems));
    if (j.flags) std::memset(j.flags, 0, size_t(j.src.heads * pl.nblocks));
  }
  constexpr int kKinds = 5;  // Angle values
#pragma omp parallel num_threads(threads)
  {
    alignas(64) T c[kKinds][kMaxPairs], s[kKinds][kMaxPairs];
    alignas(64) T C[2 * kMaxPairs], S[2 * kMaxPairs];
    alignas(64) T x[256 + 16], ybuf[256 + 16];
#pragma omp for schedule(static)
    for (int64_t t = 0; t < pl.tokens; ++t) {
      bool have[kKinds] = {};
      const int64_t seq = pl.tok_seq[size_t(t)], i = t - pl.seq_start[size_t(seq)];
      const int64_t blk = pl.blk_first[size_t(seq)] + i / kBlockKeys, col = i % kBlockKeys;
      for (const PrepJob& j : jobs) {
        if (t < j.first_token) continue;
        const int64_t row = t - j.first_token, rows = pl.tokens - j.first_token;
        const int kind = int(j.tr.angle);
        const bool rotate = j.tr.angle != Angle::None && pl.pairs > 0;
        if (rotate && !have[kind]) {
          angles_at(pl, j.tr.angle, t, c[kind], s[kind]);
          have[kind] = true;
        }
        const T qs = ExpandAngles(pl, j.tr, t, c[kind], s[kind], C, S);
        T* dst = static_cast<T*>(j.dst);
        for (int64_t h = 0; h < j.src.heads; ++h) {
          LoadRow(pl.dtype, j.src.data, row * j.src.token_stride + h * j.src.head_stride, pl.D, x);
          T* y = j.packed ? ybuf : dst + (h * rows + row) * pl.Dp;
          RotateRow(pl, rotate, C, S, qs, x, y);
          if (j.packed) {
            T* at = dst + (h * pl.nblocks + blk) * blk_elems + col;
            for (int a = 0; a < pl.Dp; ++a) at[int64_t(a) * kBlockKeys] = y[a];
          }
          if (j.flags && AnyNonFinite(y, pl.D)) {
#pragma omp atomic write
            j.flags[h * pl.nblocks + blk] = uint8_t(1);
          }
        }
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace rotary::attn
HWY_AFTER_NAMESPACE();

#endif  // ROTARY_ATTENTION_PREP_INL_H_
