// rotary_nn/attention.h: the attention of the model for every encoding kind, fused (rotary torch ops) and plain
// (ordinary torch ops: the benchmark baseline and the independent check of the fused path).
//
// Shapes: q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] (Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv)),
// positions int64 [B, S]. Keys and values come in UN-rotated; each function applies the encoding itself.
#pragma once

#include <torch/torch.h>

#include "rotary_nn/config.h"
#include "rotary_torch/ops.h"

namespace rotary::nn {

// What attention needs about positions for one forward, computed once and shared by every layer.
struct PositionContext {
  EncodingConfig enc;              // the active encoding, resolved (rope.head_dim / rotary_dim filled)
  torch::Tensor inv_freq;          // [rotary_dim / 2] float64 (rotary kinds and linear+rope); undefined otherwise
  double attention_factor = 1.0;   // multiplies cos and sin (RopeFreqs::attention_factor)
  torch::Tensor alibi_slopes;      // [Hq] float64 (alibi); undefined otherwise
  torch::Tensor t5_bias;           // [t5_num_buckets, Hq], the model's learned parameter (t5); undefined otherwise
  double softmax_scale = 1.0;      // 1 / sqrt(head_dim)
};

// The position arguments of the fused ops (torch_ops::attention, KvCacheHolder) for this context: the mode
// (fused_position_mode: RoPER is rope + roper), frequencies, layout, window, k and log-n. Empty mode for a kind
// without rotation. Used by the fused attention and the KV-cache decoder alike.
torch_ops::AttentionPosition fused_attention_position(const PositionContext& pc);

// The score bias of the fused op for this context: alibi (the slopes), t5 (the model's learned table, whose
// gradient the op returns), none otherwise.
torch_ops::AttentionBias fused_attention_bias(const PositionContext& pc);

// Dynamic NTK and longrope frequencies depend on the current length (HF: max position + 1); the others do not.
bool length_dependent(const EncodingConfig& e);

// seq_len: the length the frequencies are for (dynamic NTK and longrope depend on it; max position + 1).
// t5_bias: the model's bias table for kind t5 (shared by every layer, as in T5).
PositionContext make_position_context(const EncodingConfig& enc, int n_heads, int head_dim, int64_t seq_len,
                                      const torch::Tensor& t5_bias = {});

// T5's bucket of every query-key pair (rotary/t5_bias.h, causal): q_positions [B, Sq], k_positions [B, Sk] ->
// int64 [B, Sq, Sk].
torch::Tensor t5_buckets(const torch::Tensor& q_positions, const torch::Tensor& k_positions, int num_buckets,
                         int max_distance);

// ALiBi head slopes [n_heads] float64 (Press et al.: 2^(-8 (h + 1) / n) for n a power of two, interleaved with the
// next power's slopes otherwise).
torch::Tensor alibi_slopes(int n_heads);

// Sinusoidal absolute encoding (Vaswani et al.) [B, S, d_model] in `dtype`: feature 2i = sin(p / 10000^(2i/d)),
// 2i+1 = cos(...); angles in float64.
torch::Tensor sinusoidal_encoding(const torch::Tensor& positions, int d_model, torch::ScalarType dtype);

// Log-n query factor [B, S, 1, 1] in `dtype`: max(1, ln(pos + 1) / ln(L)); all ones when L == 0.
torch::Tensor logn_factor(const torch::Tensor& positions, int64_t train_len, torch::ScalarType dtype);

// Plain rotation: x [B, S, H, D] turned by factor * R(angle) on the first rotary_dim features (layout as the
// encoding's), angle [B, S] float64 (fractional for Leaky ReRoPE); the rest passes through. cos/sin tables are built
// in float64 and cast to x's dtype; half-split uses the usual rotate_half form x cos + rotate_half(x) sin.
torch::Tensor rotate_plain(const torch::Tensor& x, const torch::Tensor& angle, const PositionContext& pc,
                           double factor);

// Softmax attention from plain ops, materialised [B, Hq, Sq, Sk] scores, causal by index with the queries aligned
// to the END of the keys (query i sees keys j <= Sk - Sq + i), so the same function runs a full forward
// (Sq == Sk) and one decode step against a cache of un-rotated keys (Sq == 1). ReRoPE / Leaky ReRoPE: two score
// matrices selected by pos_i - pos_j < window (the seed's way); RoPER: values turned by R(pos_j), outputs by
// R(-pos_i) (and the far part by the clipped / leaky distance). ALiBi adds -slope_h (pos_i - pos_j); T5 adds its
// learned bias[bucket(pos_i - pos_j), h].
torch::Tensor softmax_attention_plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& q_positions, const torch::Tensor& k_positions,
                                      const PositionContext& pc);

// The same attention through rotary::torch_ops::attention (the fused kernels; forward and backward), every kind:
// none/learned/sinusoidal run mode "none" (log-n still applies); alibi and t5 pass their bias to the kernel,
// which adds it per score tile (O(N) memory) and returns the T5 table's gradient.
torch::Tensor softmax_attention_fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& positions, const PositionContext& pc);

// Linear attention (AttentionKind Linear or Performer), causal, O(N) memory in the fused form.
//   linear: RoFormer eq. 19, phi = elu + 1, RoPE on phi(q), phi(k) in the numerator only (kind rope; no rotation
//     otherwise).
//   performer: FAVOR+ (Choromanski et al. 2021): RoPE on q and k first (kind rope), then the positive random
//     features of performer_features(); the numerator and the normaliser use the same features. This is how the
//     Performer code with rotary does it (rotate, then the feature map); RoFormer eq. 19 rotates AFTER the feature
//     map and leaves the normaliser un-rotated, which a softmax-kernel approximation cannot do (the rotated
//     features are no longer positive).
// projection: the layer's [m, head_dim] random matrix (performer; undefined otherwise).
// Plain: the materialised [Sq, Sk] numerator and normaliser from linear_features (queries aligned to the end of
// the keys as above). Fused: rotary::torch_ops::linear_attention (the core's running-state kernel, forward and
// backward; feature_map "identity" for the performer's features; k, v repeated to the query heads for GQA, as the
// kernel has no grouping).
torch::Tensor linear_attention_plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& q_positions, const torch::Tensor& k_positions,
                                     const PositionContext& pc, AttentionKind attention = AttentionKind::Linear,
                                     const torch::Tensor& projection = {});
torch::Tensor linear_attention_fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& positions, const PositionContext& pc,
                                     AttentionKind attention = AttentionKind::Linear,
                                     const torch::Tensor& projection = {});

// The features of q or k [B, S, H, D] at positions [B, S] for the numerator and the normaliser of linear attention:
// linear (a R(pos) phi(x), phi(x)); performer (phi(R(pos) x), the same). The plain forms and the decoder's running
// sums (generate.cpp) both use it.
struct LinearFeatures {
  torch::Tensor num, den;  // [B, S, H, D] (linear) or [B, S, H, m] (performer)
};
LinearFeatures linear_features(const torch::Tensor& x, const torch::Tensor& positions, const PositionContext& pc,
                               AttentionKind attention, const torch::Tensor& projection, bool query);

// FAVOR+ positive random features of x [..., D] (q or k, already rotated) with projection w [m, D]:
//   phi(x)_i = m^-1/2 (exp(w_i . x' - |x'|^2 / 2 - c) + eps),   x' = x D^-1/4,
// so that E[phi(q) . phi(k)] is proportional to exp(q . k / sqrt(D)), the softmax kernel (Choromanski et al.,
// Lemma 1). c, the stabiliser: for a query, the max of its own w_i . x' (a factor common to its numerator and
// normaliser, so it cancels up to eps); for keys one constant of the draw, max(0, max_i |w_i|^2/2 - 60): since
// w . x' - |x'|^2/2 <= |w|^2/2 no key feature can pass e^60 (float32 ends at e^88), and no key's features depend on
// another key's - causal, and the decoder's running sums equal the full forward (the Performer code instead
// subtracts the max over all keys of the sequence, future ones included). eps = 1e-4 keeps every feature > 0.
// Computed in float32 (float64 for float64 x), returned in x's dtype: [..., m].
inline constexpr double kPerformerEps = 1e-4;
inline constexpr double kPerformerKeyExponentCap = 60.0;
torch::Tensor performer_features(const torch::Tensor& x, const torch::Tensor& projection, bool query);

// A [m, d] Gaussian orthogonal random matrix (float32): blocks of d orthonormal rows (QR of a Gaussian matrix,
// signs fixed so the block is Haar), each row scaled by the length of an independent N(0, I_d) vector, so every row
// is marginally N(0, I_d) while the rows of a block are exactly orthogonal (the "ORF" of section 2.4, which lowers
// the variance of the estimate against i.i.d. rows).
torch::Tensor draw_performer_projection(int64_t m, int64_t d, at::Generator gen);

// The full-sequence attention the model runs (q, k, v [B, S, H, D] -> [B, S, Hq, D]): softmax, linear or
// performer attention (projection: the layer's random features); fused -> the rotary ops, else the plain
// forms.
torch::Tensor model_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& positions, const PositionContext& pc, AttentionKind attention,
                              bool fused, const torch::Tensor& projection = {});

// Repeats kv heads for grouped-query attention: [B, S, Hkv, D] -> [B, S, Hkv * group, D] (head h -> h / group).
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t group);

}  // namespace rotary::nn
