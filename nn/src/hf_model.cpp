// A Hugging Face checkpoint for the nn model: the engine's description of its config.json (rotary_engine/hf_model.h)
// as a ModelConfig, and the engine's table of tensor names mapped onto the nn model's parameters (torch-free).
#include "rotary_nn/hf_model.h"

#include <map>

#include "rotary/error.h"
#include "rotary/hf_config.h"

namespace rotary::nn {
namespace {

// The nn module in the place of each engine slot part (a block's inside "block<i>.").
const std::map<std::string_view, std::string_view>& nn_modules() {
  static const std::map<std::string_view, std::string_view> kModules = {
      {"embed", "tok_emb"},   {"final_norm", "ln_final"}, {"lm_head", "lm_head"}, {"attn_norm", "ln_attn"},
      {"q", "wq"},            {"k", "wk"},                {"v", "wv"},           {"o", "wo"},
      {"mlp_norm", "ln_mlp"}, {"gate", "fc_gate"},        {"up", "fc_in"},       {"down", "fc_out"}};
  return kModules;
}

}  // namespace

HfModelSpec hf_model_spec(const engine::HfModelDescription& description, const std::string& source) {
  HfModelSpec spec;
  static_cast<engine::HfModelDescription&>(spec) = description;
  const engine::Architecture& a = description.arch;
  ModelConfig& c = spec.config;
  c.vocab_size = int(a.vocab_size), c.d_model = int(a.d_model), c.n_layers = int(a.n_layers);
  c.n_heads = int(a.n_heads), c.n_kv_heads = int(a.n_kv_heads), c.d_ff = int(a.d_ff);
  if (a.head_dim * a.n_heads != a.d_model) c.head_dim_override = int(a.head_dim);
  c.pre_norm = true;
  c.normalization = a.norm, c.norm_eps = a.norm_eps, c.mlp = a.mlp;
  c.qkv_bias = a.qkv_bias, c.out_bias = a.out_bias, c.mlp_bias = a.mlp_bias;
  c.parallel_residual = a.parallel_residual, c.tie_embeddings = a.tie_embeddings;
  c.sliding_window = a.sliding_window;
  c.dropout = 0.0;
  c.attention = AttentionKind::Softmax;
  c.fused = true;
  c.encoding = EncodingConfig{};
  c.encoding.kind = EncodingKind::Rope;
  c.encoding.rope = description.rope;
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the model " + source + " describes, in rotary's terms)");
  }
  return spec;
}

HfModelSpec hf_model_spec(std::string_view config_json, const std::string& source) {
  return hf_model_spec(engine::read_hf_model(config_json, source), source);
}

HfModelSpec hf_model_spec_file(const std::string& path) {
  std::string where;
  const std::string text = read_hf_config_text(path, &where);
  return hf_model_spec(text, where);
}

std::vector<HfTensorPlace> hf_tensor_places(const HfModelSpec& spec) {
  std::vector<HfTensorPlace> out;
  for (const engine::HfTensorName& n : engine::hf_tensor_names(spec)) {
    const std::string block = n.slot.layer >= 0 ? "block" + std::to_string(n.slot.layer) + "." : "";
    const std::string param = n.slot.bias ? ".bias" : ".weight";
    if (n.slot.part == "qkv") {
      // GPT-NeoX's fused query_key_value: the nn model's q, k and v each take their rows of it.
      const char* parts[] = {"wq", "wk", "wv"};
      for (int part = 0; part < 3; ++part) out.push_back({block + parts[part] + param, n.stored, n.slot.shape, part});
      continue;
    }
    out.push_back({block + std::string(nn_modules().at(n.slot.part)) + param, n.stored, n.slot.shape});
  }
  return out;
}

}  // namespace rotary::nn
