// rotary_nn/hf_model.h: a Hugging Face model's config.json read as a rotary ModelConfig, and where each of our
// parameters lies in its safetensors (torch-free, so a checkpoint can be checked and fuzzed without libtorch;
// rotary_nn/hf_checkpoint.h loads the weights).
//
// Families (config.json "model_type"):
//   llama    Llama 2 / 3 / 3.1 / 3.2 (and TinyLlama, Vicuna, ...): RMSNorm, SwiGLU, no biases unless
//            attention_bias / mlp_bias say so, GQA, tied or untied head.
//   mistral  as llama; sliding_window (v0.1: 4096; absent: 4096; null, as v0.2 / v0.3 write it: no window) is
//            kept, and sequences longer than it are refused.
//   qwen2    as llama with q, k, v biases (Qwen2 / Qwen2.5); use_sliding_window as Mistral's window.
//   gpt_neox GPT-NeoX / Pythia: LayerNorm with biases, GELU, parallel residual, fused query_key_value (per head
//            [q | k | v]), partial rotation (rotary_pct); no GQA (num_key_value_heads, which GPTNeoXConfig does
//            not have, is ignored as transformers ignores it).
// The rotation - base, partial rotary, every rope_scaling type - comes from the same config.json through
// rotary::rope_spec_from_hf_config, so the checkpoint's own RoPE (Llama 3.1's llama3, Qwen's yarn, ...) is what
// runs unless the user overrides it (EncodingOverride).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "rotary_nn/config.h"

namespace rotary::nn {

inline constexpr std::string_view kHfModelTypes[] = {"llama", "mistral", "qwen2", "gpt_neox"};

struct HfModelSpec {
  std::string model_type;         // one of kHfModelTypes
  ModelConfig config;             // the architecture in our terms; encoding: rope with the checkpoint's RopeSpec
  int64_t trained_context = 0;    // the context the model was trained at: original_max_position_embeddings
                                  // where the config scales its rope, else max_position_embeddings
};

// config.json text -> the spec. rotary::Error naming `source`, the JSON field, its value and what is allowed for
// an unknown model_type, a missing or ill-typed field, an activation the family does not use, or a rope config
// rope_spec_from_hf_config refuses.
HfModelSpec hf_model_spec(std::string_view config_json, const std::string& source);
// `path`: a config.json, or a model directory holding one.
HfModelSpec hf_model_spec_file(const std::string& path);

// Where our parameter `ours` ("block0.wq.weight", named as Transformer's named_parameters()) lies in the
// checkpoint: tensor `theirs` of shape `their_shape`; part >= 0 takes rows of a fused GPT-NeoX query_key_value
// tensor (0 = q, 1 = k, 2 = v of its per-head [q | k | v] blocks).
struct HfTensorPlace {
  std::string ours;
  std::string theirs;
  std::vector<int64_t> their_shape;
  int part = -1;
};
// Every parameter of the model the spec describes, in a fixed order.
std::vector<HfTensorPlace> hf_tensor_places(const HfModelSpec& spec);
// Checkpoint tensors that are not parameters and are skipped (rotary_emb.inv_freq, GPT-NeoX's attention.bias
// masks, ...): true for such a name.
bool hf_ignored_tensor(std::string_view name);
// Every checkpoint tensor (`names`) must be read (`used`) or ignorable: rotary::Error naming `model_dir`'s tensors
// (the first five) otherwise - the config is probably another checkpoint's. A tied model's stored lm_head.weight
// (a copy of the embedding) is not read and allowed.
void check_hf_tensors_used(const HfModelSpec& spec, const std::vector<std::string>& names,
                           const std::set<std::string>& used, const std::string& model_dir);

}  // namespace rotary::nn
