// The float64 oracle: one token, one head, one pair at a time, straight from the definition.
// Its pair rotation is written out here, not taken from rotate_pair.h / rotate_pairs-inl.h: an oracle that shared
// the fast path's code would share its mistakes.
#include <cmath>
#include <vector>

#include "rotary/rope.h"

namespace rotary {

namespace {

void rotate_view_reference(const RopeFreqs& f, const RopeParams& p, const HeadsView& in, const HeadsView& out) {
  const int r = f.rotary_dim, D = f.head_dim;
  const double a = f.attention_factor;
  double scale = a, sign = 1;
  if (p.direction == RopeDirection::Inverse) scale = 1.0 / a, sign = -1;
  if (p.direction == RopeDirection::Transpose) sign = -1;
  std::vector<double> x(D);
  for (int64_t t = 0; t < p.tokens; ++t) {
    const double pos = double(p.positions[t]);
    for (int64_t h = 0; h < in.heads; ++h) {
      const int64_t src = t * in.token_stride + h * in.head_stride;
      const int64_t dst = t * out.token_stride + h * out.head_stride;
      for (int d = 0; d < D; ++d) x[d] = load_as_double(in.data, p.dtype, src + d);
      for (int i = 0; i < r / 2; ++i) {
        const auto [ia, ib] = rope_pair(f.layout, r, i);
        const double angle = sign * pos * f.inv_freq[i];
        const double c = std::cos(angle) * scale, s = std::sin(angle) * scale;
        const double x1 = x[ia], x2 = x[ib];
        store_from_double(out.data, p.dtype, dst + ia, x1 * c - x2 * s);
        store_from_double(out.data, p.dtype, dst + ib, x1 * s + x2 * c);
      }
      if (out.data != in.data || dst != src)
        for (int d = r; d < D; ++d) store_from_double(out.data, p.dtype, dst + d, x[d]);
    }
  }
}

}  // namespace

void rope_apply_reference(const RopeParams& p) {
  validate_rope_params(p);
  if (p.tokens == 0) return;
  const RopeFreqs& f = *p.freqs;
  rotate_view_reference(f, p, p.q_in, p.q_out);
  if (p.k_in.data != nullptr) rotate_view_reference(f, p, p.k_in, p.k_out);
}

}  // namespace rotary
