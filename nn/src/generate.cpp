// generate(): the decoder (decoder.h) and its sampling loop (the engine's: engine::sample_tokens) - prefill the
// prompt with the full attention, then one token at a time against per-layer caches.
//
// Which cache a layer gets:
//   fused softmax, every kind but alibi and t5 -> the core decoder (torch.classes.rotary.KvCache): rope/roper keep
//     rotated keys; rerope/leaky keep UN-rotated keys and per step rotate only the keys inside the window, scoring
//     the far ones against R(w) q (core/include/rotary/kv_cache.h).
//   plain softmax, and alibi and t5 (the core decoder has no score bias; their prefill runs fused) -> un-rotated
//     keys and values in torch tensors; each step runs the plain attention of the one new query over all of them
//     (for rerope: the seed's re-rotation of the whole cache).
//   fused linear / performer -> the running sums S = sum R(n) phi(k_n) v_n^T, z = sum phi(k_n) (performer:
//     phi(R(n) k_n) in both; O(1) per step; the prefill runs the fused op, whose core kernel keeps these sums
//     internally but does not return them);
//   plain linear / performer -> keys and values in torch, the materialised form per step.
//   with a memory -> memory_decoding.cpp's caches (Decoder::custom_caches): the core's MemoryKvCache.
// Dynamic NTK / longrope frequencies change with the length: when they do, the caches are rebuilt from the
// un-rotated keys and values (kept for that case only), so a cached step equals a full forward at that length.
#include <algorithm>
#include <cmath>
#include <limits>

#include "decoder.h"
#include "rotary/error.h"
#include "rotary_nn/attention.h"
#include "rotary_nn/model.h"
#include "rotary_torch/convert.h"
#include "rotary_torch/decode.h"

namespace rotary::nn {
namespace {

class CoreCache final : public LayerCache {
 public:
  CoreCache(int64_t capacity, int64_t kv_heads, int64_t head_dim, torch::ScalarType dtype, const PositionContext& pc)
      : scale_(pc.softmax_scale) {
    const torch_ops::AttentionPosition ap = fused_attention_position(pc);
    const std::string name = dtype == torch::kDouble ? "float64" : dtype == torch::kFloat ? "float32"
                             : dtype == torch::kHalf ? "float16" : "bfloat16";
    cache_ = c10::make_intrusive<torch_ops::KvCacheHolder>(capacity, kv_heads, head_dim, name, ap);
  }
  void append(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& positions) override {
    cache_->append(k[0], v[0], positions[0]);
  }
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position, bool) override {
    return cache_->decode(q[0][0], q_position.item<int64_t>(), scale_).view(q.sizes());
  }

 private:
  c10::intrusive_ptr<torch_ops::KvCacheHolder> cache_;
  double scale_;
};

class PlainCache final : public LayerCache {
 public:
  PlainCache(const PositionContext& pc, AttentionKind attention, torch::Tensor projection)
      : pc_(pc), attention_(attention), projection_(std::move(projection)) {}
  void append(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& positions) override {
    k_ = k_.defined() ? torch::cat({k_, k}, 1) : k;
    v_ = v_.defined() ? torch::cat({v_, v}, 1) : v;
    pos_ = pos_.defined() ? torch::cat({pos_, positions}, 1) : positions;
  }
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position, bool) override {
    if (attention_ == AttentionKind::Softmax) return softmax_attention_plain(q, k_, v_, q_position, pos_, pc_);
    return linear_attention_plain(q, k_, v_, q_position, pos_, pc_, attention_, projection_);
  }

 private:
  PositionContext pc_;
  AttentionKind attention_;
  torch::Tensor projection_;
  torch::Tensor k_, v_, pos_;  // [1, L, Hkv, D], [1, L, Hkv, D], [1, L]
};

// Linear attention's running sums (kinds linear and performer): S = sum_n num(k_n) v_n^T, z = sum_n den(k_n) with
// the features of linear_features, and o = num(q)^T S / den(q) . z.
class LinearStateCache final : public LayerCache {
 public:
  LinearStateCache(const PositionContext& pc, AttentionKind attention, torch::Tensor projection)
      : pc_(pc), attention_(attention), projection_(std::move(projection)) {}
  void append(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& positions) override {
    const LinearFeatures f = linear_features(k, positions, pc_, attention_, projection_, /*query=*/false);
    const torch::Tensor s = torch::einsum("nhd,nhe->hde", {f.num[0], v[0]}), z = f.den[0].sum(0);
    state_ = state_.defined() ? state_ + s : s;  // [Hkv, F, Dv]
    z_ = z_.defined() ? z_ + z : z;              // [Hkv, F]
  }
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position, bool) override {
    const int64_t Hq = q.size(2), Hkv = z_.size(0), F = z_.size(1);
    const LinearFeatures f = linear_features(q, q_position, pc_, attention_, projection_, /*query=*/true);
    const torch::Tensor num = torch::einsum("hgd,hde->hge", {f.num.view({Hkv, Hq / Hkv, F}), state_});
    const torch::Tensor den = torch::einsum("hgd,hd->hg", {f.den.view({Hkv, Hq / Hkv, F}), z_}).unsqueeze(-1);
    return (num / den).reshape({1, 1, Hq, -1});
  }

 private:
  PositionContext pc_;
  AttentionKind attention_;
  torch::Tensor projection_;
  torch::Tensor state_, z_;
};

// The last position of `logits` [1, n, V] as the float32 CPU row the engine's sampler reads (a float64, half or
// GPU model's logits converted as the engine's are: float32).
torch::Tensor last_logits_row(const torch::Tensor& logits) {
  return logits[0][-1].to(torch::kCPU, torch::kFloat).contiguous();
}

}  // namespace

torch::Tensor LayerCache::attend_chunk(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                       const torch::Tensor&, const PositionContext&, bool) {
  fail("decoder", "a chunk of several tokens through a cache without chunked attention",
       "one token at a time (an internal error: report it)");
}

bool Decoder::core_cache() const {
  return config().fused && config().attention == AttentionKind::Softmax && !has_score_bias(model.active_.kind);
}

std::unique_ptr<LayerCache> Decoder::new_cache(size_t layer) {
  if (custom_caches) return custom_caches(layer, pc);
  if (core_cache()) return std::make_unique<CoreCache>(capacity, config().kv_heads(), config().head_dim(), dtype, pc);
  const torch::Tensor& projection = model.blocks_[layer]->performer_projection();
  if (config().fused && config().attention != AttentionKind::Softmax)
    return std::make_unique<LinearStateCache>(pc, config().attention, projection);
  return std::make_unique<PlainCache>(pc, config().attention, projection);
}

void Decoder::rebuild() {
  caches.clear();
  for (size_t i = 0; i < model.blocks_.size(); ++i) {
    caches.push_back(new_cache(i));
    if (hist_pos.defined()) caches.back()->append(hist_k[i], hist_v[i], hist_pos);
  }
}

torch::Tensor Decoder::run(const torch::Tensor& tokens, const torch::Tensor& positions, bool retrieve) {
  const bool prefill = caches.empty() && !custom_caches;  // with custom caches every token goes through them
  const bool dynamic = length_dependent(model.active_);
  const int64_t seq_len = dynamic ? positions.max().item<int64_t>() + 1 : 0;
  PositionContext next =
      make_position_context(model.active_, config().n_heads, config().head_dim(), seq_len, model.t5_bias_);
  const bool changed = prefill || (dynamic && (!torch::equal(next.inv_freq, pc.inv_freq) ||
                                               next.attention_factor != pc.attention_factor));
  pc = std::move(next);
  if (changed || caches.empty()) rebuild();
  torch::Tensor x = model.embed(tokens, positions);
  for (size_t i = 0; i < model.blocks_.size(); ++i) {
    x = model.blocks_[i]->forward(x, [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
      if (custom_caches && tokens.size(1) > 1)  // a chunk of the prompt: attends before it is appended
        return caches[i]->attend_chunk(q, k, v, positions, pc, retrieve);
      caches[i]->append(k, v, positions);
      if (dynamic) {
        hist_k.resize(caches.size()), hist_v.resize(caches.size());
        hist_k[i] = hist_k[i].defined() ? torch::cat({hist_k[i], k}, 1) : k;
        hist_v[i] = hist_v[i].defined() ? torch::cat({hist_v[i], v}, 1) : v;
      }
      if (prefill)
        return model_attention(q, k, v, positions, pc, config().attention, config().fused,
                               model.blocks_[i]->performer_projection());
      return caches[i]->attend(q, positions, retrieve);
    });
  }
  if (dynamic) hist_pos = hist_pos.defined() ? torch::cat({hist_pos, positions}, 1) : positions;
  return model.head(x);
}

engine::GenerateOptions sampling_options(int64_t max_new, double temperature, int64_t stop_id, uint64_t seed,
                                         int64_t sample_vocab) {
  engine::GenerateOptions o;
  o.max_new = max_new, o.temperature = temperature, o.seed = seed, o.sample_vocab = sample_vocab;
  if (stop_id >= 0) o.stop_ids = {stop_id};
  return o;
}

Sampled sample_tokens(Decoder& dec, const torch::Tensor& logits, int64_t position,
                      const engine::GenerateOptions& options) {
  Sampled out;
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(logits.device());
  torch::Tensor row = last_logits_row(logits);  // kept alive while the sampler reads it
  out.tokens = engine::sample_tokens(options, dec.config().vocab_size, row.data_ptr<float>(), position,
                                     [&](int64_t token, int64_t p) {
                                       row = last_logits_row(dec.run(torch::full({1, 1}, token, i64),
                                                                     torch::full({1, 1}, p, i64)));
                                       ++out.fed;
                                       return static_cast<const float*>(row.data_ptr<float>());
                                     });
  return out;
}

std::vector<int64_t> TransformerImpl::generate(const std::vector<int64_t>& prompt, int max_new, double temperature,
                                               int64_t stop_id, uint64_t seed, int64_t sample_vocab) {
  const engine::GenerateOptions options = sampling_options(max_new, temperature, stop_id, seed, sample_vocab);
  engine::check_sampling(int64_t(prompt.size()), options, config_.vocab_size);
  const int64_t S = int64_t(prompt.size());
  if (config_.encoding.kind == EncodingKind::Learned)
    check(S + max_new - 1 <= config_.max_seq_len, "prompt.size() + max_new", S + max_new,
          "<= max_seq_len + 1 = " + std::to_string(config_.max_seq_len + 1) + " with learned absolute positions");
  if (config_.sliding_window > 0)
    check_span(torch::tensor({int64_t(0), std::max(S - 1, S + max_new - 2)}));  // the last token sampled is never fed
  if (max_new == 0) return {};
  torch::NoGradGuard no_grad;
  EvalGuard eval(*this);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(tok_emb_->weight.device());
  Decoder dec(*this, S + max_new);
  const torch::Tensor logits = dec.run(torch::tensor(prompt, i64).view({1, S}), torch::arange(S, i64).view({1, S}));
  return sample_tokens(dec, logits, S, options).tokens;
}

torch::Tensor TransformerImpl::decode_logits(const std::vector<int64_t>& tokens, int64_t prefill_len) {
  const int64_t S = int64_t(tokens.size());
  check_span(torch::tensor({int64_t(0), S - 1}));
  check(prefill_len >= 1 && prefill_len <= S, "prefill_len", prefill_len, "1..tokens.size() = " + std::to_string(S));
  torch::NoGradGuard no_grad;
  EvalGuard eval(*this);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(tok_emb_->weight.device());
  const torch::Tensor all = torch::tensor(tokens, i64).view({1, S}), pos = torch::arange(S, i64).view({1, S});
  Decoder dec(*this, S);
  std::vector<torch::Tensor> parts = {dec.run(all.narrow(1, 0, prefill_len), pos.narrow(1, 0, prefill_len))};
  for (int64_t t = prefill_len; t < S; ++t) parts.push_back(dec.run(all.narrow(1, t, 1), pos.narrow(1, t, 1)));
  return torch::cat(parts, 1)[0];
}

}  // namespace rotary::nn
