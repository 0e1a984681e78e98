// core/src/angles-inl.h: per-SIMD-target cos/sin of rotation angles (Highway "-inl" header, included once per
// target by angles_hwy.cpp and rope_kernels_hwy.cpp through foreach_target).
//
// How the angle stays accurate for large positions (the reason this file exists):
//   1. angle = double(pos) * inv_freq[i] in float64 - the same product the float64 reference forms
//      (an fp32 product is already ~0.06 rad off at pos = 1e6);
//   2. k = round(angle / (pi/2)); r = angle - k*C1 - k*C2 - k*C3 in float64 (Cody-Waite), |r| <= pi/4.
//      C1 and C2 carry at most 26 significant bits, so k*C1 and k*C2 are exact for |k| < 2^27, and angle - k*C1
//      is exact (it fits in 53 bits); C3 holds the rest of pi/2, so r is within ~1e-16 rad of the exact remainder;
//   3. sin(r), cos(r) by float64 minimax polynomials on [-pi/4, pi/4] (Cephes sin.c, ~1e-16), both from the one
//      reduction, then the quadrant k mod 4 swaps them and flips signs; times the scale in float64, then one
//      rounding to the output type (fp32 for the kernels).
// So the fp32 result is the correctly rounded value up to ~1e-15 (measured in tests/core/test_angles.cpp).
// Lanes with |angle| > kMaxFastAngle (where |k| could reach 2^27; e.g. pos > 2e8 with inv_freq = 1) take the
// scalar libm path, which reduces exactly - so every int64 position is handled and matches the float64 reference.
//
// Why not Highway's Sin/Cos (contrib/math): each repeats its own reduction and a 9-term polynomial, while here
// one reduction feeds two 6-term polynomials; the per-token cos/sin is a visible part of a decode step, where
// 32 heads x 128 features take well under a microsecond (docs/bench-rope.md).

#if defined(ROTARY_CORE_ANGLES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ROTARY_CORE_ANGLES_INL_H_
#undef ROTARY_CORE_ANGLES_INL_H_
#else
#define ROTARY_CORE_ANGLES_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstring>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace rotary {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// pi/2 = kPio2_1 + kPio2_2 + kPio2_3 to ~1.5e-33 (computed with mpmath at 300 bits); kPio2_1 and kPio2_2 are
// pi/2 truncated to 26 bits and the next 26 bits (25 and 24 significant bits once trailing zeros drop).
constexpr double kPio2_1 = 0x1.921fb50000000p+0;
constexpr double kPio2_2 = 0x1.110b460000000p-26;
constexpr double kPio2_3 = 0x1.1a62633145c07p-54;
constexpr double kTwoOverPi = 0.6366197723675814;
// |angle| <= 2e8 keeps |k| <= 1.28e8 < 2^27, where the products above are exact.
constexpr double kMaxFastAngle = 2.0e8;

// cos(angle) and sin(angle) for one vector of float64 angles; false if a lane is outside the fast range (or NaN).
template <class DD>
HWY_INLINE bool CosSinF64(DD dd, hn::Vec<DD> angle, hn::Vec<DD>& c, hn::Vec<DD>& s) {
  if (!hn::AllTrue(dd, hn::Le(hn::Abs(angle), hn::Set(dd, kMaxFastAngle)))) return false;
  const hn::RebindToUnsigned<DD> du;
  const auto k = hn::Round(hn::Mul(angle, hn::Set(dd, kTwoOverPi)));
  auto r = hn::NegMulAdd(k, hn::Set(dd, kPio2_1), angle);  // exact, fused or not
  r = hn::NegMulAdd(k, hn::Set(dd, kPio2_2), r);           // k*kPio2_2 exact; one rounding of r
  r = hn::NegMulAdd(k, hn::Set(dd, kPio2_3), r);           // the remaining ~1e-16 * k
  // sin r = r + r z P(z), cos r = 1 - z/2 + z^2 Q(z), z = r^2 (Cephes sin.c coefficients for |r| <= pi/4).
  const auto z = hn::Mul(r, r);
  auto ps = hn::Set(dd, 1.58962301576546568060E-10);
  ps = hn::MulAdd(ps, z, hn::Set(dd, -2.50507477628578072866E-8));
  ps = hn::MulAdd(ps, z, hn::Set(dd, 2.75573136213857245213E-6));
  ps = hn::MulAdd(ps, z, hn::Set(dd, -1.98412698295895385996E-4));
  ps = hn::MulAdd(ps, z, hn::Set(dd, 8.33333333332211858878E-3));
  ps = hn::MulAdd(ps, z, hn::Set(dd, -1.66666666666666307295E-1));
  const auto sin_r = hn::MulAdd(hn::Mul(r, z), ps, r);
  auto pc = hn::Set(dd, -1.13585365213876817300E-11);
  pc = hn::MulAdd(pc, z, hn::Set(dd, 2.08757008419747316778E-9));
  pc = hn::MulAdd(pc, z, hn::Set(dd, -2.75573141792967388112E-7));
  pc = hn::MulAdd(pc, z, hn::Set(dd, 2.48015872888517045348E-5));
  pc = hn::MulAdd(pc, z, hn::Set(dd, -1.38888888888730564116E-3));
  pc = hn::MulAdd(pc, z, hn::Set(dd, 4.16666666666665929218E-2));
  const auto cos_r = hn::MulAdd(hn::Mul(z, z), pc, hn::NegMulAdd(z, hn::Set(dd, 0.5), hn::Set(dd, 1.0)));
  // Quadrant q = k mod 4 from the low mantissa bits of k + 1.5 * 2^52 (exact for |k| < 2^51, two's complement):
  //   sin(angle) = [sin r, cos r, -sin r, -cos r][q],  cos(angle) = [cos r, -sin r, -cos r, sin r][q].
  const auto q = hn::BitCast(du, hn::Add(k, hn::Set(dd, 0x1.8p52)));
  const auto swap = hn::RebindMask(dd, hn::Ne(hn::And(q, hn::Set(du, 1)), hn::Zero(du)));
  const auto sin_sign = hn::BitCast(dd, hn::ShiftLeft<62>(hn::And(q, hn::Set(du, 2))));
  const auto cos_sign = hn::BitCast(dd, hn::ShiftLeft<62>(hn::And(hn::Add(q, hn::Set(du, 1)), hn::Set(du, 2))));
  s = hn::Xor(hn::IfThenElse(swap, cos_r, sin_r), sin_sign);
  c = hn::Xor(hn::IfThenElse(swap, sin_r, cos_r), cos_sign);
  return true;
}

template <class DD, class T>
HWY_INLINE void StoreAs(DD dd, hn::Vec<DD> v, T* out) {
  if constexpr (sizeof(T) == 8) {
    hn::StoreU(v, dd, out);
  } else {
    const hn::Rebind<float, DD> df;
    hn::StoreU(hn::DemoteTo(df, v), df, out);
  }
}

// cos[i] = scale * cos(pos * inv_freq[i]), sin[i] = sin_sign * scale * sin(pos * inv_freq[i]) for i < n.
// T is float or double. sin_sign = -1 gives the rotation by -pos (sin is odd; cos is even).
template <class T>
HWY_INLINE void CosSinRow(const double* HWY_RESTRICT inv_freq, size_t n, double pos, double scale, double sin_sign,
                          T* HWY_RESTRICT cos, T* HWY_RESTRICT sin) {
  const hn::ScalableTag<double> dd;
  const size_t N = hn::Lanes(dd);
  const auto vpos = hn::Set(dd, pos);
  const auto vcos_scale = hn::Set(dd, scale);
  const auto vsin_scale = hn::Set(dd, scale * sin_sign);
  // One vector of pairs starting at i (count <= N valid lanes); inv is readable for N lanes.
  auto one = [&](const double* inv, size_t count, T* c_out, T* s_out) {
    const auto angle = hn::Mul(vpos, hn::LoadU(dd, inv));
    hn::Vec<decltype(dd)> c, s;
    if (CosSinF64(dd, angle, c, s)) {
      StoreAs(dd, hn::Mul(c, vcos_scale), c_out);
      StoreAs(dd, hn::Mul(s, vsin_scale), s_out);
    } else {  // beyond the Cody-Waite range: libm reduces exactly
      for (size_t j = 0; j < count; ++j) {
        const double a = pos * inv[j];
        c_out[j] = T(std::cos(a) * scale);
        s_out[j] = T(std::sin(a) * scale * sin_sign);
      }
    }
  };
  size_t i = 0;
  for (; i + N <= n; i += N) one(inv_freq + i, N, cos + i, sin + i);
  if (i < n) {  // tail through zero-padded scratch, so no lane reads or writes past n
    constexpr size_t kMax = 64;  // >= lanes of a float64 vector on any target (2048-bit SVE: 32)
    HWY_ALIGN double inv[kMax] = {};
    HWY_ALIGN T c[kMax], s[kMax];
    const size_t rem = n - i;
    std::memcpy(inv, inv_freq + i, rem * sizeof(double));
    one(inv, rem, c, s);
    std::memcpy(cos + i, c, rem * sizeof(T));
    std::memcpy(sin + i, s, rem * sizeof(T));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace rotary
HWY_AFTER_NAMESPACE();

#endif  // ROTARY_CORE_ANGLES_INL_H_
