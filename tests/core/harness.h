// tests/core/harness.h: shared pieces of the core test suites (ggml test-backend-ops style).
//   GuardedBuffer  - a typed buffer with sentinel guard zones before and after, to catch stray writes
//   fill_uniform   - deterministic random contents for any storage dtype
//   nmse           - normalised mean squared error sum((a-b)^2) / sum(b^2) against a float64 reference, and its
//                    square root rms_error (the rms error relative to the reference's rms)
//   dtype_eps      - unit roundoff of a storage dtype, the base of every tolerance
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "rotary/dtype.h"

namespace rotary::test {

class GuardedBuffer {
 public:
  static constexpr int64_t kGuardBytes = 256;
  GuardedBuffer(DType dtype, int64_t elements);
  void* data() { return bytes_.data() + kGuardBytes; }
  const void* data() const { return bytes_.data() + kGuardBytes; }
  DType dtype() const { return dtype_; }
  int64_t size() const { return elements_; }
  double get(int64_t i) const { return load_as_double(data(), dtype_, i); }
  void set(int64_t i, double v) { store_from_double(data(), dtype_, i, v); }
  std::vector<double> to_double() const;
  // True when both guard zones still hold the sentinel pattern.
  bool guards_intact() const;

 private:
  DType dtype_;
  int64_t elements_;
  std::vector<uint8_t> bytes_;
};

// Fills every element with uniform values in [lo, hi), rounded to the dtype. Deterministic for a seed.
void fill_uniform(GuardedBuffer& b, uint64_t seed, double lo = -1.0, double hi = 1.0);

// sum((a-b)^2) / sum(b^2); b is the reference. 0 when both are all zero.
double nmse(const std::vector<double>& a, const std::vector<double>& b);
inline double rms_error(const std::vector<double>& a, const std::vector<double>& b) { return std::sqrt(nmse(a, b)); }

// Unit roundoff (half an ulp at 1) of the storage type: 2^-24 f32, 2^-11 f16, 2^-8 bf16, 2^-53 f64.
double dtype_eps(DType t);

}  // namespace rotary::test
