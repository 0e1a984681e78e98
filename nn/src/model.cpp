// The transformer: modules, the full forward (fused or plain attention per ModelConfig::fused) and overrides.
#include "rotary_nn/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <cmath>

#include "rotary/error.h"
#include "rotary_nn/attention.h"

namespace rotary::nn {
namespace {

namespace tnn = torch::nn;

tnn::Linear linear(int64_t in, int64_t out, bool bias) { return tnn::Linear(tnn::LinearOptions(in, out).bias(bias)); }

}  // namespace

NormImpl::NormImpl(NormKind kind, int64_t dim, double eps) : rms_(kind == NormKind::RmsNorm), eps_(eps) {
  weight_ = register_parameter("weight", torch::ones({dim}));
  if (!rms_) bias_ = register_parameter("bias", torch::zeros({dim}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  if (!rms_) return torch::layer_norm(x, {x.size(-1)}, weight_, bias_, eps_);
  // Hugging Face's LlamaRMSNorm: the mean of squares in float32 (float64 stays float64), the normalised x back in
  // the input's dtype, then the weight.
  const torch::Tensor xf = x.scalar_type() == torch::kDouble ? x : x.to(torch::kFloat);
  const torch::Tensor normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight_ * normed.to(x.scalar_type());
}

BlockImpl::BlockImpl(const ModelConfig& c)
    : n_heads_(c.n_heads), n_kv_heads_(c.kv_heads()), head_dim_(c.head_dim()), pre_norm_(c.pre_norm),
      parallel_(c.parallel_residual), mlp_kind_(c.mlp) {
  const int64_t d = c.d_model, hd = head_dim_, ff = c.ff_dim();
  ln_attn_ = register_module("ln_attn", Norm(c.normalization, d, c.norm_eps));
  wq_ = register_module("wq", linear(d, n_heads_ * hd, c.qkv_bias));
  wk_ = register_module("wk", linear(d, n_kv_heads_ * hd, c.qkv_bias));
  wv_ = register_module("wv", linear(d, n_kv_heads_ * hd, c.qkv_bias));
  wo_ = register_module("wo", linear(n_heads_ * hd, d, c.out_bias));
  ln_mlp_ = register_module("ln_mlp", Norm(c.normalization, d, c.norm_eps));
  if (mlp_kind_ == MlpKind::SwiGlu) fc_gate_ = register_module("fc_gate", linear(d, ff, c.mlp_bias));
  fc_in_ = register_module("fc_in", linear(d, ff, c.mlp_bias));
  fc_out_ = register_module("fc_out", linear(ff, d, c.mlp_bias));
  drop_ = register_module("drop", tnn::Dropout(c.dropout));
  // The first draw from torch's generator, seeded like the parameters' init.
  if (c.attention == AttentionKind::Performer)
    performer_proj_ = register_buffer(
        "performer_proj", draw_performer_projection(c.performer_feature_count(), hd, at::detail::getDefaultCPUGenerator()));
}

void BlockImpl::redraw_performer_projection(at::Generator gen) {
  if (!performer_proj_.defined()) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor fresh = draw_performer_projection(performer_proj_.size(0), performer_proj_.size(1), gen);
  performer_proj_.copy_(fresh);  // in place: the registered buffer (and its device and dtype) stays
}

torch::Tensor BlockImpl::mlp(const torch::Tensor& h) {
  if (mlp_kind_ == MlpKind::SwiGlu) return fc_out_(torch::silu(fc_gate_(h)) * fc_in_(h));
  return fc_out_(torch::gelu(fc_in_(h), mlp_kind_ == MlpKind::GeluTanh ? "tanh" : "none"));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const Attend& attend) {
  const int64_t B = x.size(0), S = x.size(1);
  auto attention = [&](const torch::Tensor& h) {
    const torch::Tensor q = wq_(h).view({B, S, n_heads_, head_dim_});
    const torch::Tensor k = wk_(h).view({B, S, n_kv_heads_, head_dim_});
    const torch::Tensor v = wv_(h).view({B, S, n_kv_heads_, head_dim_});
    return drop_(wo_(attend(q, k, v).reshape({B, S, n_heads_ * head_dim_})));
  };
  if (parallel_) return x + attention(ln_attn_(x)) + drop_(mlp(ln_mlp_(x)));
  torch::Tensor y = x + attention(pre_norm_ ? ln_attn_(x) : x);
  if (!pre_norm_) y = ln_attn_(y);
  y = y + drop_(mlp(pre_norm_ ? ln_mlp_(y) : y));
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
  if (config_.pre_norm) ln_final_ = register_module("ln_final", Norm(config_.normalization, d, config_.norm_eps));
  if (!config_.tie_embeddings) lm_head_ = register_module("lm_head", tnn::Linear(tnn::LinearOptions(d, config_.vocab_size).bias(false)));
  drop_ = register_module("drop", tnn::Dropout(config_.dropout));
  // gpt2: N(0, 0.02) matrices and embeddings (N(0, 1) embeddings would give huge tied logits). fan_in: a matrix
  // uniform in +-1/sqrt(its inputs), embeddings (token, learned position) N(0, 1), written out here rather than
  // left to libtorch's constructors. Either way zero biases, norms at identity.
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    torch::Tensor w = p.value();
    if (w.dim() >= 2) {
      const bool embedding = p.key() == "tok_emb.weight" || p.key() == "pos_emb.weight";
      if (config_.init == InitKind::Gpt2) w.normal_(0.0, 0.02);
      else if (embedding) w.normal_(0.0, 1.0);
      else {
        const double bound = 1.0 / std::sqrt(double(w.size(1)));
        w.uniform_(-bound, bound);
      }
    } else if (p.key().ends_with("bias")) {
      w.zero_();
    }
  }
}

void TransformerImpl::check_span(const torch::Tensor& positions) const {
  if (config_.sliding_window == 0 || positions.numel() == 0) return;
  const int64_t span = positions.max().item<int64_t>() - positions.min().item<int64_t>() + 1;
  check(span <= config_.sliding_window, "positions (span)", span,
        "<= sliding_window = " + std::to_string(config_.sliding_window) +
            ": this checkpoint attends only that far back, and rotary has no sliding-window attention, so longer "
            "sequences would give other results than the checkpoint's own code");
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

torch::Tensor TransformerImpl::final_norm(const torch::Tensor& x) { return ln_final_ ? ln_final_(x) : x; }

torch::Tensor TransformerImpl::project(const torch::Tensor& h) {
  return config_.tie_embeddings ? torch::matmul(h, tok_emb_->weight.t()) : lm_head_(h);
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& tokens, const std::optional<torch::Tensor>& positions) {
  return project(hidden_states(tokens, positions));
}

torch::Tensor TransformerImpl::hidden_states(const torch::Tensor& tokens, const std::optional<torch::Tensor>& positions) {
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
  check_span(pos);
  torch::Tensor x = embed(tokens, pos);
  const int64_t seq_len = length_dependent(active_) ? pos.max().item<int64_t>() + 1 : 0;
  const PositionContext pc = make_position_context(active_, config_.n_heads, config_.head_dim(), seq_len, t5_bias_);
  for (auto& block : blocks_) {
    const BlockImpl::Attend attend = [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
      return model_attention(q, k, v, pos, pc, config_.attention, config_.fused, block->performer_projection());
    };
    x = block->forward(x, attend);
  }
  return final_norm(x);
}

Transformer on_attention_path(const Transformer& model, bool fused) {
  ModelConfig c = model->config();
  c.fused = fused;
  Transformer out(c);
  out->to(model->parameters().front().scalar_type());
  torch::NoGradGuard no_grad;
  auto params = out->named_parameters(), buffers = out->named_buffers();
  for (const auto& t : model->named_parameters()) params[t.key()].copy_(t.value());
  for (const auto& t : model->named_buffers()) buffers[t.key()].copy_(t.value());
  out->train(model->is_training());
  return out;
}

void TransformerImpl::redraw_performer_features(uint64_t seed) {
  for (size_t i = 0; i < blocks_.size(); ++i) {
    // splitmix64 of (seed, layer): distinct, well-mixed generator seeds per layer.
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    blocks_[i]->redraw_performer_projection(at::make_generator<at::CPUGeneratorImpl>(z ^ (z >> 31)));
  }
}

}  // namespace rotary::nn
