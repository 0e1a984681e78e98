// rotary_torch/ops.h: C++ entry points of the torch ops. They call through the dispatcher, so autograd (registered
// at the Autograd key) works from C++ exactly as from Python (torch.ops.rotary.*).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <tuple>

namespace rotary::torch_ops {

// x [..., H, D] rotated by positions [...] (int64): direction "forward" | "inverse" | "transpose".
at::Tensor rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& inv_freq,
                double attention_factor, const std::string& layout, const std::string& direction = "forward");

// The position arguments of attention (see rotary/attention.h). mode: "none" | "rope" | "rerope" | "leaky_rerope".
struct AttentionPosition {
  std::string mode = "none";
  std::optional<at::Tensor> inv_freq;  // [r/2] float64, required unless mode == "none"
  double attention_factor = 1.0;
  std::string layout = "half_split";
  bool roper = false;
  int64_t window = 0;
  double leaky_k = 1.0;
  int64_t logn_train_len = 0;
};

// A score bias added to the scaled scores (see rotary/attention.h): kind "none", "alibi" (alibi_slopes [Hq]
// float64) or "t5" (t5_table [t5_num_buckets, Hq], learned: differentiable through the op).
struct AttentionBias {
  std::string kind = "none";
  std::optional<at::Tensor> alibi_slopes;
  std::optional<at::Tensor> t5_table;
  int64_t t5_num_buckets = 32;
  int64_t t5_max_distance = 128;
  bool t5_bidirectional = false;
};

// q [B, S, Hq, D] or [T, Hq, D]; k, v [.., Hkv, D]. With 4-d inputs the batch rows are the sequences; with 3-d
// inputs cu_seqlens [batch+1] (int64) packs them (none: one sequence). positions: int64 [B, S] / [T], or none
// (index inside the sequence). Returns (out like q, lse [tokens, Hq] float32 or float64 for float64 inputs).
std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const std::optional<at::Tensor>& positions,
                                             const std::optional<at::Tensor>& cu_seqlens, bool causal,
                                             double softmax_scale, const AttentionPosition& pos,
                                             const AttentionBias& bias = {});

// RoFormer eq. 19 linear attention (rotary/linear_attention.h): phi = elu + 1, the rotation a R(pos) on phi(q),
// phi(k) in the numerator only. q, k [B, S, H, D] or packed [T, H, D] (cu_seqlens as for attention; one kv head
// per query head); v [.., H, Dv]. inv_freq: [r/2] float64, or none for no rotation (attention_factor and layout
// then unused). feature_map "identity": q and k are the caller's features (each > 0; a Performer's), not
// passed through elu + 1. Returns out [.., H, Dv] in q's dtype; differentiable in q, k, v (the core backward).
at::Tensor linear_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& positions, const std::optional<at::Tensor>& cu_seqlens,
                            bool causal, const std::optional<at::Tensor>& inv_freq, double attention_factor = 1.0,
                            const std::string& layout = "half_split", const std::string& feature_map = "elu_plus_one");

}  // namespace rotary::torch_ops
