// rotary/attention.h: softmax attention with every rotary position mode, fused (flash-style) and reference.
//
// One pass over (query tile, key tile) pairs with an online softmax: no N x N buffer. The position mode decides
// how the relative distance d = pos_i - pos_j enters the score:
//   None         s_ij = q_i . k_j                                  (inputs already rotated, or NoPE)
//   Rope         s_ij = (R(pos_i) q_i) . (R(pos_j) k_j)            (distance d)
//   Rerope(w)    d < w: as Rope; d >= w: q_i . R(-w) k_j           (distance clipped at w)
//   LeakyRerope  d < w: as Rope; d >= w: distance w + (d - w)/k
// Each mode combines with log-n query scaling (q_i *= max(1, ln(pos_i + 1) / ln(L_train))) and, for Rope, with
// RoPER (values rotated by R(pos_j) before the weighted sum, output by R(-pos_i) after it).
#pragma once

#include <cstdint>

#include "rotary/dtype.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary {

enum class PositionMode : uint8_t { None, Rope, Rerope, LeakyRerope };

struct PositionParams {
  PositionMode mode = PositionMode::None;
  const RopeFreqs* freqs = nullptr;  // required unless mode == None; freqs->head_dim must equal head_dim
  bool roper = false;                // RoPER value/output rotation (pure rotation: no attention factor)
  int64_t window = 0;                // w > 0 for Rerope / LeakyRerope
  double leaky_k = 1.0;              // k > 0 for LeakyRerope (k = 1 is plain RoPE)
  int64_t logn_train_len = 0;        // L_train > 1 enables log-n query scaling; 0 disables it
};

struct AttentionParams {
  int64_t tokens = 0;                  // all sequences packed: sum of the sequence lengths
  int head_dim = 0;                    // D, 16..256 (any value, not only powers of two)
  DType dtype = DType::F32;            // storage of q, k, v, o (and gradients); accumulation fp32 (fp64 for F64)
  HeadsView q;                         // [tokens, Hq, D]
  HeadsView k;                         // [tokens, Hkv, D], Hq % Hkv == 0 (MHA, GQA, MQA)
  HeadsView v;                         // [tokens, Hkv, D]
  HeadsView o;                         // [tokens, Hq, D] output
  void* lse = nullptr;                 // [tokens, Hq] log-sum-exp of the scaled scores (f64 if dtype F64, else f32);
                                       // may be null in forward, required in backward
  int64_t batch = 1;                   // number of packed sequences
  const int64_t* cu_seqlens = nullptr; // [batch + 1] cumulative lengths (flash-attention varlen); null: one sequence
  const int64_t* positions = nullptr;  // [tokens]; null: position = index inside its sequence
  bool causal = true;                  // key j visible to query i iff j <= i (by index inside the sequence)
  double softmax_scale = 0;            // 0 means 1/sqrt(D)
  PositionParams pos;
};

struct AttentionGradParams {
  AttentionParams fwd;   // the forward's inputs, o and lse
  HeadsView dout;        // [tokens, Hq, D]
  HeadsView dq;          // [tokens, Hq, D]
  HeadsView dk;          // [tokens, Hkv, D]
  HeadsView dv;          // [tokens, Hkv, D]
};

// Throws rotary::Error naming the field on any input that does not fit.
void validate_attention_params(const AttentionParams& p);

void attention_forward(const AttentionParams& p);            // fused, tiled, SIMD + OpenMP
void attention_forward_reference(const AttentionParams& p);  // float64, materialised scores (ReRoPE: two matrices)
void attention_backward(const AttentionGradParams& g);            // recomputation, no N x N storage
void attention_backward_reference(const AttentionGradParams& g);  // float64, materialised

}  // namespace rotary
