// A GGUF file's description for the engine: metadata -> Architecture + RopeSpec, and the table of GGUF tensor
// names (no kernels: the fuzz target reads files through this one; open_hf_model.cpp loads the weights).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "rotary/error.h"
#include "rotary_engine/gguf_model.h"
#include "tensor_names.h"

namespace rotary::engine {
namespace {

std::string architectures() {
  std::string s;
  for (auto a : kGgufArchitectures) s += (s.empty() ? "" : ", ") + std::string(a);
  return s;
}

// Reads `{arch}.<name>` keys with the file named in every message.
class Metadata {
 public:
  Metadata(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  std::string key(std::string_view name) const { return arch_ + "." + std::string(name); }
  std::string field(std::string_view name) const { return f_.source() + ": metadata " + key(name); }
  bool has(std::string_view name) const { return f_.find(key(name)) != nullptr; }

  // A uint32 count in [lo, hi]; absent: `fallback`, or an Error when there is none.
  int64_t count(std::string_view name, int64_t lo, int64_t hi, std::optional<int64_t> fallback = std::nullopt) const {
    const std::optional<uint32_t> v = f_.get_optional<uint32_t>(key(name));
    if (!v) {
      if (fallback) return *fallback;
      fail(field(name), "missing", "a uint32 in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    if (int64_t(*v) < lo || int64_t(*v) > hi)
      fail(field(name), std::to_string(*v), "a uint32 in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return *v;
  }
  // A float32 for which `ok` holds (`allowed` says what that is); absent: `fallback`, or an Error.
  double real(std::string_view name, bool (*ok)(double), const char* allowed,
              std::optional<double> fallback = std::nullopt) const {
    const std::optional<float> v = f_.get_optional<float>(key(name));
    if (!v) {
      if (fallback) return *fallback;
      fail(field(name), "missing", std::string("a float32: ") + allowed);
    }
    if (!ok(double(*v))) fail(field(name), to_text(double(*v)), allowed);
    return double(*v);
  }
  std::optional<std::string_view> text(std::string_view name) const { return f_.get_optional_string(key(name)); }

 private:
  const GgufFile& f_;
  std::string arch_;
};

bool positive(double x) { return std::isfinite(x) && x > 0; }
bool at_least_one(double x) { return std::isfinite(x) && x >= 1; }
bool epsilon(double x) { return x > 0 && x < 1; }

// The rotation: base, partial rotation, scaling, and the layout llama.cpp's converter leaves the q and k rows in.
RopeSpec read_rope(const GgufFile& f, const Metadata& m, const std::string& arch, int64_t head_dim,
                   int64_t context) {
  RopeSpec r;
  r.head_dim = int(head_dim);
  r.rotary_dim = int(m.count("rope.dimension_count", 2, head_dim, head_dim));
  if (r.rotary_dim % 2 != 0)
    fail(m.field("rope.dimension_count"), std::to_string(r.rotary_dim), "an even number (features rotate in pairs)");
  r.base = m.real("rope.freq_base", positive, "a finite value > 0", 10000.0);
  r.layout = arch == "llama" ? RopeLayout::Interleaved : RopeLayout::HalfSplit;
  r.max_position_embeddings = context;
  const std::optional<std::string_view> type = m.text("rope.scaling.type");
  if (type && *type != "none" && *type != "linear" && *type != "yarn")
    fail(m.field("rope.scaling.type"), quoted_text(*type),
         "none, linear, yarn (llama3's scaling is the rope_freqs tensor; longrope is not read from GGUF yet)");
  if (type == "linear" || (!type && m.has("rope.scale_linear"))) {
    r.scaling = RopeScaling::Linear;
    r.factor = m.real(type ? "rope.scaling.factor" : "rope.scale_linear", at_least_one, "a finite value >= 1");
  } else if (type == "yarn") {
    r.scaling = RopeScaling::Yarn;
    r.factor = m.real("rope.scaling.factor", at_least_one, "a finite value >= 1");
    r.original_max_position_embeddings = m.count("rope.scaling.original_context_length", 1, kMaxAbsPosition);
    r.yarn.beta_fast = m.real("rope.scaling.yarn_beta_fast", positive, "a finite value > 0", 32.0);
    r.yarn.beta_slow = m.real("rope.scaling.yarn_beta_slow", positive, "a finite value > 0", 1.0);
    if (m.has("rope.scaling.yarn_attn_factor"))
      r.attention_factor = m.real("rope.scaling.yarn_attn_factor", positive, "a finite value > 0");
  }
  // Llama 3.1's llama3 scaling: llama.cpp's converter stores the per-pair divisors of the frequencies it computes
  // from config.json's rope_scaling as this tensor (float32), with no scaling key.
  if (const GgufTensor* freqs = f.find_tensor("rope_freqs.weight")) {
    const std::string field = f.source() + ": tensor rope_freqs.weight";
    if (r.scaling != RopeScaling::None)
      fail(field, "present with rope.scaling.type " + std::string(type.value_or("linear")),
           "one scaling: the rope_freqs tensor or a rope.scaling.type");
    const int64_t pairs = r.rotary_dim / 2;
    f.get_tensor("rope_freqs.weight", {pairs});
    if (freqs->type != GgmlType::F32) fail(field + ".type", ggml_type_name(freqs->type), "F32");
    r.scaling = RopeScaling::Explicit;
    r.freq_factors.resize(size_t(pairs));
    for (int64_t i = 0; i < pairs; ++i) {
      float v;
      std::memcpy(&v, static_cast<const uint8_t*>(freqs->data) + 4 * i, 4);
      if (!positive(double(v))) fail(field + "[" + std::to_string(i) + "]", to_text(double(v)), "a finite value > 0");
      r.freq_factors[size_t(i)] = double(v);
    }
  }
  try {
    r.validate();
    r.freqs(0);  // fields each in range can still overflow the frequencies (a float64 freq_base of 1e-310)
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the rotation " + f.source() + "'s metadata describes)");
  }
  return r;
}

const TensorNameTable& gguf_names() {
  // llama.cpp's names (gguf-py's MODEL_TENSOR table) for the llama and qwen2 architectures.
  static const TensorNameTable kGguf = {
      "blk.",
      {{"embed", "token_embd"}, {"final_norm", "output_norm"}, {"lm_head", "output"}, {"attn_norm", "attn_norm"},
       {"q", "attn_q"}, {"k", "attn_k"}, {"v", "attn_v"}, {"o", "attn_output"}, {"mlp_norm", "ffn_norm"},
       {"gate", "ffn_gate"}, {"up", "ffn_up"}, {"down", "ffn_down"}}};
  return kGguf;
}

}  // namespace

HfModelDescription read_gguf_model(const GgufFile& f) {
  HfModelDescription d;
  const std::optional<std::string_view> arch = f.get_optional_string("general.architecture");
  if (!arch || std::find(std::begin(kGgufArchitectures), std::end(kGgufArchitectures), *arch) ==
                   std::end(kGgufArchitectures))
    fail(f.source() + ": metadata general.architecture", arch ? quoted_text(*arch) : std::string("missing"),
         architectures());
  d.model_type = std::string(*arch);
  const Metadata m(f, d.model_type);
  Architecture& a = d.arch;
  a.d_model = m.count("embedding_length", 1, 1 << 16);
  a.n_layers = m.count("block_count", 1, 1024);
  a.n_heads = m.count("attention.head_count", 1, 4096);
  a.n_kv_heads = m.count("attention.head_count_kv", 1, 4096, a.n_heads);
  a.d_ff = m.count("feed_forward_length", 1, 1 << 20);
  a.head_dim = m.count("attention.key_length", 1, 1 << 16, a.d_model / a.n_heads);
  if (m.has("attention.value_length") && m.count("attention.value_length", 1, 1 << 16) != a.head_dim)
    fail(m.field("attention.value_length"), std::to_string(m.count("attention.value_length", 1, 1 << 16)),
         "equal to the key length " + std::to_string(a.head_dim) + " (the engine's heads are one width)");
  a.norm = NormKind::RmsNorm;
  a.mlp = MlpKind::SwiGlu;
  a.norm_eps = m.real("attention.layer_norm_rms_epsilon", epsilon, "a number in (0, 1)");
  // The vocabulary is the embedding's rows (the tokenizer's list may be shorter: padding rows).
  const GgufTensor* embed = f.find_tensor("token_embd.weight");
  if (!embed) fail(f.source() + ": tensor token_embd.weight", "missing", "the token embedding [vocab, d_model]");
  const std::vector<int64_t> shape = embed->shape();
  if (shape.size() != 2 || shape[1] != a.d_model || shape[0] > std::numeric_limits<int>::max())
    fail(f.source() + ": tensor token_embd.weight.shape", "[" + [&] {
           std::string s;
           for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
           return s;
         }() + "]", "[vocab, " + std::to_string(a.d_model) + "]");
  a.vocab_size = shape[0];
  if (m.has("vocab_size")) {
    const int64_t v = m.count("vocab_size", 1, std::numeric_limits<int>::max());
    if (v != a.vocab_size)
      fail(m.field("vocab_size"), std::to_string(v), "token_embd.weight's rows, " + std::to_string(a.vocab_size));
  }
  // Biases: Qwen2's q, k, v always; a llama file's where stored (attention_bias / mlp_bias in its config.json).
  if (d.model_type == "qwen2") {
    a.qkv_bias = true;
  } else {
    a.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
    a.out_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
    a.mlp_bias = f.find_tensor("blk.0.ffn_up.bias") != nullptr;
  }
  a.tie_embeddings = f.find_tensor("output.weight") == nullptr;
  const int64_t context = m.count("context_length", 1, kMaxAbsPosition);
  d.rope = read_rope(f, m, d.model_type, a.head_dim, context);
  try {
    a.validate();
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the model " + f.source() + " describes, in rotary's terms)");
  }
  d.trained_context = d.rope.original_max_position_embeddings > 0 && d.rope.scaling != RopeScaling::None
                          ? d.rope.original_max_position_embeddings
                          : context;
  return d;
}

std::vector<HfTensorName> gguf_tensor_names(const HfModelDescription& model) {
  return named_slots(gguf_names(), model.arch);
}

}  // namespace rotary::engine
