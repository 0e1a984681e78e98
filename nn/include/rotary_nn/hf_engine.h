// rotary_nn/hf_engine.h: a Hugging Face model directory run by the torch-free engine (rotary_engine/model.h) - the
// architecture read from config.json as for the nn model (rotary_nn/hf_model.h), the weights memory-mapped and
// used in place (or converted once: LoadOptions::weights), and the position method of an encoding (the
// checkpoint's own, or an override as the lab's methods make them). Torch-free: the engine does not need libtorch,
// and neither does this bridge; it lives here because the HF spec does.
#pragma once

#include <memory>
#include <string>

#include "rotary_engine/model.h"
#include "rotary_nn/config.h"
#include "rotary_nn/hf_model.h"

namespace rotary::nn {

struct HfEngineCheckpoint {
  HfModelSpec spec;
  std::shared_ptr<const engine::Model> model;  // holds the mapped files while it lives
};

// rotary::Error naming the directory, tensor and field for everything load_hf_checkpoint refuses (a missing or
// mis-shaped tensor, a tensor the architecture does not use, ...).
HfEngineCheckpoint load_hf_engine(const std::string& model_dir, const engine::LoadOptions& options = {});

// The spec's architecture in the engine's terms.
engine::Architecture engine_architecture(const HfModelSpec& spec);
// The position method of a resolved encoding (rope.head_dim and rotary_dim filled; ModelConfig::resolved_encoding
// or apply_override): rope, rerope and leaky_rerope kinds, with log-n. rotary::Error naming `encoding.kind` for the
// others (a checkpoint is always rotary).
engine::PositionMethod engine_positions(const EncodingConfig& encoding);

}  // namespace rotary::nn
