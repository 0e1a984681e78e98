// lab/bench/torch/torch_rotations.h: the pair swaps of the usual PyTorch RoPE code, shared by the torch baselines.
#pragma once

#include <torch/torch.h>

namespace rotary::bench {

// Half-split pairs (i, i + d/2), Hugging Face Llama: cat(-x[..., d/2:], x[..., :d/2]).
inline torch::Tensor rotate_half(const torch::Tensor& x) {
  using torch::indexing::Slice;
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.index({"...", Slice(h, torch::indexing::None)}), x.index({"...", Slice(0, h)})}, -1);
}

// Interleaved pairs (2i, 2i + 1), GPT-J / Meta: stack(-x[..., 1::2], x[..., ::2]).flatten(-2).
inline torch::Tensor rotate_every_two(const torch::Tensor& x) {
  using torch::indexing::Slice;
  const auto x1 = x.index({"...", Slice(0, torch::indexing::None, 2)});
  const auto x2 = x.index({"...", Slice(1, torch::indexing::None, 2)});
  return torch::stack({-x2, x1}, -1).flatten(-2);
}

}  // namespace rotary::bench
