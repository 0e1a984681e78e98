// rotary/hf_config.h: a RopeSpec from a Hugging Face config.json, read as it stands.
//
// Reads what transformers reads for its rotary embedding (docs/rope-scaling.md lists every key):
//   rope_theta (default 10000; GPT-NeoX: rotary_emb_base), partial_rotary_factor (GPT-NeoX: rotary_pct),
//   head_dim (null or absent: hidden_size / num_attention_heads; MLA models: qk_rope_head_dim),
//   max_position_embeddings, original_max_position_embeddings (top level, as Phi-3, or inside the rope dict),
//   rope_scaling (rope_type or the old `type`; "su" means longrope) or transformers 5's rope_parameters,
//   and every yarn / llama3 / longrope field.
// Hugging Face models rotate half-split pairs, so the layout is HalfSplit.
// Anything malformed, missing, of the wrong type or contradictory throws rotary::Error naming the JSON field,
// its value and what is allowed.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "rotary/rope_spec.h"

namespace rotary {

RopeSpec rope_spec_from_hf_config(std::string_view json_text);

// `path` is a config.json file or a model directory holding one.
RopeSpec rope_spec_from_hf_config_file(const std::string& path);

// The text of that config.json (rotary::Error naming the path if it cannot be read); `config_path`, if given,
// receives the file's path.
std::string read_hf_config_text(const std::string& path, std::string* config_path = nullptr);

// A special token of tokenizer_config.json (`key`: bos_token, eos_token, ...) as its text: a string, or an AddedToken
// object's "content"; nullopt for null or absent. rotary::Error naming "<source>: <key>" for anything else. The one
// reading of them, for the tokenizers (their BOS / EOS ids) and the chat templates (the variables).
std::optional<std::string> hf_special_token(const nlohmann::json& config, const std::string& key,
                                            const std::string& source);

}  // namespace rotary
