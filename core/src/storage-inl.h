// core/src/storage-inl.h (internal, per Highway target): the SIMD storage conversion every kernel uses - lanes of
// a storage type (f32, f64, bf16, f16) loaded as compute lanes (f32, or f64 for f64 storage) and stored back
// rounded once to nearest even, and whole rows of a runtime dtype. The one place that works around Highway
// 1.0.3's conversions: it truncates f32 -> bf16 (we round to nearest even, NaN stays a quiet NaN, as
// rotary::float_to_bf16) and, without F16C, truncates and clamps f32 -> f16 (we convert lane by lane there).
// The scalar counterpart is storage.h.
#if defined(ROTARY_CORE_STORAGE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ROTARY_CORE_STORAGE_INL_H_
#undef ROTARY_CORE_STORAGE_INL_H_
#else
#define ROTARY_CORE_STORAGE_INL_H_
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hwy/highway.h"
#include "rotary/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace rotary::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Highway 1.0.3 converts f32 -> f16 by truncation (and clamps overflow) where there is no F16C, so only x86
// AVX2/AVX3 use vector f16 conversions; other targets convert lane by lane with rotary's round-to-nearest-even.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
constexpr bool kVectorF16 = true;
#else
constexpr bool kVectorF16 = false;
#endif
constexpr size_t kMaxLanes = 64;  // >= lanes of an fp32 vector on any target (2048-bit SVE)

// Loads Lanes(dc) storage elements as compute lanes.
template <class DC, class TS>
HWY_INLINE hn::Vec<DC> LoadStorage(DC dc, const TS* p) {
  if constexpr (std::is_same_v<TS, hn::TFromD<DC>>) {
    return hn::LoadU(dc, p);
  } else if constexpr (std::is_same_v<TS, hwy::bfloat16_t>) {
    const hn::Rebind<hwy::bfloat16_t, DC> dbf;
    return hn::PromoteTo(dc, hn::LoadU(dbf, p));  // exact: bf16 is the upper half of an f32
  } else if constexpr (kVectorF16) {
    const hn::Rebind<hwy::float16_t, DC> dh;
    return hn::PromoteTo(dc, hn::LoadU(dh, p));
  } else {
    HWY_ALIGN float lanes[kMaxLanes];
    const uint16_t* bits = reinterpret_cast<const uint16_t*>(p);
    for (size_t j = 0; j < hn::Lanes(dc); ++j) lanes[j] = f16_to_float(bits[j]);
    return hn::Load(dc, lanes);
  }
}

// Stores compute lanes as Lanes(dc) storage elements, rounding once to nearest even.
template <class DC, class TS>
HWY_INLINE void StoreStorage(DC dc, hn::Vec<DC> v, TS* p) {
  if constexpr (std::is_same_v<TS, hn::TFromD<DC>>) {
    hn::StoreU(v, dc, p);
  } else if constexpr (std::is_same_v<TS, hwy::bfloat16_t>) {
    // Highway 1.0.3 truncates f32 -> bf16; round to nearest even as rotary::float_to_bf16 does (NaN stays quiet NaN).
    const hn::RebindToUnsigned<DC> du;
    const hn::RebindToSigned<DC> di;
    const hn::Rebind<uint16_t, DC> du16;
    const auto u = hn::BitCast(du, v);
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto rounded = hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb));
    const auto quiet_nan = hn::Or(u, hn::Set(du, 0x00400000u));
    const auto bits = hn::ShiftRight<16>(hn::IfThenElse(hn::RebindMask(du, hn::Ne(v, v)), quiet_nan, rounded));
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, bits)), du16, reinterpret_cast<uint16_t*>(p));  // fits, no saturation
  } else if constexpr (kVectorF16) {
    const hn::Rebind<hwy::float16_t, DC> dh;
    hn::StoreU(hn::DemoteTo(dh, v), dh, p);  // vcvtps2ph, round to nearest even
  } else {
    HWY_ALIGN float lanes[kMaxLanes];
    hn::Store(v, dc, lanes);
    uint16_t* bits = reinterpret_cast<uint16_t*>(p);
    for (size_t j = 0; j < hn::Lanes(dc); ++j) bits[j] = float_to_f16(lanes[j]);
  }
}

// x[0:D] = the storage row converted to T (T = float for f32/f16/bf16 storage, double for f64).
template <class T>
HWY_INLINE void LoadRow(DType dt, const void* base, int64_t off, int D, T* HWY_RESTRICT x) {
  if (dt == DType::F64 || dt == DType::F32) {
    if ((dt == DType::F64) == (sizeof(T) == 8)) {
      std::memcpy(x, static_cast<const char*>(base) + off * int64_t(sizeof(T)), sizeof(T) * size_t(D));
      return;
    }
    for (int d = 0; d < D; ++d) x[d] = T(load_as_double(base, dt, off + d));
    return;
  }
  if constexpr (sizeof(T) == 4) {
    const hn::ScalableTag<float> df;
    const int NL = int(hn::Lanes(df));
    const uint16_t* p = static_cast<const uint16_t*>(base) + off;
    int d = 0;
    if (dt == DType::BF16) {
      const hn::Rebind<uint16_t, hn::ScalableTag<float>> du16;
      const hn::Rebind<uint32_t, hn::ScalableTag<float>> du32;
      for (; d + NL <= D; d += NL)
        hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, p + d)))), df, x + d);
      for (; d < D; ++d) x[d] = bf16_to_float(p[d]);
    } else {
      const hn::Rebind<hwy::float16_t, hn::ScalableTag<float>> dh;
      for (; d + NL <= D; d += NL)
        hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p) + d)), df, x + d);
      for (; d < D; ++d) x[d] = f16_to_float(p[d]);
    }
  } else {
    for (int d = 0; d < D; ++d) x[d] = T(load_as_double(base, dt, off + d));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace rotary::simd
HWY_AFTER_NAMESPACE();

#endif  // ROTARY_CORE_STORAGE_INL_H_
