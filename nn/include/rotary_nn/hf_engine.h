// rotary_nn/hf_engine.h: a Hugging Face model directory opened by the engine (engine::open_hf_model) with the nn
// spec of the same description, and the engine's position method of an nn encoding (the checkpoint's own, or an
// override as the lab's methods make them). Torch-free: a bridge between the nn config the lab's methods are
// written in and the engine.
#pragma once

#include <memory>
#include <string>

#include "rotary_engine/hf_model.h"
#include "rotary_nn/config.h"
#include "rotary_nn/hf_model.h"

namespace rotary::nn {

struct HfEngineCheckpoint {
  HfModelSpec spec;
  std::shared_ptr<const engine::Model> model;  // holds the mapped files while it lives
};

// rotary::Error naming the directory, tensor and field for everything load_hf_checkpoint refuses (a missing or
// mis-shaped tensor, a tensor the architecture does not use, ...).
// `model_dir`: a model directory or a GGUF file (engine::open_model).
HfEngineCheckpoint load_hf_engine(const std::string& model_dir, const engine::LoadOptions& options = {});

// The position method of a resolved encoding (rope.head_dim and rotary_dim filled; ModelConfig::resolved_encoding
// or apply_override): rope, rerope and leaky_rerope kinds, with log-n. rotary::Error naming `encoding.kind` for the
// others (a checkpoint is always rotary).
engine::PositionMethod engine_positions(const EncodingConfig& encoding);

}  // namespace rotary::nn
