// rotary_nn/limits.h: bounds on a model's size that the model config, the lab's flags and its experiments share,
// stated once (header-only and torch-free, so the lab's torch-free parts include it too).
#pragma once

#include <cstdint>

namespace rotary::nn {

// The longest row of tokens a model is made for: learned position tables, training rows, evaluations, generation.
inline constexpr int64_t kMaxSequenceLength = int64_t{1} << 20;

}  // namespace rotary::nn
