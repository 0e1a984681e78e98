// rotary/angles.h: cos and sin of a token's rotation angles, accurate for any int64 position.
//
// An fp32 product p * inv_freq is already wrong by ~0.06 rad at p = 1e6 (fp32 has 24 bits; the angle needs
// ~20 bits before the binary point). We form the angle in float64 (exact to ~1e-10 rad at p = 2^24),
// reduce it to [-pi, pi] in float64 with a two-part 2*pi (Cody-Waite), and only then evaluate cos/sin in fp32;
// the reduced angle is exact to fp32 rounding, so the result is within a few fp32 ulps of the float64 value.
#pragma once

#include <cstdint>

#include "rotary/rope_spec.h"

namespace rotary {

// cos[i] = scale * cos(pos * inv_freq[i]), sin[i] = scale * sin(pos * inv_freq[i]) for i < n (fast, SIMD).
void rope_cos_sin(const double* inv_freq, int n, int64_t pos, double scale, float* cos, float* sin);
// The same in float64, for references and for F64 storage.
void rope_cos_sin_f64(const double* inv_freq, int n, int64_t pos, double scale, double* cos, double* sin);

// Fractional positions (Leaky ReRoPE uses (i - w)/k + w and j/k): angle = pos * inv_freq[i] in float64.
void rope_cos_sin_at(const double* inv_freq, int n, double pos, double scale, float* cos, float* sin);

}  // namespace rotary
