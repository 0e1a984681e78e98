// rotary/linear_attention.h: linear attention with RoPE (RoFormer, eq. 19), forward and backward.
//
//   phi(x) = elu(x) + 1 (> 0), a = freqs.attention_factor, R(p) the rotation of rope.h (rotary pairs only):
//   o_m = sum_n (a R(pos_m) phi(q_m)) . (a R(pos_n) phi(k_n)) v_n  /  sum_n phi(q_m) . phi(k_n)
// The rotation enters the numerator only; the normaliser is not rotated (it stays positive). n runs over the
// whole sequence (non-causal) or over n <= m (causal, by index inside the sequence).
// Fast: a running state per (sequence, head), O(N D Dv):
//   S_m = sum_{n<=m} (a R(pos_n) phi(k_n)) v_n^T   [D, Dv]     z_m = sum_{n<=m} phi(k_n)   [D]
//   o_m = (a R(pos_m) phi(q_m))^T S_m / (phi(q_m) . z_m)
// (non-causal: the totals S_N, z_N for every m). The backward re-runs that scan and then a reverse scan of
// P_n = sum_{m>=n} (a R(pos_m) phi(q_m)) g_m^T with g_m = dO_m / den_m; no N x N buffer anywhere.
// Reference: float64 with the N x N numerator and denominator matrices materialised.
//
// feature_map = Identity: q and k are features already (phi(x) = x), e.g. a Performer's positive random features
// computed by the caller (rotary_nn's FAVOR+); then every value of q and k must be > 0, so that the normaliser is
// positive (checked; NaN passes through to the output as NaN, like any input NaN).
#pragma once

#include <cstdint>
#include <string>

#include "rotary/dtype.h"
#include "rotary/rope.h"
#include "rotary/rope_spec.h"

namespace rotary {

enum class FeatureMap {
  EluPlusOne,  // phi(x) = elu(x) + 1, RoFormer's choice (Katharopoulos et al.)
  Identity,    // phi(x) = x: the caller's features, each > 0
};
const char* feature_map_name(FeatureMap f);  // "elu_plus_one", "identity"
FeatureMap parse_feature_map(const std::string& name);  // rotary::Error naming "feature_map" and the names

struct LinearAttentionParams {
  int64_t tokens = 0;                   // all sequences packed
  int head_dim = 0;                     // D of q and k, 1..1024
  int value_dim = 0;                    // Dv of v and o, 1..1024; 0 means head_dim
  DType dtype = DType::F32;             // storage of q, k, v, o (and gradients); arithmetic fp32 (fp64 for F64)
  HeadsView q;                          // [tokens, H, D]
  HeadsView k;                          // [tokens, H, D]
  HeadsView v;                          // [tokens, H, Dv]
  HeadsView o;                          // [tokens, H, Dv] output
  int64_t batch = 1;                    // packed sequences
  const int64_t* cu_seqlens = nullptr;  // [batch + 1] cumulative lengths; null: one sequence of all tokens
  const int64_t* positions = nullptr;   // [tokens], |pos| <= 2^53; null: index inside its sequence
  bool causal = true;
  FeatureMap feature_map = FeatureMap::EluPlusOne;
  const RopeFreqs* freqs = nullptr;  // null: no rotation (plain linear attention); else head_dim must match
  int threads = 0;                   // OpenMP threads at most, over (sequence, head); 0: omp_get_max_threads()
};

struct LinearAttentionGradParams {
  LinearAttentionParams fwd;  // the forward's inputs (o is not read)
  HeadsView dout;             // [tokens, H, Dv]
  HeadsView dq;               // [tokens, H, D]
  HeadsView dk;               // [tokens, H, D]
  HeadsView dv;               // [tokens, H, Dv]
};

// Throw rotary::Error naming the field on any input that does not fit.
void validate_linear_attention_params(const LinearAttentionParams& p);
void validate_linear_attention_grad_params(const LinearAttentionGradParams& g);

void linear_attention_forward(const LinearAttentionParams& p);                 // running state, OpenMP
void linear_attention_forward_reference(const LinearAttentionParams& p);       // float64, materialised N x N
void linear_attention_backward(const LinearAttentionGradParams& g);            // two scans, O(N D Dv)
void linear_attention_backward_reference(const LinearAttentionGradParams& g);  // float64, materialised N x N

}  // namespace rotary
