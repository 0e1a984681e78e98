// rotary/json_guard.h: reading JSON text that may be hostile (a config.json, a run config, a checkpoint's
// metadata) without crashing on it.
//
// nlohmann's parser copes with any nesting, but much of what a reader does next recurses once per level: dump()
// (error messages), copies, operator==, merge_patch. 100000 '[' overflow the stack there. Every reader therefore
// parses through parse_json, which refuses text nested deeper than kMaxJsonDepth (real configs nest 3 or 4
// levels) before parsing it, and shows values in error messages through json_excerpt, which stops after a
// hundred characters instead of dumping a value of any size. Readers then take fields out of the parsed value
// through JsonObject, the one checked reader (a config.json's RoPE fields, the HF model spec, tokenizer.json): each
// field's type checked, errors naming the field's path, and one rule for integers (json_integer).
//
// check_json_depth is compiled into the core; the rest is inline so that the core's library keeps nlohmann_json
// private (a consumer that includes this header needs nlohmann_json 3 itself).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rotary/error.h"

namespace rotary {

// The deepest nesting of arrays and objects any reader accepts.
inline constexpr int kMaxJsonDepth = 64;

// The deepest nesting of '[' and '{' in `json_text`, not counting brackets inside strings. Malformed text is
// measured as far as it goes (the parser reports what is wrong with it).
int json_nesting_depth(std::string_view json_text);

// Throws rotary::Error("rotary: <source> nesting depth = <depth> is invalid; allowed: at most <max_depth> ...")
// when `json_text` nests deeper than `max_depth`. `source` names the text for the user (a file, "config.json").
void check_json_depth(std::string_view json_text, std::string_view source, int max_depth = kMaxJsonDepth);

// Parses JSON text after check_json_depth. Text nlohmann refuses is a rotary::Error naming `source` and the
// parser's message: a syntax error (parse_error, with the byte offset) and also a number too large for a double
// (1e400: out_of_range 406, which is not a parse_error), so every nlohmann exception the parser throws.
inline nlohmann::json parse_json(std::string_view json_text, std::string_view source) {
  check_json_depth(json_text, source);
  try {
    return nlohmann::json::parse(json_text.begin(), json_text.end());
  } catch (const nlohmann::json::exception& e) {
    fail(source, std::string("malformed JSON (") + e.what() + ")", "JSON text");
  }
}

namespace detail {

// Appends `v` to `out` until `out` is longer than `limit`. The walk goes one level deeper per character written
// ('[' or '{'), so it stops within `limit` levels whatever the depth of `v`.
inline void append_json_excerpt(const nlohmann::json& v, std::string& out, size_t limit) {
  constexpr auto replace = nlohmann::json::error_handler_t::replace;  // never throw on invalid UTF-8
  if (v.is_object() || v.is_array()) {
    out.push_back(v.is_object() ? '{' : '[');
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
      if (!first) out.push_back(',');
      first = false;
      if (v.is_object()) out.append(nlohmann::json(it.key()).dump(-1, ' ', false, replace)).push_back(':');
      append_json_excerpt(it.value(), out, limit);
    }
    out.push_back(v.is_object() ? '}' : ']');
  } else if (v.is_string() && v.get_ref<const std::string&>().size() > limit) {
    // Only the start of a long string can show; dump no more of it than that.
    out.append(nlohmann::json(v.get_ref<const std::string&>().substr(0, limit)).dump(-1, ' ', false, replace));
  } else {
    out.append(v.dump(-1, ' ', false, replace));
  }
}

}  // namespace detail

// `v` as compact JSON for an error message, cut to `max_chars` (ending in "...") when longer. Safe on a value
// of any size or depth.
inline std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 100) {
  std::string out;
  detail::append_json_excerpt(v, out, max_chars);
  if (out.size() > max_chars) {
    out.resize(max_chars > 3 ? max_chars - 3 : 0);
    out += "...";
  }
  return out;
}

// The one rule for integers every reader applies: a JSON integer, or a number written with a fraction whose value
// is integral (4096.0: Python's json writes float(4096) so, and transformers reads such configs), in [lo, hi].
// nullopt for anything else: another type, 4.5, a value outside [lo, hi] (an unsigned value past 2^63 included).
inline std::optional<int64_t> json_integer(const nlohmann::json& v, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > uint64_t(INT64_MAX)) return std::nullopt;
    x = int64_t(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d == std::floor(d) && std::abs(d) < 0x1p53)) return std::nullopt;  // exact in a double and in int64
    x = int64_t(d);
  } else {
    return std::nullopt;
  }
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

// "an integer in [lo, hi]", or "an integer" when the range is all of int64: what json_integer allows, in words.
inline std::string json_integer_allowed(int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  if (lo == INT64_MIN && hi == INT64_MAX) return "an integer";
  return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// One JSON object read with every field checked. A field is named "<prefix><key>" in errors, the prefix carrying
// the source and the path to the object ("config.json: ", "rope_scaling.", "tokenizer.json: model."), as
// "rotary: <prefix><key> = <value> is invalid; allowed: <what>". A field that is absent or JSON null is not given
// (std::nullopt): transformers and tokenizers treat both as "use the default". The object may be absent (nullptr):
// then no field is given. JsonObject refers to the value it reads; the value must outlive it.
class JsonObject {
 public:
  JsonObject(const nlohmann::json* object, std::string prefix) : object_(object), prefix_(std::move(prefix)) {}
  // `value` must be a JSON object, else an error naming `name` (its whole path) and `allowed`.
  static JsonObject of(const nlohmann::json& value, const std::string& name,
                       std::string_view allowed = "a JSON object") {
    if (!value.is_object()) fail(name, json_excerpt(value), allowed);
    return JsonObject(&value, name + ".");
  }

  const nlohmann::json* json() const { return object_; }
  const std::string& prefix() const { return prefix_; }
  std::string path(std::string_view key) const { return prefix_ + std::string(key); }

  // The value at `key`; nullptr when absent or null.
  const nlohmann::json* find(std::string_view key) const {
    if (object_ == nullptr) return nullptr;
    const auto it = object_->find(std::string(key));
    return it == object_->end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail_at(std::string_view key, const nlohmann::json& value, std::string_view allowed) const {
    fail(path(key), json_excerpt(value), allowed);
  }
  [[noreturn]] void missing(std::string_view key, std::string_view allowed) const {
    fail(path(key), "(missing)", allowed);
  }

  std::optional<int64_t> integer(std::string_view key, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    const std::optional<int64_t> x = json_integer(*v, lo, hi);
    if (!x) fail_at(key, *v, json_integer_allowed(lo, hi));
    return x;
  }
  std::optional<double> number(std::string_view key) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail_at(key, *v, "a number");
    return v->get<double>();
  }
  std::optional<std::string> text(std::string_view key) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail_at(key, *v, "a string");
    return v->get<std::string>();
  }
  std::optional<bool> boolean(std::string_view key) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) fail_at(key, *v, "true or false");
    return v->get<bool>();
  }
  std::optional<std::vector<double>> number_list(std::string_view key) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_array()) fail_at(key, *v, "a list of numbers");
    std::vector<double> out;
    for (size_t i = 0; i < v->size(); ++i) {
      const nlohmann::json& e = (*v)[i];
      if (!e.is_number()) fail(path(key) + "[" + std::to_string(i) + "]", json_excerpt(e), "a number");
      out.push_back(e.get<double>());
    }
    return out;
  }
  // The object at `key` as a JsonObject named "<prefix><key>."; an absent one when not given.
  JsonObject object(std::string_view key) const {
    const nlohmann::json* v = find(key);
    if (v && !v->is_object()) fail_at(key, *v, "a JSON object");
    return JsonObject(v, path(key) + ".");
  }

  // Fields that must be given: missing ones are an error saying what is allowed.
  int64_t required_integer(std::string_view key, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const {
    if (!find(key)) missing(key, json_integer_allowed(lo, hi));
    return *integer(key, lo, hi);
  }
  std::string required_text(std::string_view key) const {
    if (!find(key)) missing(key, "a string");
    return *text(key);
  }

 private:
  const nlohmann::json* object_;
  std::string prefix_;
};

}  // namespace rotary
