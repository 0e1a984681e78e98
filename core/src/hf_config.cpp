// A RopeSpec from a Hugging Face config.json (see rotary/hf_config.h and docs/rope-scaling.md).
//
// Where transformers versions read a config differently we follow transformers 5 (rope_parameters, defaults
// filled by standardize_rope_params); where a config gives one value twice (top level and rope dict, or an
// old and a new key) and the two differ, versions disagree on which wins, so we refuse the config.
#include "rotary/hf_config.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "rotary/error.h"
#include "rotary/files.h"
#include "rotary/json_guard.h"

namespace rotary {

namespace {

using json = nlohmann::json;

// A JSON value for an error message, cut short when long (factor lists) or deep.
std::string show(const json& v) { return json_excerpt(v, 80); }

// Shortest text that reads back to the same value ("0.3", not to_text's "0.29999999999999999").
std::string value_text(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string value_text(int64_t v) { return std::to_string(v); }
std::string value_text(const std::string& v) { return v; }

// A value that may be given under several keys (old and new names, top level and rope dict): the first one
// given, after checking that every other one given agrees with it.
template <class T>
struct Given {
  std::optional<T> value;
  std::string path;
};
template <class T>
Given<T> agree(std::initializer_list<Given<T>> options) {
  Given<T> first;
  for (const Given<T>& o : options) {
    if (!o.value) continue;
    if (!first.value) {
      first = o;
    } else if (*o.value != *first.value) {
      fail(o.path, value_text(*o.value),
           "equal to " + first.path + " = " + value_text(*first.value) + " (both are given; transformers versions "
           "disagree on which one wins)");
    }
  }
  return first;
}

// "0.3 (int(80 * 0.3) = 23)": how a partial rotary factor turned into an unusable rotary dim.
std::string rotary_dim_text(double fraction, int64_t head_dim, int64_t rotary_dim) {
  return value_text(fraction) + " (int(" + std::to_string(head_dim) + " * " + value_text(fraction) +
         ") = " + std::to_string(rotary_dim) + ")";
}

double require_number(const JsonObject& o, std::string_view key, const std::string& why) {
  const std::optional<double> v = o.number(key);
  if (!v) fail(o.path(key), "missing", "a number (" + why + ")");
  return *v;
}

void check_at_least_one(double v, const std::string& path, const std::string& type) {
  check(std::isfinite(v) && v >= 1.0, path, v, "a finite value >= 1 for " + type);
}

// Multimodal configs keep the language model's fields under text_config.
JsonObject language_config(const json& root) {
  const bool flat = root.contains("num_attention_heads") || root.contains("head_dim") ||
                    root.contains("hidden_size") || root.contains("rope_scaling") || root.contains("rope_theta");
  auto tc = root.find("text_config");
  if (!flat && tc != root.end() && tc->is_object()) return JsonObject(&*tc, "text_config.");
  return JsonObject(&root, "");
}

// The rope dict: rope_scaling (transformers 4) or rope_parameters (transformers 5); when both are given they
// are merged and must agree on every key they share.
JsonObject rope_dict(const JsonObject& cfg, json& merged) {
  const json* scaling = cfg.find("rope_scaling");
  const json* params = cfg.find("rope_parameters");
  if (scaling && !scaling->is_object())
    fail(cfg.path("rope_scaling"), show(*scaling), "an object with rope_type (or type) and its fields, or null");
  if (params && !params->is_object())
    fail(cfg.path("rope_parameters"), show(*params), "an object with rope_type and its fields, or null");
  if (!scaling && !params) return JsonObject(nullptr, cfg.path("rope_scaling."));
  if (scaling && params) {
    for (auto it = params->begin(); it != params->end(); ++it) {
      auto other = scaling->find(it.key());
      if (other != scaling->end() && *other != it.value())
        fail(cfg.path("rope_parameters." + it.key()), show(it.value()),
             "equal to rope_scaling." + it.key() + " = " + show(*other) + " (both dicts are given)");
    }
    merged = *params;
    merged.update(*scaling);
    return JsonObject(&merged, cfg.path("rope_scaling."));
  }
  const json* d = scaling ? scaling : params;
  const std::string name = scaling ? "rope_scaling." : "rope_parameters.";
  // transformers 5 allows one dict per layer type ({"full_attention": {...}, "sliding_attention": {...}}).
  if (!d->contains("rope_type") && !d->contains("type")) {
    for (auto it = d->begin(); it != d->end(); ++it)
      if (it->is_object())
        fail(cfg.path(name + it.key()), show(*it),
             "one rope dict for all layers (per-layer-type RoPE is not supported)");
  }
  return JsonObject(d, cfg.path(name));
}

RopeScaling rope_type(const JsonObject& cfg, const JsonObject& rope) {
  const Given<std::string> type =
      agree<std::string>({{rope.text("rope_type"), rope.path("rope_type")}, {rope.text("type"), rope.path("type")}});
  if (!type.value) return RopeScaling::None;
  const std::string& t = *type.value;
  const std::optional<std::string> model_type = cfg.text("model_type");
  if (t == "default") return RopeScaling::None;
  if (t == "linear") return RopeScaling::Linear;
  if (t == "dynamic") return RopeScaling::Dynamic;
  if (t == "llama3") return RopeScaling::Llama3;
  if (t == "longrope" || t == "su") return RopeScaling::LongRope;
  // Phi-3's first configs called LongRoPE "yarn" (with short/long factor lists); Phi3Config renames it.
  if (t == "yarn") return model_type == "phi3" ? RopeScaling::LongRope : RopeScaling::Yarn;
  fail(type.path, t, "default, linear, dynamic, yarn, llama3, longrope (old names: su; Phi-3's yarn)");
}

// The rotated head width: qk_rope_head_dim for MLA models (transformers sets head_dim to it), else head_dim,
// else hidden_size / num_attention_heads; `field` names the one it came from.
int64_t head_dim_of(const JsonObject& cfg, std::string& field) {
  const std::optional<int64_t> explicit_dim = cfg.integer("head_dim");
  const std::optional<int64_t> mla_dim = cfg.integer("qk_rope_head_dim");
  int64_t d = 0;
  if (mla_dim) {
    if (explicit_dim && *explicit_dim != *mla_dim)
      fail(cfg.path("head_dim"), std::to_string(*explicit_dim),
           "equal to qk_rope_head_dim = " + std::to_string(*mla_dim) +
               " (MLA models rotate only qk_rope_head_dim features)");
    d = *mla_dim;
    field = cfg.path("qk_rope_head_dim");
  } else if (explicit_dim) {
    d = *explicit_dim;
    field = cfg.path("head_dim");
  } else {
    const std::optional<int64_t> hidden = cfg.integer("hidden_size");
    const std::optional<int64_t> heads = cfg.integer("num_attention_heads");
    if (!hidden || !heads)
      fail(cfg.path("head_dim"), "missing", "head_dim, or hidden_size and num_attention_heads");
    check(*heads >= 1, cfg.path("num_attention_heads"), *heads, ">= 1");
    check(*hidden >= 1, cfg.path("hidden_size"), *hidden, ">= 1");
    check(*hidden % *heads == 0, cfg.path("hidden_size"), *hidden,
          "a multiple of num_attention_heads = " + std::to_string(*heads) + " (or give head_dim)");
    d = *hidden / *heads;
    field = cfg.path("hidden_size / num_attention_heads");
  }
  check(d >= 2 && d <= 4096, field, d, "2..4096");
  return d;
}

}  // namespace

RopeSpec rope_spec_from_hf_config(std::string_view json_text) {
  const json root = parse_json(json_text, "config.json");
  if (!root.is_object()) fail("config.json", show(root), "a JSON object (the model's config)");
  const JsonObject cfg = language_config(root);
  json merged;
  const JsonObject rope = rope_dict(cfg, merged);

  RopeSpec spec;
  spec.layout = RopeLayout::HalfSplit;  // every Hugging Face model rotates half-split pairs
  spec.scaling = rope_type(cfg, rope);
  const std::string type(scaling_name(spec.scaling));

  const Given<double> theta = agree<double>({{rope.number("rope_theta"), rope.path("rope_theta")},
                                             {cfg.number("rope_theta"), cfg.path("rope_theta")},
                                             {cfg.number("rotary_emb_base"), cfg.path("rotary_emb_base")}});
  spec.base = theta.value.value_or(10000.0);
  if (theta.value) check(std::isfinite(spec.base) && spec.base > 0, theta.path, spec.base, "a finite value > 0");

  const Given<double> partial =
      agree<double>({{rope.number("partial_rotary_factor"), rope.path("partial_rotary_factor")},
                     {cfg.number("partial_rotary_factor"), cfg.path("partial_rotary_factor")},
                     {cfg.number("rotary_pct"), cfg.path("rotary_pct")}});
  const double fraction = partial.value.value_or(1.0);
  if (partial.value) check(fraction > 0 && fraction <= 1, partial.path, fraction, "a fraction in (0, 1]");

  std::string head_dim_field;
  const int64_t head_dim = head_dim_of(cfg, head_dim_field);
  spec.head_dim = int(head_dim);
  // int(head_dim * partial_rotary_factor), as transformers computes it (in double, truncated).
  const int64_t rotary_dim = int64_t(double(head_dim) * fraction);
  if (rotary_dim % 2 != 0 || rotary_dim < 2) {
    // Without a partial factor every feature rotates: the head dim itself is the value at fault.
    if (!partial.value)
      fail(head_dim_field, std::to_string(head_dim),
           "an even number (features rotate in pairs), or a partial_rotary_factor whose int(head_dim * factor) is "
           "even and >= 2");
    fail(partial.path, rotary_dim_text(fraction, head_dim, rotary_dim),
         "a rotary dim int(head_dim * partial_rotary_factor) that is even and >= 2");
  }
  spec.rotary_dim = int(rotary_dim);
  const int pairs = int(rotary_dim / 2);

  const std::optional<int64_t> max_pos = cfg.integer("max_position_embeddings");
  if (max_pos) check(*max_pos >= 1, cfg.path("max_position_embeddings"), *max_pos, ">= 1");
  spec.max_position_embeddings = max_pos.value_or(0);
  // Phi-3 keeps it at the top level, most others inside the rope dict.
  const Given<int64_t> orig = agree<int64_t>(
      {{cfg.integer("original_max_position_embeddings"), cfg.path("original_max_position_embeddings")},
       {rope.integer("original_max_position_embeddings"), rope.path("original_max_position_embeddings")}});
  if (orig.value) check(*orig.value >= 1, orig.path, *orig.value, ">= 1");

  // yarn, llama3 and longrope use the pre-extension length; transformers 5 falls back to max_position_embeddings.
  auto original_context = [&]() -> int64_t {
    if (orig.value) return *orig.value;
    if (max_pos) return *max_pos;
    fail(cfg.path("max_position_embeddings"), "missing",
         "an integer >= 1 (" + type + " needs original_max_position_embeddings or max_position_embeddings)");
  };
  // yarn and longrope without a factor: the ratio of the extended to the original context.
  auto factor_or_ratio = [&](int64_t l_orig) -> double {
    if (std::optional<double> f = rope.number("factor")) return *f;
    if (!max_pos)
      fail(rope.path("factor"), "missing",
           "a number >= 1 (or max_position_embeddings, for factor = max_position_embeddings / "
           "original_max_position_embeddings)");
    return double(*max_pos) / double(l_orig);
  };
  auto optional_positive = [&](std::string_view key) -> std::optional<double> {
    const std::optional<double> v = rope.number(key);
    if (v) check(std::isfinite(*v) && *v > 0, rope.path(key), *v, "a finite value > 0");
    return v;
  };

  switch (spec.scaling) {
    case RopeScaling::None:
      break;
    case RopeScaling::Linear:
      spec.factor = require_number(rope, "factor", "required for linear");
      check_at_least_one(spec.factor, rope.path("factor"), type);
      break;
    case RopeScaling::Dynamic:
      spec.factor = require_number(rope, "factor", "required for dynamic");
      check_at_least_one(spec.factor, rope.path("factor"), type);
      if (!max_pos) fail(cfg.path("max_position_embeddings"), "missing", "an integer >= 1 (required for dynamic)");
      break;
    case RopeScaling::Yarn: {
      spec.original_max_position_embeddings = original_context();
      spec.factor = factor_or_ratio(spec.original_max_position_embeddings);
      check_at_least_one(spec.factor, rope.path("factor"), type);
      spec.attention_factor = optional_positive("attention_factor");
      // transformers reads `get("beta_fast") or 32`: null and 0 both mean the default; so for the mscales.
      const double beta_fast = rope.number("beta_fast").value_or(0.0);
      const double beta_slow = rope.number("beta_slow").value_or(0.0);
      spec.yarn.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
      spec.yarn.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
      check(std::isfinite(spec.yarn.beta_slow) && spec.yarn.beta_slow > 0, rope.path("beta_slow"),
            spec.yarn.beta_slow, "a finite value > 0 (0 or null: 1)");
      check(std::isfinite(spec.yarn.beta_fast) && spec.yarn.beta_fast > spec.yarn.beta_slow, rope.path("beta_fast"),
            spec.yarn.beta_fast, "a finite value > beta_slow = " + value_text(spec.yarn.beta_slow) + " (0 or null: 32)");
      for (const char* key : {"mscale", "mscale_all_dim"}) {
        std::optional<double> m = rope.number(key);
        if (m && *m == 0.0) m.reset();
        if (m) check(std::isfinite(*m) && *m > 0, rope.path(key), *m, "a finite value > 0 (0 or null: not given)");
        (std::string_view(key) == "mscale" ? spec.yarn.mscale : spec.yarn.mscale_all_dim) = m;
      }
      spec.yarn.truncate = rope.boolean("truncate").value_or(true);
      break;
    }
    case RopeScaling::Llama3:
      spec.original_max_position_embeddings = original_context();
      spec.factor = require_number(rope, "factor", "required for llama3");
      check_at_least_one(spec.factor, rope.path("factor"), type);
      spec.llama3.low_freq_factor = require_number(rope, "low_freq_factor", "required for llama3");
      spec.llama3.high_freq_factor = require_number(rope, "high_freq_factor", "required for llama3");
      check(std::isfinite(spec.llama3.low_freq_factor) && spec.llama3.low_freq_factor > 0,
            rope.path("low_freq_factor"), spec.llama3.low_freq_factor, "a finite value > 0");
      check(std::isfinite(spec.llama3.high_freq_factor) &&
                spec.llama3.high_freq_factor > spec.llama3.low_freq_factor,
            rope.path("high_freq_factor"), spec.llama3.high_freq_factor,
            "a finite value > low_freq_factor = " + value_text(spec.llama3.low_freq_factor));
      break;
    case RopeScaling::LongRope: {
      spec.original_max_position_embeddings = original_context();
      check(spec.original_max_position_embeddings >= 2, orig.value ? orig.path : cfg.path("max_position_embeddings"),
            spec.original_max_position_embeddings, ">= 2 for longrope");
      spec.factor = factor_or_ratio(spec.original_max_position_embeddings);
      check_at_least_one(spec.factor, rope.path("factor"), type);
      spec.attention_factor = optional_positive("attention_factor");
      for (const char* key : {"short_factor", "long_factor"}) {
        std::optional<std::vector<double>> list = rope.number_list(key);
        if (!list) fail(rope.path(key), "missing", "a list of " + std::to_string(pairs) + " numbers (required for longrope)");
        check(int64_t(list->size()) == pairs, rope.path(key) + ".length", list->size(),
              std::to_string(pairs) + " = rotary_dim / 2 (rotary_dim " + std::to_string(rotary_dim) + ")");
        for (size_t i = 0; i < list->size(); ++i)
          check(std::isfinite((*list)[i]) && (*list)[i] > 0, rope.path(key) + "[" + std::to_string(i) + "]",
                (*list)[i], "a finite value > 0");
        (std::string_view(key) == "short_factor" ? spec.short_factor : spec.long_factor) = std::move(*list);
      }
      break;
    }
    default:
      break;
  }
  spec.validate();
  // Each parameter can be in its range and the frequencies still overflow (rope_theta = 1e-310 at head_dim 4096,
  // a longrope factor of 1e-320, a yarn mscale of 1e307): computed once here, so the config is refused when read,
  // not at the first forward. Longrope's long_factor list is taken only past the original context.
  try {
    spec.freqs(0);
    if (spec.scaling == RopeScaling::LongRope) spec.freqs(spec.original_max_position_embeddings + 1);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (the rope parameters config.json gives: " + spec.describe() + ")");
  }
  return spec;
}

std::string read_hf_config_text(const std::string& path, std::string* config_path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "config.json";
  std::string text =
      read_regular_file(p.string(), "hf_config", "a readable config.json file (or a model directory holding one)");
  if (config_path) *config_path = p.string();
  return text;
}

RopeSpec rope_spec_from_hf_config_file(const std::string& path) {
  std::string where;
  const std::string text = read_hf_config_text(path, &where);
  try {
    return rope_spec_from_hf_config(text);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in " + where + ")");
  }
}

std::optional<std::string> hf_special_token(const nlohmann::json& config, const std::string& key,
                                            const std::string& source) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  fail(source + ": " + key, json_excerpt(*it), "a string, an AddedToken object {\"content\": \"...\"} or null");
}

}  // namespace rotary
