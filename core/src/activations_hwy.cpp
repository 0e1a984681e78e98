// core/src/activations_hwy.cpp: swiglu_forward (rotary/activations.h) - Highway SIMD per target, OpenMP over blocks.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "rotary/activations.h"
#include "rotary/error.h"
#include "simd_targets.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "activations_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// (foreach_target must come first: it re-includes this file once per target)
#include <hwy/highway.h>

#include "attention_kernels-inl.h"  // ExpKeepNaN: the softmax's exponential, shared

HWY_BEFORE_NAMESPACE();
namespace rotary::activations_detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// up[i] *= silu(gate[i]) for one vector; the sigmoid from e = e^-|g| in (0, 1] (no overflow).
template <class D, class V = hn::VFromD<D>>
HWY_INLINE V SiluTimes(D d, V g, V u) {
  const V one = hn::Set(d, 1.0f);
  const V e = attn::HWY_NAMESPACE::ExpKeepNaN(d, hn::Neg(hn::Abs(g)));
  const V denom = hn::Add(one, e);
  const V sigmoid = hn::IfThenElse(hn::Lt(g, hn::Zero(d)), hn::Div(e, denom), hn::Div(one, denom));
  return hn::Mul(u, hn::Mul(g, sigmoid));
}

void SwigluSpan(const float* HWY_RESTRICT gate, float* HWY_RESTRICT up, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(SiluTimes(d, hn::LoadU(d, gate + i), hn::LoadU(d, up + i)), d, up + i);
  if (i < n) {  // the tail through a whole vector of padding (gate 0 and up 0 there: finite, discarded)
    HWY_ALIGN float g[hn::MaxLanes(d)] = {}, u[hn::MaxLanes(d)] = {};
    std::copy(gate + i, gate + n, g);
    std::copy(up + i, up + n, u);
    hn::Store(SiluTimes(d, hn::Load(d, g), hn::Load(d, u)), d, u);
    std::copy(u, u + (n - i), up + i);
  }
}

const char* ActivationsTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace rotary::activations_detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rotary {
namespace activations_detail {
HWY_EXPORT(SwigluSpan);
HWY_EXPORT(ActivationsTargetName);
// Elements per OpenMP block: below two blocks (a decode step's d_ff) the call stays on one thread.
constexpr int64_t kBlock = 16384;
}  // namespace activations_detail

void swiglu_forward(const float* gate, float* up, int64_t n, int threads) {
  check(n >= 0, "swiglu n", n, ">= 0");
  if (n == 0) return;
  check(gate != nullptr && up != nullptr, "swiglu gate / up", "null", "arrays of n floats");
  const bool apart = gate + n <= up || up + n <= gate;
  check(apart, "swiglu gate / up", "overlapping", "two arrays that do not overlap (up is written in place)");
  auto span = [](const float* g, float* u, int64_t m) { HWY_DYNAMIC_DISPATCH(activations_detail::SwigluSpan)(g, u, m); };
  const int64_t blocks = (n + activations_detail::kBlock - 1) / activations_detail::kBlock;
  const int team = int(std::min<int64_t>(blocks, threads > 0 ? threads : omp_get_max_threads()));
  if (team <= 1) return span(gate, up, n);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * activations_detail::kBlock;
    span(gate + i0, up + i0, std::min(activations_detail::kBlock, n - i0));
  }
}

const char* detail::activations_simd_target() {
  return HWY_DYNAMIC_DISPATCH(activations_detail::ActivationsTargetName)();
}

}  // namespace rotary
#endif  // HWY_ONCE
