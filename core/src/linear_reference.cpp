// core/src/linear_reference.cpp: the float64 oracle of linear_forward (rotary/linear.h). Every weight is read as a
// double (q8: quant times scale, exact in double), every product and sum is taken in double, and the result is
// rounded once to float (bf16 activations: each x rounded to bf16 first). It shares no code with the kernels (no
// tiles, no chunks, no threads), only the validation of the one contract.
#include <cstdint>

#include "linear_kernel.h"
#include "rotary/linear.h"

namespace rotary {

namespace {

double weight(const WeightMatrix& w, int64_t r, int64_t c) {
  const int64_t i = r * w.row_stride + c;
  switch (w.format) {
    case WeightFormat::F32: return load_as_double(w.data, DType::F32, i);
    case WeightFormat::F16: return load_as_double(w.data, DType::F16, i);
    case WeightFormat::BF16: return load_as_double(w.data, DType::BF16, i);
    case WeightFormat::Q8:
      return double(static_cast<const int8_t*>(w.data)[i]) * double(w.scales[r * w.scale_stride + c / kQ8Block]);
  }
  return 0;
}

// Activation x as the products see it: bf16 activations are x rounded once to bf16 (nearest even, from x's exact
// value in double: the same bf16 as rounding the float).
double activation(const LinearParams& p, int64_t i) {
  if (p.activations == ActivationFormat::F32) return double(p.x[i]);
  uint16_t b = 0;
  store_from_double(&b, DType::BF16, 0, double(p.x[i]));
  return load_as_double(&b, DType::BF16, 0);
}

}  // namespace

void linear_forward_reference(const LinearParams& p) {
  linear_detail::validate(p);
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t r = 0; r < p.w.rows; ++r) {
      double s = p.bias ? double(p.bias[r]) : 0.0;
      for (int64_t c = 0; c < p.w.cols; ++c) s += weight(p.w, r, c) * activation(p, t * p.x_stride + c);
      float& out = p.y[t * p.y_stride + r];
      out = p.accumulate ? float(double(out) + s) : float(s);
    }
}

}  // namespace rotary
