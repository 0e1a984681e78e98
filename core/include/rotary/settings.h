// rotary/settings.h: the settings of a config struct, each declared once - its dotted JSON path, command-line
// flag, help and allowed values - and everything that reads, writes, checks or documents a config driven by those
// declarations: JSON (and TOML, which is read as JSON), the range checks of validate(), the flags (the lab builds
// them from the table: lab/cli/torch/train_flags.h) and a commented TOML file of the current values.
//
//   settings::Table<RopeSpec> t;
//   t.push_back(settings::field<RopeSpec>("base", "--rope-base", "RoPE base (theta)",
//                                         [](auto& s) -> auto& { return s.base; }, settings::real_above(0)));
//   settings::from_json(t, j, spec, "rope");   // "rope.base = -1 is invalid; allowed: a number > 0"
//
// Declarations live beside their struct: RopeSpec and ModelConfig in nn/src/config.cpp, the run's TrainConfig in
// lab/train/config.cpp. Rules that relate two fields (n_heads divides d_model) stay in the struct's validate().
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "rotary/error.h"

namespace rotary::settings {

using nlohmann::json;

enum class Kind : uint8_t {
  Boolean,
  Integer,   // int / int64_t, within [int_lo, int_hi]
  Unsigned,  // uint64_t, within [0, uint_hi]
  Real,      // a finite double within lo .. hi (each end open or closed)
  Text,      // any string (non_empty: at least one character)
  Choice,    // a string from `names` (parse may accept aliases too)
  Reals,     // an array of finite doubles
};

// The values a setting takes, stated once: checked when read and by check(), printed by --help, error messages
// and the TOML file.
struct Allowed {
  Kind kind = Kind::Real;
  int64_t int_lo = std::numeric_limits<int64_t>::min(), int_hi = std::numeric_limits<int64_t>::max();
  uint64_t uint_hi = std::numeric_limits<uint64_t>::max();
  double lo = -std::numeric_limits<double>::max(), hi = std::numeric_limits<double>::max();
  bool lo_open = false, hi_open = false;
  bool non_empty = false;                            // Text
  std::function<std::vector<std::string>()> names;   // Choice: the canonical names, in the order messages list them
  bool optional = false;                             // the field may be unset (std::optional): absent from JSON
  std::string note;                                  // what special values mean: "0 = n_heads"

  // "an integer in [1, 4096] (0 = n_heads)", "a number in (0, 1]", "one of pre, post", ...
  std::string text() const;
};

Allowed integers(int64_t lo, int64_t hi, std::string note = {});
Allowed unsigned_up_to(uint64_t hi, std::string note = {});
Allowed reals(double lo, double hi, bool lo_open = false, bool hi_open = false, std::string note = {});
Allowed any_real(std::string note = {});
Allowed real_above(double lo, std::string note = {});  // (lo, max]
Allowed boolean(std::string note = {});
Allowed text(bool non_empty, std::string note = {});
Allowed names(std::function<std::vector<std::string>()> names, std::string note = {});
Allowed real_list(std::string note = {});
Allowed optional_real(std::string note = {});

// The value `v` given for `field`, of the right type and inside `allowed` (integral doubles such as TOML's 1000.0
// become integers); rotary::Error "<field> = <v> is invalid; allowed: <allowed.text()>" otherwise. Choice values
// are returned as given: the setting's own parser maps aliases.
json checked_value(const Allowed& allowed, const json& v, const std::string& field);

template <class C>
struct Setting {
  std::string path;  // dotted JSON path inside C: "optim.lr", "model.encoding.window"
  std::string flag;  // "--lr"; empty: no flag (config files only)
  std::string help;
  Allowed allowed;
  std::vector<std::string> flag_words;  // Boolean flags with words instead of true/false: {false word, true word}
  std::function<json(const C&)> get;    // the current value (null: an unset optional)
  std::function<void(C&, const json&, const std::string& field)> set;  // takes a checked_value
  // Whether to_json writes the setting (null: always). A field only one kind uses, added after configs of the
  // other kinds were stored, stays out of their JSON, so stored configs still compare equal field by field.
  std::function<bool(const C&)> written;
};

template <class C>
using Table = std::vector<Setting<C>>;

namespace detail {
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
}  // namespace detail

// A setting stored in the member that `ref` returns (a generic lambda: [](auto& c) -> auto& { return c.x; }),
// of type bool, an integer, double, std::string, std::vector<double> or std::optional<double>.
template <class C, class Ref>
Setting<C> field(std::string path, std::string flag, std::string help, Ref ref, Allowed allowed) {
  using T = std::remove_cvref_t<decltype(ref(std::declval<C&>()))>;
  Setting<C> s{std::move(path), std::move(flag), std::move(help), std::move(allowed), {}, {}, {}, {}};
  if constexpr (detail::is_optional<T>::value) {
    s.allowed.optional = true;
    s.get = [ref](const C& c) { const auto& v = ref(c); return v ? json(*v) : json(); };
    s.set = [ref](C& c, const json& v, const std::string&) {
      if (v.is_null()) ref(c).reset(); else ref(c) = v.get<typename T::value_type>();
    };
  } else {
    s.get = [ref](const C& c) { return json(ref(c)); };
    s.set = [ref](C& c, const json& v, const std::string&) { ref(c) = v.get<T>(); };
  }
  return s;
}

// A setting whose value is an enum (or any type) with names: `name(value)` gives the canonical name and
// `parse(text)` reads one (it may accept aliases and throw rotary::Error; the message then names this field).
template <class C, class Ref, class Name, class Parse>
Setting<C> choice(std::string path, std::string flag, std::string help, Ref ref, Allowed allowed, Name name,
                  Parse parse) {
  Setting<C> s{std::move(path), std::move(flag), std::move(help), std::move(allowed), {}, {}, {}, {}};
  s.get = [ref, name](const C& c) { return json(std::string(name(ref(c)))); };
  s.set = [ref, parse, a = s.allowed](C& c, const json& v, const std::string& field) {
    const std::string text = v.get<std::string>();
    try {
      ref(c) = parse(text);
    } catch (const Error&) {
      fail(field, text, a.text());
    }
  };
  return s;
}

// The settings of Inner, reached from Outer through `ref`, with `prefix` + "." before each path.
template <class Outer, class Inner, class Ref>
void nest(Table<Outer>& out, const std::string& prefix, const Table<Inner>& inner, Ref ref) {
  for (const Setting<Inner>& s : inner) {
    Setting<Outer> o{prefix + "." + s.path, s.flag, s.help, s.allowed, s.flag_words, {}, {}, {}};
    o.get = [ref, get = s.get](const Outer& c) { return get(ref(c)); };
    if (s.written) o.written = [ref, written = s.written](const Outer& c) { return written(ref(c)); };
    o.set = [ref, set = s.set](Outer& c, const json& v, const std::string& field) { set(ref(c), v, field); };
    out.push_back(std::move(o));
  }
}

// ---- Whole tables (the non-template halves are in core/src/settings.cpp) ----------------------------------

// The leaf at a dotted path, or nullptr; and setting one (creating the objects on the way).
const json* find_path(const json& j, const std::string& dotted_path);
void set_path(json& j, const std::string& dotted_path, json value);
// rotary::Error naming the first key of `j` (at any depth) that is neither one of `paths` nor an object on the
// way to one, and the keys allowed there; also for a non-object where a table of fields belongs.
void reject_unknown_fields(const json& j, const std::vector<std::string>& paths, const std::string& field_prefix);
// "prefix.path", or "path" for an empty prefix.
std::string full_field(const std::string& prefix, const std::string& path);

template <class C>
std::vector<std::string> paths(const Table<C>& table) {
  std::vector<std::string> p;
  for (const Setting<C>& s : table) p.push_back(s.path);
  return p;
}

// The setting at `path`; rotary::Error if the table has none (a caller naming a field that was never declared).
template <class C>
const Setting<C>& find_setting(const Table<C>& table, const std::string& path) {
  for (const Setting<C>& s : table)
    if (s.path == path) return s;
  fail("setting", path, "a declared setting path");
}

template <class C>
json to_json(const Table<C>& table, const C& c) {
  json j = json::object();
  for (const Setting<C>& s : table) {
    if (s.written && !s.written(c)) continue;
    json v = s.get(c);
    if (!v.is_null()) set_path(j, s.path, std::move(v));
  }
  return j;
}

// Reads the fields present in `j` over `c` (absent fields keep their values); unknown fields, wrong types, names
// that are not allowed and numbers outside their range are rotary::Error naming `field_prefix`.path.
template <class C>
void from_json(const Table<C>& table, const json& j, C& c, const std::string& field_prefix = "") {
  reject_unknown_fields(j, paths(table), field_prefix);
  for (const Setting<C>& s : table) {
    const json* v = find_path(j, s.path);
    if (!v) continue;
    const std::string field = full_field(field_prefix, s.path);
    s.set(c, checked_value(s.allowed, *v, field), field);
  }
}

// rotary::Error naming the first setting whose current value is outside its allowed values (a config built in
// code rather than read).
template <class C>
void check(const Table<C>& table, const C& c, const std::string& field_prefix = "") {
  for (const Setting<C>& s : table) {
    const json v = s.get(c);
    if (v.is_null() && s.allowed.optional) continue;
    const std::string field = full_field(field_prefix, s.path);
    checked_value(s.allowed, v, field);
    if (s.allowed.kind == Kind::Choice && s.allowed.names) {  // a name set in code, not through the parser
      const std::vector<std::string> names = s.allowed.names();
      if (std::find(names.begin(), names.end(), v.get<std::string>()) == names.end())
        fail(field, v.get<std::string>(), s.allowed.text());
    }
  }
}

struct TomlLine {
  std::string path, help, allowed;
  json value;  // null: an unset optional (written commented out)
};
// A TOML file that sets every field to `value`, each with its help and allowed values as a comment, grouped into
// [tables]; what load_config_file reads back to the same config.
std::string toml_document(const std::vector<TomlLine>& lines, const std::string& header_comment);

template <class C>
std::string to_toml(const Table<C>& table, const C& c, const std::string& header_comment) {
  std::vector<TomlLine> lines;
  for (const Setting<C>& s : table)
    lines.push_back({s.path, s.help + (s.flag.empty() ? "" : " [" + s.flag + "]"), s.allowed.text(), s.get(c)});
  return toml_document(lines, header_comment);
}

}  // namespace rotary::settings
