// The transformer: modules, the full forward (fused or plain attention per ModelConfig::fused) and overrides.
#include "rotary_nn/model.h"

#include "rotary/error.h"
#include "rotary_nn/attention.h"

namespace rotary::nn {
namespace {

namespace tnn = torch::nn;

}  // namespace

BlockImpl::BlockImpl(const ModelConfig& c)
    : n_heads_(c.n_heads), n_kv_heads_(c.kv_heads()), head_dim_(c.head_dim()), pre_norm_(c.pre_norm) {
  const int64_t d = c.d_model, hd = head_dim_;
  ln_attn_ = register_module("ln_attn", tnn::LayerNorm(tnn::LayerNormOptions({d})));
  wq_ = register_module("wq", tnn::Linear(d, n_heads_ * hd));
  wk_ = register_module("wk", tnn::Linear(d, n_kv_heads_ * hd));
  wv_ = register_module("wv", tnn::Linear(d, n_kv_heads_ * hd));
  wo_ = register_module("wo", tnn::Linear(n_heads_ * hd, d));
  ln_mlp_ = register_module("ln_mlp", tnn::LayerNorm(tnn::LayerNormOptions({d})));
  fc_in_ = register_module("fc_in", tnn::Linear(d, c.ff_dim()));
  fc_out_ = register_module("fc_out", tnn::Linear(c.ff_dim(), d));
  drop_ = register_module("drop", tnn::Dropout(c.dropout));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const Attend& attend) {
  const int64_t B = x.size(0), S = x.size(1);
  torch::Tensor h = pre_norm_ ? ln_attn_(x) : x;
  const torch::Tensor q = wq_(h).view({B, S, n_heads_, head_dim_});
  const torch::Tensor k = wk_(h).view({B, S, n_kv_heads_, head_dim_});
  const torch::Tensor v = wv_(h).view({B, S, n_kv_heads_, head_dim_});
  torch::Tensor y = x + drop_(wo_(attend(q, k, v).reshape({B, S, n_heads_ * head_dim_})));
  if (!pre_norm_) y = ln_attn_(y);
  h = pre_norm_ ? ln_mlp_(y) : y;
  y = y + drop_(fc_out_(torch::gelu(fc_in_(h))));
  return pre_norm_ ? y : ln_mlp_(y);
}

TransformerImpl::TransformerImpl(const ModelConfig& config) : config_(config) {
  config_.validate();
  active_ = config_.resolved_encoding();
  const int64_t d = config_.d_model;
  tok_emb_ = register_module("tok_emb", tnn::Embedding(config_.vocab_size, d));
  if (config_.encoding.kind == EncodingKind::Learned) pos_emb_ = register_module("pos_emb", tnn::Embedding(config_.max_seq_len, d));
  if (config_.encoding.kind == EncodingKind::T5)
    t5_bias_ = register_parameter("t5_bias", torch::zeros({config_.encoding.t5_num_buckets, config_.n_heads}));
  for (int i = 0; i < config_.n_layers; ++i)
    blocks_.push_back(register_module("block" + std::to_string(i), Block(config_)));
  // Post-norm blocks already end in a LayerNorm; only pre-norm needs the final one (as GPT-2).
  if (config_.pre_norm) ln_final_ = register_module("ln_final", tnn::LayerNorm(tnn::LayerNormOptions({d})));
  if (!config_.tie_embeddings) lm_head_ = register_module("lm_head", tnn::Linear(tnn::LinearOptions(d, config_.vocab_size).bias(false)));
  drop_ = register_module("drop", tnn::Dropout(config_.dropout));
  // GPT-2 initialisation: N(0, 0.02) matrices and embeddings (torch's N(0, 1) embedding would give huge tied
  // logits), zero biases, LayerNorm at identity.
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    if (p.value().dim() >= 2) p.value().normal_(0.0, 0.02);
    else if (p.key().ends_with("bias")) p.value().zero_();
  }
}

void TransformerImpl::set_override(const EncodingOverride& o) { active_ = apply_override(config_, o); }

torch::Tensor TransformerImpl::embed(const torch::Tensor& tokens, const torch::Tensor& positions) {
  check(tokens.numel() == 0 || (tokens.min().item<int64_t>() >= 0 && tokens.max().item<int64_t>() < config_.vocab_size),
        "tokens", "out of range", "ids in [0, vocab_size = " + std::to_string(config_.vocab_size) + ")");
  torch::Tensor x = tok_emb_(tokens);
  const EncodingKind kind = config_.encoding.kind;
  if (kind == EncodingKind::Learned) {
    const int64_t lo = positions.min().item<int64_t>(), hi = positions.max().item<int64_t>();
    check(lo >= 0 && hi < config_.max_seq_len, "positions", "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
          "[0, max_seq_len = " + std::to_string(config_.max_seq_len) + ") with learned absolute positions");
    x = x + pos_emb_(positions);
  } else if (kind == EncodingKind::Sinusoidal) {
    x = x + sinusoidal_encoding(positions, config_.d_model, x.scalar_type());
  }
  return drop_(x);
}

torch::Tensor TransformerImpl::head(const torch::Tensor& x) {
  const torch::Tensor h = ln_final_ ? ln_final_(x) : x;
  return config_.tie_embeddings ? torch::matmul(h, tok_emb_->weight.t()) : lm_head_(h);
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& tokens, const std::optional<torch::Tensor>& positions) {
  check(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong, "tokens", tokens.sizes(), "an int64 [B, S] tensor");
  const int64_t B = tokens.size(0), S = tokens.size(1);
  check(S >= 1, "tokens.shape[1]", S, ">= 1");
  torch::Tensor pos;
  if (positions) {
    check(positions->sizes() == tokens.sizes() && positions->scalar_type() == torch::kLong, "positions",
          positions->sizes(), "an int64 tensor shaped like tokens");
    pos = *positions;
  } else {
    pos = torch::arange(S, torch::TensorOptions().dtype(torch::kLong).device(tokens.device())).expand({B, S});
  }
  if (active_.logn_train_len > 0)
    check(pos.min().item<int64_t>() >= 0, "positions", pos.min().item<int64_t>(), ">= 0 with log-n (ln(pos + 1))");
  torch::Tensor x = embed(tokens, pos);
  const int64_t seq_len = length_dependent(active_) ? pos.max().item<int64_t>() + 1 : 0;
  const PositionContext pc = make_position_context(active_, config_.n_heads, config_.head_dim(), seq_len, t5_bias_);
  const BlockImpl::Attend attend = [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return model_attention(q, k, v, pos, pc, config_.attention, config_.fused);
  };
  for (auto& block : blocks_) x = block->forward(x, attend);
  return head(x);
}

}  // namespace rotary::nn
