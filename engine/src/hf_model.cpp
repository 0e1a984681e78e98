// A Hugging Face model directory's description for the engine: config.json -> Architecture + RopeSpec, and the
// family's table of tensor names (no kernels: the fuzz targets read configs through this file; open_hf_model.cpp
// loads the weights).
#include "rotary_engine/hf_model.h"

#include <algorithm>
#include <limits>
#include <map>

#include "rotary/error.h"
#include "rotary/hf_config.h"
#include "rotary/json_guard.h"
#include "tensor_names.h"

namespace rotary::engine {
namespace {

using nlohmann::json;

// A norm's epsilon: absent -> `fallback` (the config class's default), else a number in (0, 1).
double epsilon(const JsonObject& r, std::string_view key, double fallback) {
  const double eps = r.number(key).value_or(fallback);
  if (!(eps > 0 && eps < 1)) r.fail_at(key, *r.find(key), "a number in (0, 1)");
  return eps;
}

// An optional window: absent -> `fallback` (the config class's default), null -> 0 (transformers' None: no
// window; Mistral v0.2 / v0.3 and Qwen2 write "sliding_window": null), else an integer in [lo, hi].
int64_t window(const JsonObject& r, std::string_view key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!r.json()->contains(std::string(key))) return fallback;
  return r.integer(key, lo, hi).value_or(0);
}

// Llama, Mistral, Qwen2: RMSNorm + SwiGLU decoders that differ in defaults and biases.
void read_llama_like(const JsonObject& r, const std::string& type, Architecture& a) {
  const std::string act = r.text("hidden_act").value_or("silu");
  if (act != "silu") fail(r.path("hidden_act"), act, "silu (the " + type + " family's SwiGLU)");
  a.norm = NormKind::RmsNorm;
  a.mlp = MlpKind::SwiGlu;
  a.norm_eps = epsilon(r, "rms_norm_eps", 1e-6);
  if (type == "qwen2") {
    a.qkv_bias = true;  // Qwen2Attention: q, k, v with bias, o without
    a.out_bias = a.mlp_bias = false;
    if (r.boolean("use_sliding_window").value_or(false))
      a.sliding_window = window(r, "sliding_window", 4096, 1, kMaxAbsPosition);
  } else {
    a.qkv_bias = a.out_bias = r.boolean("attention_bias").value_or(false);
    a.mlp_bias = r.boolean("mlp_bias").value_or(false);
    if (type == "mistral") a.sliding_window = window(r, "sliding_window", 4096, 1, kMaxAbsPosition);
  }
  a.tie_embeddings = r.boolean("tie_word_embeddings").value_or(false);
}

void read_gpt_neox(const JsonObject& r, Architecture& a) {
  const std::string act = r.text("hidden_act").value_or("gelu");
  if (act == "gelu") a.mlp = MlpKind::Gelu;
  else if (act == "gelu_new" || act == "gelu_fast" || act == "gelu_pytorch_tanh") a.mlp = MlpKind::GeluTanh;
  else fail(r.path("hidden_act"), act, "gelu, gelu_new, gelu_fast, gelu_pytorch_tanh (GPT-NeoX's GELUs)");
  a.norm = NormKind::LayerNorm;
  a.norm_eps = epsilon(r, "layer_norm_eps", 1e-5);
  a.qkv_bias = a.out_bias = r.boolean("attention_bias").value_or(true);
  a.mlp_bias = true;
  a.parallel_residual = r.boolean("use_parallel_residual").value_or(true);
  a.fused_qkv = true;
  a.tie_embeddings = r.boolean("tie_word_embeddings").value_or(false);
}

std::string model_types() {
  std::string s;
  for (auto t : kHfModelTypes) s += (s.empty() ? "" : ", ") + std::string(t);
  return s;
}

const TensorNameTable& name_table(const std::string& model_type) {
  // Llama, Mistral and Qwen2 store their tensors alike (LlamaForCausalLM's module names).
  static const TensorNameTable kLlama = {
      "model.layers.",
      {{"embed", "model.embed_tokens"}, {"final_norm", "model.norm"}, {"lm_head", "lm_head"},
       {"attn_norm", "input_layernorm"}, {"q", "self_attn.q_proj"}, {"k", "self_attn.k_proj"},
       {"v", "self_attn.v_proj"}, {"o", "self_attn.o_proj"}, {"mlp_norm", "post_attention_layernorm"},
       {"gate", "mlp.gate_proj"}, {"up", "mlp.up_proj"}, {"down", "mlp.down_proj"}}};
  static const TensorNameTable kGptNeox = {
      "gpt_neox.layers.",
      {{"embed", "gpt_neox.embed_in"}, {"final_norm", "gpt_neox.final_layer_norm"}, {"lm_head", "embed_out"},
       {"attn_norm", "input_layernorm"}, {"qkv", "attention.query_key_value"}, {"o", "attention.dense"},
       {"mlp_norm", "post_attention_layernorm"}, {"up", "mlp.dense_h_to_4h"}, {"down", "mlp.dense_4h_to_h"}}};
  return model_type == "gpt_neox" ? kGptNeox : kLlama;
}

}  // namespace

PositionMethod HfModelDescription::positions() const {
  PositionMethod p;
  p.mode = PositionMode::Rope;
  p.rope = rope;
  return p;
}

HfModelDescription read_hf_model(std::string_view config_json, const std::string& source) {
  const json j = parse_json(config_json, source);
  if (!j.is_object()) fail(source, json_excerpt(j), "a JSON object (a model's config.json)");
  const JsonObject r(&j, source + ": ");
  HfModelDescription m;
  m.model_type = r.text("model_type").value_or("");
  if (std::find(std::begin(kHfModelTypes), std::end(kHfModelTypes), m.model_type) == std::end(kHfModelTypes))
    fail(source + ": model_type", m.model_type.empty() ? "missing" : m.model_type, model_types());

  Architecture& a = m.arch;
  a.vocab_size = r.required_integer("vocab_size", 1, std::numeric_limits<int>::max());
  a.d_model = r.required_integer("hidden_size", 1, 1 << 16);
  a.n_layers = r.required_integer("num_hidden_layers", 1, 1024);
  a.n_heads = r.required_integer("num_attention_heads", 1, 4096);
  // GPT-NeoX has no grouped-query attention: GPTNeoXConfig has no num_key_value_heads, and transformers ignores
  // the key where a config carries it. The Llama-like families read it (default: one kv head per head).
  a.n_kv_heads = m.model_type == "gpt_neox" ? a.n_heads : r.integer("num_key_value_heads", 1, 4096).value_or(a.n_heads);
  a.d_ff = r.required_integer("intermediate_size", 1, 1 << 20);
  if (m.model_type == "gpt_neox") read_gpt_neox(r, a);
  else read_llama_like(r, m.model_type, a);

  // The rotation, read by the core's reader (it also resolves head_dim and partial rotation).
  m.rope = rope_spec_from_hf_config(config_json);
  a.head_dim = m.rope.head_dim;
  try {
    a.validate();
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the model " + source + " describes, in rotary's terms)");
  }
  const int64_t max_pos = r.integer("max_position_embeddings", 1, kMaxAbsPosition).value_or(2048);
  m.trained_context = m.rope.original_max_position_embeddings > 0 && m.rope.scaling != RopeScaling::None
                          ? m.rope.original_max_position_embeddings
                          : max_pos;
  return m;
}

HfModelDescription read_hf_model_file(const std::string& path) {
  std::string where;
  const std::string text = read_hf_config_text(path, &where);
  return read_hf_model(text, where);
}

std::vector<HfTensorName> named_slots(const TensorNameTable& table, const Architecture& arch) {
  std::vector<HfTensorName> out;
  for (TensorSlot& slot : tensor_slots(arch)) {
    std::string stored;
    if (slot.layer >= 0) stored = std::string(table.layer_prefix) + std::to_string(slot.layer) + ".";
    stored += std::string(table.parts.at(slot.part)) + (slot.bias ? ".bias" : ".weight");
    out.push_back({std::move(slot), std::move(stored)});
  }
  return out;
}

std::vector<HfTensorName> hf_tensor_names(const HfModelDescription& model) {
  return named_slots(name_table(model.model_type), model.arch);
}

bool hf_ignored_tensor(std::string_view name) {
  // Buffers some checkpoints carry: the rotary inverse frequencies (recomputed from config.json), GPT-NeoX's
  // causal-mask buffers.
  return name.ends_with(".rotary_emb.inv_freq") || name.ends_with(".attention.bias") ||
         name.ends_with(".attention.masked_bias");
}

void check_tensors_used(const std::vector<std::string>& names, const std::set<std::string>& used,
                        const std::function<bool(const std::string&)>& allowed, const std::string& where,
                        const std::string& expected) {
  std::vector<std::string> unexpected;
  for (const std::string& name : names)
    if (!used.count(name) && !allowed(name)) unexpected.push_back(name);
  if (unexpected.empty()) return;
  std::string list;
  for (size_t i = 0; i < unexpected.size() && i < 5; ++i) list += (i ? ", " : "") + unexpected[i];
  if (unexpected.size() > 5) list += ", ... (" + std::to_string(unexpected.size()) + " in all)";
  fail(where + ": tensors", list, expected);
}

void check_hf_tensors_used(const HfModelDescription& model, const std::vector<std::string>& names,
                           const std::set<std::string>& used, const std::string& model_dir) {
  // A tied model's head is the embedding (Hugging Face ties them after loading); a stored copy is not read.
  const auto allowed = [&](const std::string& name) {
    return hf_ignored_tensor(name) || (model.arch.tie_embeddings && name == "lm_head.weight");
  };
  check_tensors_used(names, used, allowed, model_dir,
                     "only the tensors of a " + model.model_type + " model as its config.json describes it (is the "
                     "config from another checkpoint?)");
}

}  // namespace rotary::engine
