// core/src/settings.cpp: the non-template half of rotary/settings.h - allowed-value texts, the checked reading of
// one value, dotted paths and the TOML writer.
#include "rotary/settings.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "rotary/json_guard.h"
#include "rotary/parse_number.h"

namespace rotary::settings {
namespace {

std::string with_note(std::string text, const std::string& note) {
  return note.empty() ? text : text + " (" + note + ")";
}

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

// Whether an integral double lies in [lo, hi] of a 64-bit type: compared against 2^63 / 2^64 exactly, since
// INT64_MAX rounds up to 2^63 as a double.
bool integral_double_in(double d, int64_t lo, int64_t hi) {
  if (d < -std::ldexp(1.0, 63) || d >= std::ldexp(1.0, 63)) return false;
  const auto i = static_cast<int64_t>(d);
  return i >= lo && i <= hi;
}

}  // namespace

std::string Allowed::text() const {
  switch (kind) {
    case Kind::Boolean: return with_note("true or false", note);
    case Kind::Integer:
      if (int_lo == std::numeric_limits<int64_t>::min() && int_hi == std::numeric_limits<int64_t>::max())
        return with_note("an integer", note);
      return with_note("an integer in [" + std::to_string(int_lo) + ", " + std::to_string(int_hi) + "]", note);
    case Kind::Unsigned: return with_note("an integer in [0, " + std::to_string(uint_hi) + "]", note);
    case Kind::Real: {
      const bool no_lo = lo == -std::numeric_limits<double>::max() && !lo_open;
      const bool no_hi = hi == std::numeric_limits<double>::max() && !hi_open;
      if (no_lo && no_hi) return with_note("a finite number", note);
      if (no_hi) return with_note(std::string("a number ") + (lo_open ? "> " : ">= ") + real_bound_text(lo), note);
      return with_note(std::string("a number in ") + (lo_open ? "(" : "[") + real_bound_text(lo) + ", " +
                           real_bound_text(hi) + (hi_open ? ")" : "]"),
                       note);
    }
    case Kind::Text: return with_note(non_empty ? "a non-empty string" : "a string", note);
    case Kind::Choice: return with_note("one of " + joined(names ? names() : std::vector<std::string>{}), note);
    case Kind::Reals: return with_note("an array of finite numbers", note);
  }
  return note;
}

Allowed integers(int64_t lo, int64_t hi, std::string note) {
  Allowed a;
  a.kind = Kind::Integer, a.int_lo = lo, a.int_hi = hi, a.note = std::move(note);
  return a;
}
Allowed unsigned_up_to(uint64_t hi, std::string note) {
  Allowed a;
  a.kind = Kind::Unsigned, a.uint_hi = hi, a.note = std::move(note);
  return a;
}
Allowed reals(double lo, double hi, bool lo_open, bool hi_open, std::string note) {
  Allowed a;
  a.kind = Kind::Real, a.lo = lo, a.hi = hi, a.lo_open = lo_open, a.hi_open = hi_open, a.note = std::move(note);
  return a;
}
Allowed any_real(std::string note) {
  return reals(-std::numeric_limits<double>::max(), std::numeric_limits<double>::max(), false, false, std::move(note));
}
Allowed real_above(double lo, std::string note) {
  return reals(lo, std::numeric_limits<double>::max(), true, false, std::move(note));
}
Allowed boolean(std::string note) {
  Allowed a;
  a.kind = Kind::Boolean, a.note = std::move(note);
  return a;
}
Allowed text(bool non_empty, std::string note) {
  Allowed a;
  a.kind = Kind::Text, a.non_empty = non_empty, a.note = std::move(note);
  return a;
}
Allowed names(std::function<std::vector<std::string>()> names, std::string note) {
  Allowed a;
  a.kind = Kind::Choice, a.names = std::move(names), a.note = std::move(note);
  return a;
}
Allowed real_list(std::string note) {
  Allowed a;
  a.kind = Kind::Reals, a.note = std::move(note);
  return a;
}
Allowed optional_real(std::string note) {
  Allowed a = any_real(std::move(note));
  a.optional = true;
  return a;
}

json checked_value(const Allowed& a, const json& v, const std::string& field) {
  // Built only on failure: the value shortened however large or deep it is.
  auto refuse = [&]() -> json { fail(field, json_excerpt(v), a.text()); };
  if (v.is_null()) return a.optional ? v : refuse();
  switch (a.kind) {
    case Kind::Boolean:
      return v.is_boolean() ? v : refuse();
    case Kind::Integer:
      // TOML writers sometimes give 1000.0 for 1000: a number with an integral value is accepted.
      if (v.is_number_unsigned())
        return v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()) && v.get<int64_t>() >= a.int_lo &&
                       v.get<int64_t>() <= a.int_hi
                   ? json(v.get<int64_t>())
                   : refuse();
      if (v.is_number_integer())
        return v.get<int64_t>() >= a.int_lo && v.get<int64_t>() <= a.int_hi ? json(v.get<int64_t>()) : refuse();
      if (v.is_number_float()) {
        const double d = v.get<double>();
        return std::floor(d) == d && integral_double_in(d, a.int_lo, a.int_hi) ? json(int64_t(d)) : refuse();
      }
      return refuse();
    case Kind::Unsigned:
      // TOML's integers are int64: a larger seed is written as a decimal string (toml_value) and read back here.
      if (v.is_string()) {
        const std::optional<uint64_t> u = read_unsigned(v.get_ref<const std::string&>(), a.uint_hi);
        return u ? json(*u) : refuse();
      }
      if (v.is_number_unsigned()) return v.get<uint64_t>() <= a.uint_hi ? v : refuse();
      if (v.is_number_integer())
        return v.get<int64_t>() >= 0 && uint64_t(v.get<int64_t>()) <= a.uint_hi ? json(v.get<uint64_t>()) : refuse();
      if (v.is_number_float()) {
        const double d = v.get<double>();
        if (!(std::floor(d) == d && d >= 0 && d < std::ldexp(1.0, 64))) return refuse();
        return uint64_t(d) <= a.uint_hi ? json(uint64_t(d)) : refuse();
      }
      return refuse();
    case Kind::Real: {
      if (!v.is_number()) return refuse();
      const double d = v.get<double>();
      const bool above = a.lo_open ? d > a.lo : d >= a.lo;
      const bool below = a.hi_open ? d < a.hi : d <= a.hi;
      return std::isfinite(d) && above && below ? json(d) : refuse();
    }
    case Kind::Text:
      return v.is_string() && !(a.non_empty && v.get<std::string>().empty()) ? v : refuse();
    case Kind::Choice:
      return v.is_string() ? v : refuse();
    case Kind::Reals: {
      if (!v.is_array()) return refuse();
      for (const json& x : v)
        if (!x.is_number() || !std::isfinite(x.get<double>())) return refuse();
      return v;
    }
  }
  return refuse();
}

const json* find_path(const json& j, const std::string& dotted_path) {
  const json* node = &j;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted_path.find('.', start);
    const std::string key = dotted_path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) return nullptr;
    auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

void set_path(json& j, const std::string& dotted_path, json value) {
  json* node = &j;
  size_t start = 0;
  for (size_t dot; (dot = dotted_path.find('.', start)) != std::string::npos; start = dot + 1) {
    json& next = (*node)[dotted_path.substr(start, dot - start)];
    if (!next.is_object()) next = json::object();
    node = &next;
  }
  (*node)[dotted_path.substr(start)] = std::move(value);
}

std::string full_field(const std::string& prefix, const std::string& path) {
  return prefix.empty() ? path : prefix + "." + path;
}

void reject_unknown_fields(const json& j, const std::vector<std::string>& paths, const std::string& field_prefix) {
  // Walk `j` one object at a time; `at` is the dotted path of the object being checked ("" = the root).
  std::vector<std::pair<const json*, std::string>> todo{{&j, ""}};
  while (!todo.empty()) {
    const auto [node, at] = todo.back();
    todo.pop_back();
    const std::string where = at.empty() ? field_prefix : full_field(field_prefix, at);
    if (!node->is_object()) fail(where.empty() ? "config" : where, json_excerpt(*node), "a table of fields");
    // The keys allowed here: the next part of every declared path under `at`.
    std::map<std::string, bool> allowed;  // key -> whether it is a table (a prefix of longer paths)
    const std::string lead = at.empty() ? "" : at + ".";
    for (const std::string& p : paths) {
      if (p.compare(0, lead.size(), lead) != 0) continue;
      const std::string rest = p.substr(lead.size());
      const size_t dot = rest.find('.');
      bool& table = allowed[rest.substr(0, dot)];
      table = table || dot != std::string::npos;
    }
    for (auto it = node->begin(); it != node->end(); ++it) {
      auto a = allowed.find(it.key());
      if (a == allowed.end()) {
        std::string keys;
        for (const auto& [k, table] : allowed) keys += (keys.empty() ? "" : ", ") + k;
        fail("config field", full_field(where, it.key()), "one of " + keys);
      }
      if (a->second) todo.emplace_back(&it.value(), lead + it.key());
    }
  }
}

namespace {

// A TOML value for a JSON scalar or array (TOML strings accept JSON's escapes; floats need a '.' or exponent).
std::string toml_value(const json& v) {
  if (v.is_array()) {
    std::string s = "[";
    for (const json& x : v) s += (s.size() > 1 ? ", " : "") + toml_value(x);
    return s + "]";
  }
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    return "\"" + v.dump() + "\"";  // beyond TOML's int64; checked_value reads the string back
  if (v.is_number_float()) {
    std::string s = v.dump();
    if (s.find_first_of(".eE") == std::string::npos) s += ".0";
    return s;
  }
  return v.dump();
}

}  // namespace

std::string toml_document(const std::vector<TomlLine>& lines, const std::string& header_comment) {
  // TOML puts a table's own keys before its sub-tables: group the lines by the table (the path before the last
  // dot), root first, then tables in the order they first appear.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const TomlLine*>> by_table;
  for (const TomlLine& l : lines) {
    const size_t dot = l.path.rfind('.');
    const std::string table = dot == std::string::npos ? "" : l.path.substr(0, dot);
    if (!by_table.count(table)) order.push_back(table);
    by_table[table].push_back(&l);
  }
  std::stable_partition(order.begin(), order.end(), [](const std::string& t) { return t.empty(); });
  std::string out;
  for (size_t i = 0; i < header_comment.size();) {
    const size_t nl = header_comment.find('\n', i);
    out += "# " + header_comment.substr(i, nl == std::string::npos ? std::string::npos : nl - i) + "\n";
    if (nl == std::string::npos) break;
    i = nl + 1;
  }
  for (const std::string& table : order) {
    if (!table.empty()) out += "\n[" + table + "]\n";
    for (const TomlLine* l : by_table[table]) {
      const std::string key = l->path.substr(table.empty() ? 0 : table.size() + 1);
      out += "# " + l->help + "; " + l->allowed + "\n";
      out += (l->value.is_null() ? "# " + key + " = (unset)" : key + " = " + toml_value(l->value)) + "\n";
    }
  }
  return out;
}

}  // namespace rotary::settings
