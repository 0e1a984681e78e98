// The fast rotation kernel (rotary/rope.h rope_apply): Highway SIMD with runtime dispatch, OpenMP over tokens.
//
// Per token: cos/sin of its r/2 pairs are computed once (angles-inl.h; attention factor folded in, sin negated
// for Inverse/Transpose) and shared by every head of q and k. Then each head is one pass over memory through the
// shared pair rotation (rotate_pairs-inl.h): contiguous halves for half-split, swap_adjacent for interleaved.
// Features [r, D) are copied when out of place and untouched in place. Arithmetic is fp32 for f32/f16/bf16
// storage and fp64 for f64; every output is rounded once to the storage type (bf16/f16 to nearest even).
// bf16 skips widening and narrowing shuffles: a 32-bit lane holds two bf16 values, each becomes an fp32 by a
// shift or a mask and goes back by an integer rounding (see RotateBf16Lanes).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "rope_kernels_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "angles-inl.h"
#include "rotate_pairs-inl.h"
#include "rotation_threads.h"
#include "storage-inl.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "rotary/dtype.h"
#include "rotary/rope.h"

HWY_BEFORE_NAMESPACE();
namespace rotary {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using simd::HWY_NAMESPACE::kMaxLanes;
using simd::HWY_NAMESPACE::RotateHalfSplitRow;
using simd::HWY_NAMESPACE::RotateInterleavedRow;
using simd::HWY_NAMESPACE::RotatePairLanes;
using simd::HWY_NAMESPACE::SpreadToFeatures;
using simd::HWY_NAMESPACE::Turn;

template <class TS>
using ComputeT = std::conditional_t<std::is_same_v<TS, double>, double, float>;

// ---- bf16 as pairs in 32-bit lanes (little endian: element 2j is the low half of lane j) ----------------------

// Round fp32 lanes to bf16 bits (in the upper half of each lane), to nearest even like rotary::float_to_bf16.
// No NaN case is needed here: every NaN that can reach this point has a zero low half (a bf16 input promoted, or
// the default NaN of an invalid operation), so adding at most 0x8000 keeps it the same quiet NaN float_to_bf16 gives.
template <class DU, class VF>
HWY_INLINE hn::Vec<DU> RoundToBf16Bits(DU du, VF y) {
  const auto u = hn::BitCast(du, y);
  return hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
}

// Rotates the pairs held by lanes of `a` and `b`: low halves form one set of pairs (x1 from a, x2 from b, with
// c_lo, s_lo), high halves another (c_hi, s_hi); writes the rotated x1 values to `a`, x2 values to `b`.
template <class DF, class DU, class VU = hn::Vec<DU>, class VF = hn::Vec<DF>>
HWY_INLINE void RotateBf16Lanes(DF df, DU du, VU& a, VU& b, VF c_lo, VF s_lo, VF c_hi, VF s_hi) {
  const auto hi_mask = hn::Set(du, 0xffff0000u);
  VF a_lo = hn::BitCast(df, hn::ShiftLeft<16>(a)), a_hi = hn::BitCast(df, hn::And(a, hi_mask));
  VF b_lo = hn::BitCast(df, hn::ShiftLeft<16>(b)), b_hi = hn::BitCast(df, hn::And(b, hi_mask));
  RotatePairLanes<Turn::Forward>(df, a_lo, b_lo, c_lo, s_lo);
  RotatePairLanes<Turn::Forward>(df, a_hi, b_hi, c_hi, s_hi);
  a = hn::Or(hn::ShiftRight<16>(RoundToBf16Bits(du, a_lo)), hn::And(RoundToBf16Bits(du, a_hi), hi_mask));
  b = hn::Or(hn::ShiftRight<16>(RoundToBf16Bits(du, b_lo)), hn::And(RoundToBf16Bits(du, b_hi), hi_mask));
}

// Interleaved bf16: lane j of a vector holds pair (2j, 2j+1), so x1 is the low half and x2 the high half and the
// half tables c, s apply directly. Rotates features [0, r) of one head; c, s: [round_up(r/2, N)].
template <class DF>
HWY_INLINE void RotateHeadBf16Interleaved(DF df, const uint16_t* x, uint16_t* y, size_t r, const float* c,
                                          const float* s) {
  const hn::RebindToUnsigned<DF> du;
  const size_t N = hn::Lanes(du);  // pairs per vector
  auto one = [&](const uint16_t* xp, uint16_t* yp, size_t i) {
    auto v = hn::LoadU(du, reinterpret_cast<const uint32_t*>(xp));
    const auto vc = hn::LoadU(df, c + i), vs = hn::LoadU(df, s + i);
    // (low, high) of one lane is the pair (x_a, x_b): rotated x_a goes back to the low half, x_b to the high half.
    auto xa = hn::BitCast(df, hn::ShiftLeft<16>(v)), xb = hn::BitCast(df, hn::And(v, hn::Set(du, 0xffff0000u)));
    RotatePairLanes<Turn::Forward>(df, xa, xb, vc, vs);
    v = hn::Or(hn::ShiftRight<16>(RoundToBf16Bits(du, xa)), hn::And(RoundToBf16Bits(du, xb), hn::Set(du, 0xffff0000u)));
    hn::StoreU(v, du, reinterpret_cast<uint32_t*>(yp));
  };
  const size_t half = r / 2;
  size_t i = 0;
  for (; i + N <= half; i += N) one(x + 2 * i, y + 2 * i, i);
  if (i < half) {
    HWY_ALIGN uint16_t b[2 * kMaxLanes] = {};
    const size_t rem = 2 * (half - i);
    std::memcpy(b, x + 2 * i, rem * sizeof(uint16_t));
    one(b, b, i);
    std::memcpy(y + 2 * i, b, rem * sizeof(uint16_t));
  }
}

// Half-split bf16: a vector from each half covers 2N consecutive pairs; even pairs sit in low halves, odd pairs
// in high halves, so the tables are permuted per block of 2N: tc[blk + j] = c[blk + 2j], tc[blk + N + j] =
// c[blk + 2j + 1] (same for ts). Rotates features [0, 2*half) of one head; tc, ts: [round_up(half, 2N)].
template <class DF>
HWY_INLINE void RotateHeadBf16HalfSplit(DF df, const uint16_t* x, uint16_t* y, size_t half, const float* tc,
                                        const float* ts) {
  const hn::RebindToUnsigned<DF> du;
  const size_t N = hn::Lanes(du), B = 2 * N;  // B pairs per block
  auto one = [&](const uint16_t* x1, const uint16_t* x2, uint16_t* y1, uint16_t* y2, size_t i) {
    auto a = hn::LoadU(du, reinterpret_cast<const uint32_t*>(x1));
    auto b = hn::LoadU(du, reinterpret_cast<const uint32_t*>(x2));
    RotateBf16Lanes(df, du, a, b, hn::LoadU(df, tc + i), hn::LoadU(df, ts + i), hn::LoadU(df, tc + i + N),
                    hn::LoadU(df, ts + i + N));
    hn::StoreU(a, du, reinterpret_cast<uint32_t*>(y1));
    hn::StoreU(b, du, reinterpret_cast<uint32_t*>(y2));
  };
  size_t i = 0;
  for (; i + B <= half; i += B) one(x + i, x + half + i, y + i, y + half + i, i);
  if (i < half) {
    HWY_ALIGN uint16_t b1[2 * kMaxLanes] = {}, b2[2 * kMaxLanes] = {};
    const size_t rem = half - i;
    std::memcpy(b1, x + i, rem * sizeof(uint16_t));
    std::memcpy(b2, x + half + i, rem * sizeof(uint16_t));
    one(b1, b2, b1, b2, i);
    std::memcpy(y + i, b1, rem * sizeof(uint16_t));
    std::memcpy(y + half + i, b2, rem * sizeof(uint16_t));
  }
}

inline size_t RoundUp(size_t n, size_t m) { return (n + m - 1) / m * m; }

// Rotates tokens [t0, t1) of q (and k). Tables live on the stack unless rotary_dim is large.
template <class TS>
void RotateTokenRange(const RopeFreqs& f, const RopeParams& p, int64_t t0, int64_t t1) {
  using T = ComputeT<TS>;
  const hn::ScalableTag<T> dc;
  const size_t N = hn::Lanes(dc);
  const size_t r = size_t(f.rotary_dim), half = r / 2, D = size_t(f.head_dim);
  const size_t hp = RoundUp(half, 2 * N), rp = RoundUp(r, N);  // 2N: a bf16 half-split block
  const bool interleaved = f.layout == RopeLayout::Interleaved;
  constexpr bool kBf16 = std::is_same_v<TS, hwy::bfloat16_t>;

  constexpr size_t kStackElems = 2048;  // rotary_dim <= ~600 needs no allocation (decode stays allocation-free)
  HWY_ALIGN T stack[kStackElems];
  hwy::AlignedFreeUniquePtr<T[]> heap;
  const size_t need = 2 * hp + 2 * std::max(rp, hp);
  T* c = stack;
  if (need > kStackElems) {
    heap = hwy::AllocateAligned<T>(need);
    c = heap.get();
  }
  T* s = c + hp;    // [hp]
  // Second tables: interleaved f32/f16/f64: cd = c0 c0 c1 c1 ..., sd = -s0 s0 -s1 s1 ... [rp];
  // half-split bf16: c and s permuted per block (RotateHeadBf16HalfSplit) [hp].
  T* cd = s + hp;
  T* sd = cd + std::max(rp, hp);
  // Padding lanes are read (their results discarded), so they must hold numbers; the rest is written per token.
  std::fill(c + half, c + hp, T(0));
  std::fill(s + half, s + hp, T(0));
  std::fill(cd + r, sd, T(0));  // interleaved tables fill [0, r); bf16 half-split tables fill all of [0, hp)
  std::fill(sd + r, c + need, T(0));

  // Forward: a R(p); Inverse: R(-p) / a; Transpose: a R(-p). R(-p) has the same cos and negated sin.
  const double a = f.attention_factor;
  const double scale = p.direction == RopeDirection::Inverse ? 1.0 / a : a;
  const double sin_sign = p.direction == RopeDirection::Forward ? 1.0 : -1.0;

  // Software prefetch of the same head one token ahead: an in-place pass reads and writes every line, and the
  // hardware prefetcher alone left it at ~85% of a plain in-place read/write pass on the 2-core machine.
  const size_t row_bytes = r * sizeof(TS);
  auto rotate_view = [&](const HeadsView& in, const HeadsView& out, int64_t t) {
    const TS* src0 = static_cast<const TS*>(in.data) + t * in.token_stride;
    TS* dst0 = static_cast<TS*>(out.data) + t * out.token_stride;
    const bool ahead = t + 1 < t1;
    for (int64_t h = 0; h < in.heads; ++h) {
      const TS* x = src0 + h * in.head_stride;
      TS* y = dst0 + h * out.head_stride;
      if (ahead) {
        const char* next = reinterpret_cast<const char*>(x + in.token_stride);
        for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(next + b, 1);
      }
      if constexpr (kBf16) {
        const uint16_t* xb = reinterpret_cast<const uint16_t*>(x);
        uint16_t* yb = reinterpret_cast<uint16_t*>(y);
        if (interleaved)
          RotateHeadBf16Interleaved(dc, xb, yb, r, c, s);
        else
          RotateHeadBf16HalfSplit(dc, xb, yb, half, cd, sd);
      } else if (interleaved) {
        RotateInterleavedRow<Turn::Forward>(dc, x, y, r, cd, sd);
      } else {
        RotateHalfSplitRow<Turn::Forward>(dc, x, y, half, c, s);
      }
      if (y != x && D > r) std::memcpy(y + r, x + r, (D - r) * sizeof(TS));  // pass-through features
    }
  };

  for (int64_t t = t0; t < t1; ++t) {
    CosSinRow<T>(f.inv_freq.data(), half, double(p.positions[t]), scale, sin_sign, c, s);
    if (kBf16 && !interleaved) {
      for (size_t blk = 0; blk < half; blk += 2 * N)
        for (size_t j = 0; j < N; ++j) {
          cd[blk + j] = c[blk + 2 * j];
          sd[blk + j] = s[blk + 2 * j];
          cd[blk + N + j] = c[blk + 2 * j + 1];
          sd[blk + N + j] = s[blk + 2 * j + 1];
        }
    } else if (!kBf16 && interleaved) {
      SpreadToFeatures(c, s, half, cd, sd);
    }
    rotate_view(p.q_in, p.q_out, t);
    if (p.k_in.data != nullptr) rotate_view(p.k_in, p.k_out, t);
  }
}

template <class TS>
void RopeApplyTyped(const RopeFreqs& f, const RopeParams& p) {
  const int64_t heads = p.q_in.heads + (p.k_in.data != nullptr ? p.k_in.heads : 0);
  const double elements = double(p.tokens) * double(heads) * double(f.head_dim);
  const int64_t threads = detail::rotation_threads(p.threads, p.tokens, elements);
  if (threads <= 1) {
    RotateTokenRange<TS>(f, p, 0, p.tokens);
    return;
  }
#pragma omp parallel num_threads(int(threads))
  {
    // Contiguous token blocks: each thread streams through its own part of memory.
    const int64_t n = omp_get_num_threads(), id = omp_get_thread_num();
    RotateTokenRange<TS>(f, p, p.tokens * id / n, p.tokens * (id + 1) / n);
  }
}

void RopeApplyImpl(const RopeFreqs& f, const RopeParams& p) {
  switch (p.dtype) {
    case DType::F32: return RopeApplyTyped<float>(f, p);
    case DType::F64: return RopeApplyTyped<double>(f, p);
    case DType::BF16: return RopeApplyTyped<hwy::bfloat16_t>(f, p);
    case DType::F16: return RopeApplyTyped<hwy::float16_t>(f, p);
  }
}

const char* ChosenTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace rotary
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary {

HWY_EXPORT(RopeApplyImpl);
HWY_EXPORT(ChosenTargetName);

void rope_apply(const RopeParams& p) {
  validate_rope_params(p);
  if (p.tokens == 0) return;
  HWY_DYNAMIC_DISPATCH(RopeApplyImpl)(*p.freqs, p);
}

const char* rope_simd_target() { return HWY_DYNAMIC_DISPATCH(ChosenTargetName)(); }

}  // namespace rotary
#endif  // HWY_ONCE
