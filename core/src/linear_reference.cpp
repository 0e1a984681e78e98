// core/src/linear_reference.cpp: the float64 oracle of linear_forward (rotary/linear.h). Every weight is read as a
// double (q8: quant times its f16 scale, exact in double), every product and sum is taken in double, and the result is
// rounded once to float (bf16 / q8 activations: each x rounded to bf16 or quantized first). It shares no code with the kernels (no
// tiles, no chunks, no threads), only the validation of the one contract.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "linear_kernel.h"
#include "rotary/ggml_quants.h"
#include "rotary/linear.h"

namespace rotary {

namespace {

// Row r of a block-format matrix, every weight exact in double (ggml_dequantize_reference: not the kernels' code).
std::vector<double> block_row_values(const WeightMatrix& w, int64_t r) {
  const int64_t block = weight_block_size(w.format);
  const auto* row = static_cast<const uint8_t*>(w.data) + (r * w.row_stride / block) * weight_block_bytes(w.format);
  std::vector<double> out(size_t(w.cols));
  ggml_dequantize_reference(ggml_type_of(w.format), row, w.cols, out.data());
  return out;
}

double weight(const WeightMatrix& w, int64_t r, int64_t c) {
  const int64_t i = r * w.row_stride + c;
  switch (w.format) {
    case WeightFormat::F32: return load_as_double(w.data, DType::F32, i);
    case WeightFormat::F16: return load_as_double(w.data, DType::F16, i);
    case WeightFormat::BF16: return load_as_double(w.data, DType::BF16, i);
    case WeightFormat::Q8:
      return double(static_cast<const int8_t*>(w.data)[i]) *
             load_as_double(w.scales, DType::F16, r * w.scale_stride + c / kQ8Block);
    default: return 0;  // block formats: block_row_values
  }
  return 0;
}

// Token t's activations as the products see them: f32 as given; bf16 each x rounded once to bf16 (nearest even,
// from x's exact value in double: the same bf16 as rounding the float); q8 each block of kQ8Block quantized by the
// q8 rule of rotary/linear.h (written out here again: scale = max |x| / 127 and quant = round(x / scale) in float,
// NaN making the scale NaN, an infinity quant +-127) and read back as quant x scale, exact in double.
std::vector<double> activations(const LinearParams& p, int64_t t) {
  const float* x = p.x + t * p.x_stride;
  const int64_t K = p.w.cols;
  std::vector<double> a(size_t(K), 0.0);
  if (p.activations == ActivationFormat::F32) {
    for (int64_t c = 0; c < K; ++c) a[size_t(c)] = double(x[c]);
  } else if (p.activations == ActivationFormat::BF16) {
    for (int64_t c = 0; c < K; ++c) {
      uint16_t b = 0;
      store_from_double(&b, DType::BF16, 0, double(x[c]));
      a[size_t(c)] = load_as_double(&b, DType::BF16, 0);
    }
  } else {
    for (int64_t c0 = 0; c0 < K; c0 += kQ8Block) {
      const int64_t c1 = std::min(K, c0 + kQ8Block);
      float amax = 0;
      bool nan = false;
      for (int64_t c = c0; c < c1; ++c) {
        if (std::isnan(x[c])) nan = true;
        else if (std::fabs(x[c]) > amax) amax = std::fabs(x[c]);
      }
      const float scale = nan ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
      for (int64_t c = c0; c < c1; ++c) {
        double q = 0;
        if (std::isinf(x[c])) q = x[c] > 0 ? 127 : -127;
        else if (scale > 0 && std::isfinite(scale)) q = std::min(127.0f, std::max(-127.0f, std::round(x[c] / scale)));
        a[size_t(c)] = q * double(scale);
      }
    }
  }
  return a;
}

}  // namespace

void linear_forward_reference(const LinearParams& p) {
  linear_detail::validate(p);
  std::vector<std::vector<double>> blocks;  // block formats: every row decoded once
  if (is_block_format(p.w.format) && p.tokens > 0)
    for (int64_t r = 0; r < p.w.rows; ++r) blocks.push_back(block_row_values(p.w, r));
  for (int64_t t = 0; t < p.tokens; ++t) {
    const std::vector<double> a = activations(p, t);
    for (int64_t r = 0; r < p.w.rows; ++r) {
      double s = p.bias ? double(p.bias[r]) : 0.0;
      for (int64_t c = 0; c < p.w.cols; ++c)
        s += (blocks.empty() ? weight(p.w, r, c) : blocks[size_t(r)][size_t(c)]) * a[size_t(c)];
      float& out = p.y[t * p.y_stride + r];
      out = p.accumulate ? float(double(out) + s) : float(s);
    }
  }
}

}  // namespace rotary
