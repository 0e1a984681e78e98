// rotary/activations.h: the gated MLP's elementwise step of a checkpoint's forward, SwiGLU's
//
//   up[i] = up[i] * silu(gate[i]),   silu(g) = g * sigmoid(g) = g / (1 + e^-g),   i < n
//
// in place on `up` (Llama / Mistral / Qwen2 MLPs: down(silu(gate(x)) * up(x))). Highway SIMD with runtime dispatch,
// OpenMP over blocks of elements: at a prompt's chunk of 512 tokens and d_ff 4864 it is 2.5M exponentials per layer,
// which a scalar loop on one thread made ~7% of a 2-thread prefill.
//
// The sigmoid is taken as 1 / (1 + e) for g >= 0 and e / (1 + e) for g < 0, e = e^-|g| in (0, 1], so no exponential
// overflows (e^-g of g = -100 would be inf); e^-|g| by 2^t with a degree-6 polynomial for 2^frac (relative error
// ~1e-7, as expf). Special values follow the plain formula g / (1 + e^-g): NaN stays NaN (in gate or up), silu(+inf) =
// +inf, silu(-inf) = NaN (-inf * 0), and up's own inf / NaN multiply through - except that e^g below 2^-125
// (g < -86.6, |silu| < 1.5e-36) is 0 here, so silu is 0 and an infinite up gives NaN there (the double formula: -inf).
//
// swiglu_forward_reference is the float64 oracle: each element by g / (1 + exp(-g)) in double, rounded once; it
// shares no code with the fast path (tests/core/test_activations.cpp gives the tolerance: a few float ulps).
#pragma once

#include <cstdint>

namespace rotary {

// up [n] *= silu(gate [n]). n >= 0 (0: nothing); gate and up must not overlap (rotary::Error otherwise, before any
// write). threads <= 0: OpenMP's default.
void swiglu_forward(const float* gate, float* up, int64_t n, int threads = 0);
void swiglu_forward_reference(const float* gate, float* up, int64_t n);

namespace detail {
const char* activations_simd_target();  // the Highway target swiglu_forward dispatches to now
}

}  // namespace rotary
