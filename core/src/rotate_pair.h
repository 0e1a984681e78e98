// core/src/rotate_pair.h (internal): the one scalar pair rotation of the kernels' scalar paths (KV-cache append,
// decode's query and output turns, linear attention, the re-rotating decode baseline). Rotating pair (x_a, x_b) by
// angle t is (x_a cos t - x_b sin t, x_a sin t + x_b cos t), as rope_pair in rotary/rope_spec.h defines it; the
// inverse R(-t) passes -sin. The SIMD counterpart is rotate_pairs-inl.h. The float64 references
// (*_reference.cpp) keep their own arithmetic on purpose: an oracle that shares code with what it checks would
// share its mistakes.
#pragma once

namespace rotary::detail {

template <class W>
struct RotatedPair {
  W a, b;
};

// (x_a, x_b) turned by the angle whose cos and sin (scaled as the caller wants) are c and s.
template <class W>
inline RotatedPair<W> rotate_pair(W xa, W xb, W c, W s) {
  return {xa * c - xb * s, xa * s + xb * c};
}

}  // namespace rotary::detail
