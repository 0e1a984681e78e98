// rotary_torch/convert.h: validation and tensor -> core view conversion shared by the ops.
#pragma once

#include <torch/torch.h>

#include "rotary/attention.h"
#include "rotary/dtype.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary::torch_ops {

using OptTensor = c10::optional<at::Tensor>;

// f32, f16, bf16, f64 tensors map to the core storage types; anything else is a rotary::Error naming `field`.
DType core_dtype(const at::Tensor& t, const char* field);

// A CPU tensor [..., H, D] viewed as [tokens, H, D] with a contiguous last dim. Returns the (possibly copied)
// tensor that backs the view; `field` names the argument in errors.
at::Tensor as_tokens_heads_dim(const at::Tensor& t, const char* field);
HeadsView heads_view(const at::Tensor& t3);

// RopeFreqs from the op arguments (inv_freq [r/2] float64 tensor, attention factor, layout name, head dim).
// The ops' `mode` argument ("none", "rope", "rerope", "leaky_rerope") as the core's PositionMode; rotary::Error
// naming "mode" otherwise.
PositionMode position_mode_from_name(const std::string& mode);
RopeFreqs freqs_from(const at::Tensor& inv_freq, double attention_factor, const std::string& layout, int64_t head_dim);

// The q, k, v checks every attention op shares: [B, S, H, D] or packed [T, H, D], all the same dim count and
// dtype, the same leading (token) dims, and as many value heads as key heads. Head counts against q and the last
// dims are the op's own business (GQA, value_dim).
void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// The packing of the sequences, as the core's cu_seqlens / positions pointers want it; owns the int64 tensors
// they point into. 4-d q: one sequence per batch row (cu_seqlens must be none); 3-d: cu_seqlens [batch + 1] or
// one sequence of all tokens. positions: int64, one per token, or none (index inside the sequence).
struct Sequences {
  int64_t batch = 1;
  at::Tensor cu, positions;  // contiguous int64; undefined when absent
  const int64_t* cu_ptr() const { return cu.defined() ? cu.data_ptr<int64_t>() : nullptr; }
  const int64_t* positions_ptr() const { return positions.defined() ? positions.data_ptr<int64_t>() : nullptr; }
};
Sequences sequences_from(const at::Tensor& q, const OptTensor& cu_seqlens, const OptTensor& positions,
                         int64_t tokens);

// For an autograd backward that is not itself differentiable (the fused attention backward kernels): returns
// `grads` unchanged unless a graph of the backward is being built (create_graph=True); then returns them wired to
// a node that raises "rotary: <op> has no second derivative ..." if anything differentiates through them, as
// PyTorch's once_differentiable does. The values stay right, so a first-order use of create_graph still works.
torch::autograd::variable_list first_derivative_only(torch::autograd::variable_list grads, const char* op);

// The typed dispatcher handle of a registered op ("rotary::name"); calls go through every dispatch key.
template <class Fn>
auto typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

}  // namespace rotary::torch_ops
