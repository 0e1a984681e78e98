// rotary_torch/convert.h: validation and tensor -> core view conversion shared by the ops.
#pragma once

#include <torch/torch.h>

#include "rotary/dtype.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary::torch_ops {

// f32, f16, bf16, f64 tensors map to the core storage types; anything else is a rotary::Error naming `field`.
DType core_dtype(const at::Tensor& t, const char* field);

// A CPU tensor [..., H, D] viewed as [tokens, H, D] with a contiguous last dim. Returns the (possibly copied)
// tensor that backs the view; `field` names the argument in errors.
at::Tensor as_tokens_heads_dim(const at::Tensor& t, const char* field);
HeadsView heads_view(const at::Tensor& t3);

// RopeFreqs from the op arguments (inv_freq [r/2] float64 tensor, attention factor, layout name, head dim).
RopeFreqs freqs_from(const at::Tensor& inv_freq, double attention_factor, const std::string& layout, int64_t head_dim);

}  // namespace rotary::torch_ops
