// A Hugging Face checkpoint for the engine as the lab runs it: the engine opens the directory (or a GGUF file) itself
// (engine::open_model); the nn spec of the same description gives the lab its config and overrides.
#include "rotary_nn/hf_engine.h"

#include "rotary/error.h"

namespace rotary::nn {

engine::PositionMethod engine_positions(const EncodingConfig& e) {
  engine::PositionMethod p;
  switch (e.kind) {
    case EncodingKind::Rope: p.mode = PositionMode::Rope; break;
    case EncodingKind::Rerope: p.mode = PositionMode::Rerope; break;
    case EncodingKind::LeakyRerope: p.mode = PositionMode::LeakyRerope; break;
    default: fail("encoding.kind", std::string(encoding_kind_name(e.kind)), "rope, rerope, leaky_rerope (the engine runs checkpoints' rotary attention)");
  }
  p.rope = e.rope, p.window = e.window, p.leaky_k = e.leaky_k, p.logn_train_len = e.logn_train_len;
  return p;
}

HfEngineCheckpoint load_hf_engine(const std::string& model_dir, const engine::LoadOptions& options) {
  engine::HfModel opened = engine::open_model(model_dir, options);
  return {hf_model_spec(opened.description, model_dir), std::move(opened.model)};
}

}  // namespace rotary::nn
