// rotary_nn/model.h: a decoder-only transformer (libtorch C++ frontend) with pluggable position encodings.
//
// tokens -> embedding (+ learned / sinusoidal positions) -> n_layers blocks -> final norm -> LM head.
// A block: attention (n_heads query heads, n_kv_heads key/value heads) and an MLP (d_ff; GELU or SwiGLU), each a
// residual branch with dropout, pre- or post-norm (LayerNorm or RMSNorm), one after the other or side by side
// (GPT-NeoX's parallel residual). GPT-2's form is the default; Llama, Mistral, Qwen2 and GPT-NeoX checkpoints load
// into the same classes (rotary_nn/hf_checkpoint.h). Where each encoding enters and which kinds run fused:
// docs/model.md.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "rotary_nn/config.h"

namespace rotary::nn {

// LayerNorm (weight and bias, as torch::nn::LayerNorm, so stored models keep their parameter names) or RMSNorm
// (Llama: x / sqrt(mean(x^2) + eps) * weight, reduced in float32 at least, as Hugging Face does).
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(NormKind kind, int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  bool rms_;
  double eps_;
  torch::Tensor weight_, bias_;
};
TORCH_MODULE(Norm);

// One transformer block. The attention itself is passed in (attend: q, k, v [B, S, H, D] -> [B, S, Hq, D]), so
// the same weights serve the full forward (fused or plain) and the cached decoder of generate().
class BlockImpl : public torch::nn::Module {
 public:
  using Attend = std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v)>;
  explicit BlockImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const Attend& attend);  // x [B, S, d_model] -> [B, S, d_model]
  // attention = performer: this layer's [m, head_dim] random features (a buffer: saved with the model); else
  // undefined. redraw_performer_projection replaces it by a fresh draw from `gen`.
  const torch::Tensor& performer_projection() const { return performer_proj_; }
  void redraw_performer_projection(at::Generator gen);

 private:
  torch::Tensor mlp(const torch::Tensor& h);  // [B, S, d_model] -> [B, S, d_model]

  int n_heads_, n_kv_heads_, head_dim_;
  bool pre_norm_, parallel_;
  MlpKind mlp_kind_;
  Norm ln_attn_{nullptr}, ln_mlp_{nullptr};
  torch::nn::Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wo_{nullptr};
  torch::nn::Linear fc_in_{nullptr}, fc_out_{nullptr}, fc_gate_{nullptr};  // fc_gate_: swiglu only
  torch::nn::Dropout drop_{nullptr};
  torch::Tensor performer_proj_;
};
TORCH_MODULE(Block);

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const ModelConfig& config);  // validates config (rotary::Error)
  // tokens [B, S] int64 -> logits [B, S, V]. positions [B, S] int64 (default 0..S-1 in every row); with a causal
  // rotary kind and fused = true they must increase strictly along each row.
  torch::Tensor forward(const torch::Tensor& tokens, const std::optional<torch::Tensor>& positions = std::nullopt);
  // forward() in two halves, for callers that take the LM head in chunks of positions (16k positions x a 128k
  // vocabulary is 8 GB of float32 logits): the final hidden states after the last norm [B, S, d_model], and the
  // LM head alone (hidden [..., d_model] -> logits [..., V]). project(hidden_states(t, p)) == forward(t, p).
  torch::Tensor hidden_states(const torch::Tensor& tokens, const std::optional<torch::Tensor>& positions = std::nullopt);
  torch::Tensor project(const torch::Tensor& hidden);
  const ModelConfig& config() const { return config_; }
  // Replaces the encoding used from now on by the trained one with `o` applied (each call starts again from the
  // trained encoding; an empty override restores it). rotary::Error naming the field if it does not fit.
  void set_override(const EncodingOverride& o);
  const EncodingConfig& active_encoding() const { return active_; }
  // attention = performer: every layer draws new random features, layer i from a generator seeded with a mix of
  // (seed, i), so data-parallel ranks and a resumed run draw the same (training calls it every performer_redraw
  // steps). No-op for the other attention kinds.
  void redraw_performer_features(uint64_t seed);
  // Autoregressive sampling through the KV-cache decoder: prompt [S] -> generated ids (excluding the prompt).
  // temperature 0 = greedy. Stops after max_new tokens or when `stop_id` is produced (not included). Only ids in
  // [0, sample_vocab) are ever produced (0: the whole vocabulary): a checkpoint's embedding table may have padding
  // rows past the last id its tokenizer has. Non-finite logits are a rotary::Error naming the position.
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int max_new, double temperature,
                                int64_t stop_id, uint64_t seed, int64_t sample_vocab = 0);
  // Teacher-forced decoding through the same caches: prefill tokens[0, prefill_len), then feed the rest one token
  // at a time. Returns logits [S, V] for every position, which equal forward(tokens)[0] up to rounding (for tests
  // and decode benchmarks).
  torch::Tensor decode_logits(const std::vector<int64_t>& tokens, int64_t prefill_len);

 private:
  friend struct Decoder;  // nn/src/decoder.h: generate() and the memory decoding
  torch::Tensor embed(const torch::Tensor& tokens, const torch::Tensor& positions);  // -> [B, S, d_model]
  torch::Tensor final_norm(const torch::Tensor& x);                                   // -> [B, S, d_model]
  torch::Tensor head(const torch::Tensor& x) { return project(final_norm(x)); }       // -> [B, S, V]
  // rotary::Error when positions span more than a checkpoint's sliding_window (ModelConfig::sliding_window).
  void check_span(const torch::Tensor& positions) const;

  ModelConfig config_;
  EncodingConfig active_;  // the trained encoding resolved (rope.head_dim, rope.rotary_dim filled) + override
  torch::nn::Embedding tok_emb_{nullptr}, pos_emb_{nullptr};
  torch::Tensor t5_bias_;  // [t5_num_buckets, n_heads] (kind t5): one table for every layer, as in T5
  std::vector<Block> blocks_;
  Norm ln_final_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(Transformer);

// The same weights (parameters and buffers, dtype and training mode) on the other attention path: the fused kernels
// and plain torch ops compute the same function (tests/nn/test_model.cpp), so a model trained on one runs on the
// other. Builds the model anew, which draws its start from torch's generator before the copy.
Transformer on_attention_path(const Transformer& model, bool fused);

}  // namespace rotary::nn
