// Fast cos/sin of rotation angles (rotary/angles.h), Highway SIMD with runtime dispatch.
// The accuracy argument (float64 angle, Cody-Waite reduction mod 2pi, float64 polynomial) is in angles-inl.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "angles_hwy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "angles-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace rotary {
namespace HWY_NAMESPACE {

void CosSinF32(const double* inv_freq, int n, double pos, double scale, float* cos, float* sin) {
  CosSinRow<float>(inv_freq, size_t(n), pos, scale, 1.0, cos, sin);
}

const char* AnglesTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace rotary
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cmath>

#include "rotary/angles.h"
#include "rotary/error.h"
#include "simd_targets.h"

namespace rotary {

HWY_EXPORT(CosSinF32);
HWY_EXPORT(AnglesTargetName);

const char* detail::angles_simd_target() { return HWY_DYNAMIC_DISPATCH(AnglesTargetName)(); }

namespace {
void check_row(const double* inv_freq, int n, double scale, const void* cos, const void* sin) {
  check(n >= 0, "n", n, ">= 0");
  if (n == 0) return;
  check(inv_freq != nullptr, "inv_freq", "null", "a pointer to n frequencies");
  check(cos != nullptr, "cos", "null", "a pointer to n floats");
  check(sin != nullptr, "sin", "null", "a pointer to n floats");
  check(std::isfinite(scale), "scale", scale, "a finite value");
}
}  // namespace

void rope_cos_sin(const double* inv_freq, int n, int64_t pos, double scale, float* cos, float* sin) {
  check_row(inv_freq, n, scale, cos, sin);
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(CosSinF32)(inv_freq, n, double(pos), scale, cos, sin);  // double(pos): exact to 2^53
}

void rope_cos_sin_at(const double* inv_freq, int n, double pos, double scale, float* cos, float* sin) {
  check_row(inv_freq, n, scale, cos, sin);
  check(std::isfinite(pos), "pos", pos, "a finite position");
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(CosSinF32)(inv_freq, n, pos, scale, cos, sin);
}

}  // namespace rotary
#endif  // HWY_ONCE
