// The fast table rotation (rotary/rope_table.h rope_table_apply): Highway SIMD with runtime dispatch, OpenMP over
// tokens.
//
// Per token, the table row is spread once into padded per-lane tables that every head shares, with the sign of
// the direction folded in, so that each head is one pass of two products per element:
//   half-split:  y_a = x_a ca + x_b sa',  y_b = x_b cb + x_a sb'     (vectors of N pairs from each half)
//   interleaved: y = x cd + swap_adjacent(x) sd                       (vectors of N / 2 whole pairs)
// forward: sa' = -s_a, sb' = s_b; transpose: sa' = s_b, sb' = -s_a (the file comment of rope_table.h). Storage
// goes through storage-inl.h (f32 / f16 / bf16 as f32 lanes, f64 as f64 lanes), rounded once on the way out.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "rope_table_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "rotation_threads.h"
#include "storage-inl.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "rotary/dtype.h"
#include "rotary/rope_table.h"

HWY_BEFORE_NAMESPACE();
namespace rotary {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using simd::HWY_NAMESPACE::kMaxLanes;
using simd::HWY_NAMESPACE::LoadStorage;
using simd::HWY_NAMESPACE::StoreStorage;

template <class TS>
using TableT = std::conditional_t<std::is_same_v<TS, double>, double, float>;

inline size_t RoundUpTo(size_t n, size_t m) { return (n + m - 1) / m * m; }

// Pairs [0, half) of a half-split row; ca, sa, cb, sb padded to whole vectors.
template <class D, class TS, class T = hn::TFromD<D>>
HWY_INLINE void TurnHalfSplitRow(D d, const TS* x, TS* y, size_t half, const T* ca, const T* sa, const T* cb,
                                 const T* sb) {
  const size_t N = hn::Lanes(d);
  auto one = [&](const TS* xa, const TS* xb, TS* ya, TS* yb, size_t i) {
    const auto va = LoadStorage(d, xa), vb = LoadStorage(d, xb);
    const auto ra = hn::MulAdd(vb, hn::LoadU(d, sa + i), hn::Mul(va, hn::LoadU(d, ca + i)));
    const auto rb = hn::MulAdd(va, hn::LoadU(d, sb + i), hn::Mul(vb, hn::LoadU(d, cb + i)));
    StoreStorage(d, ra, ya);
    StoreStorage(d, rb, yb);
  };
  size_t i = 0;
  for (; i + N <= half; i += N) one(x + i, x + half + i, y + i, y + half + i, i);
  if (i < half) {  // the last partial vector through scratch: no access past the row
    HWY_ALIGN TS xa[kMaxLanes] = {}, xb[kMaxLanes] = {}, ya[kMaxLanes], yb[kMaxLanes];
    const size_t rem = half - i;
    std::memcpy(xa, x + i, rem * sizeof(TS));
    std::memcpy(xb, x + half + i, rem * sizeof(TS));
    one(xa, xb, ya, yb, i);
    std::memcpy(y + i, ya, rem * sizeof(TS));
    std::memcpy(y + half + i, yb, rem * sizeof(TS));
  }
}

// Features [0, r) of an interleaved row; cd, sd per feature, padded to whole vectors.
template <class D, class TS, class T = hn::TFromD<D>>
HWY_INLINE void TurnInterleavedRow(D d, const TS* x, TS* y, size_t r, const T* cd, const T* sd) {
#if HWY_TARGET == HWY_SCALAR
  // One lane cannot hold a pair: feature by feature, the partner read before either is written.
  for (size_t j = 0; j < r; j += 2) {
    const auto va = LoadStorage(d, x + j), vb = LoadStorage(d, x + j + 1);
    StoreStorage(d, hn::MulAdd(vb, hn::LoadU(d, sd + j), hn::Mul(va, hn::LoadU(d, cd + j))), y + j);
    StoreStorage(d, hn::MulAdd(va, hn::LoadU(d, sd + j + 1), hn::Mul(vb, hn::LoadU(d, cd + j + 1))), y + j + 1);
  }
#else
  const size_t N = hn::Lanes(d);  // even: vectors hold whole pairs
  auto one = [&](const TS* xp, TS* yp, size_t i) {
    const auto v = LoadStorage(d, xp);
    StoreStorage(d, hn::MulAdd(hn::Reverse2(d, v), hn::LoadU(d, sd + i), hn::Mul(v, hn::LoadU(d, cd + i))), yp);
  };
  size_t i = 0;
  for (; i + N <= r; i += N) one(x + i, y + i, i);
  if (i < r) {
    HWY_ALIGN TS xb[kMaxLanes] = {}, yb[kMaxLanes];
    const size_t rem = r - i;
    std::memcpy(xb, x + i, rem * sizeof(TS));
    one(xb, yb, i);
    std::memcpy(y + i, yb, rem * sizeof(TS));
  }
#endif
}

template <class TS>
void TurnTokenRange(const RopeTableParams& p, int64_t t0, int64_t t1) {
  using T = TableT<TS>;
  const hn::ScalableTag<T> d;
  const size_t N = hn::Lanes(d);
  const size_t r = size_t(p.rotary_dim), half = r / 2, D = size_t(p.head_dim);
  const bool interleaved = p.layout == RopeLayout::Interleaved, per_pair = p.width == TableWidth::Pairs;
  // half-split: ca, sa, cb, sb of [hp]; interleaved: cd, sd of [rp].
  const size_t hp = RoundUpTo(half, N), rp = RoundUpTo(r, N);
  const size_t need = interleaved ? 2 * rp : 4 * hp;
  auto tables = hwy::AllocateAligned<T>(need);
  std::fill(tables.get(), tables.get() + need, T(0));  // padding lanes are read, so they hold numbers
  T* ca = tables.get();
  T* sa = ca + hp;
  T* cb = sa + hp;
  T* sb = cb + hp;
  T* cd = tables.get();
  T* sd = cd + rp;
  const T* cos = static_cast<const T*>(p.cos);
  const T* sin = static_cast<const T*>(p.sin);

  for (int64_t t = t0; t < t1; ++t) {
    const T* c = cos + p.rows[t] * p.row_stride;
    const T* s = sin + p.rows[t] * p.row_stride;
    for (size_t i = 0; i < half; ++i) {
      const auto [fa, fb] = rope_pair(p.layout, int(r), int(i));
      const size_t ea = per_pair ? i : size_t(fa), eb = per_pair ? i : size_t(fb);
      const T turn_a = p.transpose ? s[eb] : -s[ea];
      const T turn_b = p.transpose ? -s[ea] : s[eb];
      if (interleaved) {
        cd[2 * i] = c[ea];
        cd[2 * i + 1] = c[eb];
        sd[2 * i] = turn_a;
        sd[2 * i + 1] = turn_b;
      } else {
        ca[i] = c[ea];
        cb[i] = c[eb];
        sa[i] = turn_a;
        sb[i] = turn_b;
      }
    }
    const TS* src = static_cast<const TS*>(p.x_in.data) + t * p.x_in.token_stride;
    TS* dst = static_cast<TS*>(p.x_out.data) + t * p.x_out.token_stride;
    for (int64_t h = 0; h < p.x_in.heads; ++h) {
      const TS* x = src + h * p.x_in.head_stride;
      TS* y = dst + h * p.x_out.head_stride;
      if (interleaved)
        TurnInterleavedRow(d, x, y, r, cd, sd);
      else
        TurnHalfSplitRow(d, x, y, half, ca, sa, cb, sb);
      if (y != x && D > r) std::memcpy(y + r, x + r, (D - r) * sizeof(TS));  // pass-through features
    }
  }
}

template <class TS>
void RopeTableTyped(const RopeTableParams& p) {
  const double elements = double(p.tokens) * double(p.x_in.heads) * double(p.head_dim);
  const int64_t threads = detail::rotation_threads(p.threads, p.tokens, elements);
  if (threads <= 1) {
    TurnTokenRange<TS>(p, 0, p.tokens);
    return;
  }
#pragma omp parallel num_threads(int(threads))
  {
    const int64_t n = omp_get_num_threads(), id = omp_get_thread_num();
    TurnTokenRange<TS>(p, p.tokens * id / n, p.tokens * (id + 1) / n);
  }
}

void RopeTableImpl(const RopeTableParams& p) {
  switch (p.dtype) {
    case DType::F32: return RopeTableTyped<float>(p);
    case DType::F64: return RopeTableTyped<double>(p);
    case DType::BF16: return RopeTableTyped<hwy::bfloat16_t>(p);
    case DType::F16: return RopeTableTyped<hwy::float16_t>(p);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace rotary
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary {

HWY_EXPORT(RopeTableImpl);

void rope_table_apply(const RopeTableParams& p) {
  validate_rope_table_params(p);
  if (p.tokens == 0) return;
  HWY_DYNAMIC_DISPATCH(RopeTableImpl)(p);
}

}  // namespace rotary
#endif  // HWY_ONCE
