// The float64 oracle of rotary/rope_table.h: one token, one head, one pair at a time, from the formula
//   forward:    y_a = x_a c_a - x_b s_a,  y_b = x_b c_b + x_a s_b
//   transpose:  y_a = x_a c_a + x_b s_b,  y_b = x_b c_b - x_a s_a
// with (c_a, s_a), (c_b, s_b) the table entries of features a and b (both the pair's entry for per-pair tables).
// It shares no code with the fast kernel (rope_table_hwy.cpp).
#include <vector>

#include "rotary/rope_table.h"

namespace rotary {

void rope_table_apply_reference(const RopeTableParams& p) {
  validate_rope_table_params(p);
  const int r = p.rotary_dim, D = p.head_dim;
  const DType table_type = p.dtype == DType::F64 ? DType::F64 : DType::F32;
  std::vector<double> x(size_t(D), 0.0);
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int64_t row = p.rows[t] * p.row_stride;
    for (int64_t h = 0; h < p.x_in.heads; ++h) {
      const int64_t src = t * p.x_in.token_stride + h * p.x_in.head_stride;
      const int64_t dst = t * p.x_out.token_stride + h * p.x_out.head_stride;
      for (int d = 0; d < D; ++d) x[size_t(d)] = load_as_double(p.x_in.data, p.dtype, src + d);
      for (int i = 0; i < r / 2; ++i) {
        const auto [a, b] = rope_pair(p.layout, r, i);
        const int64_t ea = p.width == TableWidth::Pairs ? i : a, eb = p.width == TableWidth::Pairs ? i : b;
        const double ca = load_as_double(p.cos, table_type, row + ea), sa = load_as_double(p.sin, table_type, row + ea);
        const double cb = load_as_double(p.cos, table_type, row + eb), sb = load_as_double(p.sin, table_type, row + eb);
        const double xa = x[size_t(a)], xb = x[size_t(b)];
        const double ya = p.transpose ? xa * ca + xb * sb : xa * ca - xb * sa;
        const double yb = p.transpose ? xb * cb - xa * sa : xb * cb + xa * sb;
        store_from_double(p.x_out.data, p.dtype, dst + a, ya);
        store_from_double(p.x_out.data, p.dtype, dst + b, yb);
      }
      if (p.x_out.data != p.x_in.data || dst != src)
        for (int d = r; d < D; ++d) store_from_double(p.x_out.data, p.dtype, dst + d, x[size_t(d)]);
    }
  }
}

}  // namespace rotary
