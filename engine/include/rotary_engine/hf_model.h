// rotary_engine/hf_model.h: a Hugging Face model directory opened by the engine itself - config.json read as the
// engine's Architecture and the checkpoint's RopeSpec, the tensors found by one table per family of Hugging Face
// names -> engine slots, the safetensors (one file or sharded) mapped and read in place (rotary_engine/model.h).
//
// Families (config.json "model_type"; the defaults where config.json leaves a key out are those of transformers'
// config classes: LlamaConfig, MistralConfig, Qwen2Config, GPTNeoXConfig):
//   llama    Llama 2 / 3 / 3.1 / 3.2 (and TinyLlama, Vicuna, ...): RMSNorm, SwiGLU, no biases unless
//            attention_bias / mlp_bias say so, GQA, tied or untied head.
//   mistral  as llama; sliding_window (v0.1: 4096; absent: 4096; null, as v0.2 / v0.3 write it: no window) is
//            kept, and sequences longer than it are refused.
//   qwen2    as llama with q, k, v biases (Qwen2 / Qwen2.5); use_sliding_window as Mistral's window.
//   gpt_neox GPT-NeoX / Pythia: LayerNorm with biases, GELU, parallel residual, fused query_key_value (per head
//            [q | k | v]), partial rotation (rotary_pct); no GQA (num_key_value_heads, which GPTNeoXConfig does
//            not have, is ignored as transformers ignores it).
// The rotation - base, partial rotary, every rope_scaling type - comes from the same config.json through the core's
// rotary::rope_spec_from_hf_config, so the checkpoint's own RoPE (Llama 3.1's llama3, Qwen's yarn, ...) is what runs
// unless a caller gives another PositionMethod.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "rotary/rope_spec.h"
#include "rotary_engine/model.h"

namespace rotary::engine {

inline constexpr std::string_view kHfModelTypes[] = {"llama", "mistral", "qwen2", "gpt_neox"};

// What a config.json describes, in the engine's terms.
struct HfModelDescription {
  std::string model_type;       // one of kHfModelTypes
  Architecture arch;            // validated
  RopeSpec rope;                // the checkpoint's rotation (head_dim and rotary_dim resolved)
  int64_t trained_context = 0;  // the context the model was trained at: original_max_position_embeddings where the
                                // config scales its rope, else max_position_embeddings
  // The checkpoint's own position method: its RoPE, no window, no log-n.
  PositionMethod positions() const;
};

// config.json text -> the description. rotary::Error naming `source`, the JSON field, its value and what is allowed
// for an unknown model_type (listing kHfModelTypes), a missing or ill-typed field, an activation the family does not
// use, a shape the engine cannot run, or a rope config rope_spec_from_hf_config refuses.
HfModelDescription read_hf_model(std::string_view config_json, const std::string& source);
// `path`: a config.json, or a model directory holding one.
HfModelDescription read_hf_model_file(const std::string& path);

// Where an engine slot (tensor_slots) is stored in the family's checkpoints: the Hugging Face tensor name and the
// shape it is stored in (a fused GPT-NeoX qkv slot is the whole query_key_value tensor, its per-head [q | k | v]
// rows as stored).
struct HfTensorName {
  TensorSlot slot;
  std::string stored;
};
// Every slot of the description's architecture, in tensor_slots' order, with its stored name: the family's table.
std::vector<HfTensorName> hf_tensor_names(const HfModelDescription& model);
// Checkpoint tensors that are not weights and are skipped (rotary_emb.inv_freq, GPT-NeoX's attention.bias masks,
// ...): true for such a name.
bool hf_ignored_tensor(std::string_view name);
// Every checkpoint tensor (`names`) must be read (`used`) or ignorable: rotary::Error naming `model_dir`'s tensors
// (the first five) otherwise - the config is probably another checkpoint's. A tied model's stored lm_head.weight
// (a copy of the embedding) is not read and allowed.
void check_hf_tensors_used(const HfModelDescription& model, const std::vector<std::string>& names,
                           const std::set<std::string>& used, const std::string& model_dir);

// A model directory opened: config.json, the safetensors mapped (kept mapped while the model lives) and every
// tensor found, checked and used in place or converted (LoadOptions). rotary::Error naming the directory, tensor
// and field for everything refused (a missing or mis-shaped tensor, a tensor the architecture does not use, a
// non-finite weight, ...).
struct HfModel {
  HfModelDescription description;
  std::shared_ptr<const Model> model;
};
HfModel open_hf_model(const std::string& model_dir, const LoadOptions& options = {});

// A model path as the commands take it: a GGUF file (a regular file named *.gguf: open_gguf_model,
// rotary_engine/gguf_model.h), else a Hugging Face model directory (open_hf_model).
bool is_gguf_path(const std::string& path);
HfModel open_model(const std::string& path, const LoadOptions& options = {});

}  // namespace rotary::engine
