// lab/bench/rope_torch_baseline.h: the rotation as PyTorch users usually write it, for `rotary bench rope`.
//
// Half-split (Hugging Face Llama):  q * cos + rotate_half(q) * sin,  rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])
// Interleaved (GPT-J / Meta style): q * cos + rotate_every_two(q) * sin, rotate_every_two(x) = stack(-x[..., 1::2],
//                                   x[..., ::2]).flatten(-2), with cos/sin repeated per pair.
// q: [1, tokens, heads, dim] in f32 or bf16; cos, sin: [1, tokens, 1, dim] in q's dtype, precomputed outside the
// timed call (as HF caches them). The composition allocates its result (out of place).
// Only lab/bench/torch/rope_torch_baseline.cpp includes torch; it is compiled when libtorch is found
// (ROTARY_HAVE_TORCH=1).
#pragma once

#include <cstdint>
#include <functional>

namespace rotary::bench {

struct TorchRopeCase {
  int64_t tokens = 0, heads = 0, dim = 0;
  const int64_t* positions = nullptr;  // [tokens]
  double base = 10000.0;
  bool bf16 = false;
  bool interleaved = false;
  int threads = 1;  // torch::set_num_threads
};

// A callable that runs one application of the composition on its own (random) q.
std::function<void()> make_torch_rope(const TorchRopeCase& c);

// Seed 002's runtime comparison (`rotary bench rope-cost`): q and k of [seq, batch, heads, dim] as GPT-NeoX lays
// them out, each either rotated by the composition above (half-split; cos/sin [seq, 1, 1, dim] broadcast over batch
// and heads, as the seed's code caches them) or given an additive position embedding, `x + pe` with pe
// [seq, 1, 1, dim]. Both allocate their results, as written in PyTorch.
struct TorchQkCase {
  int64_t seq = 0, batch = 0, heads = 0, dim = 0;
  bool bf16 = false;
  int threads = 1;
};
std::function<void()> make_torch_rotary_qk(const TorchQkCase& c);
std::function<void()> make_torch_additive_qk(const TorchQkCase& c);

}  // namespace rotary::bench
