// core/src/activations_reference.cpp: the float64 oracle of rotary/activations.h - the plain formula, one element at
// a time, sharing no code with the Highway kernel.
#include <cmath>
#include <cstdint>

#include "rotary/activations.h"

namespace rotary {

void swiglu_forward_reference(const float* gate, float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    up[i] = float(double(up[i]) * (g / (1.0 + std::exp(-g))));
  }
}

}  // namespace rotary
