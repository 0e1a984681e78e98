// rotary/attention.h: softmax attention with every rotary position mode, fused (flash-style) and reference.
//
// One pass over (query tile, key tile) pairs with an online softmax: no N x N buffer. The position mode decides
// how the relative distance d = pos_i - pos_j enters the score:
//   None         s_ij = q_i . k_j                                  (inputs already rotated, or NoPE)
//   Rope         s_ij = (R(pos_i) q_i) . (R(pos_j) k_j)            (distance d)
//   Rerope(w)    d < w: as Rope; d >= w: q_i . R(-w) k_j           (distance clipped at w)
//   LeakyRerope  d < w: as Rope; d >= w: distance w + (d - w)/k
// R(p) carries the RopeFreqs attention factor on the rotated features (so it scales the rotated part of every
// score by factor^2, in all three modes); features past rotary_dim pass through unscaled.
// Each mode combines with log-n query scaling (q_i *= max(1, ln(pos_i + 1) / ln(L_train)), before rotation)
// and with RoPER: values are rotated by the same effective relative distance the score sees,
//   o_i = sum_j a_ij R(-delta_ij) v_j,  delta_ij = d (Rope; Rerope/Leaky inside the window),
//                                       w (Rerope beyond it), w + (d - w)/k (Leaky beyond it);
// for Rope this is RoPER's R(-pos_i) sum_j a_ij R(pos_j) v_j. The value rotation is a pure rotation (no
// attention factor). docs/attention.md gives the reasoning.
//
// A score bias (ScoreBiasParams) adds b_h(pos_i - pos_j) to the scaled score, after the rotation and the softmax
// scale, in any position mode: ALiBi (-slope_h (pos_i - pos_j)) or T5's learned bias per head and relative bucket
// (rotary/t5_bias.h); the backward also returns the gradient of the T5 table. The kernels take the bias from a
// table by clamped distance (T5's buckets are constant past max_distance), so no N x N buffer exists.
//
// Sequences: tokens of several sequences are packed (cu_seqlens, flash-attention varlen); causal masking is by
// index inside the sequence, and then positions must increase strictly inside each sequence.
// Non-finite inputs: a NaN or Inf in q, k or v makes exactly those outputs (o, lse) non-finite whose reference
// value is non-finite (a NaN in q_i: row i; in k_j or v_j: the rows that see key j), never others.
#pragma once

#include <cstdint>

#include "rotary/dtype.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary {

enum class PositionMode : uint8_t { None, Rope, Rerope, LeakyRerope };

struct PositionParams {
  PositionMode mode = PositionMode::None;
  const RopeFreqs* freqs = nullptr;  // required unless mode == None; freqs->head_dim must equal head_dim (rope.h: the
                                     // Params convention)
  bool roper = false;                // RoPER value/output rotation (pure rotation: no attention factor); needs mode != None
  int64_t window = 0;                // w > 0 for Rerope / LeakyRerope
  double leaky_k = 1.0;              // k > 0 for LeakyRerope (k = 1 is plain RoPE)
  int64_t logn_train_len = 0;        // L_train > 1 enables log-n query scaling (then positions must be >= 0); 0 disables it
};

enum class ScoreBias : uint8_t { None, Alibi, T5 };

struct ScoreBiasParams {
  ScoreBias kind = ScoreBias::None;
  const double* alibi_slopes = nullptr;  // Alibi: [Hq] finite; s_ij -= slope_h * (pos_i - pos_j)
  const void* t5_table = nullptr;        // T5: [t5_num_buckets, Hq] row-major in the attention's dtype (Hugging
                                         // Face's relative_attention_bias.weight); s_ij += table[bucket][h]
  int t5_num_buckets = 32;               // T5: as rotary/t5_bias.h validates them
  int t5_max_distance = 128;
  bool t5_bidirectional = false;         // false: causal buckets (a key after its query is bucket 0)
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
  const int64_t* positions = nullptr;  // [tokens]; null: position = index inside its sequence; |pos| <= 2^53
  bool causal = true;                  // key j visible to query i iff j <= i (by index inside the sequence)
  double softmax_scale = 0;            // 0 means 1/sqrt(D)
  PositionParams pos;
  ScoreBiasParams bias;
  int threads = 0;                     // OpenMP threads at most (forward and backward); 0: omp_get_max_threads()
  // Queries for the last tokens only (forward, one sequence): outputs for tokens [first_query, tokens), whose keys
  // and values come first in k and v. q, o are then [tokens - first_query, Hq, D] and lse [tokens - first_query,
  // Hq]: row r is token first_query + r (its position, its causal limit). A prompt run in chunks against the keys
  // before it, or a retrieval memory's chunk against its window, so that no work is spent on rows nobody reads.
  int64_t first_query = 0;
};

struct AttentionGradParams {
  AttentionParams fwd;   // the forward's inputs, o and lse (first_query = 0: the backward takes every query)
  HeadsView dout;        // [tokens, Hq, D]
  HeadsView dq;          // [tokens, Hq, D]
  HeadsView dk;          // [tokens, Hkv, D]
  HeadsView dv;          // [tokens, Hkv, D]
  void* dt5_table = nullptr;  // bias kind T5: [t5_num_buckets, Hq] in the attention's dtype, overwritten with the
                              // gradient of the table (required then; must be null otherwise)
};

// Throws rotary::Error naming the field on any input that does not fit.
void validate_attention_params(const AttentionParams& p);
void validate_attention_grad_params(const AttentionGradParams& g);

void attention_forward(const AttentionParams& p);            // fused, tiled, SIMD + OpenMP
void attention_forward_reference(const AttentionParams& p);  // float64, materialised scores (ReRoPE: two matrices)
void attention_backward(const AttentionGradParams& g);            // recomputation, no N x N storage
void attention_backward_reference(const AttentionGradParams& g);  // float64, materialised

// Bytes of scratch the fused kernels allocate for these parameters with `threads` OpenMP threads (0: p.threads,
// and when that is 0 too, the current omp_get_max_threads()). The kernels size their one allocation with these functions, so the numbers
// are exact; they grow as O(tokens * heads * head_dim), never as tokens^2.
int64_t attention_forward_scratch_bytes(const AttentionParams& p, int threads = 0);
int64_t attention_backward_scratch_bytes(const AttentionGradParams& g, int threads = 0);

}  // namespace rotary
