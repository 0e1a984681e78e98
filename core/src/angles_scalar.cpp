// Scalar float64 cos/sin of rotation angles with libm (exact argument reduction): the oracle side. The fast
// kernels, F64 storage included, use the SIMD path of angles-inl.h, whose tests compare against this.
#include <cmath>

#include "rotary/angles.h"

namespace rotary {

void rope_cos_sin_f64(const double* inv_freq, int n, int64_t pos, double scale, double* cos, double* sin) {
  const double p = double(pos);  // exact for |pos| <= 2^53
  for (int i = 0; i < n; ++i) {
    const double a = p * inv_freq[i];
    cos[i] = std::cos(a) * scale;
    sin[i] = std::sin(a) * scale;
  }
}

}  // namespace rotary
