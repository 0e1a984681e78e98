// chat/src/jinja_builtins.cpp: the filters, tests, methods and global functions templates may use. Each list here is
// what parsing accepts; a name outside it is refused with the template line (docs/chat-templates.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "jinja_syntax.h"

namespace rotary::chat::detail {
namespace {

const std::set<std::string> kFilters = {
    "abs", "capitalize", "count", "d", "default", "e", "escape", "first", "float", "indent", "int", "items", "join",
    "last", "length", "list", "lower", "map", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "string", "title", "tojson", "trim", "unique", "upper"};
const std::set<std::string> kTests = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false", "float", "ge", "gt", "in",
    "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence",
    "string", "true", "undefined", "upper"};
const std::set<std::string> kStringMethods = {"startswith", "endswith", "split", "strip", "lstrip", "rstrip", "upper",
                                              "lower", "replace", "title", "capitalize", "format", "join", "find",
                                              "count", "isdigit", "splitlines"};
const std::set<std::string> kDictMethods = {"items", "keys", "values", "get"};
const std::set<std::string> kGlobals = {"raise_exception", "strftime_now", "namespace", "range", "dict"};

std::string join_names(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Arguments by position or name, as Python binds them; unknown names or too many are errors.
struct Binder {
  Interpreter& in;
  CallArgs& args;
  std::string what;
  int line;
  std::vector<std::string> names;
  Value get(size_t index, const std::string& name, Value dflt = Value::undefined()) {
    names.push_back(name);
    for (const auto& [n, v] : args.named)
      if (n == name) return v;
    return index < args.positional.size() ? args.positional[index] : dflt;
  }
  void done() {
    if (args.positional.size() > names.size())
      in.error(line, what + " with " + to_text(args.positional.size()) + " arguments",
               "at most " + to_text(names.size()));
    for (const auto& kv : args.named)
      if (std::find(names.begin(), names.end(), kv.first) == names.end())
        in.error(line, what + " argument " + kv.first, names.empty() ? "no arguments" : "the arguments of " + what);
  }
};

std::string need_string(Interpreter& in, const Value& v, const std::string& what, int line) {
  if (!v.is_string()) in.error(line, what + " of type " + type_name(v), "a string");
  return v.text;
}
int64_t need_int(Interpreter& in, const Value& v, const std::string& what, int line) {
  if (v.kind == Value::Kind::Bool) return v.boolean;
  if (v.kind != Value::Kind::Int) in.error(line, what + " of type " + type_name(v), "an integer");
  return v.integer;
}

std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<uint32_t> cps = code_points(s), set;
  const bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) set = code_points(chars.text);
  auto strip = [&](uint32_t cp) {
    return whitespace ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip(cps[b])) ++b;
  if (right) while (e > b && strip(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x80) c = char(upper ? std::toupper(c) : std::tolower(c));
  return s;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between characters
    const auto cps = code_points(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (k < cps.size()) append_code_point(out, cps[k]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos).append(to);
    pos = at + from.size();
    ++done;
  }
  return out.append(s, pos, std::string::npos);
}

std::vector<std::string> split_lines(const std::string& s) {  // str.splitlines()
  std::vector<std::string> lines;
  const auto cps = code_points(s);
  size_t start = 0;
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k];
    if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      lines.push_back(from_code_points(cps, start, k));
      if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
      start = k + 1;
    }
  }
  if (start < cps.size()) lines.push_back(from_code_points(cps, start, cps.size()));
  return lines;
}

ValueList as_items(Interpreter& in, const Value& v, const std::string& what, int line) {
  if (v.is_list()) return *v.list;
  if (v.is_undefined()) return {};
  ValueList out;
  if (v.is_dict()) {
    for (const auto& kv : v.dict->items) out.push_back(Value::from_string(kv.first));
  } else if (v.is_string()) {
    for (uint32_t cp : code_points(v.text)) {
      std::string s;
      append_code_point(s, cp);
      out.push_back(Value::from_string(s));
    }
  } else {
    in.error(line, what + " of a " + type_name(v), "a list, dict or string");
  }
  return out;
}

Value attribute_path(Interpreter& in, const Value& v, const std::string& path, int line) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(c); });
    cur = digits && cur.is_list() ? getitem_value(in, cur, Value::from_int(std::stoll(part)), line)
                                  : getitem_value(in, cur, Value::from_string(part), line);
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string title_case(const std::string& s, bool jinja_filter) {
  // Jinja's title filter starts a word after '-', whitespace, '(', '{', '[', '<'; str.title after any non-letter.
  const auto cps = code_points(s);
  std::string out;
  bool start = true;
  for (uint32_t c : cps) {
    const bool letter = c < 0x80 ? std::isalpha(int(c)) != 0 : true;
    uint32_t o = c;
    if (c < 0x80) o = uint32_t(start ? std::toupper(int(c)) : std::tolower(int(c)));
    append_code_point(out, o);
    if (jinja_filter) start = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c);
    else start = !letter && !(c < 0x80 && std::isdigit(int(c)));
    if (!jinja_filter && c < 0x80 && std::isdigit(int(c))) start = false;
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string lower = ascii_case(s, false);
  if (!lower.empty() && static_cast<unsigned char>(lower[0]) < 0x80) lower[0] = char(std::toupper(lower[0]));
  return lower;
}

std::string py_round(double x, int64_t digits) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", int(std::clamp<int64_t>(digits, 0, 300)), x);
  return buf;
}

bool run_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args, int line);

Value filter_select(Interpreter& in, const Value& v, CallArgs& args, bool by_attr, bool keep, int line,
                    const std::string& what) {
  ValueList items = as_items(in, v, what, line);
  size_t first = 0;
  std::string attr;
  if (by_attr) {
    if (args.positional.empty()) in.error(line, what + " without an attribute", "selectattr(attribute, test, ...)");
    attr = need_string(in, args.positional[0], what + " attribute", line);
    first = 1;
  }
  std::string test;
  CallArgs test_args;
  if (args.positional.size() > first) {
    test = need_string(in, args.positional[first], what + " test", line);
    if (!is_known_test(test)) in.error(line, "test " + quoted_text(test), "the tests " + known_tests());
    test_args.positional.assign(args.positional.begin() + long(first) + 1, args.positional.end());
  }
  ValueList out;
  for (const auto& item : items) {
    const Value probe = by_attr ? attribute_path(in, item, attr, line) : item;
    CallArgs a = test_args;
    const bool pass = test.empty() ? truthy(probe) : run_test(in, test, probe, a, line);
    if (pass == keep) out.push_back(item);
  }
  return Value::from_list(std::move(out));
}

Value run_filter(Interpreter& in, const std::string& name, Value v, CallArgs& args, int line) {
  Binder b{in, args, "filter " + name, line, {}};
  const size_t cap = in.options.limits.max_output_bytes;
  if (name == "trim") {
    Value chars = b.get(0, "chars");
    b.done();
    return Value::from_string(strip_chars(to_str(v), chars, true, true));
  }
  if (name == "tojson") {
    Value indent = b.get(0, "indent", Value::none()), ensure = b.get(1, "ensure_ascii"),
          seps = b.get(2, "separators", Value::none()), sort = b.get(3, "sort_keys");
    b.done();
    if (truthy(ensure)) in.error(line, "tojson(ensure_ascii=true)", "ensure_ascii false (transformers' tojson)");
    const int ind = indent.is_none() ? -1 : int(std::clamp<int64_t>(need_int(in, indent, "tojson indent", line), 0, 64));
    std::string item = ind < 0 ? ", " : ",", key = ": ";
    if (!seps.is_none()) {
      if (!seps.is_list() || seps.list->size() != 2)
        in.error(line, "tojson separators of type " + type_name(seps), "a pair of strings");
      item = need_string(in, (*seps.list)[0], "tojson separators", line);
      key = need_string(in, (*seps.list)[1], "tojson separators", line);
    }
    std::string text = dump_json(v, ind, item, key, truthy(sort), &in, line);
    if (text.size() > cap) in.error(line, "tojson text past the output limit", "RenderLimits::max_output_bytes");
    return Value::from_string(std::move(text));
  }
  if (name == "length" || name == "count") {
    b.done();
    if (v.is_string()) return Value::from_int(int64_t(utf8_length(v.text)));
    if (v.is_list()) return Value::from_int(int64_t(v.list->size()));
    if (v.is_dict()) return Value::from_int(int64_t(v.dict->items.size()));
    if (v.is_undefined()) return Value::from_int(0);
    in.error(line, name + " of a " + type_name(v), "strings, lists and dicts");
  }
  if (name == "upper" || name == "lower") {
    b.done();
    return Value::from_string(ascii_case(to_str(v), name == "upper"));
  }
  if (name == "title") {
    b.done();
    return Value::from_string(title_case(to_str(v), true));
  }
  if (name == "capitalize") {
    b.done();
    return Value::from_string(capitalize(to_str(v)));
  }
  if (name == "items") {
    b.done();
    if (v.is_undefined()) return Value::from_list({});
    if (!v.is_dict()) in.error(line, "items of a " + type_name(v), "a dict");
    ValueList out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::from_list({Value::from_string(k), x}));
    return Value::from_list(std::move(out));
  }
  if (name == "string") {
    b.done();
    return Value::from_string(to_str(v));
  }
  if (name == "safe") {
    b.done();
    return v;
  }
  if (name == "e" || name == "escape") {
    b.done();
    return Value::from_string(html_escape(to_str(v)));
  }
  if (name == "int") {
    Value dflt = b.get(0, "default", Value::from_int(0));
    b.get(1, "base");
    b.done();
    if (v.kind == Value::Kind::Int) return v;
    if (v.kind == Value::Kind::Bool) return Value::from_int(v.boolean);
    if (v.kind == Value::Kind::Float && std::isfinite(v.real) && std::fabs(v.real) < 9.2e18)
      return Value::from_int(int64_t(v.real));
    if (v.is_string()) {
      const std::string t = strip_chars(v.text, Value::undefined(), true, true);
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && *end == '\0' && errno == 0) return Value::from_int(x);
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::from_int(int64_t(d));
    }
    return dflt;
  }
  if (name == "float") {
    Value dflt = b.get(0, "default", Value::from_float(0.0));
    b.done();
    if (v.kind == Value::Kind::Float) return v;
    if (v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool)
      return Value::from_float(double(v.kind == Value::Kind::Int ? v.integer : v.boolean));
    if (v.is_string()) {
      const std::string t = strip_chars(v.text, Value::undefined(), true, true);
      char* end = nullptr;
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && *end == '\0') return Value::from_float(d);
    }
    return dflt;
  }
  if (name == "default" || name == "d") {
    Value dflt = b.get(0, "default_value", Value::from_string("")), boolean = b.get(1, "boolean");
    b.done();
    if (v.is_undefined() || (truthy(boolean) && !truthy(v))) return dflt;
    return v;
  }
  if (name == "join") {
    Value sep = b.get(0, "d", Value::from_string("")), attr = b.get(1, "attribute", Value::none());
    b.done();
    std::string out;
    bool first = true;
    for (const auto& item : as_items(in, v, "join", line)) {
      if (!first) out += to_str(sep);
      first = false;
      out += to_str(attr.is_none() ? item : attribute_path(in, item, to_str(attr), line));
      if (out.size() > cap) in.error(line, "join text past the output limit", "RenderLimits::max_output_bytes");
    }
    return Value::from_string(std::move(out));
  }
  if (name == "first" || name == "last") {
    b.done();
    ValueList items = as_items(in, v, name, line);
    if (items.empty()) return Value::undefined(name + " of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    b.done();
    return Value::from_list(as_items(in, v, "list", line));
  }
  if (name == "reverse") {
    b.done();
    if (v.is_string()) {
      auto cps = code_points(v.text);
      std::reverse(cps.begin(), cps.end());
      return Value::from_string(from_code_points(cps, 0, cps.size()));
    }
    ValueList items = as_items(in, v, "reverse", line);
    std::reverse(items.begin(), items.end());
    return Value::from_list(std::move(items));
  }
  if (name == "replace") {
    Value from = b.get(0, "old"), to = b.get(1, "new"), count = b.get(2, "count", Value::none());
    b.done();
    const int64_t n = count.is_none() ? -1 : need_int(in, count, "replace count", line);
    std::string out = replace_all(to_str(v), to_str(from), to_str(to), n);
    if (out.size() > cap) in.error(line, "replace text past the output limit", "RenderLimits::max_output_bytes");
    return Value::from_string(std::move(out));
  }
  if (name == "map") {
    ValueList items = as_items(in, v, "map", line);
    ValueList out;
    Value attr, dflt;
    for (const auto& [n, x] : args.named) {
      if (n == "attribute") attr = x;
      else if (n == "default") dflt = x;
      else in.error(line, "map argument " + n, "attribute, default, or a filter name and its arguments");
    }
    if (!attr.is_undefined()) {
      if (!args.positional.empty()) in.error(line, "map(attribute=...) with positional arguments", "no others");
      for (const auto& item : items) {
        Value x = attribute_path(in, item, to_str(attr), line);
        out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
      }
      return Value::from_list(std::move(out));
    }
    if (args.positional.empty()) in.error(line, "map without arguments", "map(attribute=NAME) or map(FILTER, ...)");
    const std::string f = need_string(in, args.positional[0], "map filter", line);
    if (!is_known_filter(f)) in.error(line, "filter " + quoted_text(f), "the filters " + known_filters());
    for (const auto& item : items) {
      CallArgs a;
      a.positional.assign(args.positional.begin() + 1, args.positional.end());
      out.push_back(run_filter(in, f, item, a, line));
    }
    return Value::from_list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return filter_select(in, v, args, name.size() > 6, name.rfind("select", 0) == 0, line, name);
  if (name == "unique") {
    Value case_sensitive = b.get(0, "case_sensitive"), attr = b.get(1, "attribute", Value::none());
    b.done();
    ValueList out, seen;
    for (const auto& item : as_items(in, v, "unique", line)) {
      Value key = attr.is_none() ? item : attribute_path(in, item, to_str(attr), line);
      if (key.is_string() && !truthy(case_sensitive)) key = Value::from_string(ascii_case(key.text, false));
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::from_list(std::move(out));
  }
  if (name == "indent") {
    Value width = b.get(0, "width", Value::from_int(4)), first = b.get(1, "first"), blank = b.get(2, "blank");
    b.done();
    const std::string pad = width.is_string() ? width.text
                                               : std::string(size_t(std::clamp<int64_t>(need_int(in, width, "indent width", line), 0, 1024)), ' ');
    const auto lines = split_lines(to_str(v) + "\n");
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) out += "\n";
      if (k == 0 ? truthy(first) : (truthy(blank) || !lines[k].empty())) out += pad;
      out += lines[k];
      if (out.size() > cap) in.error(line, "indent text past the output limit", "RenderLimits::max_output_bytes");
    }
    return Value::from_string(std::move(out));
  }
  if (name == "round") {
    Value precision = b.get(0, "precision", Value::from_int(0)), method = b.get(1, "method", Value::from_string("common"));
    b.done();
    const int64_t p = need_int(in, precision, "round precision", line);
    const std::string m = to_str(method);
    if (!v.is_number()) in.error(line, "round of a " + type_name(v), "a number");
    const double x = v.kind == Value::Kind::Float ? v.real : double(v.kind == Value::Kind::Int ? v.integer : v.boolean);
    if (m == "common") {
      if (v.kind != Value::Kind::Float) return Value::from_int(v.kind == Value::Kind::Int ? v.integer : v.boolean);
      return Value::from_float(std::strtod(py_round(x, p).c_str(), nullptr));
    }
    const double scale = std::pow(10.0, double(p));
    if (m == "floor") return Value::from_float(std::floor(x * scale) / scale);
    if (m == "ceil") return Value::from_float(std::ceil(x * scale) / scale);
    in.error(line, "round method " + quoted_text(m), "common, floor, ceil");
  }
  if (name == "abs") {
    b.done();
    if (v.kind == Value::Kind::Float) return Value::from_float(std::fabs(v.real));
    if (v.kind == Value::Kind::Int && v.integer != INT64_MIN) return Value::from_int(v.integer < 0 ? -v.integer : v.integer);
    if (v.kind == Value::Kind::Bool) return Value::from_int(v.boolean);
    in.error(line, "abs of a " + type_name(v), "a number");
  }
  in.error(line, "filter " + quoted_text(name), "the filters " + known_filters());
}

bool run_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args, int line) {
  Binder b{in, args, "test " + name, line, {}};
  using K = Value::Kind;
  auto no_args = [&] { b.done(); };
  if (name == "defined") return no_args(), !v.is_undefined();
  if (name == "undefined") return no_args(), v.is_undefined();
  if (name == "none") return no_args(), v.is_none();
  if (name == "string") return no_args(), v.is_string();
  if (name == "number") return no_args(), v.is_number();
  if (name == "integer") return no_args(), v.kind == K::Int;
  if (name == "float") return no_args(), v.kind == K::Float;
  if (name == "boolean") return no_args(), v.kind == K::Bool;
  if (name == "true") return no_args(), v.kind == K::Bool && v.boolean;
  if (name == "false") return no_args(), v.kind == K::Bool && !v.boolean;
  if (name == "mapping") return no_args(), v.is_dict();
  if (name == "callable") return no_args(), v.kind == K::Callable;
  // Jinja's Undefined iterates (as empty) and has a length: both tests hold for it.
  if (name == "iterable") return no_args(), v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return no_args(), v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "lower" || name == "upper") {
    b.done();
    const std::string s = to_str(v);
    return s == ascii_case(s, name == "upper");
  }
  if (name == "odd" || name == "even") {
    b.done();
    const int64_t x = need_int(in, v, "test " + name + " operand", line);
    return (x % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = need_int(in, b.get(0, "num"), "divisibleby argument", line);
    b.done();
    if (d == 0) in.error(line, "divisibleby 0", "a non-zero divisor");
    return need_int(in, v, "divisibleby operand", line) % d == 0;
  }
  if (name == "sameas") {
    const Value other = b.get(0, "other");
    b.done();
    if (v.kind != other.kind) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.kind == K::Bool) return v.boolean == other.boolean;
    if (v.is_list()) return v.list == other.list;
    if (v.is_dict()) return v.dict == other.dict;
    return values_equal(v, other);
  }
  if (name == "in") {
    const Value seq = b.get(0, "seq");
    b.done();
    if (seq.is_string()) return v.is_string() && seq.text.find(v.text) != std::string::npos;
    if (seq.is_list()) return std::any_of(seq.list->begin(), seq.list->end(), [&](const Value& x) { return values_equal(x, v); });
    if (seq.is_dict()) return v.is_string() && seq.dict->find(v.text);
    in.error(line, "test in with a " + type_name(seq), "a string, list or dict");
  }
  const Value other = b.get(0, "other");
  b.done();
  if (name == "eq" || name == "equalto") return values_equal(v, other);
  if (name == "ne") return !values_equal(v, other);
  if (v.is_number() && other.is_number()) {
    const double x = v.kind == K::Float ? v.real : double(v.kind == K::Int ? v.integer : v.boolean);
    const double y = other.kind == K::Float ? other.real : double(other.kind == K::Int ? other.integer : other.boolean);
    if (name == "lt") return x < y;
    if (name == "le") return x <= y;
    if (name == "gt") return x > y;
    if (name == "ge") return x >= y;
  }
  if (v.is_string() && other.is_string()) {
    if (name == "lt") return v.text < other.text;
    if (name == "le") return v.text <= other.text;
    if (name == "gt") return v.text > other.text;
    if (name == "ge") return v.text >= other.text;
  }
  in.error(line, "test " + name + " between " + type_name(v) + " and " + type_name(other), "numbers or strings");
}

std::string format_string(Interpreter& in, const std::string& fmt, CallArgs& args, int line) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if ((c == '{' || c == '}') && k + 1 < fmt.size() && fmt[k + 1] == c) {
      out.push_back(c);
      ++k;
      continue;
    }
    if (c == '}') in.error(line, "format string " + quoted_text(fmt), "balanced { }");
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    const size_t close = fmt.find('}', k);
    if (close == std::string::npos) in.error(line, "format string " + quoted_text(fmt), "balanced { }");
    const std::string field = fmt.substr(k + 1, close - k - 1);
    Value v;
    if (field.empty()) {
      if (auto_index >= args.positional.size()) in.error(line, "format field {} past the arguments", "one per {}");
      v = args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char ch) { return std::isdigit(ch); })) {
      const size_t i = size_t(std::stoul(field));
      if (i >= args.positional.size()) in.error(line, "format field {" + field + "}", "an argument's index");
      v = args.positional[i];
    } else {
      bool found = false;
      for (const auto& [n, x] : args.named)
        if (n == field) v = x, found = true;
      if (!found) in.error(line, "format field {" + field + "}", "plain {}, {N} or {name} fields with arguments");
    }
    out += to_str(v);
    k = close;
  }
  return out;
}

}  // namespace

bool is_known_filter(const std::string& name) { return kFilters.count(name) > 0; }
bool is_known_test(const std::string& name) { return kTests.count(name) > 0; }
bool is_known_method(const std::string& name) { return kStringMethods.count(name) || kDictMethods.count(name); }
bool is_known_global(const std::string& name) { return kGlobals.count(name) > 0; }
std::string known_filters() { return join_names(kFilters); }
std::string known_tests() { return join_names(kTests); }
std::string known_methods() {
  return join_names(kStringMethods) + " of strings; " + join_names(kDictMethods) +
         " of dicts (list.append and other changes are refused, as transformers' immutable sandbox does)";
}
std::string known_globals() { return join_names(kGlobals); }

Value apply_filter(Interpreter& in, const std::string& name, Value value, CallArgs& args, int line) {
  return run_filter(in, name, std::move(value), args, line);
}
bool apply_test(Interpreter& in, const std::string& name, const Value& value, CallArgs& args, int line) {
  return run_test(in, name, value, args, line);
}

Value getattr_value(Interpreter& in, const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined())
    in.error(line, "attribute " + name + " of undefined " + quoted_text(obj.text), "attributes of defined values");
  if (obj.is_dict()) {
    if (!obj.dict->is_namespace && kDictMethods.count(name)) {
      Value self = obj;
      return Value::from_callable(name, [self, name](Interpreter& it, CallArgs& a, int l) {
        return call_method(it, self, name, a, l);
      });
    }
    const Value* v = obj.dict->find(name);
    return v ? *v : Value::undefined(name);
  }
  return Value::undefined(name);  // Jinja: a missing attribute is undefined, not an error
}

Value getitem_value(Interpreter& in, const Value& obj, const Value& key, int line) {
  if (obj.is_undefined())
    in.error(line, "index " + quoted_text(to_str(key)) + " of undefined " + quoted_text(obj.text),
             "indexing defined values");
  if (obj.is_dict()) {
    if (key.is_string()) {
      const Value* v = obj.dict->find(key.text);
      if (v) return *v;
      return getattr_value(in, obj, key.text, line);
    }
    return Value::undefined(to_str(key));
  }
  if ((obj.is_list() || obj.is_string()) && (key.kind == Value::Kind::Int || key.kind == Value::Kind::Bool)) {
    int64_t i = key.kind == Value::Kind::Int ? key.integer : key.boolean;
    if (obj.is_list()) {
      const int64_t n = int64_t(obj.list->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("index " + to_text(key.integer));
      return (*obj.list)[size_t(i)];
    }
    const auto cps = code_points(obj.text);
    const int64_t n = int64_t(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("index " + to_text(key.integer));
    return Value::from_string(from_code_points(cps, size_t(i), size_t(i) + 1));
  }
  if (key.is_string()) return getattr_value(in, obj, key.text, line);
  return Value::undefined(to_str(key));
}

Value call_method(Interpreter& in, const Value& obj, const std::string& name, CallArgs& args, int line) {
  Binder b{in, args, "method " + name, line, {}};
  if (obj.is_dict() && kDictMethods.count(name)) {
    if (name == "get") {
      Value key = b.get(0, "key"), dflt = b.get(1, "default", Value::none());
      b.done();
      const Value* v = key.is_string() ? obj.dict->find(key.text) : nullptr;
      return v ? *v : dflt;
    }
    b.done();
    ValueList out;
    for (const auto& [k, x] : obj.dict->items) {
      if (name == "items") out.push_back(Value::from_list({Value::from_string(k), x}));
      else if (name == "keys") out.push_back(Value::from_string(k));
      else out.push_back(x);
    }
    return Value::from_list(std::move(out));
  }
  if (obj.is_string() && kStringMethods.count(name)) {
    const std::string& s = obj.text;
    if (name == "startswith" || name == "endswith") {
      Value p = b.get(0, "prefix");
      b.done();
      ValueList options = p.is_list() ? *p.list : ValueList{p};
      for (const auto& o : options) {
        const std::string t = need_string(in, o, "method " + name + " argument", line);
        if (name == "startswith" ? s.compare(0, t.size(), t) == 0
                                 : s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0)
          return Value::from_bool(true);
      }
      return Value::from_bool(false);
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      Value chars = b.get(0, "chars");
      b.done();
      return Value::from_string(strip_chars(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "upper" || name == "lower") return b.done(), Value::from_string(ascii_case(s, name == "upper"));
    if (name == "title") return b.done(), Value::from_string(title_case(s, false));
    if (name == "capitalize") return b.done(), Value::from_string(capitalize(s));
    if (name == "isdigit")
      return b.done(), Value::from_bool(!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(c); }));
    if (name == "splitlines") {
      b.done();
      ValueList out;
      for (auto& l : split_lines(s)) out.push_back(Value::from_string(l));
      return Value::from_list(std::move(out));
    }
    if (name == "replace") {
      Value from = b.get(0, "old"), to = b.get(1, "new"), count = b.get(2, "count", Value::from_int(-1));
      b.done();
      std::string out = replace_all(s, need_string(in, from, "replace old", line), need_string(in, to, "replace new", line),
                                    need_int(in, count, "replace count", line));
      if (out.size() > in.options.limits.max_output_bytes)
        in.error(line, "replace text past the output limit", "RenderLimits::max_output_bytes");
      return Value::from_string(std::move(out));
    }
    if (name == "find" || name == "count") {
      const std::string t = need_string(in, b.get(0, "sub"), "method " + name + " argument", line);
      b.done();
      if (name == "find") {
        const size_t at = s.find(t);
        return Value::from_int(at == std::string::npos ? -1 : int64_t(utf8_length(s.substr(0, at))));
      }
      if (t.empty()) return Value::from_int(int64_t(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(t); at != std::string::npos; at = s.find(t, at + t.size())) ++n;
      return Value::from_int(n);
    }
    if (name == "join") {
      Value items = b.get(0, "iterable");
      b.done();
      std::string out;
      bool first = true;
      for (const auto& x : as_items(in, items, "join", line)) {
        if (!first) out += s;
        first = false;
        out += need_string(in, x, "join item", line);
        if (out.size() > in.options.limits.max_output_bytes)
          in.error(line, "join text past the output limit", "RenderLimits::max_output_bytes");
      }
      return Value::from_string(std::move(out));
    }
    if (name == "format") return Value::from_string(format_string(in, s, args, line));
    // split(sep=None, maxsplit=-1)
    Value sep = b.get(0, "sep", Value::none()), maxsplit = b.get(1, "maxsplit", Value::from_int(-1));
    b.done();
    const int64_t limit = need_int(in, maxsplit, "split maxsplit", line);
    ValueList out;
    if (sep.is_none()) {  // runs of whitespace, none at the ends
      const auto cps = code_points(s);
      size_t k = 0;
      int64_t splits = 0;
      while (k < cps.size()) {
        while (k < cps.size() && is_py_space(cps[k])) ++k;
        if (k >= cps.size()) break;
        if (limit >= 0 && splits >= limit) {
          size_t e = cps.size();
          while (e > k && is_py_space(cps[e - 1])) --e;
          out.push_back(Value::from_string(from_code_points(cps, k, e)));
          break;
        }
        size_t e = k;
        while (e < cps.size() && !is_py_space(cps[e])) ++e;
        out.push_back(Value::from_string(from_code_points(cps, k, e)));
        ++splits;
        k = e;
      }
      return Value::from_list(std::move(out));
    }
    const std::string t = need_string(in, sep, "split separator", line);
    if (t.empty()) in.error(line, "split with an empty separator", "a non-empty separator");
    size_t pos = 0;
    int64_t splits = 0;
    while (limit < 0 || splits < limit) {
      const size_t at = s.find(t, pos);
      if (at == std::string::npos) break;
      out.push_back(Value::from_string(s.substr(pos, at - pos)));
      pos = at + t.size();
      ++splits;
    }
    out.push_back(Value::from_string(s.substr(pos)));
    return Value::from_list(std::move(out));
  }
  const std::string what = "method " + name + " of a " + type_name(obj);
  in.error(line, what, obj.is_string() ? "the string methods " + join_names(kStringMethods)
                       : obj.is_dict() ? "the dict methods " + join_names(kDictMethods)
                                       : "the methods " + known_methods());
}

Value global_function(const std::string& name) {
  if (name == "raise_exception")
    return Value::from_callable(name, [](Interpreter& in, CallArgs& a, int line) -> Value {
      const std::string msg = a.positional.empty() ? "" : to_str(a.positional[0]);
      throw Error("rotary: " + in.program.origin + " line " + std::to_string(line) +
                  ": the template raised an exception: " + msg);
    });
  if (name == "strftime_now")
    return Value::from_callable(name, [](Interpreter& in, CallArgs& a, int line) {
      if (a.positional.size() != 1 || !a.positional[0].is_string())
        in.error(line, "strftime_now arguments", "one format string");
      const std::time_t now = in.options.now ? *in.options.now : std::time(nullptr);
      std::tm tm{};
      gmtime_r(&now, &tm);
      char buf[512];
      const size_t n = std::strftime(buf, sizeof buf, a.positional[0].text.c_str(), &tm);
      if (n == 0 && !a.positional[0].text.empty())
        in.error(line, "strftime_now format " + quoted_text(a.positional[0].text), "a format giving under 512 bytes");
      return Value::from_string(std::string(buf, n));
    });
  if (name == "namespace" || name == "dict")
    return Value::from_callable(name, [name](Interpreter& in, CallArgs& a, int line) {
      Value d = Value::new_dict();
      d.dict->is_namespace = name == "namespace";
      for (const auto& p : a.positional) {
        if (!p.is_dict()) in.error(line, name + "() positional argument of type " + type_name(p), "a dict");
        for (const auto& kv : p.dict->items) d.dict->set(kv.first, kv.second);
      }
      for (const auto& [n, v] : a.named) d.dict->set(n, v);
      return d;
    });
  if (name == "range")
    return Value::from_callable(name, [](Interpreter& in, CallArgs& a, int line) {
      if (a.positional.empty() || a.positional.size() > 3 || !a.named.empty())
        in.error(line, "range arguments", "range(stop), range(start, stop) or range(start, stop, step)");
      std::vector<int64_t> n;
      for (const auto& p : a.positional) n.push_back(need_int(in, p, "range argument", line));
      const int64_t start = n.size() > 1 ? n[0] : 0, stop = n.size() > 1 ? n[1] : n[0], step = n.size() > 2 ? n[2] : 1;
      if (step == 0) in.error(line, "range step 0", "a non-zero step");
      ValueList out;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        in.count_iteration(line);
        out.push_back(Value::from_int(k));
        if ((step > 0 && k > INT64_MAX - step) || (step < 0 && k < INT64_MIN - step)) break;
      }
      return Value::from_list(std::move(out));
    });
  return Value::undefined(name);
}

}  // namespace rotary::chat::detail
