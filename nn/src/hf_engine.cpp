// A Hugging Face checkpoint for the engine: config.json through hf_model_spec, each engine tensor slot mapped to the
// checkpoint tensor hf_tensor_places names for the nn parameter in the same place, the files kept mapped.
#include "rotary_nn/hf_engine.h"

#include <map>
#include <set>

#include "rotary/error.h"
#include "rotary/safetensors.h"

namespace rotary::nn {

engine::Architecture engine_architecture(const HfModelSpec& spec) {
  const ModelConfig& c = spec.config;
  engine::Architecture a;
  a.vocab_size = c.vocab_size, a.d_model = c.d_model, a.n_layers = c.n_layers, a.n_heads = c.n_heads;
  a.n_kv_heads = c.kv_heads(), a.head_dim = c.head_dim(), a.d_ff = c.ff_dim();
  a.norm = c.normalization, a.norm_eps = c.norm_eps, a.mlp = c.mlp;
  a.qkv_bias = c.qkv_bias, a.out_bias = c.out_bias, a.mlp_bias = c.mlp_bias;
  a.parallel_residual = c.parallel_residual, a.tie_embeddings = c.tie_embeddings;
  a.fused_qkv = spec.model_type == "gpt_neox";
  a.sliding_window = c.sliding_window;
  return a;
}

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

namespace {

// The nn parameter in the place of an engine slot ("layers.3.q.weight" -> "block3.wq.weight").
std::string nn_parameter(const std::string& slot) {
  static const std::map<std::string, std::string> kParts = {
      {"attn_norm", "ln_attn"}, {"q", "wq"}, {"k", "wk"}, {"v", "wv"}, {"qkv", "wq"}, {"o", "wo"},
      {"mlp_norm", "ln_mlp"}, {"gate", "fc_gate"}, {"up", "fc_in"}, {"down", "fc_out"}};
  if (slot == "embed") return "tok_emb.weight";
  if (slot == "lm_head") return "lm_head.weight";
  if (slot.starts_with("final_norm.")) return "ln_final" + slot.substr(10);
  // layers.<i>.<part>.<weight|bias>
  const size_t a = slot.find('.', 7), b = slot.rfind('.');
  return "block" + slot.substr(7, a - 7) + "." + kParts.at(slot.substr(a + 1, b - a - 1)) + slot.substr(b);
}

}  // namespace

HfEngineCheckpoint load_hf_engine(const std::string& model_dir, const engine::LoadOptions& options) {
  HfEngineCheckpoint out;
  out.spec = hf_model_spec_file(model_dir);
  auto weights = std::make_shared<const SafetensorsCheckpoint>(SafetensorsCheckpoint::open(model_dir));
  std::map<std::string, HfTensorPlace> places;
  for (HfTensorPlace& p : hf_tensor_places(out.spec)) places[p.ours] = std::move(p);
  std::set<std::string> used;
  auto lookup = [&](const std::string& slot) {
    const HfTensorPlace& place = places.at(nn_parameter(slot));
    // A fused GPT-NeoX qkv slot is the whole query_key_value tensor (its per-head [q | k | v] rows as stored).
    const SafetensorsTensor t = weights->get(place.theirs, place.their_shape);
    used.insert(place.theirs);
    return engine::StoredTensor{t.dtype, t.data, t.shape, place.theirs};
  };
  out.model = engine::Model::load(engine_architecture(out.spec), lookup, options, weights);
  check_hf_tensors_used(out.spec, weights->names(), used, model_dir);
  return out;
}

}  // namespace rotary::nn
