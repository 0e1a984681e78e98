// ModelConfig / EncodingConfig: validation, JSON, and inference-time overrides. Torch-free on purpose (fast to
// compile; a config can be checked before any tensor exists).
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <span>

#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "rotary/settings.h"
#include "rotary/t5_bias.h"
#include "rotary_nn/config.h"

namespace rotary::nn {
namespace {

using nlohmann::json;

// A setting whose value is one of the enum values `kinds`, spelled by `name` (declared once: JSON, flags, --help and
// messages list the same names; the code compares the enum).
template <class M, class Ref, class E, size_t N, class Name>
settings::Setting<M> enum_choice(const std::string& path, const std::string& flag, const std::string& help, Ref ref,
                                 const E (&kinds)[N], Name name) {
  return settings::choice<M>(
      path, flag, help, ref,
      settings::names([&kinds, name] {
        std::vector<std::string> n;
        for (E k : kinds) n.emplace_back(name(k));
        return n;
      }),
      name,
      [&kinds, name, path](const std::string& text) {
        for (E k : kinds)
          if (name(k) == text) return k;
        fail(path, text, "a name of the list");  // choice() replaces this message by one listing the names
      });
}

int derived_rotary_dim(int head_dim, double fraction) { return int(std::floor(head_dim * fraction / 2.0)) * 2; }

// Checks one encoding against the model's head dim; `prefix` ("encoding." or "override.") starts every field name.
void validate_encoding(const EncodingConfig& e, int head_dim, const std::string& prefix) {
  // First each field inside its declared range (an override built in code has not been through from_json).
  ModelConfig m;
  m.encoding = e;
  for (const auto& s : model_settings())
    if (s.path.starts_with("encoding.") && !s.path.starts_with("encoding.rope."))
      settings::checked_value(s.allowed, s.get(m), prefix + s.path.substr(std::string("encoding.").size()));
  const bool rotary = is_rotary(e.kind);
  const bool windowed = is_windowed(e.kind);
  if (rotary) {
    check(e.rope.head_dim == 0 || e.rope.head_dim == head_dim, prefix + "rope.head_dim", e.rope.head_dim,
          "0 (filled from the model) or the model's head_dim = " + std::to_string(head_dim));
    const int from_fraction = derived_rotary_dim(head_dim, e.rotary_fraction);
    if (e.rope.rotary_dim != 0 && e.rotary_fraction != 1.0)
      check(e.rope.rotary_dim == from_fraction, prefix + "rope.rotary_dim", e.rope.rotary_dim,
            "0 or head_dim * rotary_fraction rounded down to even = " + std::to_string(from_fraction) +
                " (give one of rope.rotary_dim and rotary_fraction)");
    const int r = e.rope.rotary_dim != 0 ? e.rope.rotary_dim : from_fraction;
    check(r >= 2 && r % 2 == 0 && r <= head_dim, prefix + "rope.rotary_dim", r,
          "an even number in [2, head_dim = " + std::to_string(head_dim) + "] (raise rotary_fraction)");
    RopeSpec s = e.rope;
    s.head_dim = head_dim;
    s.rotary_dim = r;
    try {
      s.validate();
    } catch (const Error& err) {
      throw Error(std::string(err.what()) + " (in " + prefix + "rope)");
    }
  }
  if (windowed) {
    check(e.window >= 1, prefix + "window", e.window, ">= 1 for " + std::string(encoding_kind_name(e.kind)));
  } else {
    check(e.window == 0, prefix + "window", e.window, "0 (only rerope and leaky_rerope use a window)");
  }
  // The ranges of window, leaky_k and logn_train_len are declared with the fields (model_settings); what each
  // kind allows of them is checked here.
  if (e.kind != EncodingKind::LeakyRerope)
    check(e.leaky_k == 1.0, prefix + "leaky_k", e.leaky_k, "1 (only leaky_rerope uses leaky_k)");
  check(e.logn_train_len == 0 || e.logn_train_len > 1, prefix + "logn_train_len", e.logn_train_len,
        "0 (off) or a training length > 1");
  if (e.kind == EncodingKind::T5) {
    try {
      validate_t5_buckets(e.t5_num_buckets, e.t5_max_distance, /*bidirectional=*/false);
    } catch (const Error& err) {
      throw Error(std::string(err.what()) + " (in " + prefix + ")");
    }
  } else {
    const EncodingConfig d;
    check(e.t5_num_buckets == d.t5_num_buckets, prefix + "t5_num_buckets", e.t5_num_buckets,
          std::to_string(d.t5_num_buckets) + " (only t5 uses buckets)");
    check(e.t5_max_distance == d.t5_max_distance, prefix + "t5_max_distance", e.t5_max_distance,
          std::to_string(d.t5_max_distance) + " (only t5 uses buckets)");
  }
}

}  // namespace

std::string_view encoding_kind_name(EncodingKind kind) {
  switch (kind) {
    case EncodingKind::None: return "none";
    case EncodingKind::Learned: return "learned";
    case EncodingKind::Sinusoidal: return "sinusoidal";
    case EncodingKind::Alibi: return "alibi";
    case EncodingKind::T5: return "t5";
    case EncodingKind::Rope: return "rope";
    case EncodingKind::Roper: return "roper";
    case EncodingKind::Rerope: return "rerope";
    case EncodingKind::LeakyRerope: return "leaky_rerope";
  }
  return "?";
}

std::string encoding_kind_names() {
  std::string s;
  for (EncodingKind k : kEncodingKinds) s += (s.empty() ? "" : ", ") + std::string(encoding_kind_name(k));
  return s;
}

EncodingKind parse_encoding_kind(std::string_view name, std::string_view field) {
  for (EncodingKind k : kEncodingKinds)
    if (encoding_kind_name(k) == name) return k;
  fail(field, std::string(name), encoding_kind_names());
}

std::ostream& operator<<(std::ostream& os, EncodingKind kind) { return os << encoding_kind_name(kind); }

std::string_view attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::Softmax: return "softmax";
    case AttentionKind::Linear: return "linear";
    case AttentionKind::Performer: return "performer";
  }
  return "?";
}
std::ostream& operator<<(std::ostream& os, AttentionKind kind) { return os << attention_kind_name(kind); }

std::string_view init_kind_name(InitKind kind) {
  switch (kind) {
    case InitKind::Gpt2: return "gpt2";
    case InitKind::FanIn: return "fan_in";
  }
  return "?";
}
std::ostream& operator<<(std::ostream& os, InitKind kind) { return os << init_kind_name(kind); }

bool is_rotary(EncodingKind kind) {
  return kind == EncodingKind::Rope || kind == EncodingKind::Roper || kind == EncodingKind::Rerope ||
         kind == EncodingKind::LeakyRerope;
}

bool has_score_bias(EncodingKind kind) { return kind == EncodingKind::Alibi || kind == EncodingKind::T5; }

bool is_windowed(EncodingKind kind) { return kind == EncodingKind::Rerope || kind == EncodingKind::LeakyRerope; }

FusedPositionMode fused_position_mode(EncodingKind kind) {
  check(is_rotary(kind), "encoding.kind", kind, "rope, roper, rerope, leaky_rerope (a kind with a fused position mode)");
  if (kind == EncodingKind::Roper) return {"rope", true};
  return {std::string(encoding_kind_name(kind)), false};
}

void ModelConfig::validate() const {
  settings::check(model_settings(), *this);  // every field inside its declared range
  check(vocab_size >= 1, "vocab_size", vocab_size, ">= 1");
  if (head_dim_override == 0)
    check(d_model % n_heads == 0, "n_heads", n_heads,
          "a divisor of d_model = " + std::to_string(d_model) + " (or set head_dim)");
  check(pre_norm || !parallel_residual, "parallel_residual", parallel_residual,
        "false with pre_norm = false (a parallel block normalises its input)");
  check(n_kv_heads == 0 || n_heads % n_kv_heads == 0, "n_kv_heads", n_kv_heads,
        "0 (= n_heads) or a divisor of n_heads = " + std::to_string(n_heads));
  validate_encoding(encoding, head_dim(), "encoding.");
  if (attention != AttentionKind::Softmax) {
    const std::string attention_name(attention_kind_name(attention));
    const bool ok = encoding.kind == EncodingKind::None || encoding.kind == EncodingKind::Learned ||
                    encoding.kind == EncodingKind::Sinusoidal || encoding.kind == EncodingKind::Rope;
    check(ok, "encoding.kind", encoding.kind,
          "none, learned, sinusoidal, rope with attention = " + attention_name +
              " (linear attention has no score bias to add, and no clipped distances or value rotation)");
    check(encoding.logn_train_len == 0, "encoding.logn_train_len", encoding.logn_train_len,
          "0 with attention = " + attention_name +
              " (log-n sharpens a softmax's scores, which linear attention has not)");
  }
  if (attention == AttentionKind::Performer)
    check(performer_feature_count() <= 1024, "performer_features", performer_feature_count(),
          "1..1024 (the linear attention kernel's feature width; round(head_dim ln head_dim) passes it from "
          "head_dim 190 on: set performer_features)");
  if (attention != AttentionKind::Performer) {
    const ModelConfig d;
    check(performer_features == d.performer_features, "performer_features", performer_features,
          std::to_string(d.performer_features) + " (only attention = performer uses random features)");
    check(performer_redraw == d.performer_redraw, "performer_redraw", performer_redraw,
          std::to_string(d.performer_redraw) + " (only attention = performer redraws features)");
  }
  // The fused attention kernel takes head dims 16..256; linear attention never calls it.
  if (fused && attention == AttentionKind::Softmax)
    check(head_dim() >= 16 && head_dim() <= 256, "head_dim", head_dim(),
          "16..256 with fused = true (the fused attention kernel's range); set fused = false for other sizes");
}

int ModelConfig::performer_feature_count() const {
  if (performer_features > 0) return performer_features;
  const double d = head_dim();  // m ~ d ln d (Choromanski et al., Theorem 4: enough for a uniform approximation)
  return std::max(1, int(std::lround(d * std::log(d))));
}

EncodingConfig ModelConfig::resolved_encoding() const {
  EncodingConfig e = encoding;
  if (is_rotary(e.kind)) {
    e.rope.head_dim = head_dim();
    if (e.rope.rotary_dim == 0) e.rope.rotary_dim = derived_rotary_dim(head_dim(), e.rotary_fraction);
  }
  return e;
}

EncodingConfig apply_override(const ModelConfig& trained, const EncodingOverride& o) {
  EncodingConfig e = trained.resolved_encoding();
  const EncodingKind was = trained.encoding.kind;
  const std::string was_name(encoding_kind_name(was));
  if (o.kind) {
    // RoPE, ReRoPE and Leaky ReRoPE rotate q and k alike and differ only in the distances they use, so a model
    // trained with one runs with another; every other kind changes what the weights were trained on.
    auto same_weights = [](EncodingKind k) { return k == EncodingKind::Rope || is_windowed(k); };
    if (same_weights(was)) {
      check(same_weights(*o.kind), "override.kind", *o.kind,
            "rope, rerope, leaky_rerope for a model trained with " + was_name +
                " (other kinds change what the weights were trained on)");
    } else {
      check(*o.kind == was, "override.kind", *o.kind,
            was_name + " (a model trained with " + was_name + " can change its parameters, not its kind)");
    }
    e.kind = *o.kind;
    // Fields the new kind does not use go back to their defaults unless the override sets them.
    if (!is_windowed(e.kind) && !o.window) e.window = 0;
    if (e.kind != EncodingKind::LeakyRerope && !o.leaky_k) e.leaky_k = 1.0;
  }
  if (o.rope) {
    check(is_rotary(e.kind), "override.rope", "given",
          "none for kind " + std::string(encoding_kind_name(e.kind)) + " (it has no rotation)");
    RopeSpec s = *o.rope;
    check(s.head_dim == 0 || s.head_dim == e.rope.head_dim, "override.rope.head_dim", s.head_dim,
          "0 or the model's head_dim = " + std::to_string(e.rope.head_dim));
    check(s.rotary_dim == 0 || s.rotary_dim == e.rope.rotary_dim, "override.rope.rotary_dim", s.rotary_dim,
          "0 or the trained rotary_dim = " + std::to_string(e.rope.rotary_dim) +
              " (the other features were trained without rotation)");
    check(s.layout == e.rope.layout, "override.rope.layout", layout_name(s.layout),
          std::string(layout_name(e.rope.layout)) + " (the layout the weights were trained with)");
    s.head_dim = e.rope.head_dim;
    s.rotary_dim = e.rope.rotary_dim;
    e.rope = s;
  }
  if (o.window) e.window = *o.window;
  if (o.leaky_k) e.leaky_k = *o.leaky_k;
  if (o.logn_train_len) e.logn_train_len = *o.logn_train_len;
  validate_encoding(e, trained.head_dim(), "override.");
  if (trained.attention != AttentionKind::Softmax)
    check(e.logn_train_len == 0, "override.logn_train_len", e.logn_train_len,
          "0 with attention = " + std::string(attention_kind_name(trained.attention)));
  return e;
}

// ---- JSON: every field declared once (rotary/settings.h) -------------------------------------------------------

const settings::Table<RopeSpec>& rope_settings() {
  using namespace settings;
  static const Table<RopeSpec> table = [] {
    using S = RopeSpec;
    Table<S> t;
    // Ranges and cross-field rules belong to RopeSpec::validate() (the core's one check of a rotation); these
    // declare types, names and flags.
    t.push_back(field<S>("head_dim", "", "head dimension (0 = from the model)", [](auto& s) -> auto& { return s.head_dim; },
                         integers(0, std::numeric_limits<int>::max())));
    t.push_back(field<S>("rotary_dim", "", "rotated features per head (0 = from rotary_fraction)",
                         [](auto& s) -> auto& { return s.rotary_dim; }, integers(0, std::numeric_limits<int>::max())));
    t.push_back(field<S>("base", "--rope-base", "RoPE base (theta)", [](auto& s) -> auto& { return s.base; }, any_real()));
    t.push_back(choice<S>("layout", "--rope-layout", "which features form a rotation pair",
                          [](auto& s) -> auto& { return s.layout; },
                          names([] { return std::vector<std::string>{"half_split", "interleaved"}; }),
                          layout_name, parse_layout));
    t.push_back(choice<S>("scaling", "--rope-scaling", "context-extension scaling",
                          [](auto& s) -> auto& { return s.scaling; },
                          names([] {
                            return std::vector<std::string>{"none", "linear", "ntk_fixed", "ntk_mixed", "dynamic",
                                                            "yarn", "llama3", "longrope", "explicit"};
                          }),
                          scaling_name, parse_scaling));
    t.push_back(field<S>("factor", "--rope-factor", "context-extension factor of the scaling",
                         [](auto& s) -> auto& { return s.factor; }, any_real()));
    t.push_back(field<S>("max_position_embeddings", "", "the configured context (dynamic, yarn, longrope)",
                         [](auto& s) -> auto& { return s.max_position_embeddings; }, integers(0, kMaxAbsPosition)));
    t.push_back(field<S>("original_max_position_embeddings", "--rope-original-max",
                         "pre-extension context (yarn, llama3, longrope; 0 = not given)",
                         [](auto& s) -> auto& { return s.original_max_position_embeddings; }, integers(0, kMaxAbsPosition)));
    t.push_back(field<S>("ntk_mixed_exponent", "", "ntk_mixed: exponent b of exp(a i^b)",
                         [](auto& s) -> auto& { return s.ntk_mixed_exponent; }, any_real()));
    t.push_back(field<S>("yarn.beta_fast", "", "yarn: fast boundary of the ramp",
                         [](auto& s) -> auto& { return s.yarn.beta_fast; }, any_real()));
    t.push_back(field<S>("yarn.beta_slow", "", "yarn: slow boundary of the ramp",
                         [](auto& s) -> auto& { return s.yarn.beta_slow; }, any_real()));
    t.push_back(field<S>("yarn.truncate", "", "yarn: round the correction range to integers",
                         [](auto& s) -> auto& { return s.yarn.truncate; }, boolean()));
    t.push_back(field<S>("yarn.mscale", "", "yarn: DeepSeek-style mscale",
                         [](auto& s) -> auto& { return s.yarn.mscale; }, optional_real()));
    t.push_back(field<S>("yarn.mscale_all_dim", "", "yarn: DeepSeek-style mscale_all_dim",
                         [](auto& s) -> auto& { return s.yarn.mscale_all_dim; }, optional_real()));
    t.push_back(field<S>("llama3.low_freq_factor", "", "llama3: low-frequency factor",
                         [](auto& s) -> auto& { return s.llama3.low_freq_factor; }, any_real()));
    t.push_back(field<S>("llama3.high_freq_factor", "", "llama3: high-frequency factor",
                         [](auto& s) -> auto& { return s.llama3.high_freq_factor; }, any_real()));
    t.push_back(field<S>("short_factor", "", "longrope: per-pair factors up to the original context",
                         [](auto& s) -> auto& { return s.short_factor; }, real_list()));
    t.push_back(field<S>("long_factor", "", "longrope: per-pair factors beyond it",
                         [](auto& s) -> auto& { return s.long_factor; }, real_list()));
    t.push_back(field<S>("freq_factors", "", "explicit: per-pair frequency divisors",
                         [](auto& s) -> auto& { return s.freq_factors; }, real_list()));
    t.push_back(field<S>("attention_factor", "", "overrides the computed attention factor",
                         [](auto& s) -> auto& { return s.attention_factor; }, optional_real()));
    return t;
  }();
  return table;
}

const settings::Table<ModelConfig>& model_settings() {
  using namespace settings;
  static const Table<ModelConfig> table = [] {
    using M = ModelConfig;
    constexpr int kIntMax = std::numeric_limits<int>::max();
    Table<M> t;
    t.push_back(field<M>("vocab_size", "", "token ids (0 = from the task)", [](auto& c) -> auto& { return c.vocab_size; },
                         integers(0, kIntMax)));
    t.push_back(field<M>("d_model", "--d-model", "model width", [](auto& c) -> auto& { return c.d_model; }, integers(1, 1 << 16)));
    t.push_back(field<M>("n_layers", "--n-layers", "transformer blocks", [](auto& c) -> auto& { return c.n_layers; },
                         integers(1, 1024)));
    t.push_back(field<M>("n_heads", "--n-heads", "attention heads", [](auto& c) -> auto& { return c.n_heads; },
                         integers(1, 4096)));
    t.push_back(field<M>("n_kv_heads", "--n-kv-heads", "key/value heads", [](auto& c) -> auto& { return c.n_kv_heads; },
                         integers(0, 4096, "0 = n_heads")));
    t.push_back(field<M>("d_ff", "--d-ff", "MLP width", [](auto& c) -> auto& { return c.d_ff; },
                         integers(0, 1 << 20, "0 = 4 * d_model")));
    // Fields added for checkpoints of other architectures are written only when they differ from GPT-2's
    // defaults, so the configs the lab stored before keep their form.
    auto if_not_default = [](Setting<M> s) {
      s.written = [get = s.get](const M& c) { return get(c) != get(M{}); };
      return s;
    };
    t.push_back(if_not_default(field<M>("head_dim", "--head-dim", "per-head width",
                                        [](auto& c) -> auto& { return c.head_dim_override; },
                                        integers(0, 1 << 16, "0 = d_model / n_heads"))));
    Setting<M> norm = field<M>("pre_norm", "--norm", "LayerNorm before (pre) or after (post) each block",
                               [](auto& c) -> auto& { return c.pre_norm; }, boolean());
    norm.flag_words = {"post", "pre"};
    t.push_back(std::move(norm));
    t.push_back(if_not_default(enum_choice<M>(
        "normalization", "--normalization", "the blocks' norm", [](auto& c) -> auto& { return c.normalization; },
        engine::kNormKinds, engine::norm_kind_name)));
    t.push_back(if_not_default(field<M>("norm_eps", "--norm-eps", "epsilon of every norm",
                                        [](auto& c) -> auto& { return c.norm_eps; }, reals(0, 1, true, false))));
    t.push_back(if_not_default(enum_choice<M>("mlp", "--mlp", "the MLP's form (swiglu: down(silu(gate) * up))",
                                              [](auto& c) -> auto& { return c.mlp; }, engine::kMlpKinds,
                                              engine::mlp_kind_name)));
    t.push_back(if_not_default(field<M>("qkv_bias", "--qkv-bias", "biases on the q, k, v projections",
                                        [](auto& c) -> auto& { return c.qkv_bias; }, boolean())));
    t.push_back(if_not_default(field<M>("out_bias", "--out-bias", "bias on the attention's output projection",
                                        [](auto& c) -> auto& { return c.out_bias; }, boolean())));
    t.push_back(if_not_default(field<M>("mlp_bias", "--mlp-bias", "biases on the MLP's projections",
                                        [](auto& c) -> auto& { return c.mlp_bias; }, boolean())));
    t.push_back(if_not_default(field<M>("parallel_residual", "--parallel-residual",
                                        "attention and MLP side by side on the same input (GPT-NeoX)",
                                        [](auto& c) -> auto& { return c.parallel_residual; }, boolean())));
    t.push_back(if_not_default(field<M>("sliding_window", "",
                                        "the checkpoint's attention span (longer sequences are refused)",
                                        [](auto& c) -> auto& { return c.sliding_window; },
                                        integers(0, kMaxAbsPosition, "0 = none"))));
    t.push_back(field<M>("dropout", "--dropout", "dropout rate", [](auto& c) -> auto& { return c.dropout; },
                         reals(0, 1, false, true)));
    t.push_back(field<M>("tie_embeddings", "--tie-embeddings", "share the input embedding and the LM head",
                         [](auto& c) -> auto& { return c.tie_embeddings; }, boolean()));
    t.push_back(if_not_default(enum_choice<M>(
        "init", "--init", "the parameters' start: gpt2 (N(0, 0.02)) or fan_in (torch's: +-1/sqrt(inputs), embeddings N(0, 1))",
        [](auto& c) -> auto& { return c.init; }, kInitKinds, init_kind_name)));
    t.push_back(field<M>("max_seq_len", "--max-seq-len", "learned positions: table size",
                         [](auto& c) -> auto& { return c.max_seq_len; }, integers(1, kMaxSequenceLength)));
    t.push_back(enum_choice<M>("attention", "--attention",
                               "softmax, linear (RoPE as in RoFormer eq. 19) or performer (FAVOR+, rope before "
                               "the feature map)",
                               [](auto& c) -> auto& { return c.attention; }, kAttentionKinds, attention_kind_name));
    // Written only for the performer, so the configs of the other kinds keep their form.
    auto performer_only = [](Setting<M> s) {
      s.written = [](const M& c) { return c.attention == AttentionKind::Performer; };
      return s;
    };
    t.push_back(performer_only(field<M>("performer_features", "--performer-features",
                                        "performer: random features per layer",
                                        [](auto& c) -> auto& { return c.performer_features; },
                                        integers(0, 1024, "0 = round(head_dim ln head_dim)"))));
    t.push_back(performer_only(field<M>("performer_redraw", "--performer-redraw",
                                        "performer: redraw the random features every N training steps",
                                        [](auto& c) -> auto& { return c.performer_redraw; },
                                        integers(0, kMaxAbsPosition, "0 = never"))));
    t.push_back(field<M>("fused", "--fused", "rotary's fused ops (true) or plain torch ops (false)",
                         [](auto& c) -> auto& { return c.fused; }, boolean()));
    t.push_back(enum_choice<M>("encoding.kind", "--encoding", "how positions enter the model",
                               [](auto& c) -> auto& { return c.encoding.kind; }, kEncodingKinds, encoding_kind_name));
    nest(t, "encoding.rope", rope_settings(), [](auto& c) -> auto& { return c.encoding.rope; });
    t.push_back(field<M>("encoding.rotary_fraction", "--rotary-fraction", "fraction of each head that rotates",
                         [](auto& c) -> auto& { return c.encoding.rotary_fraction; }, reals(0, 1, true, false)));
    t.push_back(field<M>("encoding.window", "--window", "rerope / leaky_rerope window",
                         [](auto& c) -> auto& { return c.encoding.window; }, integers(0, kMaxAbsPosition, "0 = no window")));
    t.push_back(field<M>("encoding.leaky_k", "--leaky-k", "leaky_rerope: slope 1/k beyond the window",
                         [](auto& c) -> auto& { return c.encoding.leaky_k; }, real_above(0)));
    // Added with the t5 kind and written only for it, so the stored configs of the other kinds keep their form.
    auto t5_only = [](Setting<M> s) {
      s.written = [](const M& c) { return c.encoding.kind == EncodingKind::T5; };
      return s;
    };
    t.push_back(t5_only(field<M>("encoding.t5_num_buckets", "--t5-buckets", "t5: relative position buckets",
                                 [](auto& c) -> auto& { return c.encoding.t5_num_buckets; }, integers(2, 4096))));
    t.push_back(t5_only(field<M>("encoding.t5_max_distance", "--t5-max-distance",
                                 "t5: distances from here on share the last bucket",
                                 [](auto& c) -> auto& { return c.encoding.t5_max_distance; },
                                 integers(2, kMaxSequenceLength))));
    t.push_back(field<M>("encoding.logn_train_len", "--logn",
                         "log-n query scaling relative to this training length",
                         [](auto& c) -> auto& { return c.encoding.logn_train_len; }, integers(0, kMaxAbsPosition, "0 = off")));
    return t;
  }();
  return table;
}

json rope_spec_to_json(const RopeSpec& s) { return settings::to_json(rope_settings(), s); }

RopeSpec rope_spec_from_json(const json& j, const std::string& field) {
  RopeSpec s;
  settings::from_json(rope_settings(), j, s, field);
  return s;
}

void to_json(json& j, const EncodingConfig& e) {
  ModelConfig m;
  m.encoding = e;
  j = settings::to_json(model_settings(), m).at("encoding");
}

void from_json(const json& j, EncodingConfig& e) {
  ModelConfig m;
  settings::from_json(model_settings(), json{{"encoding", j}}, m);
  e = m.encoding;
}

void to_json(json& j, const ModelConfig& c) { j = settings::to_json(model_settings(), c); }

// Missing fields keep their defaults; unknown fields, wrong types, unknown names and values outside a field's own
// range throw rotary::Error. Rules between fields are left to validate(): a config may be completed later (the lab
// fills vocab_size 0 from its task).
void from_json(const json& j, ModelConfig& c) {
  c = ModelConfig{};
  settings::from_json(model_settings(), j, c);
}

void to_json(json& j, const EncodingOverride& o) {
  j = json::object();
  if (o.kind) j["kind"] = encoding_kind_name(*o.kind);
  if (o.rope) j["rope"] = rope_spec_to_json(*o.rope);
  if (o.window) j["window"] = *o.window;
  if (o.leaky_k) j["leaky_k"] = *o.leaky_k;
  if (o.logn_train_len) j["logn_train_len"] = *o.logn_train_len;
}

void from_json(const json& j, EncodingOverride& o) {
  const std::string p = "override";
  settings::reject_unknown_fields(j, {"kind", "rope", "window", "leaky_k", "logn_train_len"}, p);
  o = EncodingOverride{};
  // Each field is read by the trained encoding's own declaration (model_settings), so both take the same values.
  ModelConfig m;
  auto read = [&](const std::string& key) {
    const json* v = settings::find_path(j, key);
    if (!v) return false;
    const auto& s = settings::find_setting(model_settings(), "encoding." + key);
    s.set(m, settings::checked_value(s.allowed, *v, p + "." + key), p + "." + key);
    return true;
  };
  if (read("kind")) o.kind = m.encoding.kind;
  if (j.contains("rope")) o.rope = rope_spec_from_json(j.at("rope"), p + ".rope");
  if (read("window")) o.window = m.encoding.window;
  if (read("leaky_k")) o.leaky_k = m.encoding.leaky_k;
  if (read("logn_train_len")) o.logn_train_len = m.encoding.logn_train_len;
}

}  // namespace rotary::nn
