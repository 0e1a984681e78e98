// nn/src/decoder.h (internal to the nn layer): the token-by-token decoder of the model's generate() and of the
// memory decoding (memory_decoding.cpp) - per-layer caches, one run() per prompt chunk or token, and the sampling
// loop both use (the engine's: engine::sample_tokens).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "rotary_engine/generate.h"
#include "rotary_nn/attention.h"
#include "rotary_nn/model.h"

namespace rotary::nn {

// One layer's cache of one sequence. k, v [1, n, Hkv, D] un-rotated at positions [1, n]; q [1, 1, Hq, D].
class LayerCache {
 public:
  virtual ~LayerCache() = default;
  virtual void append(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& positions) = 0;
  // The new token's k, v are already appended; q_position [1, 1]. `retrieve`: a cache with a retrieval memory
  // searches it in this step (the others ignore it). -> [1, 1, Hq, D]
  virtual torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& q_position, bool retrieve) = 0;
  // A chunk of n > 1 tokens of a decoder whose every token goes through its caches (Decoder::custom_caches):
  // q [1, n, Hq, D], k, v [1, n, Hkv, D] at positions [1, n] attend, then are appended. -> [1, n, Hq, D]
  virtual torch::Tensor attend_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& positions, const PositionContext& pc, bool retrieve);
};

// Puts the module in eval mode (no dropout) while it lives and restores the mode afterwards.
struct EvalGuard {
  torch::nn::Module& m;
  bool was;
  explicit EvalGuard(torch::nn::Module& module) : m(module), was(module.is_training()) { m.eval(); }
  ~EvalGuard() { m.train(was); }
};

// Makes layer `layer`'s cache for the position context `pc` (called again when dynamic frequencies change it).
using CacheFactory = std::function<std::unique_ptr<LayerCache>(size_t layer, const PositionContext& pc)>;

struct Decoder {
  TransformerImpl& model;
  int64_t capacity;
  torch::ScalarType dtype;
  // Set: every layer's cache comes from it and every token goes through the caches (no full-attention prefill;
  // a chunk of several tokens goes to LayerCache::attend_chunk). Unset: the model's own caches (generate.cpp).
  CacheFactory custom_caches;
  PositionContext pc;
  std::vector<std::unique_ptr<LayerCache>> caches;
  std::vector<torch::Tensor> hist_k, hist_v;  // un-rotated [1, L, Hkv, D], only for length-dependent frequencies
  torch::Tensor hist_pos;                     // [1, L]

  Decoder(TransformerImpl& m, int64_t cap, CacheFactory custom = {})
      : model(m), capacity(cap), dtype(m.tok_emb_->weight.scalar_type()), custom_caches(std::move(custom)) {}

  const ModelConfig& config() const { return model.config_; }
  // tokens, positions [1, n] -> logits [1, n, V]. Without custom caches the first call (the prompt) runs the full
  // attention and later calls take one token each through the caches. `retrieve` goes to every cache's attend.
  torch::Tensor run(const torch::Tensor& tokens, const torch::Tensor& positions, bool retrieve = true);

 private:
  bool core_cache() const;
  std::unique_ptr<LayerCache> new_cache(size_t layer);
  void rebuild();  // fresh caches for `pc`, refilled from the kept history (empty at the start)
};

// The sampling settings of a generate: engine::GenerateOptions (rotary_engine/generate.h), whose sampler and checks
// (engine::check_sampling) the nn model's generation shares with the engine's.
engine::GenerateOptions sampling_options(int64_t max_new, double temperature, int64_t stop_id, uint64_t seed,
                                         int64_t sample_vocab);

struct Sampled {
  std::vector<int64_t> tokens;  // generated, stop_id excluded
  int64_t fed = 0;              // tokens fed back through the decoder after `logits`
};
// The one sampling loop, engine::sample_tokens over this decoder: samples from the last position of `logits`
// ([1, n, V], the decoder's output for the tokens up to `position` - 1; read as float32 on the CPU, as the engine's
// logits are), feeds each sampled token back at position, position + 1, ..., until max_new tokens or stop_id.
// Non-finite logits are a rotary::Error naming the id and the position.
Sampled sample_tokens(Decoder& dec, const torch::Tensor& logits, int64_t position,
                      const engine::GenerateOptions& options);

}  // namespace rotary::nn
