// Hugging Face config.json -> ModelConfig, and the checkpoint's tensor names for each of our parameters
// (torch-free). The defaults below are those of transformers' config classes (LlamaConfig, MistralConfig,
// Qwen2Config, GPTNeoXConfig), used where config.json leaves a key out.
#include "rotary_nn/hf_model.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "rotary/error.h"
#include "rotary/hf_config.h"
#include "rotary/json_guard.h"

namespace rotary::nn {
namespace {

using nlohmann::json;

// A norm's epsilon: absent -> `fallback` (the config class's default), else a number in (0, 1].
double epsilon(const JsonObject& r, std::string_view key, double fallback) {
  const double eps = r.number(key).value_or(fallback);
  if (!(eps > 0 && eps <= 1)) r.fail_at(key, *r.find(key), "a number in (0, 1]");
  return eps;
}

// An optional window: absent -> `fallback` (the config class's default), null -> 0 (transformers' None: no
// window; Mistral v0.2 / v0.3 and Qwen2 write "sliding_window": null), else an integer in [lo, hi].
int64_t window(const JsonObject& r, std::string_view key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!r.json()->contains(std::string(key))) return fallback;
  return r.integer(key, lo, hi).value_or(0);
}

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// Llama, Mistral, Qwen2: RMSNorm + SwiGLU decoders that differ in defaults and biases.
void read_llama_like(const JsonObject& r, const std::string& type, ModelConfig& c) {
  const std::string act = r.text("hidden_act").value_or("silu");
  if (act != "silu") fail(r.path("hidden_act"), act, "silu (the " + type + " family's SwiGLU)");
  c.normalization = NormKind::RmsNorm;
  c.mlp = MlpKind::SwiGlu;
  c.norm_eps = epsilon(r, "rms_norm_eps", 1e-6);
  if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2Attention: q, k, v with bias, o without
    c.out_bias = false;
    c.mlp_bias = false;
    if (r.boolean("use_sliding_window").value_or(false))
      c.sliding_window = window(r, "sliding_window", 4096, 1, kMaxAbsPosition);
  } else {
    c.qkv_bias = c.out_bias = r.boolean("attention_bias").value_or(false);
    c.mlp_bias = r.boolean("mlp_bias").value_or(false);
    if (type == "mistral") c.sliding_window = window(r, "sliding_window", 4096, 1, kMaxAbsPosition);
  }
  c.tie_embeddings = r.boolean("tie_word_embeddings").value_or(false);
}

void read_gpt_neox(const JsonObject& r, ModelConfig& c) {
  const std::string act = r.text("hidden_act").value_or("gelu");
  if (act == "gelu") c.mlp = MlpKind::Gelu;
  else if (act == "gelu_new" || act == "gelu_fast" || act == "gelu_pytorch_tanh") c.mlp = MlpKind::GeluTanh;
  else fail(r.path("hidden_act"), act, "gelu, gelu_new, gelu_fast, gelu_pytorch_tanh (GPT-NeoX's GELUs)");
  c.normalization = NormKind::LayerNorm;
  c.norm_eps = epsilon(r, "layer_norm_eps", 1e-5);
  c.qkv_bias = c.out_bias = r.boolean("attention_bias").value_or(true);
  c.mlp_bias = true;
  c.parallel_residual = r.boolean("use_parallel_residual").value_or(true);
  c.tie_embeddings = r.boolean("tie_word_embeddings").value_or(false);
}

std::string model_types() {
  std::string s;
  for (auto t : kHfModelTypes) s += (s.empty() ? "" : ", ") + std::string(t);
  return s;
}

}  // namespace

HfModelSpec hf_model_spec(std::string_view config_json, const std::string& source) {
  const json j = parse_json(config_json, source);
  if (!j.is_object()) fail(source, json_excerpt(j), "a JSON object (a model's config.json)");
  const JsonObject r(&j, source + ": ");
  HfModelSpec spec;
  spec.model_type = r.text("model_type").value_or("");
  if (std::find(std::begin(kHfModelTypes), std::end(kHfModelTypes), spec.model_type) == std::end(kHfModelTypes))
    fail(source + ": model_type", spec.model_type.empty() ? "missing" : spec.model_type, model_types());

  ModelConfig& c = spec.config;
  c.vocab_size = int(r.required_integer("vocab_size", 1, kIntMax));
  c.d_model = int(r.required_integer("hidden_size", 1, 1 << 16));
  c.n_layers = int(r.required_integer("num_hidden_layers", 1, 1024));
  c.n_heads = int(r.required_integer("num_attention_heads", 1, 4096));
  // GPT-NeoX has no grouped-query attention: GPTNeoXConfig has no num_key_value_heads, and transformers ignores
  // the key where a config carries it. The Llama-like families read it (default: one kv head per head).
  c.n_kv_heads = spec.model_type == "gpt_neox" ? c.n_heads
                                               : int(r.integer("num_key_value_heads", 1, 4096).value_or(c.n_heads));
  c.d_ff = int(r.required_integer("intermediate_size", 1, 1 << 20));
  c.pre_norm = true;
  c.dropout = 0.0;
  c.attention = AttentionKind::Softmax;
  c.fused = true;
  if (spec.model_type == "gpt_neox") read_gpt_neox(r, c);
  else read_llama_like(r, spec.model_type, c);

  // The rotation, read by the core's reader (it also resolves head_dim and partial rotation).
  RopeSpec rope = rope_spec_from_hf_config(config_json);
  if (rope.head_dim * c.n_heads != c.d_model) c.head_dim_override = rope.head_dim;
  c.encoding = EncodingConfig{};
  c.encoding.kind = EncodingKind::Rope;
  c.encoding.rope = rope;
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the model " + source + " describes, in rotary's terms)");
  }
  const int64_t max_pos = r.integer("max_position_embeddings", 1, kMaxAbsPosition).value_or(2048);
  spec.trained_context = rope.original_max_position_embeddings > 0 && rope.scaling != RopeScaling::None
                             ? rope.original_max_position_embeddings
                             : max_pos;
  return spec;
}

HfModelSpec hf_model_spec_file(const std::string& path) {
  std::string where;
  const std::string text = read_hf_config_text(path, &where);
  return hf_model_spec(text, where);
}

std::vector<HfTensorPlace> hf_tensor_places(const HfModelSpec& spec) {
  const ModelConfig& c = spec.config;
  const int64_t d = c.d_model, hd = c.head_dim(), hq = int64_t(c.n_heads) * hd, hkv = int64_t(c.kv_heads()) * hd;
  const int64_t ff = c.ff_dim(), V = c.vocab_size;
  std::vector<HfTensorPlace> out;
  auto add = [&](std::string ours, std::string theirs, std::vector<int64_t> shape, int part = -1) {
    out.push_back({std::move(ours), std::move(theirs), std::move(shape), part});
  };
  auto linear = [&](const std::string& ours, const std::string& theirs, int64_t in, int64_t outf, bool bias) {
    add(ours + ".weight", theirs + ".weight", {outf, in});
    if (bias) add(ours + ".bias", theirs + ".bias", {outf});
  };
  auto norm = [&](const std::string& ours, const std::string& theirs) {
    add(ours + ".weight", theirs + ".weight", {d});
    if (c.normalization == NormKind::LayerNorm) add(ours + ".bias", theirs + ".bias", {d});
  };
  if (spec.model_type == "gpt_neox") {
    add("tok_emb.weight", "gpt_neox.embed_in.weight", {V, d});
    for (int i = 0; i < c.n_layers; ++i) {
      const std::string o = "block" + std::to_string(i), t = "gpt_neox.layers." + std::to_string(i);
      norm(o + ".ln_attn", t + ".input_layernorm");
      const char* qkv[] = {"wq", "wk", "wv"};
      for (int part = 0; part < 3; ++part) {
        add(o + "." + qkv[part] + ".weight", t + ".attention.query_key_value.weight", {3 * hq, d}, part);
        if (c.qkv_bias) add(o + "." + qkv[part] + ".bias", t + ".attention.query_key_value.bias", {3 * hq}, part);
      }
      linear(o + ".wo", t + ".attention.dense", hq, d, c.out_bias);
      norm(o + ".ln_mlp", t + ".post_attention_layernorm");
      linear(o + ".fc_in", t + ".mlp.dense_h_to_4h", d, ff, c.mlp_bias);
      linear(o + ".fc_out", t + ".mlp.dense_4h_to_h", ff, d, c.mlp_bias);
    }
    norm("ln_final", "gpt_neox.final_layer_norm");
    if (!c.tie_embeddings) add("lm_head.weight", "embed_out.weight", {V, d});
    return out;
  }
  add("tok_emb.weight", "model.embed_tokens.weight", {V, d});
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string o = "block" + std::to_string(i), t = "model.layers." + std::to_string(i);
    norm(o + ".ln_attn", t + ".input_layernorm");
    linear(o + ".wq", t + ".self_attn.q_proj", d, hq, c.qkv_bias);
    linear(o + ".wk", t + ".self_attn.k_proj", d, hkv, c.qkv_bias);
    linear(o + ".wv", t + ".self_attn.v_proj", d, hkv, c.qkv_bias);
    linear(o + ".wo", t + ".self_attn.o_proj", hq, d, c.out_bias);
    norm(o + ".ln_mlp", t + ".post_attention_layernorm");
    linear(o + ".fc_gate", t + ".mlp.gate_proj", d, ff, c.mlp_bias);
    linear(o + ".fc_in", t + ".mlp.up_proj", d, ff, c.mlp_bias);
    linear(o + ".fc_out", t + ".mlp.down_proj", ff, d, c.mlp_bias);
  }
  norm("ln_final", "model.norm");
  if (!c.tie_embeddings) add("lm_head.weight", "lm_head.weight", {V, d});
  return out;
}

bool hf_ignored_tensor(std::string_view name) {
  // Buffers some checkpoints carry: the rotary inverse frequencies (recomputed from config.json), GPT-NeoX's
  // causal-mask buffers. A tied checkpoint may also store lm_head.weight as a copy of the embedding.
  return name.ends_with(".rotary_emb.inv_freq") || name.ends_with(".attention.bias") ||
         name.ends_with(".attention.masked_bias");
}

void check_hf_tensors_used(const HfModelSpec& spec, const std::vector<std::string>& names,
                           const std::set<std::string>& used, const std::string& model_dir) {
  std::vector<std::string> unexpected;
  for (const std::string& name : names) {
    if (used.count(name) || hf_ignored_tensor(name)) continue;
    // A tied model's head is the embedding (Hugging Face ties them after loading); a stored copy is not read.
    if (spec.config.tie_embeddings && name == "lm_head.weight") continue;
    unexpected.push_back(name);
  }
  if (unexpected.empty()) return;
  std::string list;
  for (size_t i = 0; i < unexpected.size() && i < 5; ++i) list += (i ? ", " : "") + unexpected[i];
  if (unexpected.size() > 5) list += ", ... (" + std::to_string(unexpected.size()) + " in all)";
  fail(model_dir + ": tensors", list,
       "only the tensors of a " + spec.model_type + " model as its config.json describes it (is the config from "
       "another checkpoint?)");
}

}  // namespace rotary::nn
