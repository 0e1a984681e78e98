// lab/bench/decode_torch_baseline.h: the seed's ReRoPE decode step as its PyTorch code runs it, for
// `rotary bench decode`.
//
// Seed 004's transformers-Llama patch keeps the key cache un-rotated and, for a single new query at position i,
// re-rotates every cached key by the clipped distance: positions d_j = min(i - j, w), cos/sin gathered from the
// cached [max_pos, D] tables, k' = k * cos + rotate_half(k) * (-sin), then repeat_kv (the kv heads copied out to
// the query heads), softmax(q k'^T / sqrt(D)) and the product with the (repeated) values.
// Only lab/bench/torch/decode_torch_baseline.cpp includes torch; it is compiled when libtorch is found
// (ROTARY_HAVE_TORCH=1).
#pragma once

#include <cstdint>
#include <functional>

namespace rotary::bench {

struct TorchRerotateCase {
  int64_t context = 0, hq = 0, hkv = 0, dim = 0;  // cache tokens, heads, head dim (half-split, full rotation)
  int64_t window = 0;                             // ReRoPE w
  const float* k = nullptr;                       // [context, hkv, dim], un-rotated, positions 0..context-1
  const float* v = nullptr;                       // [context, hkv, dim]
  const float* q = nullptr;                       // [hq, dim], un-rotated, position context-1
  const double* inv_freq = nullptr;               // [dim / 2]
  int threads = 1;                                // torch::set_num_threads
};

// A callable that runs one decode step and writes o [hq, dim] (f32).
std::function<void(float* o)> make_torch_rerope_decode(const TorchRerotateCase& c);

}  // namespace rotary::bench
