// ModelConfig / EncodingConfig: validation, JSON, and inference-time overrides. Torch-free on purpose (fast to
// compile; a config can be checked before any tensor exists).
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <span>

#include "rotary/error.h"
#include "rotary/json_guard.h"
#include "rotary_nn/config.h"

namespace rotary::nn {
namespace {

using nlohmann::json;

std::string choices(std::span<const std::string_view> names) {
  std::string s;
  for (auto n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

bool is_one_of(std::string_view v, std::span<const std::string_view> names) {
  return std::find(names.begin(), names.end(), v) != names.end();
}

// Typed field readers: a wrong JSON type is a rotary::Error naming the field, not a nlohmann type_error.
template <class T>
void read(const json& j, const char* key, const std::string& prefix, T& out) {
  if (!j.contains(key)) return;
  const json& v = j.at(key);
  // Messages are built only on failure, and show the value shortened (json_excerpt), however large or deep.
  auto refuse = [&](std::string_view allowed) { fail(prefix + key, json_excerpt(v), allowed); };
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) refuse("true or false");
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) refuse("an integer");
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                                             : v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                                   v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max());
    if (!fits) refuse("an integer in range of " + std::string(sizeof(T) == 8 ? "int64" : "int32"));
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) refuse("a number");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) refuse("a string");
  }
  if constexpr (std::is_same_v<T, std::vector<double>>) {
    if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_number(); }))
      refuse("an array of numbers");
  }
  out = v.get<T>();
}

void reject_unknown(const json& j, std::initializer_list<const char*> known, const std::string& prefix) {
  if (!j.is_object()) fail(prefix.empty() ? "config" : prefix.substr(0, prefix.size() - 1), json_excerpt(j), "a JSON object");
  std::set<std::string> names(known.begin(), known.end());
  std::string list;
  for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
  for (auto it = j.begin(); it != j.end(); ++it)
    check(names.count(it.key()) > 0, prefix + it.key(), "(unknown field)", "one of " + list);
}

int derived_rotary_dim(int head_dim, double fraction) { return int(std::floor(head_dim * fraction / 2.0)) * 2; }

// Checks one encoding against the model's head dim; `prefix` ("encoding." or "override.") starts every field name.
void validate_encoding(const EncodingConfig& e, int head_dim, const std::string& prefix) {
  const bool rotary = is_rotary(e.kind);
  const bool windowed = is_windowed(e.kind);
  if (rotary) {
    check(std::isfinite(e.rotary_fraction) && e.rotary_fraction > 0 && e.rotary_fraction <= 1,
          prefix + "rotary_fraction", e.rotary_fraction, "a value in (0, 1]");
    check(e.rope.head_dim == 0 || e.rope.head_dim == head_dim, prefix + "rope.head_dim", e.rope.head_dim,
          "0 (filled from the model) or d_model / n_heads = " + std::to_string(head_dim));
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
  if (e.kind == EncodingKind::LeakyRerope) {
    check(std::isfinite(e.leaky_k) && e.leaky_k > 0, prefix + "leaky_k", e.leaky_k, "a finite value > 0");
  } else {
    check(e.leaky_k == 1.0, prefix + "leaky_k", e.leaky_k, "1 (only leaky_rerope uses leaky_k)");
  }
  check(e.logn_train_len == 0 || e.logn_train_len > 1, prefix + "logn_train_len", e.logn_train_len,
        "0 (off) or a training length > 1");
}

}  // namespace

std::string_view encoding_kind_name(EncodingKind kind) {
  switch (kind) {
    case EncodingKind::None: return "none";
    case EncodingKind::Learned: return "learned";
    case EncodingKind::Sinusoidal: return "sinusoidal";
    case EncodingKind::Alibi: return "alibi";
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

bool is_rotary(EncodingKind kind) {
  return kind == EncodingKind::Rope || kind == EncodingKind::Roper || kind == EncodingKind::Rerope ||
         kind == EncodingKind::LeakyRerope;
}

bool is_windowed(EncodingKind kind) { return kind == EncodingKind::Rerope || kind == EncodingKind::LeakyRerope; }

FusedPositionMode fused_position_mode(EncodingKind kind) {
  check(is_rotary(kind), "encoding.kind", kind, "rope, roper, rerope, leaky_rerope (a kind with a fused position mode)");
  if (kind == EncodingKind::Roper) return {"rope", true};
  return {std::string(encoding_kind_name(kind)), false};
}

void ModelConfig::validate() const {
  check(vocab_size >= 1, "vocab_size", vocab_size, ">= 1");
  check(d_model >= 1, "d_model", d_model, ">= 1");
  check(n_layers >= 1, "n_layers", n_layers, ">= 1");
  check(n_heads >= 1 && d_model % n_heads == 0, "n_heads", n_heads,
        "a divisor of d_model = " + std::to_string(d_model));
  check(n_kv_heads == 0 || (n_kv_heads >= 1 && n_heads % n_kv_heads == 0), "n_kv_heads", n_kv_heads,
        "0 (= n_heads) or a divisor of n_heads = " + std::to_string(n_heads));
  check(d_ff >= 0, "d_ff", d_ff, ">= 0 (0: 4 * d_model)");
  check(std::isfinite(dropout) && dropout >= 0 && dropout < 1, "dropout", dropout, "a value in [0, 1)");
  check(max_seq_len >= 1, "max_seq_len", max_seq_len, ">= 1");
  check(is_one_of(attention, kAttentionKinds), "attention", attention, choices(kAttentionKinds));
  validate_encoding(encoding, head_dim(), "encoding.");
  if (attention == "linear") {
    const bool ok = encoding.kind == EncodingKind::None || encoding.kind == EncodingKind::Learned ||
                    encoding.kind == EncodingKind::Sinusoidal || encoding.kind == EncodingKind::Rope;
    check(ok, "encoding.kind", encoding.kind,
          "none, learned, sinusoidal, rope with attention = linear (RoFormer eq. 19 has no ALiBi bias, clipped "
          "distances or value rotation)");
    check(encoding.logn_train_len == 0, "encoding.logn_train_len", encoding.logn_train_len,
          "0 with attention = linear (log-n sharpens a softmax; linear attention has none)");
  }
  // The fused attention kernel takes head dims 16..256; ALiBi and linear attention never call it.
  if (fused && attention == "softmax" && encoding.kind != EncodingKind::Alibi)
    check(head_dim() >= 16 && head_dim() <= 256, "d_model / n_heads", head_dim(),
          "16..256 with fused = true (the fused attention kernel's range); set fused = false for other sizes");
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
  if (trained.attention == "linear")
    check(e.logn_train_len == 0, "override.logn_train_len", e.logn_train_len, "0 with attention = linear");
  return e;
}

// ---- JSON ----------------------------------------------------------------------------------------------------

json rope_spec_to_json(const RopeSpec& s) {
  json j = {{"head_dim", s.head_dim},
            {"rotary_dim", s.rotary_dim},
            {"base", s.base},
            {"layout", std::string(layout_name(s.layout))},
            {"scaling", std::string(scaling_name(s.scaling))},
            {"factor", s.factor},
            {"max_position_embeddings", s.max_position_embeddings},
            {"original_max_position_embeddings", s.original_max_position_embeddings},
            {"ntk_mixed_exponent", s.ntk_mixed_exponent},
            {"yarn", {{"beta_fast", s.yarn.beta_fast}, {"beta_slow", s.yarn.beta_slow}, {"truncate", s.yarn.truncate}}},
            {"llama3", {{"low_freq_factor", s.llama3.low_freq_factor}, {"high_freq_factor", s.llama3.high_freq_factor}}},
            {"short_factor", s.short_factor},
            {"long_factor", s.long_factor},
            {"freq_factors", s.freq_factors}};
  if (s.yarn.mscale) j["yarn"]["mscale"] = *s.yarn.mscale;
  if (s.yarn.mscale_all_dim) j["yarn"]["mscale_all_dim"] = *s.yarn.mscale_all_dim;
  if (s.attention_factor) j["attention_factor"] = *s.attention_factor;
  return j;
}

RopeSpec rope_spec_from_json(const json& j, const std::string& field) {
  const std::string p = field + ".";
  reject_unknown(j,
                 {"head_dim", "rotary_dim", "base", "layout", "scaling", "factor", "max_position_embeddings",
                  "original_max_position_embeddings", "ntk_mixed_exponent", "yarn", "llama3", "short_factor",
                  "long_factor", "freq_factors", "attention_factor"},
                 p);
  RopeSpec s;
  read(j, "head_dim", p, s.head_dim);
  read(j, "rotary_dim", p, s.rotary_dim);
  read(j, "base", p, s.base);
  std::string name;
  if (j.contains("layout")) {
    read(j, "layout", p, name);
    s.layout = parse_layout(name);
  }
  if (j.contains("scaling")) {
    read(j, "scaling", p, name);
    s.scaling = parse_scaling(name);
  }
  read(j, "factor", p, s.factor);
  read(j, "max_position_embeddings", p, s.max_position_embeddings);
  read(j, "original_max_position_embeddings", p, s.original_max_position_embeddings);
  read(j, "ntk_mixed_exponent", p, s.ntk_mixed_exponent);
  if (j.contains("yarn")) {
    const json& y = j.at("yarn");
    const std::string yp = p + "yarn.";
    reject_unknown(y, {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}, yp);
    read(y, "beta_fast", yp, s.yarn.beta_fast);
    read(y, "beta_slow", yp, s.yarn.beta_slow);
    read(y, "truncate", yp, s.yarn.truncate);
    double m = 0;
    if (y.contains("mscale")) read(y, "mscale", yp, m), s.yarn.mscale = m;
    if (y.contains("mscale_all_dim")) read(y, "mscale_all_dim", yp, m), s.yarn.mscale_all_dim = m;
  }
  if (j.contains("llama3")) {
    const json& l = j.at("llama3");
    const std::string lp = p + "llama3.";
    reject_unknown(l, {"low_freq_factor", "high_freq_factor"}, lp);
    read(l, "low_freq_factor", lp, s.llama3.low_freq_factor);
    read(l, "high_freq_factor", lp, s.llama3.high_freq_factor);
  }
  read(j, "short_factor", p, s.short_factor);
  read(j, "long_factor", p, s.long_factor);
  read(j, "freq_factors", p, s.freq_factors);
  if (j.contains("attention_factor")) {
    double a = 0;
    read(j, "attention_factor", p, a);
    s.attention_factor = a;
  }
  return s;
}

void to_json(json& j, const EncodingConfig& e) {
  j = {{"kind", encoding_kind_name(e.kind)},
       {"rope", rope_spec_to_json(e.rope)},
       {"rotary_fraction", e.rotary_fraction},
       {"window", e.window},
       {"leaky_k", e.leaky_k},
       {"logn_train_len", e.logn_train_len}};
}

void from_json(const json& j, EncodingConfig& e) {
  const std::string p = "encoding.";
  reject_unknown(j, {"kind", "rope", "rotary_fraction", "window", "leaky_k", "logn_train_len"}, p);
  e = EncodingConfig{};
  if (j.contains("kind")) {
    std::string kind;
    read(j, "kind", p, kind);
    e.kind = parse_encoding_kind(kind, p + "kind");
  }
  if (j.contains("rope")) e.rope = rope_spec_from_json(j.at("rope"), p + "rope");
  read(j, "rotary_fraction", p, e.rotary_fraction);
  read(j, "window", p, e.window);
  read(j, "leaky_k", p, e.leaky_k);
  read(j, "logn_train_len", p, e.logn_train_len);
}

void to_json(json& j, const ModelConfig& c) {
  j = {{"vocab_size", c.vocab_size}, {"d_model", c.d_model},       {"n_layers", c.n_layers},
       {"n_heads", c.n_heads},       {"n_kv_heads", c.n_kv_heads}, {"d_ff", c.d_ff},
       {"pre_norm", c.pre_norm},     {"dropout", c.dropout},       {"tie_embeddings", c.tie_embeddings},
       {"max_seq_len", c.max_seq_len}, {"attention", c.attention}, {"fused", c.fused},
       {"encoding", c.encoding}};
}

// Missing fields keep their defaults; unknown fields, wrong types and unknown names throw rotary::Error. Values are
// left to validate(): a config may be completed later (the lab fills vocab_size 0 from its task).
void from_json(const json& j, ModelConfig& c) {
  reject_unknown(j,
                 {"vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "pre_norm", "dropout",
                  "tie_embeddings", "max_seq_len", "attention", "fused", "encoding"},
                 "");
  c = ModelConfig{};
  read(j, "vocab_size", "", c.vocab_size);
  read(j, "d_model", "", c.d_model);
  read(j, "n_layers", "", c.n_layers);
  read(j, "n_heads", "", c.n_heads);
  read(j, "n_kv_heads", "", c.n_kv_heads);
  read(j, "d_ff", "", c.d_ff);
  read(j, "pre_norm", "", c.pre_norm);
  read(j, "dropout", "", c.dropout);
  read(j, "tie_embeddings", "", c.tie_embeddings);
  read(j, "max_seq_len", "", c.max_seq_len);
  read(j, "attention", "", c.attention);
  check(is_one_of(c.attention, kAttentionKinds), "attention", c.attention, choices(kAttentionKinds));
  read(j, "fused", "", c.fused);
  if (j.contains("encoding")) from_json(j.at("encoding"), c.encoding);
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
  const std::string p = "override.";
  reject_unknown(j, {"kind", "rope", "window", "leaky_k", "logn_train_len"}, p);
  o = EncodingOverride{};
  std::string kind;
  int64_t n = 0;
  double k = 0;
  if (j.contains("kind")) read(j, "kind", p, kind), o.kind = parse_encoding_kind(kind, p + "kind");
  if (j.contains("rope")) o.rope = rope_spec_from_json(j.at("rope"), p + "rope");
  if (j.contains("window")) read(j, "window", p, n), o.window = n;
  if (j.contains("leaky_k")) read(j, "leaky_k", p, k), o.leaky_k = k;
  if (j.contains("logn_train_len")) read(j, "logn_train_len", p, n), o.logn_train_len = n;
}

}  // namespace rotary::nn
