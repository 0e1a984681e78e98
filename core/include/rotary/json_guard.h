// rotary/json_guard.h: reading JSON text that may be hostile (a config.json, a run config, a checkpoint's
// metadata) without crashing on it.
//
// nlohmann's parser copes with any nesting, but much of what a reader does next recurses once per level: dump()
// (error messages), copies, operator==, merge_patch. 100000 '[' overflow the stack there. Every reader therefore
// parses through parse_json, which refuses text nested deeper than kMaxJsonDepth (real configs nest 3 or 4
// levels) before parsing it, and shows values in error messages through json_excerpt, which stops after a
// hundred characters instead of dumping a value of any size.
//
// check_json_depth is compiled into the core; parse_json and json_excerpt are inline so that the core's library
// keeps nlohmann_json private (a consumer that includes this header needs nlohmann_json 3 itself).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

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

}  // namespace rotary
