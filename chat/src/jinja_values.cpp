// chat/src/jinja_values.cpp: Python's conversions of the interpreter's values - str(), repr(), ==, truth,
// json.dumps - since chat templates print what Python prints.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja_syntax.h"

namespace rotary::chat::detail {

const Value* ValueDict::find(const std::string& key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
void ValueDict::set(const std::string& key, Value value) {
  for (auto& kv : items)
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    const auto c = static_cast<unsigned char>(s[k]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || k + size_t(n) > s.size()) {  // a stray byte counts as one character (U+FFFD's place)
      out.push_back(0xFFFD);
      ++k;
      continue;
    }
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int j = 1; j < n; ++j) cp = (cp << 6) | (static_cast<unsigned char>(s[k + size_t(j)]) & 0x3F);
    out.push_back(cp);
    k += size_t(n);
  }
  return out;
}
std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end && k < cps.size(); ++k) append_code_point(out, cps[k]);
  return out;
}
size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}
bool is_py_space(uint32_t cp) {  // str.isspace()
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.boolean;
    case Value::Kind::Int: return v.integer != 0;
    case Value::Kind::Float: return v.real != 0;
    case Value::Kind::String: return !v.text.empty();
    case Value::Kind::List: return !v.list->empty();
    case Value::Kind::Dict: return !v.dict->items.empty();
    case Value::Kind::Callable: return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "undefined";
    case Value::Kind::None: return "none";
    case Value::Kind::Bool: return "boolean";
    case Value::Kind::Int: return "integer";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "string";
    case Value::Kind::List: return "list";
    case Value::Kind::Dict: return v.dict->is_namespace ? "namespace" : "dict";
    case Value::Kind::Callable: return "function";
  }
  return "value";
}

// repr(float): the shortest text that reads back, fixed between 1e-4 and 1e16, else d.ddde+XX.
std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp10 = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  if (exp10 >= -4 && exp10 < 16) {
    std::string out;
    if (exp10 < 0) {
      out = "0." + std::string(size_t(-exp10 - 1), '0') + digits;
    } else if (size_t(exp10 + 1) >= digits.size()) {
      out = digits + std::string(size_t(exp10 + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp10 + 1)) + "." + digits.substr(size_t(exp10 + 1));
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return sign + out + ebuf;
}

namespace {
std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (b < 0x20 || b == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    } else out.push_back(c);
  }
  out.push_back(q);
  return out;
}
}  // namespace

std::string py_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String: return repr_string(v.text);
    case Value::Kind::List: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + py_repr((*v.list)[k]);
      return out + "]";
    }
    case Value::Kind::Dict: {
      std::string out = v.dict->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        out += (first ? "" : ", ") + repr_string(k) + ": " + py_repr(x);
        first = false;
      }
      return out + (v.dict->is_namespace ? "}>" : "}");
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.boolean ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.integer);
    case Value::Kind::Float: return py_float(v.real);
    case Value::Kind::String: return v.text;
    case Value::Kind::Callable: return "<function " + v.callable->name + ">";
    default: return py_repr(v);
  }
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::Float || b.kind == Value::Kind::Float) {
      auto d = [](const Value& v) {
        return v.kind == Value::Kind::Float ? v.real : double(v.kind == Value::Kind::Bool ? v.boolean : v.integer);
      };
      return d(a) == d(b);
    }
    auto i = [](const Value& v) { return v.kind == Value::Kind::Bool ? int64_t(v.boolean) : v.integer; };
    return i(a) == i(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.text == b.text;
    case Value::Kind::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Kind::Dict:
      if (a.dict == b.dict) return true;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (!y || !values_equal(x, *y)) return false;
      }
      return true;
    case Value::Kind::Callable: return a.callable == b.callable;
    default: return false;
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::from_bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::from_int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) fail("template variable", to_text(u), "integers within 64 bits");
      return Value::from_int(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::from_float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::from_string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList out;
      for (const auto& x : j) out.push_back(from_json(x));
      return Value::from_list(std::move(out));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::new_dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->set(it.key(), from_json(it.value()));
      return d;
    }
    default: fail("template variable", "binary JSON data", "JSON values");
  }
}

namespace {
void json_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void dump_into(std::string& out, const Value& v, int indent, int level, std::string_view item_sep,
               std::string_view key_sep, bool sort_keys, const Interpreter* in, int line) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(size_t(indent) * size_t(lvl), ' ');
  };
  if (level > 512) fail("tojson", "a value nested deeper than 512", "shallower values");
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.boolean ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.integer); return;
    case Value::Kind::Float:
      if (std::isnan(v.real)) out += "NaN";
      else if (std::isinf(v.real)) out += v.real < 0 ? "-Infinity" : "Infinity";
      else out += py_float(v.real);
      return;
    case Value::Kind::String: json_string(out, v.text); return;
    case Value::Kind::List:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out.append(item_sep);
        newline(level + 1);
        dump_into(out, (*v.list)[k], indent, level + 1, item_sep, key_sep, sort_keys, in, line);
      }
      newline(level);
      out.push_back(']');
      return;
    case Value::Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out.append(item_sep);
        newline(level + 1);
        json_string(out, items[k]->first);
        out.append(key_sep);
        dump_into(out, items[k]->second, indent, level + 1, item_sep, key_sep, sort_keys, in, line);
      }
      newline(level);
      out.push_back('}');
      return;
    }
    default: {
      const std::string what = "tojson of a " + type_name(v) + (v.is_undefined() ? " " + quoted_text(v.text) : "");
      if (in) in->error(line, what, "JSON values (none, booleans, numbers, strings, lists, dicts)");
      fail("tojson", what, "JSON values");
    }
  }
}
}  // namespace

std::string dump_json(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep, bool sort_keys,
                      const Interpreter* in, int line) {
  std::string out;
  dump_into(out, v, indent, 0, item_sep, key_sep, sort_keys, in, line);
  return out;
}

}  // namespace rotary::chat::detail
