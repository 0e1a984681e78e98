// rotary_nn/hf_model.h: a Hugging Face model's config.json read as a rotary ModelConfig, and where each of our
// parameters lies in its safetensors (torch-free, so a checkpoint can be checked and fuzzed without libtorch;
// rotary_nn/hf_checkpoint.h loads the weights).
//
// The family, the architecture, the rotation and the table of tensor names are the engine's
// (rotary_engine/hf_model.h): the nn model reads the same description and maps the same table onto its parameters.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "rotary_engine/hf_model.h"
#include "rotary_nn/config.h"

namespace rotary::nn {

using engine::check_hf_tensors_used;
using engine::hf_ignored_tensor;
using engine::kHfModelTypes;

// The engine's description of a checkpoint (model_type, arch, rope, trained_context) and the same architecture as
// the nn model's config (encoding: rope with the checkpoint's RopeSpec).
struct HfModelSpec : engine::HfModelDescription {
  ModelConfig config;
};

// config.json text -> the spec. rotary::Error naming `source`, the JSON field, its value and what is allowed for
// an unknown model_type, a missing or ill-typed field, an activation the family does not use, or a rope config
// rope_spec_from_hf_config refuses.
HfModelSpec hf_model_spec(std::string_view config_json, const std::string& source);
// `path`: a config.json, or a model directory holding one.
HfModelSpec hf_model_spec_file(const std::string& path);
// The description as the nn model's config (rotary::Error naming `source` for what the nn model refuses).
HfModelSpec hf_model_spec(const engine::HfModelDescription& description, const std::string& source);

// Where our parameter `ours` ("block0.wq.weight", named as Transformer's named_parameters()) lies in the
// checkpoint: tensor `theirs` of shape `their_shape`; part >= 0 takes rows of a fused GPT-NeoX query_key_value
// tensor (0 = q, 1 = k, 2 = v of its per-head [q | k | v] blocks).
struct HfTensorPlace {
  std::string ours;
  std::string theirs;
  std::vector<int64_t> their_shape;
  int part = -1;
};
// Every parameter of the model the spec describes: the engine's table of names (engine::hf_tensor_names) mapped
// onto the nn model's modules.
std::vector<HfTensorPlace> hf_tensor_places(const HfModelSpec& spec);

}  // namespace rotary::nn
